"""Traffic engines: the socket code that sends and receives one kind of flow, run inside a host's agent.

An engine is a class with:
  name, proto      registry key and L4 protocol on the wire
  dport            a fixed destination port (e.g. 4791 for RoCEv2) or None = the scenario's
  sender(flow, job)            → a Sender (one per flow this host sends)
  receivers(flows, job)        → Receivers for the flows this host receives (grouped as the engine likes)

A Sender is driven by the agent's send loop (one thread, non-blocking sockets, poll):
  begin(now)                   called at t0 + flow.start_s
  pump(now) → (status, arg)    do a bounded amount of work; status is READY (call again soon), WAIT_TIME
                               (arg = absolute wake-up time), WAIT_WRITE / WAIT_READ (poll the fileno()), DONE
  stats() → dict               sender-side figures for the result
A Receiver is driven by the receive thread: fileno(), on_readable(now) → list of new Receivers (e.g. accepted
connections) or None, ``closed``; its flows are ``RxFlow`` objects the agent polls for ``finished(now)``.

The engines (each counts L4 payload bytes, so ``size_bytes`` is exactly what the receiver counts): udp.py
(sequence-numbered datagrams), tcp.py (the kernel's TCP), roce/ (RoCEv2: BTH/RETH/AETH/ICRC over UDP 4791, RC
reliability and DCQCN). Shared pieces (status codes, pacing, receive state) are in engine_api.py.
"""
from __future__ import annotations

from .roce import RoceEngine
from .tcp import TcpEngine
from .udp import UdpEngine

ENGINES = {"udp": UdpEngine, "tcp": TcpEngine, "roce": RoceEngine}
