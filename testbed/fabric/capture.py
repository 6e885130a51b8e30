"""Packet captures: one tcpdump per interface of the nodes a scenario lists under ``capture:``.

Files are ``DIR/pcap/<node>-<ifname>.pcap`` (plain pcap, Ethernet link type), readable by tshark and scapy.
tcpdump runs inside the node's namespace and is stopped with SIGINT so it flushes its buffer.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from . import netns


class CaptureError(Exception):
    pass


class Captures:
    def __init__(self, fabric, nodes: list[str], outdir: Path, snaplen: int = 0):
        self.fabric, self.nodes, self.dir, self.snaplen = fabric, nodes, Path(outdir) / "pcap", snaplen
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self) -> None:
        if not self.nodes:
            return
        tcpdump = shutil.which("tcpdump")
        if not tcpdump:
            raise CaptureError("capture: tcpdump is not installed (apt-get install tcpdump)")
        self.dir.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            for p in self.fabric.topo.ports[node]:
                path = self.dir / f"{node}-{p.ifname}.pcap"
                argv = [tcpdump, "-i", p.ifname, "-w", str(path), "-U", "-n", "-q", "-B", "4096",
                        "-s", str(self.snaplen), "--immediate-mode"]
                proc = netns.spawn(self.fabric.ns[node], argv, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, start_new_session=True)
                self.procs.append((proc, path))
        deadline = time.time() + 5
        for proc, path in self.procs:           # tcpdump creates the file once it listens
            while not path.exists() and proc.poll() is None and time.time() < deadline:
                time.sleep(0.01)
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace").strip().splitlines()
                self.stop()
                raise CaptureError(f"capture: tcpdump on {path.stem} failed: {err[-1] if err else '?'}")
        time.sleep(0.1)

    def stop(self) -> list[str]:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr:
                proc.stderr.close()
        files = [str(path.relative_to(self.dir.parent)) for _, path in self.procs if path.exists()]
        for _, path in self.procs:
            if path.exists():
                os.chmod(path, 0o644)
        self.procs = []
        return files
