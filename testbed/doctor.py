"""Capability probe of the running kernel and host: what this machine can emulate, found by trying it.

Nothing is guessed from the kernel version. Kernel features are exercised in a scratch network namespace
``ftb-doctor-<pid>`` (always removed): a veth pair, every qdisc kind, clsact + a cls_bpf filter, a tcx link,
a VXLAN device, a multipath route. The BPF program used is two instructions (``r0 = 0; exit``) loaded with
the raw bpf() syscall, so the probe needs neither BCC nor headers; BCC itself is checked separately through
``testbed.datapath.kheaders.compile_probe``. A full probe takes well under a second plus the BCC compile.

Public API: ``probe()``, ``render()``, ``as_dict()``, ``require()``, ``MissingFeature``, ``Capability``.
"""
from __future__ import annotations

import ctypes
import errno
import glob
import os
import platform
import shutil
import struct
import subprocess
import threading
from dataclasses import asdict
from typing import Callable, Iterable

from .capability import Capability, MissingFeature, kernel_release

# ---------------------------------------------------------------------------------------------------------



# name -> (label used in messages, needed_for, kind of remedy)
#   remedy "vm": a kernel feature -> run in the VM;  "setup": a package -> scripts/setup.sh;  other: literal
_SPEC: dict[str, tuple[str, str, str]] = {
    "root": ("root privileges", "everything (namespaces, tc, eBPF)", "run as root (sudo)"),
    "bpf": ("the bpf() syscall", "eBPF switching", "vm"),
    "btf": ("kernel BTF (/sys/kernel/btf/vmlinux)", "CO-RE eBPF (optional; BCC does not need it)", "vm"),
    "bpffs": ("bpffs", "pinning BPF maps (optional)", "mount it: mount -t bpf bpf /sys/fs/bpf"),
    "clsact": ("clsact qdisc", "eBPF switching", "vm"),
    "cls_bpf": ("cls_bpf filter", "eBPF switching", "vm"),
    "tcx": ("tcx attachment (BPF_TCX_INGRESS)", "eBPF switching via tcx (optional; cls_bpf is used)", "vm"),
    "veth": ("veth", "links (every fabric)", "vm"),
    "htb": ("HTB qdisc", "link shaping, PFC pause (HTB+TBF)", "vm"),
    "tbf": ("TBF qdisc", "link shaping, PFC pause (HTB+TBF)", "vm"),
    "pfifo": ("pfifo qdisc", "port buffers (packet limit)", "vm"),
    "bfifo": ("bfifo qdisc", "port buffers (byte limit)", "vm"),
    "netem": ("netem qdisc", "link delay (netem)", "vm"),
    "red": ("red qdisc", "reference ECN (red)", "vm"),
    "fq": ("fq qdisc", "EDT pacing (fq)", "vm"),
    "fq_codel": ("fq_codel qdisc", "reference AQM (fq_codel)", "vm"),
    "prio": ("prio qdisc", "strict-priority reference queues (prio)", "vm"),
    "vxlan": ("VXLAN", "multi-machine (vxlan)", "vm"),
    "multipath": ("IPv4 multipath routing", "kernel ECMP baseline (multipath routes)", "vm"),
    "rdma_rxe": ("Soft-RoCE (rdma_rxe)", "RoCE with Soft-RoCE (rxe)", "vm"),
    "bcc": ("BCC compile of a tc program", "eBPF switching (BCC)", "setup"),
    "tshark": ("tshark", "capture decoding (RoCEv2 dissector)", "setup"),
    "tcpdump": ("tcpdump", "packet captures", "setup"),
    "ray": ("Ray (the cluster extra)", "sweeps and fabrics over several machines (testbed cluster, --cluster)",
            "installed on first use of `testbed cluster` or by scripts/test-setup.sh (pip install '.[cluster]')"),
    "pymetis": ("pymetis (the cluster extra)", "placement strategy auto (METIS partitioning)",
                "installed on first use of `testbed cluster` or by scripts/test-setup.sh (pip install '.[cluster]')"),
    "perftest": ("perftest (ib_write_bw)", "RoCE with Soft-RoCE (rxe) benchmarks",
                 "install it: apt-get install perftest (and run in the VM for rxe)"),
    "iperf3": ("iperf3", "iperf3 flows (traffic.engine iperf3)", "install it: apt-get install iperf3"),
    "openmpi": ("Open MPI (mpirun)", "MPI collectives (traffic.engine mpi)",
                "install it: apt-get install openmpi-bin python3-mpi4py"),
    "mpi4py": ("mpi4py", "MPI collectives (traffic.engine mpi)",
               "install it: apt-get install python3-mpi4py (the venv sees the system site packages)"),
    "docker-sdk": ("the docker Python SDK", "container hosts (hosts.docker, testbed image)",
                   "bash scripts/docker-setup.sh (done on first use)"),
    "docker": ("a Docker daemon", "container hosts (hosts.docker, testbed image)",
               "start dockerd (README: Docker hosts; started on first use)"),
}

