"""What a kernel or machine can do, as ``testbed doctor`` reports it, and the error for a missing piece: a leaf,
so the fabric and the datapath can refuse a feature the machine lacks without importing the doctor's probes."""
from __future__ import annotations

import platform
from dataclasses import dataclass

from .errors import TestbedError


@dataclass
class Capability:
    name: str
    ok: bool
    detail: str
    needed_for: str


class MissingFeature(TestbedError):
    """A capability a command needs is absent. ``str(exc)`` is one readable line for the CLI."""

    def __init__(self, message: str, missing: list[Capability]):
        super().__init__(message)
        self.missing = missing


def kernel_release() -> str:
    return platform.release()
