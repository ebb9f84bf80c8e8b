"""Peak resident memory of this process over a block of code, measured by a sampling thread.

On glibc, freed tensors above the mmap threshold return to the system at once; run with
``MALLOC_MMAP_THRESHOLD_=131072`` (:data:`FIXED_MMAP`) and RSS follows the tensors alive instead
of what the allocator keeps, which is what the memory estimate (``symkit estimate``) models.
"""

from __future__ import annotations

import threading
import time

import psutil

FIXED_MMAP = "MALLOC_MMAP_THRESHOLD_=131072"
"""glibc environment setting: every block of 128 KiB or more is its own mapping, returned to the
OS when freed (by default the threshold grows after frees and freed blocks stay resident), so
RSS follows the live tensors."""


class PeakRSS:
    """``with PeakRSS() as rss: ...``; then ``rss.peak`` and ``rss.delta`` (peak minus RSS at
    entry) in bytes. Samples every ``interval`` seconds, so a peak shorter than that may be
    missed."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval

    def __enter__(self) -> PeakRSS:
        self.proc = psutil.Process()
        self.start = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def delta(self) -> int:
        return self.peak - self.start