QDISC_KINDS = ("htb", "tbf", "pfifo", "bfifo", "netem", "red", "fq", "fq_codel", "prio")
NETNS_PREFIX = "ftb-doctor-"

# ---------------------------------------------------------------------------------------------------------
# bpf() through ctypes

_BPF_PROG_LOAD = 5
_BPF_LINK_CREATE = 28
BPF_PROG_TYPE_SCHED_CLS = 3
BPF_TCX_INGRESS = 46
# r0 = 0 (BPF_ALU64|BPF_MOV|BPF_K); exit (BPF_JMP|BPF_EXIT). For a direct-action tc program 0 = TC_ACT_OK.
_TRIVIAL_PROG = struct.pack("<BBhi", 0xB7, 0, 0, 0) + struct.pack("<BBhi", 0x95, 0, 0, 0)


def _bpf(cmd: int, attr: bytes) -> int:
    """Raw bpf(2) on an attr given as bytes; returns the result (an fd for loads/links) or raises OSError."""
    from .datapath.objects import bpf
    return bpf(cmd, ctypes.create_string_buffer(attr, len(attr)))


def load_trivial_sched_cls() -> int:
    """Load ``r0 = 0; exit`` as BPF_PROG_TYPE_SCHED_CLS and return its fd (caller closes)."""
    insns = ctypes.create_string_buffer(_TRIVIAL_PROG, len(_TRIVIAL_PROG))
    lic = ctypes.create_string_buffer(b"GPL")
    attr = struct.pack("<IIQQIIQII16sII", BPF_PROG_TYPE_SCHED_CLS, len(_TRIVIAL_PROG) // 8,
                       ctypes.addressof(insns), ctypes.addressof(lic), 0, 0, 0, 0, 0, b"ftb_doctor", 0, 0)
    return _bpf(_BPF_PROG_LOAD, attr)


def tcx_attach(prog_fd: int, ifindex: int, attach_type: int = BPF_TCX_INGRESS) -> int:
    """BPF_LINK_CREATE of a tcx link; the calling thread's namespace resolves ``ifindex``. Returns link fd."""
    attr = struct.pack("<IIIIIIQ", prog_fd, ifindex, attach_type, 0, 0, 0, 0)
    return _bpf(_BPF_LINK_CREATE, attr)


# ---------------------------------------------------------------------------------------------------------
# qdisc parameters valid on a full kernel (a present qdisc must be created, not rejected for its options)

