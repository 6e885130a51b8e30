"""Queueing and flow control: the virtual queue, ECN, trimming, shared buffers, PFC and credits."""
