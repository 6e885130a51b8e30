"""Load balancing: how a switch picks the egress port among equal-cost (or weighted) next hops — ECMP,
flowlet, spray, adaptive, WCMP and its controller, DLB — and researchers' own modes."""
