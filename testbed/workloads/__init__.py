"""Workloads: plan flows from a scenario, run them with one agent process per host, collect per-flow results.

    flows = plan(scenario.traffic, topo, scenario.seed, duration_s)
    results = run(flows, ns_of=lambda host: f"ftb-{host}", duration_s=5, packet_size=1500)

``run`` starts ``python -m testbed.workloads.agent`` in every involved host's namespace, waits until each has
started, picks t0 a little later, hands every agent its job (the flows it sends and receives), waits for the
results and always kills and reaps every agent it started. Times in results are seconds relative to t0.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Optional

from .engines import ENGINES
from .flows import Flow, derangement, offered_mbps, plan

if TYPE_CHECKING:                     # the agent imports this package too: keep its start-up light
    import selectors
    import subprocess

READY_TIMEOUT_S = 30.0
DEFAULT_SNDBUF = 212992     # net.core.wmem_default: what one socket would get, shared by a host's UDP senders


class WorkloadError(Exception):
    """An agent failed; the message is one line."""


@dataclass
class FlowResult:
    flow_id: int
    src: str
    dst: str
    sport: int
    dport: int
    proto: str
    bytes: int                       # L4 payload bytes received (UDP: unique datagrams, header included)
    packets_sent: Optional[int]      # UDP only (None for TCP)
    packets_received: Optional[int]  # UDP: unique datagrams; None for TCP
    lost: Optional[int]              # UDP: sent − received unique; None for TCP (see retrans)
    start_s: Optional[float]         # first byte handed to the kernel (TCP: connection established)
    end_s: Optional[float]           # last byte received
    fct_s: Optional[float]           # sized flow: end − start when complete, else None; duration flow: same
    goodput_mbps: float              # bytes × 8 / (end − start)
    rate_bps: Optional[int]
    size_bytes: Optional[int]
    rail: int = 0
    engine: str = ""
    complete: Optional[bool] = None  # sized flows: every byte arrived
    reordered: Optional[int] = None  # UDP: datagrams that arrived after a higher sequence number
    duplicates: Optional[int] = None
    retrans: Optional[int] = None    # TCP: segments retransmitted by the sender (tcpi_total_retrans)
    owd_mean_ms: Optional[float] = None   # UDP one-way delay (shared clock), mean and max
    owd_max_ms: Optional[float] = None
    bytes_sent: Optional[int] = None
    error: Optional[str] = None
    # RoCE engine (None for the others): NAKs the receiver sent, retransmit timeouts at the sender, CNPs the
    # receiver sent, CE-marked packets it received, and whether the delivered bytes equal the sent ones
    naks: Optional[int] = None
    timeouts: Optional[int] = None
    cnps: Optional[int] = None
    ce_marks: Optional[int] = None
    checksum_ok: Optional[bool] = None

    def to_dict(self) -> dict:
        return asdict(self)


def _rel(t: Optional[float], t0: float) -> Optional[float]:
    return None if t is None else t - t0


def _result(f: Flow, t0: float, tx: dict, rx: dict) -> FlowResult:
    start = _rel(tx.get("send_start"), t0)
    end = _rel(rx.get("last_rx"), t0)
    received = rx.get("bytes", 0)
    complete = rx.get("complete") if f.size_bytes is not None else None
    if start is None or end is None:
        fct = None
    elif f.size_bytes is not None:
        fct = end - start if complete else None
    else:
        fct = end - start
    span = (end - start) if (start is not None and end is not None) else None
    goodput = received * 8 / span / 1e6 if span and span > 0 else 0.0
    udp = f.proto == "udp"
    if f.proto == "rocev2":          # packets_sent counts retransmissions; nothing is "lost" under RC
        sent = tx.get("packets_sent")
        got = rx.get("packets")
        return _roce_result(f, t0, tx, rx, start, end, received, complete, fct, goodput, sent, got)
    sent = tx.get("packets_sent")
    got = rx.get("packets")
    lost = max(0, sent - got) if (udp and sent is not None and got is not None) else None

    def ms(x):
        return None if x is None else x * 1e3

    return FlowResult(
        flow_id=f.flow_id, src=f.src, dst=f.dst, sport=f.sport, dport=f.dport, proto=f.proto,
        bytes=received, packets_sent=sent if udp else None, packets_received=got if udp else None, lost=lost,
        start_s=start, end_s=end, fct_s=fct, goodput_mbps=goodput, rate_bps=f.rate_bps, size_bytes=f.size_bytes,
        rail=f.rail, engine=f.engine, complete=complete, reordered=rx.get("reordered"),
        duplicates=rx.get("dup"), retrans=tx.get("retrans"), owd_mean_ms=ms(rx.get("owd_mean_s")),
        owd_max_ms=ms(rx.get("owd_max_s")), bytes_sent=tx.get("bytes_sent"),
        error=tx.get("error") or rx.get("error"), naks=rx.get("naks_sent"), timeouts=tx.get("timeouts"),
        cnps=rx.get("cnps_sent"), ce_marks=rx.get("ce_marks"), checksum_ok=rx.get("checksum_ok"))


def _roce_result(f, t0, tx, rx, start, end, received, complete, fct, goodput, sent, got) -> "FlowResult":
    return FlowResult(
        flow_id=f.flow_id, src=f.src, dst=f.dst, sport=f.sport, dport=f.dport, proto=f.proto,
        bytes=received, packets_sent=sent, packets_received=got, lost=None, start_s=start, end_s=end,
        fct_s=fct, goodput_mbps=goodput, rate_bps=f.rate_bps, size_bytes=f.size_bytes, rail=f.rail,
        engine=f.engine, complete=complete, reordered=rx.get("reordered"), duplicates=rx.get("dup"),
        retrans=tx.get("retrans"), bytes_sent=tx.get("bytes_sent"), error=tx.get("error") or rx.get("error"),
        naks=rx.get("naks_sent"), timeouts=tx.get("timeouts"), cnps=rx.get("cnps_sent"),
        ce_marks=rx.get("ce_marks"), checksum_ok=rx.get("checksum_ok"))


class _Agent:
    def __init__(self, host: str, ns: str, proc: "subprocess.Popen"):
        self.host, self.ns, self.proc = host, ns, proc
        self.out = bytearray()
        self.err = bytearray()
        self.ready = False

    def last_err_line(self) -> str:
        lines = [ln for ln in self.err.decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else "(no message)"

    def fail(self, what: str) -> WorkloadError:
        return WorkloadError(f"traffic agent on {self.host} (namespace {self.ns}) {what}: {self.last_err_line()}")


def _pump(sel: "selectors.BaseSelector", timeout: float) -> None:
    for key, _ in sel.select(timeout):
        agent, which = key.data
        try:
            chunk = os.read(key.fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            sel.unregister(key.fd)
            continue
        (agent.out if which == "out" else agent.err).extend(chunk)


def _kill(agents: list[_Agent]) -> None:
    import subprocess
    for a in agents:
        if a.proc.poll() is None:
            try:
                a.proc.kill()
            except OSError:
                pass
    for a in agents:
        try:
            a.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for pipe in (a.proc.stdin, a.proc.stdout, a.proc.stderr):
            try:
                if pipe:
                    pipe.close()
            except OSError:
                pass


def run(flows: list[Flow], ns_of: Callable[[str], str], duration_s: float, packet_size: int,
        timeout_s: Optional[float] = None, *, grace_s: float = 2.0, drain_s: float = 0.3,
        sndbuf_bytes: Optional[int] = DEFAULT_SNDBUF, start_margin_s: Optional[float] = None,
        info: Optional[dict] = None) -> list[FlowResult]:
    """Run ``flows`` for at most ``duration_s`` (+ ``grace_s`` to drain), one agent per involved host, and return
    one FlowResult per flow, in the order given.

    ``packet_size`` is the IP packet size of UDP datagrams (and sets TCP's MSS to packet_size − 40).
    ``sndbuf_bytes``: send-buffer budget (kernel truesize accounting) that a host's UDP senders share; it must
    stay below the host link's qdisc limit so that blasting senders block instead of overflowing their own
    qdisc (≥ ~8 KB per socket whatever the budget). None = the kernel default for every socket.
    ``timeout_s``: hard limit for the whole run (default: duration + last start + grace + 30 s).
    ``info``: if given, receives ``t0`` (epoch seconds that result times are relative to).
    """
    import logging
    import selectors
    import subprocess

    from ..fabric import netns

    if not flows:
        return []
    ids = [f.flow_id for f in flows]
    if len(set(ids)) != len(ids):
        raise ValueError("flow ids must be unique")
    hosts = list(dict.fromkeys([h for f in flows for h in (f.src, f.dst)]))
    last_start = max(f.start_s for f in flows)
    if timeout_s is None:
        timeout_s = duration_s + last_start + grace_s + 30.0
    t_begin = time.time()
    hard_end = t_begin + timeout_s
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    agents: list[_Agent] = []
    sel = selectors.DefaultSelector()
    try:
        for h in hosts:
            ns = ns_of(h)
            try:
                p = netns.spawn(ns, [sys.executable, "-m", "testbed.workloads.agent"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
            except (OSError, subprocess.SubprocessError) as e:
                raise WorkloadError(f"cannot start the traffic agent on {h} (namespace {ns}): {e}") from None
            a = _Agent(h, ns, p)
            agents.append(a)
            os.set_blocking(p.stdout.fileno(), False)
            os.set_blocking(p.stderr.fileno(), False)
            sel.register(p.stdout.fileno(), selectors.EVENT_READ, (a, "out"))
            sel.register(p.stderr.fileno(), selectors.EVENT_READ, (a, "err"))

        # 1. wait until every agent has started Python and said so
        ready_end = min(hard_end, time.time() + READY_TIMEOUT_S)
        while not all(a.ready for a in agents):
            for a in agents:
                if not a.ready and b"\n" in a.out:
                    a.ready = True
                elif not a.ready and a.proc.poll() is not None:
                    _pump(sel, 0.05)
                    raise a.fail(f"exited before it was ready (exit {a.proc.returncode})")
            if all(a.ready for a in agents):
                break
            if time.time() > ready_end:
                slow = next(a for a in agents if not a.ready)
                raise WorkloadError(f"traffic agent on {slow.host} (namespace {slow.ns}) did not start "
                                    f"within {ready_end - t_begin:.0f} s")
            _pump(sel, 0.05)

        # 2. t0 shortly after now: every agent only has to parse its job and bind its sockets
        margin = start_margin_s if start_margin_s is not None else 0.15 + 0.01 * len(agents)
        t0 = time.time() + margin
        if info is not None:
            info["t0"] = t0
        by_src: dict[str, list] = {h: [] for h in hosts}
        by_dst: dict[str, list] = {h: [] for h in hosts}
        for f in flows:
            by_src[f.src].append(f.to_dict())
            by_dst[f.dst].append(f.to_dict())
        for a in agents:
            job = {"host": a.host, "t0": t0, "duration_s": duration_s, "packet_size": packet_size,
                   "grace_s": grace_s, "drain_s": drain_s, "sndbuf_bytes": sndbuf_bytes,
                   "send": by_src[a.host], "recv": by_dst[a.host]}
            try:
                a.proc.stdin.write((json.dumps(job) + "\n").encode())
                a.proc.stdin.close()
            except (BrokenPipeError, OSError):
                _pump(sel, 0.1)
                raise a.fail("stopped before it took its job") from None

        # 3. collect
        while sel.get_map():
            if time.time() > hard_end:
                busy = [a.host for a in agents if a.proc.poll() is None]
                raise WorkloadError(f"traffic agents still running after {timeout_s:g} s: {', '.join(busy)}")
            _pump(sel, 0.2)
            for a in agents:
                if a.proc.poll() not in (None, 0):
                    _pump(sel, 0.05)
                    raise a.fail(f"failed (exit {a.proc.returncode})")
        outputs = {}
        for a in agents:
            try:
                rc = a.proc.wait(timeout=max(0.1, hard_end - time.time()))
            except subprocess.TimeoutExpired:
                raise WorkloadError(f"traffic agent on {a.host} did not exit") from None
            if rc != 0:
                raise a.fail(f"failed (exit {rc})")
            lines = [ln for ln in a.out.decode(errors="replace").splitlines() if ln.strip()]
            try:
                outputs[a.host] = json.loads(lines[-1])
                outputs[a.host]["recv"]
            except (IndexError, ValueError, KeyError):
                raise WorkloadError(f"traffic agent on {a.host} printed no result") from None
            late = outputs[a.host].get("bound_at", 0) - t0
            if late > 0:
                logging.getLogger(__name__).warning("traffic agent on %s bound its receivers %.3f s after t0", a.host, late)
    finally:
        _kill(agents)
        sel.close()

    results = []
    for f in flows:
        tx = outputs[f.src]["send"].get(str(f.flow_id), {})
        rx = outputs[f.dst]["recv"].get(str(f.flow_id), {})
        results.append(_result(f, t0, tx, rx))
    return results


__all__ = ["ENGINES", "Flow", "FlowResult", "WorkloadError", "derangement", "offered_mbps", "plan", "run"]
