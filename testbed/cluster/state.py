"""The local cluster's state file: which machines it runs and at which underlay addresses. A leaf of the
cluster package, read by the Ray connection (``auto`` address, machine names) and written by ``local``."""
from __future__ import annotations

import json
from pathlib import Path

from ..fabric import netns

STATE = Path(netns.STATE_DIR) / "cluster.json"


def read_state() -> dict | None:
    try:
        return json.loads(STATE.read_text())
    except (OSError, ValueError):
        return None


def names_by_address() -> dict[str, str]:
    """Underlay address → machine name (m<i>) of the local cluster; empty when none is up."""
    st = read_state()
    return {m["address"]: m["name"] for m in st["machines"]} if st else {}
