"""The INT maps: the stage's configuration, its counters and the sinks' report ring."""
from __future__ import annotations

import ctypes as ct

from ..fabric.port import HOST_LINK_ROLES
from .names import INT_STATS


class IntMaps:
    """A part of Datapath (datapath/program.py): INT maps: the stage's configuration, its counters and the sinks' report ring."""

    @property
    def int_on(self) -> bool:
        """The INT stage runs: leaf stacks (telemetry.int) or host stacks (hpcc)."""
        return self.int_spec is not None or self.host_stacks

    def _fill_int(self) -> None:
        if not self.int_on:
            return
        i = self.int_spec
        t = self._bpf[b"int_config"]
        v = t.Leaf()
        if i is not None:
            v.enabled, v.sample, v.max_hops = 1, i.sample, i.max_hops
        v.host_stacks = 1 if self.host_stacks else 0
        v.mtu = max([self.topo.spec.mtu] + [c.mtu for c in self.ports.values() if c.port.role not in HOST_LINK_ROLES])
        t[t.Key(0)] = v

    def int_counters(self) -> dict[str, int]:
        """What INT did so far (INT_STATS names: packets instrumented at their source, refused for want of room,
        records pushed in transit, hops past max_hops, reports exported and lost for a full ring buffer, packets
        the program could not instrument)."""
        self._need()
        t = self._bpf[b"int_stats"]
        return {name: int(sum(t.getvalue(t.Key(i)))) for i, name in enumerate(INT_STATS)}

    def open_int_reports(self, callback) -> None:
        """Deliver every sink's report (struct int_report bytes) to ``callback(data: bytes)`` from poll_int (a later
        call replaces the consumer: BCC opens a ring buffer once per program)."""
        self._need()
        first = self._int_consumer is None
        self._int_consumer = callback
        if first:
            def cb(_ctx, data, size):
                self._int_consumer(ct.string_at(data, size))
            self._int_cb = cb                  # BCC keeps only a weak hold on the callback
            self._bpf[b"int_reports"].open_ring_buffer(cb)

    def poll_int(self, timeout_ms: int) -> None:
        self._bpf.ring_buffer_poll(timeout_ms)
