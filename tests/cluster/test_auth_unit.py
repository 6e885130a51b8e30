"""Sealed control messages (testbed/auth.py) and the metrics federation's sealed replies: what a process of the
run sends verifies; what is forged, altered, sent on another channel, under another key or replayed is dropped
and counted."""
from __future__ import annotations

import threading
from wsgiref.simple_server import make_server

import pytest

from testbed.auth import Channel, new_key
from testbed.telemetry import live


def test_a_sealed_message_opens_once_under_the_same_key_and_channel():
    key = new_key()
    tx, rx = Channel(key, "flood"), Channel(key, "flood")
    a, b = tx.seal(b'{"seq": 1, "down": [101]}'), tx.seal(b'{"seq": 2, "down": []}')
    assert b"\n" not in a and a.endswith(b'{"seq": 1, "down": [101]}')
    assert rx.open(a) == b'{"seq": 1, "down": [101]}'
    assert rx.open(b) == b'{"seq": 2, "down": []}'
    assert rx.open(a) is None and rx.open(b) is None              # both replayed
    assert rx.counts() == {"forged": 0, "replayed": 2}


@pytest.mark.parametrize("tamper", [
    lambda m: m[:-2] + b"9]",                                     # the content altered
    lambda m: m.replace(b" ", b"  ", 1),                          # the envelope altered
    lambda m: b"garbage",                                         # not a sealed message at all
    lambda m: b"",
    lambda m: Channel(new_key(), "flood").seal(b'{"down": [1]}'),  # another run's key
    lambda m: Channel(KEY, "tables").seal(b'{"down": [1]}'),       # this run's key, another channel
])
def test_a_forged_or_altered_message_is_dropped_and_counted(tamper):
    rx = Channel(KEY, "flood")
    assert rx.open(tamper(Channel(KEY, "flood").seal(b'{"down": [1]}'))) is None
    assert rx.counts() == {"forged": 1, "replayed": 0}


KEY = new_key()


def test_an_older_message_of_a_sender_is_a_replay_and_another_senders_is_not():
    tx1, tx2, rx = Channel(KEY, "flood"), Channel(KEY, "flood"), Channel(KEY, "flood")
    old, new = tx1.seal(b"1"), tx1.seal(b"2")
    assert rx.open(new) == b"2" and rx.open(old) is None          # overtaken: older than what came since
    assert rx.open(tx2.seal(b"x")) == b"x"                        # a restarted agent is a new sender
    assert rx.counts() == {"forged": 0, "replayed": 1}


def test_the_context_is_under_the_mac():
    tx, rx = Channel(KEY, "metrics"), Channel(KEY, "metrics")
    assert rx.open(tx.seal(b"body", context=b"n1"), context=b"n2") is None
    assert rx.counts()["forged"] == 1


def _serve(app):
    server = make_server("127.0.0.1", 0, app)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address


def _metrics_app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "38")])
    return [b"# TYPE ftb_x counter\nftb_x_total 7.0\n\n"]


def test_the_federation_takes_a_sealed_reply_and_drops_an_altered_one():
    key = new_key()
    good, good_at = _serve(live._sealed(_metrics_app, Channel(key, "metrics")))

    def altering(environ, start_response):          # a man in the middle: the exporter's reply, one digit changed
        import urllib.request
        with urllib.request.urlopen(f"http://{good_at[0]}:{good_at[1]}/metrics?{environ['QUERY_STRING']}") as r:
            body, seal = r.read().replace(b"7.0", b"9.0"), r.headers[live.SEAL_HEADER]
        start_response("200 OK", [(live.SEAL_HEADER, seal), ("Content-Length", str(len(body)))])
        return [body]
    bad, bad_at = _serve(altering)
    import socket
    with socket.socket() as probe:                 # a free port for the federation's own endpoint
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fed = live.FabricFederation("r1", f"127.0.0.1:{port}", key=key)
    try:
        assert "ftb_x_total 7.0" in fed._fetch(good_at)
        with pytest.raises(ValueError, match="not sealed by this run"):
            fed._fetch(bad_at)
        fed.machines, fed.missed = {"m0": good_at, "m1": bad_at}, {"m0": 0, "m1": 0}
        names = {s.labels.get("machine"): s.value for f in fed.collect() for s in f.samples
                 if f.name == "ftb_machine_up"}
        assert names == {"m0": 1, "m1": 0}
    finally:
        res = fed.close()
        good.shutdown()
        bad.shutdown()
    assert res["rejected"] == {"forged": 2, "replayed": 0} and res["missed"] == {"m0": 0, "m1": 1}
    assert fed.degradations() == ["metrics: m1's reply to 1 of 1 scrape(s) did not verify under the run's key "
                                  "(forged or altered on the way: dropped, its samples missing from them)"]


