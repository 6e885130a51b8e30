"""iperf3's JSON report (``iperf3 -c … -J``) → one flows.csv row (FlowResult), with the columns the udp and tcp
engines write where they mean the same thing.

iperf3 3.12's client report holds both ends: ``end.sum_sent`` (what the client sent) and ``end.sum_received``
(what the server received, as the server reported it back), with ``jitter_ms``, ``lost_packets`` and
``packets`` for UDP and ``retransmits`` in ``sum_sent`` for TCP. ``bytes`` are payload bytes (for UDP
iperf3's datagram payload, sequence header included, as the udp engine counts its own).
"""
from __future__ import annotations

from ..results import FlowResult


def to_result(flow, report: dict | None, error: str | None, start: float, end: float, origin: float) -> FlowResult:
    """The flow's row: ``start``/``end`` when its client was started and when it exited (epoch seconds),
    ``origin`` the run's time zero. goodput_mbps and fct_s are iperf3's own (received bytes over its data
    phase, ``sum_received.seconds``); a sized flow is complete when every byte arrived."""
    ok = report is not None and error is None
    sent = (report or {}).get("end", {}).get("sum_sent", {}) if ok else {}
    recv = (report or {}).get("end", {}).get("sum_received", {}) if ok else {}
    udp = flow.proto == "udp"
    got = int(recv.get("bytes", 0))
    # the receiver's "packets" is the highest sequence number it saw: lost ones after it are not in its
    # lost_packets; as the udp engine counts, lost = sent − received
    n_sent = int(sent["packets"]) if udp and "packets" in sent else None
    n_recv = int(recv["packets"]) - int(recv.get("lost_packets", 0)) if udp and "packets" in recv else None
    seconds = float(recv.get("seconds") or 0.0)
    complete = (got >= flow.size_bytes) if (ok and flow.size_bytes is not None) else None
    return FlowResult(
        flow_id=flow.flow_id, src=flow.src, dst=flow.dst, sport=flow.sport, dport=flow.dport, proto=flow.proto,
        bytes=got, packets_sent=n_sent, packets_received=n_recv,
        lost=max(0, n_sent - n_recv) if n_sent is not None and n_recv is not None else None,
        start_s=start - origin, end_s=end - origin,
        fct_s=(seconds if (flow.size_bytes is None or complete) and ok else None),
        goodput_mbps=got * 8 / seconds / 1e6 if seconds > 0 else 0.0,
        rate_bps=flow.rate_bps, size_bytes=flow.size_bytes, rail=flow.rail, engine="iperf3", complete=complete,
        retrans=int(sent["retransmits"]) if not udp and "retransmits" in sent else None,
        bytes_sent=int(sent.get("bytes", 0)) if ok else None,
        jitter_ms=float(recv["jitter_ms"]) if udp and "jitter_ms" in recv else None,
        error=error)