def _register_red_plugin() -> None:
    """pyroute2 0.9 has no encoder for red's options; register a minimal one (tc_red_qopt + stab)."""
    from pyroute2.netlink import nla
    from pyroute2.netlink.rtnl import TC_H_ROOT
    from pyroute2.netlink.rtnl.tcmsg import common as _common
    from pyroute2.netlink.rtnl.tcmsg import plugins

    if "red" in plugins:
        return

    class _Red:
        parent = TC_H_ROOT

        @staticmethod
        def fix_request(request):
            pass

        @staticmethod
        def get_parameters(kwarg):
            parms = {"limit": kwarg.get("limit", 400_000), "qth_min": kwarg.get("min", 30_000),
                     "qth_max": kwarg.get("max", 90_000), "Wlog": kwarg.get("wlog", 9),
                     "Plog": kwarg.get("plog", 20), "Scell_log": kwarg.get("scell_log", 10),
                     "flags": kwarg.get("flags", 0)}
            return {"attrs": [["TCA_RED_PARMS", parms], ["TCA_RED_STAB", {"value": bytes(256)}]]}

        class options(nla):
            nla_map = (("TCA_RED_UNSPEC", "none"), ("TCA_RED_PARMS", "parms"), ("TCA_RED_STAB", "stab"),
                       ("TCA_RED_MAX_P", "uint32"))

            class parms(nla):
                fields = (("limit", "I"), ("qth_min", "I"), ("qth_max", "I"), ("Wlog", "B"), ("Plog", "B"),
                          ("Scell_log", "B"), ("flags", "B"))

            class stab(nla):
                fields = (("value", "256s"),)

        class stats(nla.hex):
            pass

        stats2 = _common.stats2

    plugins["red"] = _Red


QDISC_PARAMS: dict[str, dict] = {
    "htb": {"default": 0x10},
    "tbf": {"rate": "100mbit", "burst": 32_000, "latency": 50_000},
    "pfifo": {"limit": 100},
    "bfifo": {"limit": 100_000},
    "netem": {"delay": 1000},
    "red": {},
    "fq": {},
    "fq_codel": {},
    "prio": {"bands": 3, "priomap": [1, 2, 2, 2, 1, 2, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]},
}


def try_qdisc(ipr, index: int, kind: str) -> tuple[bool, str]:
    """Create ``kind`` as root qdisc on ``index``, check it is there, delete it. (ok, detail)."""
    from pyroute2.netlink.exceptions import NetlinkError

    if kind == "red":
        _register_red_plugin()
    try:
        ipr.tc("add", kind, index, 0x10000, **QDISC_PARAMS[kind])
    except NetlinkError as e:
        name = errno.errorcode.get(e.code, str(e.code))
        if e.code in (errno.ENOENT, errno.EOPNOTSUPP):
            return False, f"kernel has no sch_{kind} (create failed: {name}, qdisc kind unknown)"
        return False, f"create failed: {name} {e}"
    found = [q for q in ipr.tc("dump", index=index) if q.get_attr("TCA_KIND") == kind and q["index"] == index]
    try:
        ipr.tc("del", index=index, handle=0x10000, parent=0xFFFFFFFF)   # no kind: no options re-encoded
    except NetlinkError as e:
        return bool(found), f"created, but deleting it again failed: {e}"
    if not found:
        return False, "create was acknowledged but the qdisc is not in the dump"
    return True, "created as root qdisc on a veth"


# ---------------------------------------------------------------------------------------------------------
# individual probes

def _cap(name: str, ok: bool, detail: str) -> Capability:
    return Capability(name, bool(ok), detail, _SPEC[name][1])


def _probe_root() -> Capability:
    euid = os.geteuid()
    caps = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    caps = int(line.split()[1], 16)
    except OSError:
        pass
    need = {"NET_ADMIN": 12, "SYS_ADMIN": 21}
    lacking = [n for n, bit in need.items() if not caps & (1 << bit)]
    if euid != 0:
        return _cap("root", False, f"running as uid {euid}, not root")
    if lacking:
        return _cap("root", False, "root but without CAP_" + ", CAP_".join(lacking))
    return _cap("root", True, "euid 0 with CAP_NET_ADMIN and CAP_SYS_ADMIN")


