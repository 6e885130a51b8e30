"""The host's side of the controller channel (workloads/controller_channel.py) against a stand-in controller on
a real Unix datagram socket: many requests answered by a controller that blocks on each answer (as the real
one does) all come back — a host that blocked on its own requests while the controller blocked on answers into
the host's full queue (10 datagrams) would wait for ever — and with no controller every flow keeps its port."""
from __future__ import annotations

import json
import socket
import threading

from testbed.workloads.controller_channel import ask, reply


def _controller(path, n: int, done: threading.Event) -> threading.Thread:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(str(path))

    def serve():
        try:
            for _ in range(n):
                msg, addr = srv.recvfrom(4096)
                m = json.loads(msg)
                srv.sendto(reply(m["flow"], 50000 + m["flow"], "start"), addr)     # blocking, as service.py
        finally:
            srv.close()
            done.set()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_a_host_with_many_flows_gets_every_answer_from_a_controller_that_blocks(tmp_path):
    path, done = tmp_path / "ctl.sock", threading.Event()
    t = _controller(path, 120, done)
    flows = [{"flow_id": i, "sport": 40000 + i} for i in range(120)]
    got = ask(str(path), flows, timeout_s=5.0, tag="h0")
    assert got == {i: 50000 + i for i in range(120)}
    assert done.wait(5) and not t.is_alive()
    assert not list(tmp_path.glob("ctl-h0-*.sock"))          # the host's socket file is removed


def test_no_controller_listening_keeps_every_port(tmp_path):
    assert ask(str(tmp_path / "nobody.sock"), [{"flow_id": 1, "sport": 40001}], 0.2, "h1") == {}
