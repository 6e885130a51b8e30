"""fabric-testbed: AI data-centre fabric emulation on the real Linux kernel datapath."""
__version__ = "0.1.0"
