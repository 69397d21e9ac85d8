"""One self-contained HTML page per report: figures embedded as base64 PNG, sortable tables with a
few lines of inline JavaScript, inline CSS; nothing is fetched, so the file opens offline."""

from __future__ import annotations

import base64
import html
import math
import platform
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

_CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1280px;
       padding: 0 1.5em; color: #1b1b1b; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; }
code { background: #f3f3f3; padding: 0 .25em; border-radius: 3px; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: .92em; }
table { border-collapse: collapse; font-size: .88em; margin: 1em 0; }
th, td { border: 1px solid #ddd; padding: .25em .55em; text-align: right; white-space: nowrap; }
th { background: #f6f6f6; position: sticky; top: 0; }
table.sortable th { cursor: pointer; user-select: none; }
th[aria-sort="ascending"]::after { content: " \\25B2"; } th[aria-sort="descending"]::after { content: " \\25BC"; }
td.text, th.text { text-align: left; }
tr.best td { background: #fff6c8; font-weight: 600; }
.meta td { text-align: left; white-space: normal; }
.scroll { overflow-x: auto; }
"""

# Click a header to sort by it (numbers by value, text alphabetically); click again to reverse.
_JS = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  var heads = table.tHead.rows[0].cells;
  Array.prototype.forEach.call(heads, function (th, col) {
    th.addEventListener("click", function () {
      var asc = th.getAttribute("aria-sort") !== "ascending";
      Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", asc ? "ascending" : "descending");
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      function key(row) {
        var cell = row.cells[col], raw = cell.getAttribute("data-value");
        var text = raw !== null ? raw : cell.textContent;
        var num = parseFloat(text);
        return text !== "" && isFinite(num) && /^[-+0-9.eE]+$/.test(text.trim()) ? [0, num] : [1, text];
      }
      rows.sort(function (a, b) {
        var ka = key(a), kb = key(b);
        var c = ka[0] - kb[0] || (ka[1] < kb[1] ? -1 : ka[1] > kb[1] ? 1 : 0);
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  table.setAttribute("data-sortable-ready", "1");
});
// #sort=COLUMN (or #sort=-COLUMN, descending) in the address sorts the first table on opening.
(function () {
  var m = location.hash.match(/sort=(-?)([^&]+)/), table = document.querySelector("table.sortable");
  if (!m || !table) { return; }
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
    if (th.textContent === decodeURIComponent(m[2])) { th.click(); if (m[1]) { th.click(); } }
  });
})();
"""


def versions() -> dict[str, str]:
    """The versions that made a report (kvsim and the libraries its numbers and figures go through)."""
    import matplotlib
    import numpy
    import simpy

    from kvsim.simcore.simulate import KVSIM_VERSION

    return {"kvsim": KVSIM_VERSION, "python": platform.python_version(), "numpy": numpy.__version__,
            "pandas": pd.__version__, "simpy": simpy.__version__, "matplotlib": matplotlib.__version__}


def figure(png: Path, caption: str) -> str:
    """A <figure> with the PNG embedded (base64) and its caption."""
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    alt = html.escape(caption.split(".")[0])
    return (f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _is_missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def table(frame: pd.DataFrame, formats: dict[str, Callable[[Any], str]] | None = None,
          row_class: Sequence[str] | None = None, caption: str = "") -> str:
    """A sortable table: each cell shows its formatted text and keeps its raw value for sorting."""
    formats = formats or {}
    text_cols = {c for c in frame.columns if frame[c].dtype == object or frame[c].dtype == bool}
    head = "".join(f'<th class="text">{html.escape(str(c))}</th>' if c in text_cols
                   else f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for i, row in enumerate(frame.itertuples(index=False)):
        cells = []
        for col, value in zip(frame.columns, row, strict=True):
            shown = "" if _is_missing(value) else formats.get(col, str)(value)
            raw = "" if _is_missing(value) else str(value)
            cls = ' class="text"' if col in text_cols else ""
            cells.append(f'<td{cls} data-value="{html.escape(raw)}">{html.escape(shown)}</td>')
        cls = f' class="{row_class[i]}"' if row_class and row_class[i] else ""
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (f'<div class="scroll"><table class="sortable">{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def meta_table(items: dict[str, str]) -> str:
    """Key / value lines (command, versions, settings) as a small two-column table."""
    rows = "".join(f'<tr><th class="text">{html.escape(k)}</th><td>{v}</td></tr>' for k, v in items.items())
    return f'<table class="meta"><tbody>{rows}</tbody></table>'


def code(text: str) -> str:
    return f"<code>{html.escape(text)}</code>"


def _inline(text: str) -> str:
    """Markdown inline marks we use (`code`, **bold**, [text](link)) on escaped text."""
    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)
    return re.sub(r"\[([^\]]+)\]\(([^)]+)\)", r'<a href="\2">\1</a>', out)


def markdown(text: str) -> str:
    """The small markdown subset our reports write (headings, bullets, pipe tables, paragraphs)."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")), 3)
            out.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append(f"<ul>{''.join(items)}</ul>")
            continue
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(set(c) <= set("-: ") for c in cells):
                    rows.append(cells)
                i += 1
            head = "".join(f"<th>{_inline(c)}</th>" for c in rows[0])
            body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
            out.append(f'<div class="scroll"><table class="sortable"><thead><tr>{head}</tr></thead>'
                       f"<tbody>{body}</tbody></table></div>")
            continue
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


def page(title: str, body: Sequence[str]) -> str:
    """The whole document: inline CSS, the body parts, then the sorting script."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + f"\n<script>{_JS}</script>\n</body></html>\n")


def escape_text(text: str) -> str:
    return html.escape(text)
