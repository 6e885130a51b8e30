"""Live Prometheus metrics of a lab (``testbed up|run --metrics HOST:PORT``).

A forked helper (helper.py) that serves the datapath's counters while the lab lives: every scrape reads
the BPF maps afresh, so the values are the switch program's own, as current as the scrape and never sampled
twice (counters as Prometheus counters, depths as gauges). It reads without resetting anything the run's
telemetry sampler resets (a queue's interval maximum), so scraping never changes a result. Per-flow bytes come
from the switches' flow table, which the exporter turns on at every switch (``Datapath.track_all_flows``).

A fabric over several machines (``testbed run --cluster --metrics``) has one exporter per machine, on its
underlay address, and one endpoint at the driver (FabricFederation) that fetches them all at every scrape and
serves them as one lab's.

Metric names and labels are listed in results/README.md (Live metrics).
"""
from __future__ import annotations

import http.client
import ipaddress
import secrets
import signal
import threading
import urllib.parse
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

from ..auth import Channel
from ..helper import ForkedHelper, write_result
from ..errors import HelperFailed

PREFIX = "ftb_"
IP_PROTOS = {6: "tcp", 17: "udp"}
SEAL_HEADER = "X-FTB-Seal"      # a machine's exporter seals its reply to the federation (testbed/auth.py)
DEFAULT_HOST = "127.0.0.1"      # `--metrics PORT`: only this machine can scrape


