"""The switch program's counters read from user space: per port, drop reasons, and the per-flow paths."""
from __future__ import annotations

import time

from .names import DROP_REASONS, net_str
from .records import FlowPath, PortCounters


class CounterMaps:
    """A part of Datapath (datapath/program.py): switch program's counters read from user space: per port, drop reasons, and the per-flow paths."""

    def port_counters(self) -> dict[int, PortCounters]:
        """Counters of every switch port, by ifindex."""
        self._need()
        t = self._bpf[b"port_stats"]
        out = {}
        clock = time.time
        for ifx in self._switch_ports:
            t0 = clock()
            values = t.getvalue(t.Key(ifx))
            c = PortCounters(read_at=(t0 + clock()) / 2)
            for cpu in values:
                c.rx_packets += cpu.rx_packets
                c.rx_bytes += cpu.rx_bytes
                c.tx_packets += cpu.tx_packets
                c.tx_bytes += cpu.tx_bytes
                for i, name in enumerate(DROP_REASONS):
                    if cpu.drops[i]:
                        c.discard_reasons[name] = c.discard_reasons.get(name, 0) + cpu.drops[i]
            c.discards = sum(c.discard_reasons.values())
            out[ifx] = c
        return out

    def drop_counters(self) -> dict[str, int]:
        """Drops by reason over the whole fabric (including packets on ports the maps do not know)."""
        self._need()
        t = self._bpf[b"drop_reason_counts"]
        return {name: int(sum(t.getvalue(t.Key(i)))) for i, name in enumerate(DROP_REASONS)}

    def track_all_flows(self) -> None:
        """Keep per-flow counters at every switch a flow crosses, on single-port routes too (as SM routing does),
        for live per-flow metrics: one flow-table lookup more per packet where a route has one port."""
        self.track_flows = True
        self.set_mode(self.switch_spec)

    def flow_paths(self) -> list[FlowPath]:
        """Per-flow packet counts per next hop at switches where the flow had a choice (n > 1), or at every
        switch it crossed with SM routing or ``track_all_flows``."""
        self._need()
        out = []
        for k, v in self._bpf[b"flows"].items():
            sw = self._names.get(k.switch_id, f"switch{k.switch_id}")
            daddr = net_str(k.daddr)
            group = self.next_hops(sw, daddr)
            packets = {}
            for slot in range(min(len(group), self.max_nh)):
                if v.pkts[slot]:
                    packets[group[slot]] = int(v.pkts[slot])
            out.append(FlowPath(sw, net_str(k.saddr), daddr, k.sport, k.dport, k.proto, packets,
                                int(v.flowlets), int(v.bytes)))
        out.sort(key=lambda f: (f.switch, f.saddr, f.daddr, f.sport, f.dport, f.proto))
        return out

    def clear_flows(self) -> None:
        """Forget flowlet state and per-flow path counts."""
        self._need()
        self._bpf[b"flows"].clear()

    def reset_counters(self) -> None:
        """Zero port and drop counters (e.g. between phases of a run)."""
        self._need()
        for name in ("port_stats", "drop_reason_counts", "queue_stats", "queue_max", "pfc_stats"):
            self._bpf[name.encode()].clear()      # arrays: clear() zeroes every element
