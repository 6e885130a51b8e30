"""The built-in RoCEv2 engine (``traffic.engine: roce``): RC queue pairs doing RDMA WRITEs over UDP 4791.

One flow = one RC QP (requester on the flow's source host, responder on its destination). Responder QPN =
0x100 + 2·flow_id, requester QPN = responder + 1. A sized flow is a sequence of RDMA WRITE messages of
``msg_bytes`` (the last one shorter) into a memory region of ``size_bytes``; a duration flow repeats messages of
``msg_bytes`` until the end of the run. Packets carry ``mtu`` payload bytes (the IB path MTU); WRITE FIRST/ONLY
carry a RETH, the last packet of a message asks for an ACK.

Per host (agent process) one ``Endpoint``: a UDP socket bound to :4791 (receives data, ACK/NAK, CNP; IP_RECVTOS
gives the ECN bits) and a raw socket for ACK/NAK/CNP. A requester with one entropy value sends its data packets
on its own UDP socket (``wire.data_socket``: the kernel writes IPv4/UDP headers whose ICRC-covered fields are
fixed — IP id 0 with DF — so the ICRC is still exact; IP_RECVERR makes a full shaped host link back-pressure it
with ENOBUFS/EAGAIN like a NIC queue instead of dropping silently); one with several (``entropy: packet`` and the
path-aware modes) writes whole frames, each with the source port its entropy policy picks, and sends bursts of
them with one sendmmsg (``batch.py``; the same back-pressure).

Reliability (RC):
  receiver gbn  (what RoCE NICs do) the responder accepts only the expected PSN; on a gap it sends one NAK
                (PSN sequence error) carrying the expected PSN and drops out-of-order packets; the requester
                goes back to that PSN and resends everything from it (go-back-N).
  receiver ooo  (DDP / IRN style) the responder places every packet by its PSN (the message layout is known to
                both ends, as DDP placement information would tell it), acknowledges cumulatively and NAKs a
                missing PSN selectively once the highest received PSN is ``reorder_window`` packets past it
                and that happened ``reorder_time`` ago (sprayed paths reorder by the spread of their queueing
                delays, in time more than in packets: a faster sender deepens the reordering in PSNs);
                the requester then resends only that PSN (selective repeat).
  Cumulative ACKs every ``ACK_EVERY`` in-order packets and on every ack-request; retransmit timeout ``rto_s``
  (go back to / resend the oldest unacknowledged PSN).
Congestion control ``cc: dcqcn``: CE-marked arrivals make the responder send a CNP (opcode 0x81) at most once per
QP per CNP interval; the requester's CC (DCQCN's reaction point, a ``SenderCC``: ``cc/dcqcn.py``) sets its
pacing rate from them; the other CCs read ACKs (``cc/``), every one through the requester's one CC slot. ``cc: none``: the
requester sends as fast as the host link takes it (or at the flow's rate).

Test-only knobs (``traffic.roce``): ``drop_prob`` makes the responder discard that fraction of data packets as if
the network lost them (seeded); ``ce_prob`` makes the requester send that fraction of packets already CE-marked.
"""
from __future__ import annotations



from . import wire as w
from .endpoint import endpoint, rsp_qpn
from .requester import Requester
from .responder import Responder


class RoceEngine:
    name = "roce"
    proto = "rocev2"
    dport = w.ROCE_PORT

    @staticmethod
    def framing(packet_size: int, opts: dict | None) -> tuple[int, int]:
        """(payload bytes per full packet: the IB path MTU, IP-level bytes per packet that are not payload:
        IPv4 + UDP + BTH + ICRC, + the XTH when the packets carry one; a message's RETH, once, is left out)."""
        o = opts or {}
        return int(o["mtu"]), w.IP_LEN + w.UDP_LEN + w.BTH_LEN + w.ICRC_LEN + (w.XTH_LEN if o.get("ext") else 0)

    @staticmethod
    def sender(flow: dict, job: dict):
        return Requester(flow, job)

    @staticmethod
    def receivers(flows: list[dict], job: dict):
        ep = endpoint()
        ep.rx_open = True
        states = []
        for f in flows:
            r = Responder(f, ep, job.get("drain_s", 0.3))
            ep.rsp[rsp_qpn(f["flow_id"])] = r
            states.append(r)
        return [ep], states
