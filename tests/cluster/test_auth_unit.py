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


def test_a_bare_port_binds_only_this_machine():
    assert live.parse_address("9464") == ("127.0.0.1", 9464)
    assert live.parse_address("198.19.255.1:9464") == ("198.19.255.1", 9464)
