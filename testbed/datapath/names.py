"""The switch program's names, the numbers its modes, kinds and flags have in ebpf/lib/common.h, and the
byte encodings of map keys."""
from __future__ import annotations

import socket
import struct




PROGRAM = "ftb_switch_ingress"

NIC_RELEASE = "ftb_nic_release"     # XDP on leaf host ports: releases the sender's socket (see switch.c)

HOST_PROGRAM = "ftb_host_ingress"

STAGES = ("ftb_stage_adaptive", "ftb_stage_forward", "ftb_stage_failover",   # tail-call stages, in the order of
          "ftb_stage_int")                                                    # STAGE_* (common.h)

INT_STAGE = "ftb_stage_int"

ADAPTIVE_STAGE = "ftb_stage_adaptive"

ADAPTIVE_MODES = ("adaptive", "dlb")   # the load-balancing modes whose choice runs in ADAPTIVE_STAGE (switch.c)

CONTROL_PROGRAM = "ftb_ctl"          # user space's atomic changes to the queue model (run with PROG_TEST_RUN)

MODES = {"ecmp": 0, "flowlet": 1, "spray": 2, "adaptive": 3, "wcmp": 4, "dlb": 5, "plugin": 6}

WCMP_GRANULARITY = {"flow": 0, "flowlet": 1, "packet": 2}

AR_METRICS = {"queue": 0, "load": 1, "queue+load": 2}

AR_GRANULARITY = {"packet": 0, "flowlet": 1}

SPRAY_KINDS = {"random": 0, "round_robin": 1}

# Index = the DROP_* enum in ebpf/lib/common.h.
DROP_REASONS = ("not_ipv4", "malformed", "no_route", "empty_group", "ttl", "no_port", "bad_egress", "port_down")

MIN_MAX_NH = 16

PORT_VALID = 1

PORT_EDGE = 2                        # the port faces a host: INT's source and sink (common.h)

INT_STATS = ("sourced", "no_room", "transit", "exceeded", "exported", "export_lost", "failed",   # INT_* (common.h)
             "probes", "delivered")


def mac_bytes(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def net_u32(addr: str) -> int:
    """An IPv4 address as the u32 whose memory holds it in network byte order (as the C side stores it)."""
    return int.from_bytes(socket.inet_aton(addr), "little")


def net_str(u32: int) -> str:
    return socket.inet_ntoa(struct.pack("<I", u32))
