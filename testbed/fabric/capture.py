"""Packet captures: one tcpdump per interface of the nodes a scenario lists under ``capture:``.

Files are ``DIR/pcap/<node>-<ifname>.pcap`` (plain pcap, Ethernet link type), readable by tshark and scapy.
tcpdump runs inside the node's namespace and is stopped with SIGINT so it flushes its buffer.

PFC frames a node *sends* leave through AF_PACKET with PACKET_QDISC_BYPASS (they must not wait behind the data
queued on the port), which also skips the capture tap of the sending interface: a capture of the node would
show the pause frames it received but none it sent. With ``mac_control`` the capture therefore also records, on
the far end of each link, the MAC control frames (EtherType 0x8808) arriving from the node — on a veth exactly
what the node sent — and merges them into the node's file by time (mergecap).

On one machine's part of a fabric over several (testbed/cluster/) the captured nodes of other machines are not
in the fabric: the part captures its own nodes, and for a captured node on another machine whose link ends here
(a cut link) the frames it sent, as ``.<node>-<ifname>.sent-mac-control.pcap``, which the driver merges into
that node's file once every machine's files are in the run directory (``merge_pending``).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import TestbedError
from . import netns


SENT_SUFFIX = ".sent-mac-control.pcap"
MAC_CONTROL_IN = ["-Q", "in", "ether", "proto", "0x8808"]
PENDING = Path(".pending")       # merge_into of a sent-frames capture the driver merges (another machine's node)


class CaptureError(TestbedError):
    pass


@dataclass
class _Tcpdump:
    proc: subprocess.Popen
    path: Path
    merge_into: Path | None = None       # a sent-frames capture: merged into this file at the end


class Captures:
    def __init__(self, fabric, nodes: list[str], outdir: Path, snaplen: int = 0, mac_control: bool = False):
        """``nodes``: the scenario's ``capture``; those not in ``fabric`` are another machine's (see above)."""
        ports = fabric.topo.ports
        self.fabric, self.dir, self.snaplen = fabric, Path(outdir) / "pcap", snaplen
        self.nodes = [n for n in nodes if n in ports]
        self.remote = {n for n in nodes if n not in ports}
        self.mac_control = mac_control
        self.procs: list[_Tcpdump] = []

    def _spawn(self, tcpdump: str, node: str, ifname: str, path: Path, extra: list[str],
               merge_into: Path | None = None) -> None:
        argv = [tcpdump, "-i", ifname, "-w", str(path), "-U", "-n", "-q", "-B", "4096", "-s", str(self.snaplen),
                "--immediate-mode", *extra]
        proc = netns.spawn(self.fabric.ns[node], argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True)
        self.procs.append(_Tcpdump(proc, path, merge_into))

    def start(self) -> None:
        if not self.nodes and not self.remote:
            return
        tcpdump = shutil.which("tcpdump")
        if not tcpdump:
            raise CaptureError("capture: tcpdump is not installed (apt-get install tcpdump)")
        if self.mac_control and not shutil.which("mergecap"):
            raise CaptureError("capture: mergecap (Debian's wireshark-common) is needed to merge the PFC frames a "
                               "node sends into its capture; apt-get install wireshark-common")
        self.dir.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            for p in self.fabric.topo.ports[node]:
                main = self.dir / f"{node}-{p.ifname}.pcap"
                self._spawn(tcpdump, node, p.ifname, main, [])
                if self.mac_control and p.peer_node in self.fabric.topo.ports:   # else the peer's machine does
                    self._spawn(tcpdump, p.peer_node, p.peer_ifname, _sent(self.dir, node, p.ifname), MAC_CONTROL_IN,
                                merge_into=main)
        if self.mac_control:                    # captured nodes of other machines: what they sent over a cut link
            for node, ports in self.fabric.topo.ports.items():
                for q in ports:
                    if q.peer_node in self.remote:
                        self._spawn(tcpdump, node, q.ifname, _sent(self.dir, q.peer_node, q.peer_ifname),
                                    MAC_CONTROL_IN, merge_into=PENDING)
        deadline = time.time() + 5
        for t in self.procs:                    # tcpdump creates the file once it listens
            while not t.path.exists() and t.proc.poll() is None and time.time() < deadline:
                time.sleep(0.01)
            if t.proc.poll() is not None:
                err = t.proc.stderr.read().decode(errors="replace").strip().splitlines()
                self.stop()
                raise CaptureError(f"capture: tcpdump for {t.path.name} failed: {err[-1] if err else '?'}")
        time.sleep(0.1)

    def stop(self) -> list[str]:
        for t in self.procs:
            if t.proc.poll() is None:
                t.proc.send_signal(signal.SIGINT)
        for t in self.procs:
            try:
                t.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                t.proc.kill()
                t.proc.wait()
            if t.proc.stderr:
                t.proc.stderr.close()
        for t in self.procs:
            if t.merge_into not in (None, PENDING) and t.path.exists():
                _merge(t.merge_into, t.path)
        files = [str(t.path.relative_to(self.dir.parent)) for t in self.procs
                 if t.merge_into is None and t.path.exists()]
        for t in self.procs:
            if t.merge_into in (None, PENDING) and t.path.exists():
                os.chmod(t.path, 0o644)
        self.procs = []
        return files


def _sent(d: Path, node: str, ifname: str) -> Path:
    return d / f".{node}-{ifname}{SENT_SUFFIX}"


def merge_pending(d: Path) -> None:
    """Merge every sent-frames capture left in the pcap directory ``d`` (by the machines of a fabric over
    several) into its node's file."""
    for extra in sorted(d.glob(f".*{SENT_SUFFIX}")):
        main = d / (extra.name[1:-len(SENT_SUFFIX)] + ".pcap")
        if not main.exists():
            raise CaptureError(f"capture: {extra.name} has no {main.name} to merge into")
        _merge(main, extra)


def _merge(main: Path, extra: Path) -> None:
    """Merge ``extra`` into ``main`` by timestamp (mergecap), then remove ``extra``."""
    out = main.with_name(f".{main.name}.merged")
    r = subprocess.run(["mergecap", "-F", "pcap", "-w", str(out), str(main), str(extra)], capture_output=True,
                       text=True)
    if r.returncode:
        raise CaptureError(f"capture: mergecap {main.name}: {(r.stderr or r.stdout).strip().splitlines()[-1]}")
    os.replace(out, main)
    extra.unlink()