def _probe_btf() -> Capability:
    p = "/sys/kernel/btf/vmlinux"
    try:
        with open(p, "rb") as f:
            magic = f.read(2)
        size = os.path.getsize(p)
    except OSError as e:
        return _cap("btf", False, f"{p}: {e.strerror}")
    if magic != b"\x9f\xeb":
        return _cap("btf", False, f"{p} exists but has no BTF magic")
    return _cap("btf", True, f"{p} ({size / 1e6:.1f} MB)")


def _probe_bpffs() -> Capability:
    try:
        with open("/proc/filesystems") as f:
            supported = any(line.split()[-1] == "bpf" for line in f if line.strip())
    except OSError:
        supported = False
    mounts = []
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1] for line in f if line.split()[2] == "bpf"]
    except OSError:
        pass
    if mounts:
        return _cap("bpffs", True, "mounted at " + ", ".join(mounts))
    if supported:
        return _cap("bpffs", False, "kernel supports bpffs but it is not mounted (mount -t bpf bpf /sys/fs/bpf)")
    return _cap("bpffs", False, "kernel has no bpf filesystem")


def _probe_rdma_rxe() -> Capability:
    rel = platform.release()
    rdma_tool = shutil.which("rdma")
    loaded = os.path.isdir("/sys/module/rdma_rxe")
    builtin = False
    try:
        with open(f"/lib/modules/{rel}/modules.builtin") as f:
            builtin = any(line.strip().endswith("/rdma_rxe.ko") for line in f)
    except OSError:
        pass
    module_files = glob.glob(f"/lib/modules/{rel}/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko*")
    has_modules = os.path.exists("/proc/modules")
    how = ""
    if not loaded and not builtin and module_files and has_modules and shutil.which("modprobe"):
        # What `rdma link add ... type rxe` would do anyway (request_module); then look again.
        try:
            subprocess.run(["modprobe", "-q", "rdma_rxe"], timeout=5, capture_output=True)
        except (OSError, subprocess.SubprocessError):
            pass
        loaded = os.path.isdir("/sys/module/rdma_rxe")
        how = " (loaded by doctor with modprobe)" if loaded else ""
    if loaded or builtin:
        state = ("module loaded" if loaded else "built into the kernel") + how
        if not rdma_tool:
            return _cap("rdma_rxe", False, f"{state}, but the `rdma` tool (iproute2) is missing")
        return _cap("rdma_rxe", True, f"{state}; `rdma` at {rdma_tool} (rxe works in the initial namespace)")
    reasons = ["/sys/module/rdma_rxe absent"]
    if not has_modules:
        reasons.append("kernel has no loadable-module support (/proc/modules absent)")
    elif module_files:
        reasons.append(f"{module_files[0]} exists but modprobe did not load it")
    else:
        reasons.append(f"no rdma_rxe.ko under /lib/modules/{rel}")
    if not builtin:
        reasons.append("not in modules.builtin")
    if not os.path.isdir("/sys/class/infiniband"):
        reasons.append("no RDMA subsystem (/sys/class/infiniband absent)")
    reasons.append(f"`rdma` tool {'present' if rdma_tool else 'absent'}")
    return _cap("rdma_rxe", False, "; ".join(reasons))


def _probe_tool(name: str, exe: str) -> Capability:
    p = shutil.which(exe)
    return _cap(name, bool(p), p if p else f"{exe} not found on PATH")


def _probe_module(name: str, module: str) -> Capability:
    """A Python package importable here (found without importing it: Ray takes a second to import)."""
    import importlib.metadata as md
    import importlib.util
    if importlib.util.find_spec(module) is None:
        return _cap(name, False, f"Python module {module} not installed")
    try:
        return _cap(name, True, f"{module} {md.version(module)}")
    except md.PackageNotFoundError:
        return _cap(name, True, f"{module} (version unknown)")


def _probe_bcc() -> Capability:
    try:
        from testbed.datapath.kheaders import compile_probe  # type: ignore[import-not-found]
    except ImportError:
        return _cap("bcc", False, "not checked: datapath not installed")
    try:
        ok, detail = compile_probe()
    except Exception as e:  # noqa: BLE001 — reported, never raised
        ok, detail = False, f"compile_probe raised {e!r}"
    return _cap("bcc", bool(ok), str(detail))


