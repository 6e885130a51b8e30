"""Errors of the eBPF datapath, phrased for the user."""
from ..errors import TestbedError


class DatapathError(TestbedError):
    """The datapath cannot be built or loaded here; the message is one readable line."""
