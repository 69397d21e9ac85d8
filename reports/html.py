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
th { background: #f6f6f6; position: sticky; top: 0; white-space: normal; min-width: 3.5em; vertical-align: bottom; }
th.key, td.key { position: sticky; left: 0; z-index: 1; background: #fff; }
th.key { z-index: 2; background: #f6f6f6; } td.key { font-weight: 600; }
td.wrap { white-space: normal; min-width: 9em; }
tr.ruled td { color: #777; } tr.ruled td.key { font-weight: normal; }
pre.serve { background: #f3f3f3; padding: .5em .8em; white-space: pre-wrap; overflow-wrap: anywhere; margin: .3em 0; }
.answer p { margin: .3em 0; }
.ci { display: block; font-size: .8em; color: #666; font-weight: normal; white-space: normal; }
table.md td { white-space: normal; } table.md td.key { white-space: nowrap; }
tr.overloaded td { background: repeating-linear-gradient(135deg, #f1f1f1 0 6px, #e4e4e4 6px 12px); color: #666; }
tr.overloaded td.key { background: #e9e9e9; }
.mark { color: #b22222; font-weight: 600; }
.answer { font-size: 1.08em; background: #f4f8ff; border-left: 4px solid #3b6fd4; padding: .6em 1em; }
.constants { color: #333; font-size: .92em; margin: .6em 0 .2em; }
.constants b { color: #1b1b1b; }
.note { color: #555; font-size: .92em; }
table.sortable th { cursor: pointer; user-select: none; }
th[aria-sort="ascending"]::after { content: " \\25B2"; } th[aria-sort="descending"]::after { content: " \\25BC"; }
td.text, th.text { text-align: left; }
tr.best td { background: #fff6c8; font-weight: 600; }
.meta td { text-align: left; white-space: normal; }
.scroll { overflow-x: auto; max-width: 100%; }
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
// Sticky key columns (the settings a row stands for) stay at the left edge while the rest scrolls:
// each one's offset is the width of the key columns before it.
document.querySelectorAll("table.sortable").forEach(function (table) {
  var first = table.tHead.rows[0].cells, left = 0;
  for (var c = 0; c < first.length && first[c].classList.contains("key"); c++) {
    Array.prototype.forEach.call(table.rows, function (row) { if (row.cells[c]) { row.cells[c].style.left = left + "px"; } });
    left += first[c].getBoundingClientRect().width;
  }
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


def number(value: Any) -> str:
    """A number rounded to what it can mean: whole numbers with thousands separators, otherwise
    about four significant digits (1,575.9 / 18.4 / 0.736), never a 16-digit float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    v = float(value)
    if not math.isfinite(v):
        return str(v)
    size = abs(v)
    if size >= 100:
        return f"{v:,.1f}" if size < 10_000 else f"{v:,.0f}"
    if size >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _plain_value(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def constant_columns(frame: pd.DataFrame, keep: Sequence[str] = ()) -> dict[str, Any]:
    """Columns holding one value in every row (None: empty in every row), except those in `keep`;
    a table of one row has none (every column would be "constant")."""
    if len(frame) < 2:
        return {}
    out: dict[str, Any] = {}
    for col in frame.columns:
        if col in keep:
            continue
        values = frame[col]
        if values.isna().all():
            out[col] = None
        elif values.notna().all() and values.map(lambda v: repr(_plain_value(v))).nunique() == 1:
            out[col] = _plain_value(values.iloc[0])
    return out


def constants_header(constants: dict[str, Any], formats: dict[str, Callable[[Any], str]] | None = None) -> str:
    """The settings every row shares, as one line above the table (so the table shows what varies)."""
    formats = formats or {}
    shown = [f"{html.escape(str(k))} <b>{html.escape(formats.get(k, number)(v))}</b>"
             for k, v in constants.items() if v is not None]
    empty = [html.escape(str(k)) for k, v in constants.items() if v is None]
    parts = []
    if shown:
        parts.append("<b>Same in every row:</b> " + " &middot; ".join(shown))
    if empty:
        parts.append("<b>empty in every row:</b> " + ", ".join(empty))
    return f'<p class="constants">{"; ".join(parts)}</p>' if parts else ""


def _head_text(name: str) -> str:
    """A column name that may wrap after its underscores (narrower tables)."""
    return "_<wbr>".join(html.escape(part) for part in name.split("_"))


def table(frame: pd.DataFrame, formats: dict[str, Callable[[Any], str]] | None = None,
          row_class: Sequence[str] | None = None, caption: str = "", key: Sequence[str] = (),
          lift_constants: bool = True, wrap: Sequence[str] = (),
          below: dict[str, Sequence[str]] | None = None) -> str:
    """A sortable table: each cell shows its formatted text (numbers rounded by `number` unless
    `formats` says otherwise) and keeps its raw value for sorting. Columns with one value in every
    row go to a line above it (`lift_constants`); the `key` columns come first and stay visible
    at the left edge when the table scrolls sideways; `wrap` columns (long text) may wrap; `below`
    (column -> a text per row) adds a small second line to a cell (a 95% interval under its mean)."""
    formats = formats or {}
    below = below or {}
    constants = constant_columns(frame, keep=[*key, *below]) if lift_constants else {}
    frame = frame[[c for c in key if c in frame.columns]
                  + [c for c in frame.columns if c not in constants and c not in key]]
    text_cols = {c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])
                 or pd.api.types.is_bool_dtype(frame[c])}

    def classes(col: str) -> str:
        names = (["key"] if col in key else []) + (["text"] if col in text_cols else []) + (
            ["wrap"] if col in wrap else [])
        return f' class="{" ".join(names)}"' if names else ""

    head = "".join(f"<th{classes(c)}>{_head_text(str(c))}</th>" for c in frame.columns)
    body = []
    for i, row in enumerate(frame.itertuples(index=False)):
        cells = []
        for col, value in zip(frame.columns, row, strict=True):
            value = _plain_value(value)
            shown = "" if _is_missing(value) else formats.get(col, number)(value)
            raw = "" if _is_missing(value) else str(value)
            extra = below[col][i] if col in below else ""
            extra = f'<span class="ci">{html.escape(extra)}</span>' if extra and shown else ""
            cells.append(f'<td{classes(col)} data-value="{html.escape(raw)}">{html.escape(shown)}{extra}</td>')
        cls = f' class="{row_class[i]}"' if row_class and row_class[i] else ""
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (constants_header(constants, formats) +
            f'<div class="scroll"><table class="sortable">{cap}<thead><tr>{head}</tr></thead>'
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


def markdown(text: str, key_columns: int = 1) -> str:
    """The small markdown subset our reports write (headings, bullets, pipe tables, paragraphs);
    a table's first `key_columns` columns stay visible when it scrolls sideways, its cells wrap."""
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
            def cell(tag: str, j: int, text: str) -> str:
                return f'<{tag} class="key">{_inline(text)}</{tag}>' if j < key_columns else f"<{tag}>{_inline(text)}</{tag}>"

            head = "".join(cell("th", j, c) for j, c in enumerate(rows[0]))
            body = "".join("<tr>" + "".join(cell("td", j, c) for j, c in enumerate(r)) + "</tr>" for r in rows[1:])
            out.append(f'<div class="scroll"><table class="sortable md"><thead><tr>{head}</tr></thead>'
                       f"<tbody>{body}</tbody></table></div>")
            continue
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


def page(title: str, body: Sequence[str]) -> str:
    """The whole document: inline CSS, the body parts, then the sorting script. A path that is not
    UTF-8 (its bytes decoded as surrogates) shows escaped, so the page can be written as UTF-8."""
    text = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + f"\n<script>{_JS}</script>\n</body></html>\n")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def escape_text(text: str) -> str:
    return html.escape(text)
