"""Full-kernel lane: a cached Debian image booted under QEMU, to run what this host's kernel cannot.

The development/CI kernel has no modules (no rdma_rxe, netem, red, fq). Distribution kernels have them, so the
lane boots Debian bookworm's own kernel (6.1) in a throw-away QEMU guest:

``build()``
    ``debootstrap --variant=minbase bookworm`` + linux-image-amd64 into a scratch folder, then **the same
    provisioning script as Vagrant** (``vagrant/provision.sh``, which runs ``scripts/setup.sh``) in a chroot of
    it, with the project copied to ``/opt/fabric-testbed/src`` and the venv at ``/opt/fabric-testbed/venv``.
    The tree becomes an ext4 image with ``mke2fs -d``; kernel and initrd are copied next to it. The image is
    booted once (``testbed doctor`` inside, which also measures the boot) and only then renamed into
    ``/var/cache/fabric-testbed/vm/<key>/`` — atomic: an image in the cache is complete and has booted. The key
    hashes the provisioning inputs (provision.sh, setup.sh, pyproject.toml) and this module's recipe, so editing
    any of them makes the next ``build`` produce a new image; ``run`` refuses a stale one with a clear message.
``run(cmd)``
    ``qemu-system-x86_64`` with direct kernel boot (``-kernel``/``-initrd`` from the cache), root on virtio
    (``-snapshot``: the image is never written), ``-nographic`` with the serial console on stdout. Two 9p shares:
    the project (mounted at ``/opt/fabric-testbed/src`` and bind-mounted at the host's own path, which is the
    working directory, so paths in output and results/ match the host) and a per-run control folder. The
    image's init mounts them and runs CMD as root; its output is streamed; the guest powers off; the exit code
    is CMD's. KVM is tried when /dev/kvm is usable and remembered per host kernel + QEMU; if the guest does not
    reach userspace under KVM (this host's PVM hypervisor cannot run stock Debian kernels: "failed to set MSR
    0x10a", or a hang after SeaBIOS) it falls back to TCG by itself. ``FTB_VM_ACCEL=kvm|tcg`` forces one.
``test()``
    ``run`` of ``pytest -m fullkernel`` (the tests that need a distribution kernel).

Errors a user can cause raise ``VMError`` with one readable line. Nothing is left behind: the scratch build
folder and chroot mounts are removed on every exit path, and QEMU is killed on timeout or interrupt.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .errors import TestbedError

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("FTB_VM_CACHE", "/var/cache/fabric-testbed/vm"))
SUITE = "bookworm"
MIRROR = os.environ.get("FTB_VM_MIRROR", "http://deb.debian.org/debian")
GUEST_SRC = "/opt/fabric-testbed/src"
GUEST_VENV = "/opt/fabric-testbed/venv"
GUEST_INIT = "/opt/fabric-testbed/vm-init"
# What debootstrap installs; everything else comes from vagrant/provision.sh (shared with Vagrant).
BASE_PACKAGES = ["linux-image-amd64", "initramfs-tools", "kmod", "iproute2", "python3", "util-linux",
                 "procps", "ca-certificates"]
RECIPE_VERSION = 1                       # bump when build() changes in a way that must invalidate images
START, EXIT = "FTB-VM-START", "FTB-VM-EXIT="

Log = Callable[[str], None]


class VMError(TestbedError):
    """A problem phrased for the user (one line)."""


def _log(msg: str) -> None:
    print(f"vm: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ the guest init

INIT = r"""#!/bin/sh
# fabric-testbed VM init (PID 1): mount, run the host's per-run script from the control share, power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
hostname ftb-vm
ip link set lo up
O=trans=virtio,version=9p2000.L,msize=262144
mkdir -p /ftbctl
mount -t 9p -o $O ftbctl /ftbctl && mount -t 9p -o $O,cache=loose project __SRC__
if [ -r /ftbctl/run.sh ]; then
    /bin/sh /ftbctl/run.sh
else
    echo "ftb-vm: no control share (run the image with testbed vm run)"