def test_a_bare_port_binds_only_this_machine():
    import socket
    assert live.parse_address("9464") == ("127.0.0.1", 9464)
    assert live.parse_address("198.19.255.1:9464") == ("198.19.255.1", 9464)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fed = live.FabricFederation("r1", str(port))           # `--metrics PORT`: the endpoint listens on loopback
    try:
        assert fed.server.socket.getsockname() == ("127.0.0.1", port)
    finally:
        fed.close()


# ---- an SM agent's table port (routing/manager.py): what reaches it from the underlay

def _sma(monkeypatch, key: bytes):
    """An SM agent's table-serving half, without a datapath: its listening socket on loopback, the run's
    channels, and the tables it writes recorded instead of written."""
    import socket
    import types

    from testbed.routing import manager
    written = []
    monkeypatch.setattr(manager, "apply_tables", lambda bpf, topo, puts, dels, max_nh: written.append(puts)
                        or len(puts) + len(dels))
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)                          # as RoutingAgent._prepare makes it
    agent = object.__new__(manager._Agent)
    agent.o = types.SimpleNamespace(tables=server)
    agent.serving, agent.fds, agent.errors, agent.tables_taken = {}, [server.fileno()], [], 0
    agent.bpf, agent.whole, agent.max_nh = None, None, 16
    agent.channels = {n: Channel(key, n) for n in ("flood", "tables", "tables-ack")}
    return agent, server, written


def _pump(agent, until=lambda: False, rounds: int = 20) -> None:
    from testbed.helper import wait_readable
    for _ in range(rounds):
        for fd in wait_readable(agent.fds, 0.05):
            if fd in agent.serving or fd == agent.o.tables.fileno():
                agent._serve_tables(fd)
        if until():
            return


TABLE = b'{"put": [["leaf0", "198.18.0.1", [7]]], "del": []}'


def _reset(conn) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a peer that crashes or an attacker does."""
    import socket
    import struct
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def test_the_table_port_drops_forged_and_replayed_tables_unanswered_and_writes_the_sms(monkeypatch):
    import socket
    key = new_key()
    agent, server, written = _sma(monkeypatch, key)
    listening = server.fileno()
    sm = Channel(key, "tables")
    genuine = sm.seal(TABLE)
    try:
        with socket.create_connection(server.getsockname()) as c:
            c.sendall(TABLE + b"\n")                                          # no MAC at all
            c.sendall(Channel(new_key(), "tables").seal(TABLE) + b"\n")      # another key's
            _pump(agent, lambda: agent.channels["tables"].forged == 2)
            c.sendall(genuine + b"\n")                                        # the SM's own
            _pump(agent, lambda: agent.tables_taken == 1)
            c.settimeout(2)
            ack = Channel(key, "tables-ack").open(c.recv(4096).rstrip(b"\n"))
            assert ack == b'{"entries": 1}'
            c.sendall(genuine + b"\n")                                        # … replayed
            _pump(agent, lambda: agent.channels["tables"].replayed == 1)
            c.settimeout(0.3)
            with pytest.raises(socket.timeout):                               # never answered
                c.recv(4096)
        _pump(agent, lambda: len(agent.serving) == 0)
    finally:
        server.close()
    assert written == [{("leaf0", "198.18.0.1"): (7,)}] and agent.tables_taken == 1
    assert agent.channels["tables"].counts() == {"forged": 2, "replayed": 1}
    assert agent.serving == {} and agent.fds == [listening]          # the connection was let go


def test_a_line_cut_by_a_reset_or_left_unfinished_neither_stops_nor_holds_the_agent(monkeypatch):
    """Half a message then a TCP reset, and a connection that stops inside a line: the agent's loop is never
    held (its reads do not block) nor ended (a reset is the connection's end, not the agent's); the cut line is
    counted as forged, and the SM's tables still go through on another connection."""
    import socket
    import time
    key = new_key()
    agent, server, written = _sma(monkeypatch, key)
    try:
        stalled = socket.create_connection(server.getsockname())
        stalled.sendall(b"AAAA" * 10)                                         # … and nothing more
        cut = socket.create_connection(server.getsockname())
        cut.sendall(TABLE[:20])
        _pump(agent, lambda: len(agent.serving) == 2, rounds=5)
        t = time.monotonic()
        _pump(agent, rounds=3)
        assert time.monotonic() - t < 1.0                                     # the stalled line holds nothing
        _reset(cut)
        _pump(agent, lambda: len(agent.serving) == 1)
        with socket.create_connection(server.getsockname()) as c:
            c.sendall(Channel(key, "tables").seal(TABLE) + b"\n")
            c.settimeout(2)
            _pump(agent, lambda: agent.tables_taken == 1)
            assert Channel(key, "tables-ack").open(c.recv(4096).rstrip(b"\n")) == b'{"entries": 1}'
        stalled.close()
        _pump(agent, lambda: len(agent.serving) == 0)
    finally:
        server.close()
    assert agent.channels["tables"].counts() == {"forged": 2, "replayed": 0}   # both unfinished lines
    assert len(written) == 1 and agent.serving == {}
