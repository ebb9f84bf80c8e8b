"""pipeline.core.memory: the peak resident memory of a block, sampled by a thread."""

from __future__ import annotations

import re

import numpy as np

from pipeline.core.memory import FIXED_MMAP, PeakRSS

MB = 1 << 20


def test_memory_held_at_the_end_of_the_block_is_in_the_peak():
    with PeakRSS() as rss:
        block = np.ones(200 * MB // 8)  # 200 MB, every page written
    assert block[-1] == 1.0
    assert rss.delta >= 150 * MB
    assert rss.delta == rss.peak - rss.start
    assert not rss._thread.is_alive()  # the sampler stops with the block


def test_an_empty_block_measures_no_growth_to_speak_of():
    with PeakRSS(interval=0.001) as rss:
        pass
    assert rss.peak >= rss.start > 0
    assert 0 <= rss.delta < 100 * MB


def test_the_allocator_setting_is_one_environment_assignment():
    name, _, value = FIXED_MMAP.partition("=")
    assert re.fullmatch(r"MALLOC_\w+_", name) and int(value) == 128 * 1024
