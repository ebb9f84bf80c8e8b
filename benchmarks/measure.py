"""Measuring a command the way the benchmarks report it: wall time and peak memory."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil


def run_measured(cmd: list[str], cwd: Path) -> tuple[float, int, int, str]:
    """Run ``cmd`` in ``cwd`` (the venv's bin first on PATH, DVC analytics off); return its wall
    time, the peak memory of its process tree (sum of PSS sampled every 0.1 s, or less often
    when a sample itself takes longer than 1/10 of that: reading PSS walks the page tables, which
    for a process of several GiB costs a noticeable share of a core; forked workers share pages
    with their parent, so a sum of RSS would count those pages twice), the largest
    single-process peak RSS among the children so far, and its output. A failure stops the
    benchmark with the output."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    peak = 0
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    ps = psutil.Process(proc.pid)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            t = time.perf_counter()
            total = 0
            try:
                for p in [ps, *ps.children(recursive=True)]:
                    info = p.memory_full_info()
                    total += getattr(info, "pss", info.rss)
            except psutil.Error:
                pass
            peak = max(peak, total)
            time.sleep(max(0.1, 10 * (time.perf_counter() - t)))

    th = threading.Thread(target=sample)
    th.start()
    out, _ = proc.communicate()
    done.set()
    th.join()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out}")
    max_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: KiB
    return time.perf_counter() - t0, peak, max_rss, out
