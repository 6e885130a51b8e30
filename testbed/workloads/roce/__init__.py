"""The built-in RoCEv2 engine: wire format (wire.py), RC delivery (rc.py), congestion control (cc/)."""
from .rc import RoceEngine

__all__ = ["RoceEngine"]
