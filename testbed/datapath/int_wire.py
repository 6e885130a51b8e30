"""The sizes of the INT stack the switch program pushes (ebpf/lib/int.h; field by field in docs/int.md)."""

INT_HEADER_BYTES = 16        # INT over UDP: the shim (4 B) and the INT-MD metadata header (12 B)
INT_HOP_BYTES = 32           # one hop's metadata: 8 words
INT_MAX_HOPS = 8             # the program's compile-time bound on the stack (-DINT_MAX_HOPS)