class MetricsFailed(HelperFailed):
    pass


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` with an IPv4 host, or a bare ``PORT`` on 127.0.0.1 → (host, port); ValueError with one
    readable line otherwise."""
    if text.isdigit():
        text = f"{DEFAULT_HOST}:{text}"
    host, sep, port = text.rpartition(":")
    try:
        ipaddress.IPv4Address(host)
        number = int(port)
    except ValueError:
        raise ValueError(f"--metrics {text!r}: expected HOST:PORT with an IPv4 host, or a PORT on 127.0.0.1, e.g. "
                         f"127.0.0.1:9464") from None
    if not sep or not 0 < number < 65536:
        raise ValueError(f"--metrics {text!r}: the port must be 1–65535")
    return host, number


class FabricCollector:
    """A prometheus-client collector over one lab's datapath: ``collect()`` reads the maps and yields families."""

    def __init__(self, lab: str, datapath, topo):
        self.lab, self.dp, self.topo = lab, datapath, topo
        self.ports = {p.ifindex: p for ports in topo.ports.values() for p in ports}    # switch ports, host NICs
        self.hosts = {topo.address(h): h for h in topo.hosts}
        self.scrapes = 0

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        self.scrapes += 1
        port_labels = ["lab", "switch", "port", "peer"]

        def fam(kind, name, doc, labels):
            return kind(PREFIX + name, doc, labels=labels)
        per_port = {k: fam(CounterMetricFamily, k, doc, port_labels) for k, doc in (
            ("port_tx_bytes", "Frame bytes the switch program sent out of the port"),
            ("port_rx_bytes", "Frame bytes that arrived on the port"),
            ("port_tx_packets", "Packets sent out of the port"),
            ("port_rx_packets", "Packets that arrived on the port"),
            ("port_discards", "Frames the switch program could not forward, charged to their ingress"))}
        for ifx, c in self.dp.port_counters().items():
            p = self.ports[ifx]
            labels = [self.lab, p.node, p.ifname, p.peer_node]
            for k, v in (("port_tx_bytes", c.tx_bytes), ("port_rx_bytes", c.rx_bytes),
                         ("port_tx_packets", c.tx_packets), ("port_rx_packets", c.rx_packets),
                         ("port_discards", c.discards)):
                per_port[k].add_metric(labels, v)
        yield from per_port.values()

        q_labels = port_labels + ["priority"]
        depth = fam(GaugeMetricFamily, "queue_depth_bytes", "Bytes in the queue now (the switch program's model)",
                    q_labels)
        per_queue = {k: fam(CounterMetricFamily, k, doc, q_labels) for k, doc in (
            ("queue_drops", "Packets tail-dropped at the queue's buffer"),
            ("queue_ecn_marks", "Packets marked CE at the queue"),
            ("queue_trims", "Packets cut to their headers instead of dropped (switch.trim)"),
            ("pause_frames", "PFC pause frames sent for the queue's priority out of the port"),
            ("paused_seconds", "Time the queue's egress was paused by PFC"))}
        pfc = self.dp.pfc_counters()
        for (ifx, prio), c in self.dp.queue_counters(reset_max=False).items():
            p = self.ports[ifx]
            labels = [self.lab, p.node, p.ifname, p.peer_node, str(prio)]
            depth.add_metric(labels, self.dp.queue_depth(ifx, prio))
            frames, paused_ns = pfc.get((ifx, prio), (0, 0))
            for k, v in (("queue_drops", c.drops), ("queue_ecn_marks", c.ecn_marks), ("queue_trims", c.trims),
                         ("pause_frames", frames), ("paused_seconds", paused_ns / 1e9)):
                per_queue[k].add_metric(labels, v)
        yield depth
        yield from per_queue.values()

        f_labels = ["lab", "switch", "src", "dst", "sport", "dport", "proto"]
        fbytes = fam(CounterMetricFamily, "flow_bytes", "Frame bytes of the flow through the switch", f_labels)
        fpkts = fam(CounterMetricFamily, "flow_packets", "Packets of the flow through the switch", f_labels)
        for f in self.dp.flow_paths():
            labels = [self.lab, f.switch, self.hosts.get(f.saddr, f.saddr), self.hosts.get(f.daddr, f.daddr),
                      str(f.sport), str(f.dport), IP_PROTOS.get(f.proto, str(f.proto))]
            fbytes.add_metric(labels, f.bytes)
            fpkts.add_metric(labels, sum(f.packets.values()))
        yield fbytes
        yield fpkts


def _sealed(app, channel: Channel):
    """The exporter's WSGI app, its reply sealed for the federation: the MAC covers the body and the nonce the
    request carried, so an altered reply, or an old one served again, does not verify."""
    def sealed_app(environ, start_response):
        nonce = urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).get("nonce", [""])[0].encode()
        held: dict = {}

        def keep(status, headers, exc_info=None):
            held["status"], held["headers"] = status, headers
        body = b"".join(app(environ, keep))
        head = channel.seal(body, context=nonce).split(b" ", 1)[0]
        start_response(held["status"], [(k, v) for k, v in held["headers"] if k.lower() != "content-length"]
                       + [(SEAL_HEADER, head.decode()), ("Content-Length", str(len(body)))])
        return [body]
    return sealed_app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):      # noqa: A002 — one line per scrape on stderr is noise
        return


class MetricsExporter(ForkedHelper):
    """The parent's side: ``start()`` listens (so an address in use is refused here, in one line) and forks the
    exporter that serves it; ``stop()`` returns its scrape count."""

    label = "metrics exporter"
    failure = MetricsFailed

    def __init__(self, lab: str, datapath, topo, address: str | tuple[str, int], key: bytes | None = None):
        """``address``: the user's HOST:PORT, or (host, port) — port 0 picks a free one (a machine's exporter
        behind a FabricFederation); ``endpoint`` then says which. ``key``: the run's key, which seals every
        reply for the federation."""
        super().__init__()
        self.lab, self.dp, self.topo, self.key = lab, datapath, topo, key
        self.host, self.port = parse_address(address) if isinstance(address, str) else address

    @property
    def endpoint(self) -> tuple[str, int]:
        return self.host, self.port

    def start(self) -> None:
        from prometheus_client import CollectorRegistry, make_wsgi_app
        collector = FabricCollector(self.lab, self.dp, self.topo)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        try:
            app = make_wsgi_app(registry)
            if self.key is not None:
                app = _sealed(app, Channel(self.key, "metrics"))
            server = make_server(self.host, self.port, app, handler_class=_QuietHandler)
        except OSError as e:
            raise MetricsFailed(f"metrics exporter: cannot listen on {self.host}:{self.port}: {e.strerror}") from None
        self.port = server.server_address[1]
        self.dp.track_all_flows()
        try:
            self._fork(lambda wfd, ready: self._serve(server, collector, wfd, ready), f"ftb-{self.lab}-met")
        finally:
            server.server_close()              # the child holds its own copy of the socket

    def _serve(self, server, collector: FabricCollector, wfd: int, ready) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
        thread.start()
        ready()
        while not stop.is_set():
            stop.wait(0.5)
        server.shutdown()
        thread.join(2.0)
        write_result(wfd, {"scrapes": collector.scrapes, "address": f"{self.host}:{self.port}"})


FETCH_TIMEOUT_S = 2.0        # a machine's exporter that has not answered by then is reported down for that scrape


class Unsealed(ValueError):
    """A machine's metrics reply that does not verify under the run's key for the request it answers."""


class FabricFederation:
    """The one metrics endpoint of a fabric over several machines, served by a thread of the driver: every scrape
    fetches each machine's exporter afresh and serves their families merged, with the names and labels of one
    machine's lab (``lab`` = the run's), plus ``ftb_machine_up{machine}`` — 0 when that machine's exporter did not
    answer this scrape (its samples are missing from it). Listens at construction, so an address in use is refused
    before anything is built."""

    def __init__(self, lab: str, address: str, key: bytes | None = None):
        """``key``: the run's key; a machine's reply that does not verify under it is dropped (counted in
        ``rejected``) and that machine reads as down for the scrape."""
        from prometheus_client import CollectorRegistry, make_wsgi_app
        self.lab, self.address = lab, address
        self.channel = Channel(key, "metrics") if key is not None else None
        host, port = parse_address(address)
        self.machines: dict[str, tuple[str, int]] = {}
        self.scrapes = 0
        self.missed: dict[str, int] = {}
        self.unsealed: dict[str, int] = {}         # … of which their reply did not verify (dropped)
        self.results: dict | None = None           # once closed
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        try:
            self.server = make_server(host, port, make_wsgi_app(registry), handler_class=_QuietHandler)
        except OSError as e:
            raise MetricsFailed(f"metrics: cannot listen on {address}: {e.strerror}") from None
        self._thread: threading.Thread | None = None

    def serve(self, machines: dict[str, tuple[str, int]]) -> None:
        """Start serving, from the machines' exporters (machine name → its endpoint)."""
        self.machines = dict(machines)
        self.missed = {m: 0 for m in machines}
        self.unsealed = {m: 0 for m in machines}
        self._thread = threading.Thread(target=self.server.serve_forever, name="metrics-federation", daemon=True)
        self._thread.start()

    def _fetch(self, endpoint: tuple[str, int]) -> str:
        """A machine's metrics; Unsealed when its reply is not sealed by the run's key for this request."""
        nonce = secrets.token_hex(8)
        url = f"http://{endpoint[0]}:{endpoint[1]}/metrics" + (f"?nonce={nonce}" if self.channel else "")
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as r:
            body, head = r.read(), r.headers.get(SEAL_HEADER, "")
        sealed = head.encode() + b" " + body
        if self.channel is not None and self.channel.open(sealed, context=nonce.encode()) is None:
            raise Unsealed(f"the reply of {endpoint[0]}:{endpoint[1]} is not sealed by this run")
        return body.decode()

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily
        from prometheus_client.parser import text_string_to_metric_families
        self.scrapes += 1
        up = GaugeMetricFamily(PREFIX + "machine_up", "1 when the machine's exporter answered this scrape",
                               labels=["lab", "machine"])
        merged: dict = {}
        for machine, endpoint in self.machines.items():
            try:
                families = list(text_string_to_metric_families(self._fetch(endpoint)))
            except (OSError, http.client.HTTPException, ValueError) as e:
                self.missed[machine] += 1
                self.unsealed[machine] = self.unsealed.get(machine, 0) + isinstance(e, Unsealed)
                up.add_metric([self.lab, machine], 0)
                continue
            up.add_metric([self.lab, machine], 1)
            for fam in families:
                into = merged.setdefault(fam.name, fam)
                samples = [s._replace(labels=dict(s.labels, lab=self.lab)) if "lab" in s.labels else s
                           for s in fam.samples]
                if into is fam:
                    fam.samples = samples
                else:
                    into.samples.extend(samples)
        yield up
        yield from merged.values()

    def close(self) -> dict:
        """Stop serving; what it served (the manifest's ``metrics``). Idempotent."""
        if self.results is None:
            if self._thread is not None:
                self.server.shutdown()
                self._thread.join(FETCH_TIMEOUT_S * (1 + len(self.machines)))
            self.server.server_close()
            self.results = {"address": self.address, "scrapes": self.scrapes, "missed": dict(self.missed),
                            "machines": {m: f"{h}:{p}" for m, (h, p) in self.machines.items()},
                            "rejected": self.channel.counts() if self.channel else None}
        return self.results

    def degradations(self) -> list[str]:
        out = []
        for m, n in self.missed.items():
            bad = self.unsealed.get(m, 0)
            if n > bad:
                out.append(f"metrics: {m}'s exporter did not answer {n - bad} of {self.scrapes} scrape(s) (its "
                           f"samples were missing from them)")
            if bad:
                out.append(f"metrics: {m}'s reply to {bad} of {self.scrapes} scrape(s) did not verify under the "
                           f"run's key (forged or altered on the way: dropped, its samples missing from them)")
        return out
