"""Debian's Chromium for Playwright: the benchmarks and the browser tests launch it the
same way (Playwright's own browser download is not available here)."""

from __future__ import annotations

import os
import shutil

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    """CHROMIUM, or the chromium on PATH."""
    path = os.environ.get("CHROMIUM") or shutil.which("chromium")
    if not path:
        raise RuntimeError("a real browser is needed: apt-get install chromium "
                           "(.ci/run installs it), or set CHROMIUM to its path")
    return path
