"""Authenticated control messages between a run's machines.

Over several machines the run's processes talk on the underlay: the subnet manager's tables and their
acknowledgements, the link-state floods, the metrics federation. Anything that reaches the underlay could
otherwise program the switches or fake a failure. Every message is therefore sealed: an HMAC-SHA256 under a
per-run key (made by the driver, handed to the machines' parts through Ray, never written to disk) over the
channel's name, the sender's id, a sequence number, an optional context (a request's nonce) and the content. A
receiver drops — and counts — what does not verify (forged or altered) and what it has seen before or that is
older than what it has seen from that sender (replayed).

A sealed message is one line: ``<base64 of id (8 B) + seq (8 B) + MAC (32 B)> <payload>``; JSON payloads have no
raw newline, so it fits the line-based table channel and a datagram alike.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import struct

KEY_BYTES = 32
_HEAD = struct.Struct("!8sQ32s")
_HEAD_B64 = len(base64.b64encode(bytes(_HEAD.size)))


def new_key() -> bytes:
    """A run's key: random, held only by the run's own processes."""
    return secrets.token_bytes(KEY_BYTES)


class Channel:
    """One kind of message under one run's key (``name`` is under the MAC: a flood cannot pass as a table).
    Seals what this process sends; opens what it receives, keeping per sender the highest sequence number."""

    def __init__(self, key: bytes, name: str):
        if len(key) != KEY_BYTES:
            raise ValueError(f"a run key is {KEY_BYTES} bytes, got {len(key)}")
        self.key, self.name = key, name.encode()
        self.sender = secrets.token_bytes(8)
        self.seq = 0
        self.last: dict[bytes, int] = {}
        self.forged = 0          # no valid MAC: made without the key, or altered on the way
        self.replayed = 0        # valid, but seen before (or older than what the sender sent since)

    def _mac(self, sender: bytes, seq: int, context: bytes, payload: bytes) -> bytes:
        msg = b"\0".join((self.name, sender, seq.to_bytes(8, "big"), context, payload))
        return hmac.new(self.key, msg, hashlib.sha256).digest()

    def seal(self, payload: bytes, context: bytes = b"") -> bytes:
        self.seq += 1
        head = _HEAD.pack(self.sender, self.seq, self._mac(self.sender, self.seq, context, payload))
        return base64.b64encode(head) + b" " + payload

    def open(self, data: bytes, context: bytes = b"") -> bytes | None:
        """The payload of a message that verifies and is new; None (counted) otherwise. A line's newline is
        the caller's to strip: it is not part of the message."""
        try:
            sender, seq, mac = _HEAD.unpack(base64.b64decode(data[:_HEAD_B64], validate=True))
        except (ValueError, struct.error):
            self.forged += 1
            return None
        payload = data[_HEAD_B64 + 1:]
        if data[_HEAD_B64:_HEAD_B64 + 1] != b" " or not hmac.compare_digest(
                mac, self._mac(sender, seq, context, payload)):
            self.forged += 1
            return None
        if seq <= self.last.get(sender, 0):
            self.replayed += 1
            return None
        self.last[sender] = seq
        return payload

    def refuse(self) -> None:
        """Count as forged what cannot even be opened: a message cut short (its connection ended inside it) or
        longer than any the run sends."""
        self.forged += 1

    def counts(self) -> dict:
        return {"forged": self.forged, "replayed": self.replayed}
