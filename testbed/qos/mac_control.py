"""The MAC control frames of flow control, shared by the PFC agent, the credit meter and the switch program
(ebpf/lib/common.h): where they go, their EtherType and opcodes, and the agent's kick frame."""

PFC_DST = bytes.fromhex("0180c2000001")     # the MAC control multicast address PFC (802.1Qbb) frames go to
ETH_P_MACCTL = 0x8808
PFC_OPCODE = 0x0101
CREDIT_OPCODE = 0xFC01          # a MAC control frame to PFC's address with an opcode of its own: a credit grant
ETH_P_KICK = 0x88B5             # the agent's kick frame: restarts a resumed port's serialiser at once
KICK_LEN = 60                   # bytes of a kick frame (Ethernet header + 46), counted by the class it goes through
