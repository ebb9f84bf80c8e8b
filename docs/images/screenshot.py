"""Re-make docs/images/report-first-screen.png, the README's picture of the report: the first
screen of reports/report.html, rendered by headless Chromium exactly as tests/test_browser.py
renders it (same binary, window size and flags, from tests/browser.py).

    make screenshot        # or: .venv/bin/python docs/images/screenshot.py [--page P] [--out F]

Run it after the report changes. The picture is documentation, not an artifact of the
experiment: fonts and Chromium versions change its pixels, never the report.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.browser import HEIGHT, WIDTH, chromium

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's header chunk; ValueError when ``data`` is not a PNG."""
    if data[:8] != PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def screenshot(page: Path, out: Path) -> tuple[int, int]:
    """Write the first screen of ``page`` to ``out`` (PNG); return its (width, height)."""
    if not page.is_file():
        raise SystemExit(f"screenshot: {page} does not exist: run `make repro` (stage report)")
    with tempfile.TemporaryDirectory() as tmp:
        shot = Path(tmp) / "screen.png"
        done = chromium(page, Path(tmp) / "chromium", f"--screenshot={shot}")
        if not shot.is_file():
            raise SystemExit(f"screenshot: Chromium wrote no picture (exit {done.returncode}): "
                             f"{done.stderr[-800:]}")
        data = shot.read_bytes()
    size = png_size(data)
    if size != (WIDTH, HEIGHT):
        raise SystemExit(f"screenshot: Chromium drew {size[0]} x {size[1]} px, not the "
                         f"{WIDTH} x {HEIGHT} window of tests/test_browser.py")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page", type=Path, default=ROOT / "reports" / "report.html")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "docs" / "images" / "report-first-screen.png")
    args = parser.parse_args(argv)
    width, height = screenshot(args.page, args.out)
    print(f"screenshot: {args.out} ({width} x {height} px, {args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