fi
sync
echo o > /proc/sysrq-trigger
sleep 30
""".replace("__SRC__", GUEST_SRC)


# ------------------------------------------------------------------------------------------------ cache and key

def image_key() -> str:
    """Hash of what the image is made from: the provisioning script and its inputs, plus this recipe."""
    h = hashlib.sha256()
    for rel in ("vagrant/provision.sh", "scripts/setup.sh", "scripts/lib.sh", "pyproject.toml"):
        p = ROOT / rel
        h.update(rel.encode() + b"\0" + (p.read_bytes() if p.exists() else b"") + b"\0")
    h.update(json.dumps([RECIPE_VERSION, SUITE, BASE_PACKAGES, INIT]).encode())
    return h.hexdigest()[:16]


@dataclass
class Image:
    dir: Path

    @property
    def disk(self) -> Path:
        return self.dir / "rootfs.img"

    @property
    def kernel(self) -> Path:
        return self.dir / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.dir / "initrd.img"

    @property
    def meta(self) -> dict:
        try:
            return json.loads((self.dir / "meta.json").read_text())
        except (OSError, ValueError):
            return {}

    def complete(self) -> bool:
        return all(p.is_file() for p in (self.disk, self.kernel, self.initrd, self.dir / "meta.json"))


def cached_image(key: Optional[str] = None) -> Optional[Image]:
    img = Image(CACHE / (key or image_key()))
    return img if img.complete() else None


def _require_image() -> Image:
    img = cached_image()
    if img:
        return img
    others = sorted(p.name for p in CACHE.glob("*") if p.is_dir() and not p.name.startswith("."))
    why = (f"the cached image(s) {', '.join(others)} were built from other provisioning inputs"
           if others else f"no image in {CACHE}")
    raise VMError(f"no VM image for the current provisioning (key {image_key()}): {why}; "
                  f"build it with `testbed vm build`")


# ------------------------------------------------------------------------------------------------ host tools

TOOLS = {"debootstrap": "debootstrap", "mke2fs": "e2fsprogs", "qemu-system-x86_64": "qemu-system-x86"}


def _tools(names) -> None:
    missing = [n for n in names if not shutil.which(n)]
    if not missing:
        return
    pkgs = sorted({TOOLS[n] for n in missing})
    script = ROOT / "scripts" / "vm-setup.sh"
    if os.geteuid() == 0 and script.exists() and os.environ.get("FTB_VM_NO_APT") != "1":
        _log(f"{', '.join(missing)} missing: installing {' '.join(pkgs)} with scripts/vm-setup.sh")
        subprocess.run(["bash", str(script)], check=False, stdin=subprocess.DEVNULL)
        missing = [n for n in names if not shutil.which(n)]
    if missing:
        raise VMError(f"{', '.join(missing)} not found: install {' '.join(pkgs)} "
                      f"(bash scripts/vm-setup.sh, or apt-get install {' '.join(pkgs)})")


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise VMError(f"testbed vm {what} needs root (debootstrap, chroot, mounts): run it with sudo")


# ------------------------------------------------------------------------------------------------ build

def _sh(args: list[str], log_file, what: str, env: Optional[dict] = None, timeout: float = 3600) -> None:
    log_file.write(f"\n$ {shlex.join(args)}\n".encode())
    log_file.flush()
    try:
        r = subprocess.run(args, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise VMError(f"{what} timed out after {timeout:.0f} s (log: {log_file.name})") from None
    if r.returncode:
        tail = Path(log_file.name).read_text(errors="replace").strip().splitlines()[-6:]
        raise VMError(f"{what} failed (exit {r.returncode}; log: {log_file.name}): " + " | ".join(tail))


def _copy_project(dst: Path) -> None:
    skip = {".git", ".venv", "results", "__pycache__", ".pytest_cache", "build", "vm"}

    def ignore(d, names):
        return [n for n in names if n in skip or n.endswith((".pyc", ".egg-info"))]
    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)
    (dst / "results").mkdir(exist_ok=True)


class _Mounts:
    def __init__(self, root: Path):
        self.root, self.done = root, []

    def bind(self, src: str, rel: str, fstype: Optional[str] = None) -> None:
        tgt = self.root / rel.lstrip("/")
        tgt.mkdir(parents=True, exist_ok=True)
        args = ["mount", "-t", fstype, fstype, str(tgt)] if fstype else ["mount", "--bind", src, str(tgt)]
        subprocess.run(args, check=True)
        self.done.append(tgt)

    def close(self) -> None:
        for tgt in reversed(self.done):
            subprocess.run(["umount", "-l", str(tgt)], check=False)
        self.done.clear()


_HOST_CA = "/tmp/ftb-host-ca.crt"
_PIP_FILES = ("etc/pip.conf", "etc/xdg/pip")


def _host_network_config(rootfs: Path, mounts: "_Mounts") -> dict[str, str]:
    """Let the chroot's apt/pip reach the network the way the host does: proxy variables, the host's CA bundle
    (a TLS-intercepting proxy's CA) and pip configuration. Removed from the image after provisioning."""
    env = {k: v for k, v in os.environ.items()
           if k.lower() in ("http_proxy", "https_proxy", "no_proxy") or k.startswith("PIP_")}
    for k in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        ca = os.environ.get(k)
        if ca and os.path.isfile(ca):
            shutil.copy(ca, rootfs / _HOST_CA.lstrip("/"))
            env.update(PIP_CERT=_HOST_CA, SSL_CERT_FILE=_HOST_CA, REQUESTS_CA_BUNDLE=_HOST_CA)
            break
    env.pop("SSL_CERT_DIR", None)
    links = os.environ.get("PIP_FIND_LINKS", "")
    if links and os.path.isdir(links):
        mounts.bind(links, links)
    for rel in _PIP_FILES:
        src = Path("/") / rel
        if src.is_file():
            shutil.copy(src, rootfs / rel)
        elif src.is_dir():
            shutil.copytree(src, rootfs / rel, dirs_exist_ok=True)
    return env


def _drop_host_network_config(rootfs: Path) -> None:
    for rel in (_HOST_CA.lstrip("/"), *_PIP_FILES):
        p = rootfs / rel
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists():
            p.unlink()


def build(force: bool = False, log: Log = _log, boot_check: bool = True) -> Image:
    """Build (or reuse) the image for the current provisioning inputs. Returns the cached Image."""
    key = image_key()
    img = cached_image(key)
    if img and not force:
        log(f"image {key} is cached ({img.dir}); `testbed vm build --force` rebuilds it")
        return img
    _need_root("build")
    _tools(["debootstrap", "mke2fs", "qemu-system-x86_64"])
    CACHE.mkdir(parents=True, exist_ok=True)
    work = CACHE / f".build-{key}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    rootfs = work / "rootfs"
    logpath = CACHE / f"build-{key}.log"
    times: dict[str, float] = {}
    mounts = _Mounts(rootfs)
    t0 = time.monotonic()
    try:
        with open(logpath, "wb") as lf:
            log(f"building image {key} (log: {logpath})")
            debs = CACHE / "debs"
            debs.mkdir(exist_ok=True)
            t = time.monotonic()
            log(f"debootstrap --variant=minbase {SUITE} + {', '.join(BASE_PACKAGES)} …")
            _sh(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                 f"--cache-dir={debs}", SUITE, str(rootfs), MIRROR], lf, "debootstrap")
            times["debootstrap_s"] = time.monotonic() - t

            t = time.monotonic()
            log("provisioning with vagrant/provision.sh in a chroot …")
            (rootfs / "etc/apt/sources.list").write_text(
                f"deb {MIRROR} {SUITE} main\ndeb {MIRROR} {SUITE}-updates main\n"
                f"deb http://security.debian.org/debian-security {SUITE}-security main\n")
            shutil.copy("/etc/resolv.conf", rootfs / "etc/resolv.conf")
            (rootfs / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\nexit 101\n")
            (rootfs / "usr/sbin/policy-rc.d").chmod(0o755)
            _copy_project(rootfs / GUEST_SRC.lstrip("/"))
            apt_cache = CACHE / "apt-archives"
            (apt_cache / "partial").mkdir(parents=True, exist_ok=True)
            mounts.bind("", "/proc", "proc")
            mounts.bind("", "/sys", "sysfs")
            mounts.bind("/dev", "/dev")
            mounts.bind("/dev/pts", "/dev/pts")
            mounts.bind(str(apt_cache), "/var/cache/apt/archives")
            env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
                   "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive", "FTB_PROVISION_CHROOT": "1",
                   "FTB_VENV": GUEST_VENV, "PIP_NO_CACHE_DIR": "1"}
            env.update(_host_network_config(rootfs, mounts))
            _sh(["chroot", str(rootfs), "bash", f"{GUEST_SRC}/vagrant/provision.sh"], lf,
                "provisioning (vagrant/provision.sh in the image chroot)", env=env)
            _sh(["chroot", str(rootfs), "apt-get", "clean"], lf, "apt-get clean", env=env)
            mounts.close()
            _drop_host_network_config(rootfs)
            (rootfs / "usr/sbin/policy-rc.d").unlink()
            times["provision_s"] = time.monotonic() - t

            t = time.monotonic()
            init = rootfs / GUEST_INIT.lstrip("/")
            init.write_text(INIT)
            init.chmod(0o755)
            (rootfs / "etc/hostname").write_text("ftb-vm\n")
            (rootfs / "etc/fstab").write_text("/dev/vda / ext4 rw,relatime 0 1\n")
            kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
            initrds = sorted((rootfs / "boot").glob("initrd.img-*"))
            if not kernels or not initrds:
                raise VMError("the image has no kernel or initrd in /boot (linux-image-amd64 did not install)")
            shutil.copy(kernels[-1], work / "vmlinuz")
            shutil.copy(initrds[-1], work / "initrd.img")
            kver = kernels[-1].name.removeprefix("vmlinuz-")
            used = int(subprocess.run(["du", "-sxb", str(rootfs)], capture_output=True, text=True,
                                      check=True).stdout.split()[0])
            size_mb = int(used * 1.25 / 2**20) + 1024
            _sh(["mke2fs", "-q", "-F", "-t", "ext4", "-L", "ftbroot", "-E", "root_owner=0:0", "-d", str(rootfs),
                 str(work / "rootfs.img"), f"{size_mb}M"], lf, "mke2fs")
            shutil.rmtree(rootfs)
            times["image_s"] = time.monotonic() - t
            meta = {"key": key, "suite": SUITE, "kernel": kver, "size_mb": size_mb, "used_mb": used // 2**20,
                    "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "project": str(ROOT), **times}
            (work / "meta.json").write_text(json.dumps(meta, indent=2))

        img = Image(work)
        if boot_check:
            log("boot check: `testbed doctor` in the guest …")
            t = time.monotonic()
            res = run(["testbed", "doctor"], image=img, log=log, timeout=900)
            times["boot_check_s"] = time.monotonic() - t
            if res.returncode != 0:
                raise VMError(f"the new image booted but `testbed doctor` failed in it (exit {res.returncode})")
            meta.update(times, boot_s=res.boot_s, accel=res.accel)
            (work / "meta.json").write_text(json.dumps(meta, indent=2))
        final = CACHE / key
        if final.exists():
            shutil.rmtree(final)
        os.rename(work, final)
        _prune(keep=key)
        total = time.monotonic() - t0
        log(f"image {key} ready in {total:.0f} s: " + ", ".join(f"{k} {v:.0f}" for k, v in times.items())
            + f" (kernel {kver}, {size_mb} MB)")
        return Image(final)
    finally:
        mounts.close()
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def _prune(keep: str, max_images: int = 2) -> None:
    """Keep the newest ``max_images`` images (the current one always)."""
    imgs = sorted((p for p in CACHE.glob("*") if p.is_dir() and not p.name.startswith(".") and
                   p.name not in ("debs", "apt-archives")), key=lambda p: p.stat().st_mtime, reverse=True)
    kept = 1
    for p in imgs:
        if p.name == keep:
            continue
        if kept < max_images:
            kept += 1
            continue
        shutil.rmtree(p, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ run

@dataclass
class RunResult:
    returncode: int
    accel: str
    boot_s: float          # qemu start → guest userspace (the START marker)
    total_s: float
    output: str            # CMD's output (the console after START), also streamed


def _accel_cache() -> Path:
    return CACHE / "accel.json"


def _accel_order() -> list[str]:
    forced = os.environ.get("FTB_VM_ACCEL")
    if forced in ("kvm", "tcg"):
        return [forced]
    kvm_ok = os.access("/dev/kvm", os.R_OK | os.W_OK)
    if not kvm_ok:
        return ["tcg"]
    try:
        known = json.loads(_accel_cache().read_text())
        if known.get("host") == _host_id():
            return ["kvm", "tcg"] if known.get("kvm") else ["tcg"]
    except (OSError, ValueError):
        pass
    return ["kvm", "tcg"]


def _host_id() -> str:
    try:
        q = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True).stdout
    except OSError:
        q = ""
    return f"{platform.release()} {q.splitlines()[0] if q else ''}"


def _remember_accel(kvm: bool) -> None:
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        _accel_cache().write_text(json.dumps({"host": _host_id(), "kvm": kvm}))
    except OSError:
        pass


def _qemu_args(img: Image, ctl: Path, accel: str, mem_mb: int, cpus: int, share: Path) -> list[str]:
    cpu = ["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else ["-accel", "tcg,thread=multi", "-cpu", "max"]
    append = ("console=ttyS0 root=/dev/vda rootfstype=ext4 rw quiet loglevel=3 panic=-1 "
              f"init={GUEST_INIT} net.ifnames=0 mitigations=off")
    return ["qemu-system-x86_64", "-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-snapshot",
            *cpu, "-m", str(mem_mb), "-smp", str(cpus), "-serial", "stdio",
            "-kernel", str(img.kernel), "-initrd", str(img.initrd), "-append", append,
            "-drive", f"file={img.disk},format=raw,if=virtio,cache=unsafe",
            "-virtfs", f"local,path={share},mount_tag=project,security_model=none,id=project",
            "-virtfs", f"local,path={ctl},mount_tag=ftbctl,security_model=none,id=ftbctl",
            "-device", "virtio-rng-pci"]


def _run_script(cmd: list[str], workdir: str, env: dict[str, str]) -> str:
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    return f"""set +e
mkdir -p {shlex.quote(workdir)}
[ {shlex.quote(workdir)} = {GUEST_SRC} ] || mount --bind {GUEST_SRC} {shlex.quote(workdir)}
cd {shlex.quote(workdir)}
export HOME=/root TERM=dumb LANG=C.UTF-8 FTB_IN_VM=1 PYTHONDONTWRITEBYTECODE=1
export PATH={GUEST_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PYTHONPATH={shlex.quote(workdir)}
{exports}for m in rdma_rxe sch_netem sch_red sch_fq sch_prio; do modprobe $m 2>/dev/null; done
echo {START} "$(uname -r)"
{shlex.join(cmd)} </dev/null 2>&1
rc=$?
echo $rc > /ftbctl/exit
sync
echo {EXIT}$rc
"""


def run(cmd: list[str], image: Optional[Image] = None, timeout: float = 3600, mem_mb: int = 3072,
        cpus: int = 2, env: Optional[dict[str, str]] = None, log: Log = _log,
        stream: Callable[[str], None] = lambda s: print(s, flush=True),
        boot_timeout: float = 120) -> RunResult:
    """Boot the image, run CMD as root in the project folder, stream its output, power off."""
    if not cmd:
        raise VMError("testbed vm run needs a command: testbed vm run -- uname -a")
    img = image or _require_image()
    _tools(["qemu-system-x86_64"])
    order = _accel_order()
    last_err = ""
    for i, accel in enumerate(order):
        res = _boot(img, cmd, accel, timeout, mem_mb, cpus, env or {}, log, stream,
                    boot_timeout=min(boot_timeout, 45) if (accel == "kvm" and len(order) > 1) else boot_timeout)
        if isinstance(res, RunResult):
            if accel == "kvm" and len(order) > 1:
                _remember_accel(True)
            return res
        last_err = res
        if accel == "kvm" and i + 1 < len(order):
            log(f"KVM did not boot the guest ({res}); falling back to TCG (software emulation, slower)")
            _remember_accel(False)
    raise VMError(f"the VM did not boot: {last_err}")


def _boot(img: Image, cmd: list[str], accel: str, timeout: float, mem_mb: int, cpus: int,
          env: dict[str, str], log: Log, stream: Callable[[str], None], boot_timeout: float):
    """One boot. Returns a RunResult once the guest reached userspace, or a string saying why it did not."""
    import selectors

    ctl = Path(tempfile.mkdtemp(prefix="ftb-vm-"))
    workdir = str(ROOT)
    (ctl / "run.sh").write_text(_run_script(cmd, workdir, env))
    args = _qemu_args(img, ctl, accel, mem_mb, cpus, ROOT)
    t0 = time.monotonic()
    boot_log: list[str] = []
    out: list[str] = []
    started, boot_s, marker_rc = False, 0.0, None
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = b""
    why = None
    try:
        while True:
            now = time.monotonic()
            if not started and now - t0 > boot_timeout:
                why = f"no userspace after {boot_timeout:.0f} s under {accel}"
                break
            if now - t0 > timeout:
                why = f"timed out after {timeout:.0f} s"
                break
            if not sel.select(timeout=1.0):
                if proc.poll() is not None:
                    break
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace").rstrip("\r")
                line = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1bc", "", line)
                if not started:
                    boot_log.append(line)
                    if line.startswith(START):
                        started, boot_s = True, time.monotonic() - t0
                        log(f"booted kernel {line[len(START):].strip()} under {accel} in {boot_s:.1f} s")
                    continue
                if line.startswith(EXIT):
                    try:
                        marker_rc = int(line[len(EXIT):].strip())
                    except ValueError:
                        pass
                    continue
                out.append(line)
                stream(line)
    except KeyboardInterrupt:
        why = "interrupted"
        raise
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM if why is None else signal.SIGKILL)
                proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        rc_file = ctl / "exit"
        file_rc = None
        try:
            file_rc = int(rc_file.read_text().strip())
        except (OSError, ValueError):
            pass
        shutil.rmtree(ctl, ignore_errors=True)
    total = time.monotonic() - t0
    if not started:
        tail = " | ".join(x for x in boot_log[-5:] if x.strip())
        return why or f"qemu exited ({proc.returncode}) before userspace under {accel}: {tail}"
    rc = file_rc if file_rc is not None else marker_rc
    if rc is None:
        raise VMError(f"the guest stopped before the command finished ({why or 'powered off'}; "
                      f"qemu exit {proc.returncode})")
    return RunResult(rc, accel, boot_s, total, "\n".join(out))


def test(pytest_args: tuple[str, ...] = (), log: Log = _log, **kw) -> RunResult:
    """Run the tests marked ``fullkernel`` in the guest."""
    cmd = [f"{GUEST_VENV}/bin/python", "-m", "pytest", "-q", "-m", "fullkernel", "-p", "no:cacheprovider",
           "-o", "addopts=", *(pytest_args or ("tests",))]
    return run(cmd, log=log, **kw)


def status() -> dict:
    key = image_key()
    img = cached_image(key)
    return {"key": key, "cache": str(CACHE), "image": str(img.dir) if img else None,
            "meta": img.meta if img else None, "accel_order": _accel_order()}
