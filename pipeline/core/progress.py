"""Progress bars that never touch artifacts: tqdm on stderr, shown only on a terminal by default."""

from __future__ import annotations

import sys

from tqdm import tqdm


def progress(total: int, desc: str = "", enabled: bool | str = "auto") -> tqdm:
    if enabled == "auto":
        enabled = sys.stderr.isatty()
    return tqdm(
        total=total,
        desc=desc,
        disable=not enabled,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.5,
    )
