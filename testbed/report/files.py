"""Reading and writing result files: atomic writes (temp file, fsync, rename), plain JSON, CSV conventions.

A crash leaves either the old file or the new one, never half a file. CSV: NaN/None are empty cells, and only
empty cells read back as missing (a node named "NA" stays a name).
"""
from __future__ import annotations

import errno
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from ..errors import TestbedError


class ReportError(TestbedError):
    """A result-directory problem, already phrased for the user (one line, path first)."""


def atomic_write(path: Path, write: Callable[[Any], None], *, binary: bool = False) -> Path:
    """Write `path` via a temp file in the same directory + fsync + os.replace. `write(fh)` fills the file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if binary:
            fh = os.fdopen(fd, "wb")
        else:
            fh = os.fdopen(fd, "w", encoding="utf-8", newline="")
        with fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are read by other users (runs are often root)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(d: Path) -> None:
    """Make the rename durable. Some filesystems cannot fsync a directory (EINVAL on the VM lane's 9p share);
    there the rename is as durable as the filesystem makes it, which is all that can be had."""
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_csv(path: Path, df: pd.DataFrame) -> Path:
    # NaN/None are written as empty cells; floats use repr precision, so a re-read gives the same values.
    return atomic_write(path, lambda fh: df.to_csv(fh, index=False, na_rep="", lineterminator="\n"))


def jsonable(obj: Any) -> Any:
    """Plain JSON: NaN/inf → null, numpy scalars → Python, paths/sets/other objects → str/list."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if hasattr(obj, "model_dump"):  # pydantic models (the resolved scenario)
        return jsonable(obj.model_dump(mode="json"))
    return str(obj)


def write_json(path: Path, obj: Any) -> Path:
    text = json.dumps(jsonable(obj), indent=2, sort_keys=False, allow_nan=False) + "\n"
    return atomic_write(path, lambda fh: fh.write(text))


def read_csv(path: Path) -> pd.DataFrame:
    # Only empty cells are missing values: a node called "NA" or "null" stays a name.
    try:
        return pd.read_csv(path, keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None


def read_manifest(d: Path) -> dict | None:
    p = d / "manifest.json"
    if not p.is_file():
        return None
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReportError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(m, dict):
        raise ReportError(f"{p}: expected a JSON object")
    return m
