"""fabric-testbed: AI data-centre fabric emulation on the real Linux kernel datapath.

The Python API (testbed/api.py) is imported on first use, so ``import testbed`` (and the CLI's start-up) stays
light: ``from testbed import load_scenario, Lab, run``.
"""
from .version import __version__

_API = ("Lab", "Result", "load_result", "load_scenario", "load_sweep", "run")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'testbed' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))
