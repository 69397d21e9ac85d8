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
