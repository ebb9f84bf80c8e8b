"""Headless Chromium as both the browser test (``tests/test_browser.py``) and the README's
screenshot (``docs/images/screenshot.py``) run it: one binary, one window size, one set of flags,
so the screenshot shows the first screen the test checks.

``CHROMIUM`` is the first of ``chromium``, ``chromium-browser`` and ``google-chrome`` on the
path, or None (the Debian package is ``chromium``; ``.ci/run`` installs it when it can).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                        "google-chrome")) if p), None)
WIDTH, HEIGHT = 1280, 900
# --virtual-time-budget lets the page's images and audio load before the DOM or screen is taken.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=5000")
# No network for a page that must draw offline: no host name resolves and every request goes
# through a proxy on a closed port (file:// pages still load).
OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9")


def chromium(page: Path, profile: Path, *action: str,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on ``page`` with ``action`` (``--dump-dom``, ``--screenshot=FILE``).

    ``profile`` is a fresh folder for Chromium's user data, so no state leaks between runs. The
    exit status is returned, not checked: the caller says what it expected.
    """
    if CHROMIUM is None:
        raise RuntimeError("headless Chromium is not installed (Debian: apt-get install chromium)")
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *action, page.resolve().as_uri()],
        capture_output=True, text=True, timeout=timeout, check=False)
