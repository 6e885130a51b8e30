"""Routing: distributed link-state rerouting, the subnet manager and its algorithms (minhop, updn, ftree),
and failures on a schedule."""