def _netns_probes(prog_fd: int | None, prog_err: str) -> list[Capability]:
    """Runs in a thread inside the scratch namespace: plain IPRoute() talks to that namespace."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    out: list[Capability] = []

    def err(e: BaseException) -> str:
        if isinstance(e, NetlinkError):
            return f"{errno.errorcode.get(e.code, e.code)} {e}"
        if isinstance(e, OSError) and e.errno:
            return f"{errno.errorcode.get(e.errno, e.errno)} {e.strerror}"
        return repr(e)

    with IPRoute() as ipr:
        # veth (everything else in here needs it)
        try:
            ipr.link("add", ifname="d0", kind="veth", peer="d1")
            d0 = ipr.link_lookup(ifname="d0")[0]
            d1 = ipr.link_lookup(ifname="d1")[0]
            ipr.link("set", index=d0, state="up")
            ipr.link("set", index=d1, state="up")
            out.append(_cap("veth", True, "created a veth pair"))
        except Exception as e:  # noqa: BLE001
            out.append(_cap("veth", False, f"creating a veth pair failed: {err(e)}"))
            for n in ("clsact", "cls_bpf", "tcx", *QDISC_KINDS, "multipath"):
                out.append(_cap(n, False, "not checked: no veth"))
            d0 = None
        if d0 is not None:
            # clsact + cls_bpf
            clsact_ok = False
            try:
                ipr.tc("add", "clsact", d0)
                clsact_ok = True
                out.append(_cap("clsact", True, "added on a veth"))
            except Exception as e:  # noqa: BLE001
                out.append(_cap("clsact", False, f"add failed: {err(e)}"))
            if not clsact_ok:
                out.append(_cap("cls_bpf", False, "not checked: no clsact"))
            elif prog_fd is None:
                out.append(_cap("cls_bpf", False, f"not checked: no BPF program ({prog_err})"))
            else:
                try:
                    ipr.tc("add-filter", "bpf", d0, ":1", fd=prog_fd, name="ftb_doctor",
                           parent=0xFFFFFFF2, classid=1, direct_action=True)
                    n = len(ipr.get_filters(index=d0, parent=0xFFFFFFF2))
                    if n:
                        out.append(_cap("cls_bpf", True, "direct-action filter attached on clsact ingress"))
                    else:
                        out.append(_cap("cls_bpf", False, "filter add acknowledged but not in the dump"))
                except Exception as e:  # noqa: BLE001
                    out.append(_cap("cls_bpf", False, f"filter attach failed: {err(e)}"))
            # tcx
            if prog_fd is None:
                out.append(_cap("tcx", False, f"not checked: no BPF program ({prog_err})"))
            else:
                try:
                    lfd = tcx_attach(prog_fd, d1)
                    os.close(lfd)
                    out.append(_cap("tcx", True, "BPF_LINK_CREATE(BPF_TCX_INGRESS) attached and released"))
                except OSError as e:
                    hint = " (kernel older than 6.6 or without tcx)" if e.errno == errno.EINVAL else ""
                    out.append(_cap("tcx", False, f"BPF_LINK_CREATE(BPF_TCX_INGRESS) failed: {err(e)}{hint}"))
            # qdiscs (on the peer, which has no clsact)
            for kind in QDISC_KINDS:
                try:
                    ok, detail = try_qdisc(ipr, d1, kind)
                except Exception as e:  # noqa: BLE001
                    ok, detail = False, f"probe error: {err(e)}"
                out.append(_cap(kind, ok, detail))
            # IPv4 multipath
            try:
                ipr.addr("add", index=d0, address="10.254.0.1", prefixlen=24)
                ipr.route("add", dst="10.253.0.0/24",
                          multipath=[{"gateway": "10.254.0.2", "oif": d0}, {"gateway": "10.254.0.3", "oif": d0}])
                hops = 0
                for r in ipr.get_routes(family=2):
                    if r.get_attr("RTA_DST") == "10.253.0.0":
                        hops = len(r.get_attr("RTA_MULTIPATH") or [])
                if hops == 2:
                    out.append(_cap("multipath", True, "route with 2 next hops installed"))
                else:
                    out.append(_cap("multipath", False, f"route installed but shows {hops} next hops"))
            except Exception as e:  # noqa: BLE001
                out.append(_cap("multipath", False, f"adding a 2-hop route failed: {err(e)}"))
        # vxlan
        try:
            ipr.link("add", ifname="dvx0", kind="vxlan", vxlan_id=4242, vxlan_port=4789)
            vx = ipr.link_lookup(ifname="dvx0")[0]
            ipr.link("set", index=vx, state="up")
            out.append(_cap("vxlan", True, "created and brought up a VXLAN device (VNI 4242, UDP 4789)"))
        except Exception as e:  # noqa: BLE001
            out.append(_cap("vxlan", False, f"creating a VXLAN device failed: {err(e)}"))
    return out


_NS_NAMES = ("veth", "clsact", "cls_bpf", "tcx", *QDISC_KINDS, "multipath", "vxlan")


def _scratch_namespace_probes(prog_fd: int | None, prog_err: str) -> list[Capability]:
    from testbed.fabric import netns

    name = f"{NETNS_PREFIX}{os.getpid()}"
    made = False
    try:
        netns.delete([name])                     # a leftover of a crashed run with a reused pid
        netns.create([name], threads=1)
        made = True
        return netns.run_in(name, _netns_probes, prog_fd, prog_err)
    except Exception as e:  # noqa: BLE001
        why = f"scratch namespace {'probe' if made else 'creation'} failed: {e!r}"
        return [_cap(n, False, f"not checked: {why}") for n in _NS_NAMES]
    finally:
        netns.delete([name])


# ---------------------------------------------------------------------------------------------------------
# public API

_PROBE_LOCK = threading.Lock()       # one scratch namespace name per process: serialise probes


def probe(with_bcc: bool = True, with_docker: bool = True) -> list[Capability]:
    """Probe everything; never raises for a missing feature. Order is stable (see ``_SPEC``). ``with_docker``:
    also ask the Docker daemon (nothing is installed or started for it)."""
    with _PROBE_LOCK:
        return _probe(with_bcc, with_docker)


def _probe_docker() -> list[Capability]:
    from .container.daemon import status
    (sdk_ok, sdk_detail), (daemon_ok, daemon_detail) = status()
    return [_cap("docker-sdk", sdk_ok, sdk_detail), _cap("docker", daemon_ok, daemon_detail)]


def _probe(with_bcc: bool, with_docker: bool) -> list[Capability]:
    found: dict[str, Capability] = {}

    def run(names: Iterable[str], fn: Callable[[], Capability | list[Capability]]) -> None:
        try:
            r = fn()
        except Exception as e:  # noqa: BLE001 — a probe bug must not hide the others
            r = [_cap(n, False, f"probe error: {e!r}") for n in names]
        for c in (r if isinstance(r, list) else [r]):
            found[c.name] = c

    run(["root"], _probe_root)
    prog_fd, prog_err = None, ""
    try:
        prog_fd = load_trivial_sched_cls()
        found["bpf"] = _cap("bpf", True, "bpf(BPF_PROG_LOAD) of a 2-instruction SCHED_CLS program")
    except OSError as e:
        prog_err = f"BPF_PROG_LOAD failed: {errno.errorcode.get(e.errno, e.errno)} {e.strerror}"
        found["bpf"] = _cap("bpf", False, prog_err)
    run(["btf"], _probe_btf)
    run(["bpffs"], _probe_bpffs)
    try:
        if found["root"].ok:
            run(_NS_NAMES, lambda: _scratch_namespace_probes(prog_fd, prog_err))
        else:
            for n in _NS_NAMES:
                found[n] = _cap(n, False, "not checked: needs root")
    finally:
        if prog_fd is not None:
            os.close(prog_fd)
    run(["rdma_rxe"], _probe_rdma_rxe)
    if with_bcc:
        run(["bcc"], _probe_bcc)
    else:
        found["bcc"] = _cap("bcc", False, "not checked: skipped (with_bcc=False)")
    run(["tshark"], lambda: _probe_tool("tshark", "tshark"))
    run(["tcpdump"], lambda: _probe_tool("tcpdump", "tcpdump"))
    run(["perftest"], lambda: _probe_tool("perftest", "ib_write_bw"))
    run(["iperf3"], lambda: _probe_tool("iperf3", "iperf3"))
    run(["openmpi"], lambda: _probe_tool("openmpi", "mpirun"))
    run(["mpi4py"], lambda: _probe_module("mpi4py", "mpi4py"))
    if with_docker:
        run(["docker-sdk", "docker"], _probe_docker)
    run(["ray"], lambda: _probe_module("ray", "ray"))
    run(["pymetis"], lambda: _probe_module("pymetis", "pymetis"))
    return [found[n] for n in _SPEC if n in found]


def as_dict(caps: list[Capability]) -> dict:
    """For run manifests: kernel, the names of what is missing, and every capability."""
    return {
        "kernel": kernel_release(),
        "machine": platform.machine(),
        "missing": [c.name for c in caps if not c.ok],
        "capabilities": {c.name: {k: v for k, v in asdict(c).items() if k != "name"} for c in caps},
    }


def render(caps: list[Capability]):
    """A rich Table: capability, status, what it is needed for, detail."""
    from rich.table import Table

    t = Table(title=f"testbed doctor — kernel {kernel_release()}", title_justify="left")
    t.add_column("capability", style="bold")
    t.add_column("status")
    t.add_column("needed for")
    t.add_column("detail", overflow="fold")
    for c in caps:
        if c.ok:
            status = "[green]present[/green]"
        elif c.detail.startswith("not checked"):
            status = "[yellow]not checked[/yellow]"
        else:
            status = "[red]absent[/red]"
        t.add_row(c.name, status, c.needed_for, c.detail)
    return t


def _message(c: Capability) -> str:
    label, needed_for, remedy = _SPEC.get(c.name, (c.name, c.needed_for, "vm"))
    needed_for = c.needed_for or needed_for
    if remedy == "vm":
        remedy = "run in the VM (see README)"
    elif remedy == "setup":
        remedy = "run scripts/setup.sh"
    if c.detail.startswith("not checked"):
        why = c.detail.split(":", 1)[1].strip() if ":" in c.detail else c.detail
        return f"{label} could not be checked ({why}): {needed_for} needs it"
    if c.name == "root":
        return f"{needed_for} needs {label} ({c.detail}); {remedy}"
    if _SPEC.get(c.name, ("", "", "vm"))[2] == "vm":
        return f"{label} is not available on this kernel ({kernel_release()}): {needed_for} needs it; {remedy}"
    return f"{label} is not available ({c.detail}): {needed_for} needs it; {remedy}"


def require(caps: list[Capability], names: Iterable[str] | str) -> None:
    """Raise ``MissingFeature`` (one readable line) unless every named capability is present."""
    if isinstance(names, str):
        names = [names]
    by_name = {c.name: c for c in caps}
    missing = []
    for n in names:
        if n not in by_name:
            raise ValueError(f"unknown capability {n!r}; known: {', '.join(by_name)}")
        if not by_name[n].ok:
            missing.append(by_name[n])
    if missing:
        raise MissingFeature("; ".join(_message(c) for c in missing), missing)


__all__ = ["Capability", "MissingFeature", "QDISC_KINDS", "as_dict", "kernel_release", "load_trivial_sched_cls",
           "probe", "render", "require", "tcx_attach", "try_qdisc"]
