"""The metrics federation of a fabric over several machines (telemetry/live.py FabricFederation), over real HTTP on
loopback: two machines' exporters (prometheus-client servers with the families a machine's exporter serves) and
one that never answers."""
from __future__ import annotations

import socket
import threading
from wsgiref.simple_server import make_server

import pytest
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from testbed.telemetry.live import FabricFederation, MetricsFailed

from conftest import free_port, scrape


class _Machine:
    """What one machine's exporter serves: its part's lab and switches."""

    def __init__(self, lab: str, switch: str, tx: float, depth: float):
        self.lab, self.switch, self.tx, self.depth = lab, switch, tx, depth

    def collect(self):
        c = CounterMetricFamily("ftb_port_tx_bytes", "tx", labels=["lab", "switch", "port", "peer"])
        c.add_metric([self.lab, self.switch, "spine0", "spine0"], self.tx)
        yield c
        g = GaugeMetricFamily("ftb_queue_depth_bytes", "depth", labels=["lab", "switch", "port", "peer", "priority"])
        g.add_metric([self.lab, self.switch, "spine0", "spine0", "0"], self.depth)
        yield g


def _serve(collector):
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    server = make_server("127.0.0.1", 0, make_wsgi_app(reg))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_federation_serves_every_machines_samples_as_one_labs_and_names_a_silent_machine():
    m0, m1 = _serve(_Machine("c1m0", "leaf0", 1000, 3)), _serve(_Machine("c1m1", "leaf1", 2500, 7))
    dead = ("127.0.0.1", free_port())                     # nothing listens there
    address = f"127.0.0.1:{free_port()}"
    fed = FabricFederation("c1", address)
    try:
        fed.serve({"m0": m0.server_address, "m1": m1.server_address, "m2": dead})
        got = scrape(address)
    finally:
        results = fed.close()
        m0.shutdown()
        m1.shutdown()
    tx = {dict(k)["switch"]: v for (n, k), v in got.items() if n == "ftb_port_tx_bytes_total"}
    assert tx == {"leaf0": 1000, "leaf1": 2500}             # one family, both machines' samples …
    assert {dict(k)["lab"] for (n, k), _ in got.items()} == {"c1"}           # … as the run's lab
    assert sum(1 for (n, _k) in got if n == "ftb_queue_depth_bytes") == 2
    up = {dict(k)["machine"]: v for (n, k), v in got.items() if n == "ftb_machine_up"}
    assert up == {"m0": 1, "m1": 1, "m2": 0}
    assert results["scrapes"] == 1 and results["missed"] == {"m0": 0, "m1": 0, "m2": 1}
    (line,) = fed.degradations()
    assert line.startswith("metrics: m2's exporter did not answer 1 of 1 scrape(s)")


def test_an_address_in_use_is_refused_in_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        address = f"127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(MetricsFailed, match=rf"^metrics: cannot listen on {address}: Address already in use$"):
            FabricFederation("c1", address)
