"""End-host path choice: which of a flow's entropy values (UDP source ports ``sport0 + k``, k < n) each data packet
uses (``traffic.roce.entropy``). The switches hash the source port (ECMP) or ignore it (spraying), so on an ECMP
fabric the entropy value *is* the path; these policies learn from what the receiver echoes per packet (its entropy
and whether it came back CE-marked or trimmed, ``wire.ECHO``) and from NAKs and timeouts.

  qp       one value for the whole QP (RoCE NICs' default: the flow is one ECMP path)
  packet   oblivious spraying: round robin over the n values, whatever the feedback
  reps     REPS (recycled entropy packet spraying): an entropy whose packet came back unmarked is recycled —
           queued for reuse by a later packet — and a marked, trimmed or lost one is not; when nothing is queued
           for reuse the sender explores a value at random. Good paths are reused in proportion to how many
           packets they carry cleanly; congested ones fall out of use within about one RTT.
  bitmap   a penalty per value (CE +1, trim/NAK +4, timeout = the maximum) that skips penalised values in the
           round robin until the penalty decays (one point per ``decay_s``); when every value is penalised the
           least penalised goes.

Pure logic with explicit times (unit-tested in tests/transport/test_transport_unit.py).
"""
from __future__ import annotations

import collections
import random

PENALTY_CE, PENALTY_LOSS, PENALTY_MAX = 1, 4, 16


class Policy:
    """The common bookkeeping: which values were used and how often each was penalised."""

    def __init__(self, n: int, seed: int = 0):
        self.n = max(1, n)
        self.used = bytearray(self.n)
        self.penalties = [0] * self.n          # penalty events per value (the flow's per-path record)
        self.rng = random.Random(seed)

    def pick(self, now: float) -> int:
        raise NotImplementedError

    def _use(self, k: int) -> int:
        self.used[k] = 1
        return k

    def feedback(self, k: int, ce: bool, trimmed: bool, now: float) -> None:
        """The receiver saw a packet sent on value ``k`` (CE-marked and/or trimmed, or clean)."""
        if ce or trimmed:
            self.penalties[k] += 1

    def nak(self, k: int, now: float) -> None:
        """The receiver NAKed a hole sent on ``k`` (reorder-detected; trims arrive as echoes). Only the bitmap
        charges it; REPS's signal is the missing clean echo."""

    def lost(self, k: int, now: float) -> None:
        """A packet sent on ``k`` timed out."""
        self.penalties[k] += 1

    def stats(self) -> dict:
        return dict(entropies_used=sum(self.used), entropy_penalties=sum(self.penalties),
                    entropies_penalised=sum(1 for p in self.penalties if p))


class Single(Policy):
    """The QP's one value (never asked to pick: the sender uses it for every packet)."""

    def __init__(self, n: int, seed: int = 0):
        super().__init__(1, seed)
        self.used[0] = 1

    def pick(self, now: float) -> int:
        return 0


class RoundRobin(Policy):
    def __init__(self, n: int, seed: int = 0):
        super().__init__(n, seed)
        self.next = 0

    def pick(self, now: float) -> int:
        k = self.next
        self.next = (k + 1) % self.n
        self.used[k] = 1
        return k


class Reps(Policy):
    """Recycle what came back clean; explore at random otherwise. The recycle queue holds at most ``n`` values
    (more than one packet's worth of a value may wait in it: a path that carries many packets cleanly is reused
    as often)."""

    def __init__(self, n: int, seed: int = 0):
        super().__init__(n, seed)
        self.recycle: collections.deque = collections.deque(maxlen=self.n)
        self.explored = 0

    def pick(self, now: float) -> int:
        if self.recycle:
            return self._use(self.recycle.popleft())
        self.explored += 1
        return self._use(self.rng.randrange(self.n))

    def feedback(self, k: int, ce: bool, trimmed: bool, now: float) -> None:
        super().feedback(k, ce, trimmed, now)
        if not (ce or trimmed):
            self.recycle.append(k)

    def stats(self) -> dict:
        return dict(super().stats(), entropies_explored=self.explored)


class Bitmap(Policy):
    """Round robin that skips values with a penalty; penalties decay by one point every ``decay_s``."""

    def __init__(self, n: int, decay_s: float, seed: int = 0):
        super().__init__(n, seed)
        self.score = [0] * self.n
        self.stamp = [0.0] * self.n            # when score[k] was last decayed
        self.decay_s = max(decay_s, 1e-6)
        self.next = 0
        self.skipped = 0

    def _current(self, k: int, now: float) -> int:
        s = self.score[k]
        if s:
            steps = int((now - self.stamp[k]) / self.decay_s)
            if steps:
                s = self.score[k] = max(0, s - steps)
                self.stamp[k] += steps * self.decay_s
        return s

    def _penalise(self, k: int, points: int, now: float) -> None:
        s = self._current(k, now)
        if not s:
            self.stamp[k] = now
        self.score[k] = min(PENALTY_MAX, s + points)
        self.penalties[k] += 1

    def pick(self, now: float) -> int:
        n, k = self.n, self.next
        best, best_s = k, None
        for _ in range(n):
            s = self._current(k, now)
            if not s:
                self.next = (k + 1) % n
                return self._use(k)
            if best_s is None or s < best_s:
                best, best_s = k, s
            self.skipped += 1
            k = (k + 1) % n
        self.next = (best + 1) % n
        return self._use(best)

    def feedback(self, k: int, ce: bool, trimmed: bool, now: float) -> None:
        if trimmed:
            self._penalise(k, PENALTY_LOSS, now)
        elif ce:
            self._penalise(k, PENALTY_CE, now)

    def nak(self, k: int, now: float) -> None:
        self._penalise(k, PENALTY_LOSS, now)

    def lost(self, k: int, now: float) -> None:
        self._penalise(k, PENALTY_MAX, now)

    def stats(self) -> dict:
        return dict(super().stats(), entropies_skipped=self.skipped)


def make(mode: str, n: int, decay_s: float, seed: int) -> Policy:
    if mode == "qp" or n <= 1:
        return Single(1, seed)
    if mode == "packet":
        return RoundRobin(n, seed)
    if mode == "reps":
        return Reps(n, seed)
    if mode == "bitmap":
        return Bitmap(n, decay_s, seed)
    raise ValueError(f"traffic.roce.entropy: unknown mode {mode!r}")
