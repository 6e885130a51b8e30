"""Load balancing: how a switch picks the egress port among equal-cost (or weighted) next hops — ECMP,
flowlet, spray, adaptive, WCMP and its controller, DLB — and researchers' own modes (``plugin.py``: a header
compiled into the switch program in place of a built-in mode, ``switch.load_balancing: plugin``).

The built-in modes' choices live in the switch program (ebpf/lb/<mode>.h behind one signature, ebpf/lb/choose.h,
dispatched by ebpf/lib/lb.h); this package is their scenario side and hands the datapath only what it needs.
"""
