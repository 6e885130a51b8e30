"""scapy layers for the INT-MD over UDP format of docs/int.md (shim + metadata header + hop records), so tests
read what the switch program wrote with an independent parser: ``IntStack(bytes(udp.payload))``."""
from scapy.fields import (BitField, ByteField, IntField, LongField, PacketListField, ShortField, ThreeBytesField,
                          XShortField)
from scapy.packet import Packet

SHIM_MD_BYTES, HOP_BYTES = 16, 32


class IntHop(Packet):
    name = "INT hop"
    fields_desc = [IntField("switch_id", 0), ShortField("ingress_port", 0), ShortField("egress_port", 0),
                   IntField("hop_latency", 0), ByteField("queue_id", 0), ThreeBytesField("queue_occupancy", 0),
                   LongField("ingress_ts", 0), IntField("tx_bytes", 0), IntField("link_rate_kbps", 0)]

    def extract_padding(self, s):
        return b"", s


class IntStack(Packet):
    name = "INT shim + INT-MD"
    fields_desc = [BitField("type", 1, 4), BitField("npt", 0, 2), BitField("rsvd0", 0, 2), ByteField("length", 0),
                   ByteField("flags", 0), ByteField("tos", 0),
                   BitField("ver", 2, 4), BitField("d", 0, 1), BitField("e", 0, 1), BitField("m", 0, 1),
                   BitField("rsvd2", 0, 12), BitField("hop_ml", 8, 5), ByteField("remaining", 0),
                   XShortField("instructions", 0), XShortField("ds_id", 0), XShortField("ds_instructions", 0),
                   XShortField("ds_flags", 0),
                   PacketListField("hops", [], IntHop,
                                   count_from=lambda p: (p.length * 4 - SHIM_MD_BYTES) // HOP_BYTES)]
