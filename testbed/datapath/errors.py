"""Errors of the eBPF datapath, phrased for the user."""


class DatapathError(Exception):
    """The datapath cannot be built or loaded here; the message is one readable line."""
