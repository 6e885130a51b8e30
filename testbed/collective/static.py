"""``static``: decides nothing — every operation runs as laid out, each flow on its own queue pair, the job's
own ring. The baseline a policy is compared with: the same schedule, the same QPs and ports, the same helper
round trip at each operation's start, no reading of the network."""
from __future__ import annotations

from .policy import Operation, Policy


class Static(Policy):
    name = "static"

    def decide(self, op: Operation, view) -> dict[int, int | None]:
        return {}
