"""The report page as blocks (headings, text, tables, images, notes) and its two renderings: one self-contained
HTML file (images inline as base64 PNG, no script, no external link) and Markdown (images as files beside it).
"""
from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .files import atomic_write

IMAGES_DIR = "report_files"


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Text:
    text: str


@dataclass
class Note:
    """Something the report could not show and why (a skipped plot, a missing file)."""
    text: str


@dataclass
class Table:
    columns: list[str]
    rows: list[list[Any]]
    caption: str = ""


@dataclass
class Image:
    name: str          # file stem, unique in the page
    png: bytes
    caption: str
    alt: str = ""


@dataclass
class Pre:
    summary: str
    text: str


Block = Heading | Text | Note | Table | Image | Pre

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1200px;margin:1.5em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.6em;border-bottom:2px solid #ddd;padding-bottom:.2em}h2{font-size:1.25em;margin-top:1.8em;
border-bottom:1px solid #eee}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right;white-space:nowrap}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
caption{text-align:left;font-size:.95em;color:#555;padding-bottom:.3em}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85em;color:#555;margin-top:.3em}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.4em .8em;font-size:.9em;margin:.6em 0}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.8em}
"""


def cell(v: Any) -> str:
    """A table cell: empty for missing, 4 significant digits for floats."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def to_html(title: str, blocks: Sequence[Block]) -> str:
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{e(title)}</title><style>{_CSS}</style></head><body>", f"<h1>{e(title)}</h1>"]
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"<h{b.level}>{e(b.text)}</h{b.level}>")
        elif isinstance(b, Text):
            out.append(f"<p>{e(b.text)}</p>")
        elif isinstance(b, Note):
            out.append(f'<p class="note">{e(b.text)}</p>')
        elif isinstance(b, Table):
            head = "".join(f"<th>{e(c)}</th>" for c in b.columns)
            body = "".join("<tr>" + "".join(f"<td>{e(cell(v))}</td>" for v in r) + "</tr>" for r in b.rows)
            cap = f"<caption>{e(b.caption)}</caption>" if b.caption else ""
            out.append(f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif isinstance(b, Image):
            data = base64.b64encode(b.png).decode("ascii")
            out.append(f'<figure id="{e(b.name)}"><img src="data:image/png;base64,{data}" '
                       f'alt="{e(b.alt or b.caption)}"><figcaption>{e(b.caption)}</figcaption></figure>')
        elif isinstance(b, Pre):
            out.append(f"<details><summary>{e(b.summary)}</summary><pre>{e(b.text)}</pre></details>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def to_markdown(title: str, blocks: Sequence[Block]) -> str:
    out = [f"# {title}", ""]
    for b in blocks:
        if isinstance(b, Heading):
            out += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Text):
            out += [b.text, ""]
        elif isinstance(b, Note):
            out += [f"> **Not shown:** {b.text}", ""]
        elif isinstance(b, Table):
            if b.caption:
                out += [f"*{b.caption}*", ""]
            out.append("| " + " | ".join(_md_escape(c) for c in b.columns) + " |")
            out.append("|" + "---|" * len(b.columns))
            out += ["| " + " | ".join(_md_escape(cell(v)) for v in r) + " |" for r in b.rows]
            out.append("")
        elif isinstance(b, Image):
            out += [f"![{b.alt or b.caption}]({IMAGES_DIR}/{b.name}.png)", "", f"*{b.caption}*", ""]
        elif isinstance(b, Pre):
            out += [f"<details><summary>{b.summary}</summary>", "", "```", b.text, "```", "", "</details>", ""]
    return "\n".join(out)


def write(d: Path, title: str, blocks: Sequence[Block]) -> tuple[Path, Path]:
    """Write ``report.html`` and ``report.md`` (+ ``report_files/*.png``, older images there removed)."""
    imgs = d / IMAGES_DIR
    names = {f"{b.name}.png" for b in blocks if isinstance(b, Image)}
    for b in blocks:
        if isinstance(b, Image):
            atomic_write(imgs / f"{b.name}.png", lambda fh, b=b: fh.write(b.png), binary=True)
    if imgs.is_dir():
        for old in imgs.glob("*.png"):
            if old.name not in names:
                old.unlink()
    md = atomic_write(d / "report.md", lambda fh: fh.write(to_markdown(title, blocks)))
    page = to_html(title, blocks)
    h = atomic_write(d / "report.html", lambda fh: fh.write(page))
    return h, md
