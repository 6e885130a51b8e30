"""Per-flow results: what the sending and the receiving agent measured, merged into one flows.csv row."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from .flows import Flow


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
    ctl_lost: Optional[int] = None   # RoCE: ACK/NAK/CNP packets the receiver could not send (host queue full)
    # RoCE extended transport (results/README.md): trimmed headers the receiver got, ACKs with a SACK bitmap the
    # sender used, entropy values used and penalised, RTT from echoed transmit times, the CC's rate percentiles
    trims_seen: Optional[int] = None
    sacks: Optional[int] = None
    entropies_used: Optional[int] = None
    entropy_penalties: Optional[int] = None
    entropies_penalised: Optional[int] = None
    rtt_min_ms: Optional[float] = None
    rtt_p50_ms: Optional[float] = None
    rtt_p99_ms: Optional[float] = None
    cc_rate_p5: Optional[float] = None
    cc_rate_p50: Optional[float] = None
    cc_rate_p95: Optional[float] = None
    int_stacks: Optional[int] = None   # hpcc: data packets that reached the receiver with an INT stack
    int_echoes: Optional[int] = None   # hpcc: ACKs that brought INT hop records back to the sender
    spurious_retransmits: Optional[int] = None   # RoCE: copies of PSNs the receiver had accepted (resent in vain)
    jitter_ms: Optional[float] = None  # iperf3 UDP: its receiver's jitter (RFC 3550 smoothed interarrival)
    entropy: Optional[int] = None      # the source port the flow started from (the fabric controller's, or own)
    entropy_from: Optional[str] = None   # "controller" | "own" (no answer in time) when a controller runs
    entropy_changes: Optional[int] = None   # times the controller moved it to another port mid-flow
    entropy_last: Optional[int] = None   # the source port it ended on (= entropy without a move)

    def to_dict(self) -> dict:
        return asdict(self)


def _rel(t: Optional[float], t0: float) -> Optional[float]:
    return None if t is None else t - t0


def flow_result(f: Flow, t0: float, tx: dict, rx: dict) -> FlowResult:
    """One flow's result from its sender's and receiver's stats; times relative to ``t0`` (epoch seconds)."""
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
        r = _roce_result(f, t0, tx, rx, start, end, received, complete, fct, goodput, sent, got)
        if tx.get("entropy_from") is not None:
            r.sport = r.entropy = tx.get("entropy_first") or tx.get("sport", f.sport)
            r.entropy_from, r.entropy_changes = tx["entropy_from"], int(tx.get("entropy_changes") or 0)
            r.entropy_last = tx.get("sport", r.entropy)
        return r
    sent = tx.get("packets_sent")
    got = rx.get("packets")
    lost = max(0, sent - got) if (udp and sent is not None and got is not None) else None

    def ms(x):
        return None if x is None else x * 1e3

    ctl = tx.get("entropy_from") is not None
    first = tx.get("entropy_first") or tx.get("sport", f.sport)
    return FlowResult(
        flow_id=f.flow_id, src=f.src, dst=f.dst, sport=first, dport=f.dport, proto=f.proto,
        entropy=first if ctl else None, entropy_from=tx.get("entropy_from"),
        entropy_changes=int(tx.get("entropy_changes") or 0) if ctl else None,
        entropy_last=tx.get("sport", first) if ctl else None,
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
        ce_marks=rx.get("ce_marks"), checksum_ok=rx.get("checksum_ok"), ctl_lost=rx.get("ctl_lost"),
        trims_seen=rx.get("trims_seen"), sacks=tx.get("sacks"), entropies_used=tx.get("entropies_used"),
        entropy_penalties=tx.get("entropy_penalties"), entropies_penalised=tx.get("entropies_penalised"),
        rtt_min_ms=_ms(tx.get("rtt_min_s")), rtt_p50_ms=_ms(tx.get("rtt_p50_s")), rtt_p99_ms=_ms(tx.get("rtt_p99_s")),
        cc_rate_p5=tx.get("cc_rate_p5"), cc_rate_p50=tx.get("cc_rate_p50"), cc_rate_p95=tx.get("cc_rate_p95"),
        int_stacks=rx.get("int_stacks") if tx.get("int_echoes") is not None else None,
        int_echoes=tx.get("int_echoes"), spurious_retransmits=rx.get("spurious_retransmits"))


def _ms(x: Optional[float]) -> Optional[float]:
    return None if x is None else x * 1e3
