"""Rendering a report page in headless Chromium (Debian package `chromium`) for the tests; a test
that needs it is skipped, with the reason, where no Chromium is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def render(page: Path, fragment: str = "", screenshot: Path | None = None) -> tuple[str, str]:
    """(DOM after scripts ran, browser log) of a local page in headless Chromium."""
    browser = chromium()
    if browser is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium)")
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--enable-logging=stderr", "--v=0", "--window-size=1300,2400"]
    args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    done = subprocess.run(args + [page.as_uri() + fragment], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def console_errors(log: str) -> list[str]:
    """Lines where the page itself spoke: any console message (our pages log nothing, so a
    console.error or an uncaught exception shows here) or a failed load; not the browser's own
    noise about D-Bus or GPUs."""
    return [line for line in log.splitlines() if ":CONSOLE" in line or "Uncaught" in line or "net::ERR" in line]


_MEASURE = """
<script>
window.addEventListener("load", function () {
  var doc = document.documentElement, out = {viewport: window.innerWidth, page: doc.scrollWidth, tables: []};
  document.querySelectorAll("table").forEach(function (t) {
    var box = t.closest(".scroll"), r = t.getBoundingClientRect(), row = {
      cls: t.className, width: t.scrollWidth, right: r.right, container: box ? box.clientWidth : null,
      keys: t.tHead ? Array.prototype.filter.call(t.tHead.rows[0].cells, function (c) {
        return c.classList.contains("key"); }).map(function (c) { return c.textContent; }) : [],
      keys_visible_scrolled: null};
    if (box && t.tHead) {  // scrolled all the way right: are the key columns still inside the box?
      box.scrollLeft = box.scrollWidth;
      var edge = box.getBoundingClientRect();
      row.keys_visible_scrolled = Array.prototype.every.call(t.tHead.rows[0].cells, function (c) {
        if (!c.classList.contains("key")) { return true; }
        var k = c.getBoundingClientRect();
        return k.left >= edge.left - 1 && k.right <= edge.right + 1;
      });
      box.scrollLeft = 0;
    }
    out.tables.push(row);
  });
  document.querySelectorAll("img").forEach(function (im) {
    out.images = out.images || [];
    out.images.push({right: im.getBoundingClientRect().right, width: im.clientWidth, natural: im.naturalWidth});
  });
  var pre = document.createElement("pre");
  pre.id = "kvsim-measure";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def measure(page: Path, tmp: Path, width: int = 1280) -> dict:
    """Layout facts of a page at a `width`-pixel wide viewport, measured by Chromium itself: the
    viewport, the document's scroll width, and per table its scroll width, its right edge, its
    scroll container's width (None when it has none), its key columns' names and whether they
    stay inside the container when it is scrolled all the way right."""
    import json
    import re

    browser = chromium()
    if browser is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium)")
    copy = tmp / f"measure-{page.name}"
    copy.write_text(page.read_text().replace("</body>", _MEASURE + "</body>"))
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--window-size={width},1000", "--dump-dom", copy.as_uri()]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="kvsim-measure">(.*?)</pre>', done.stdout, re.S)
    assert found, "the measuring script did not run"
    import html

    return json.loads(html.unescape(found.group(1)))
