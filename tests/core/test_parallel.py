"""Isolated parallel maps: order, failures, and pools left closing for the caller to join."""

from __future__ import annotations

import multiprocessing

import pytest

from pipeline.core.parallel import ItemFailure, isolated_map, join_all


def square_or_fail(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    return x * x


@pytest.mark.parametrize("workers", [1, 2])
def test_closing_gives_the_same_results_and_leaves_no_worker(workers):
    items = list(range(9))
    plain = isolated_map(square_or_fail, items, workers=workers, show_progress=False)
    closing = []
    late = isolated_map(square_or_fail, items, workers=workers, show_progress=False,
                        closing=closing)
    assert late == plain
    assert late[:3] == [0, 1, 4] and late[4:] == [x * x for x in items[4:]]
    assert late[3] == ItemFailure("error", "ValueError: three")
    assert len(closing) == 1
    join_all(closing)
    assert not closing[0].is_alive()
    assert multiprocessing.active_children() == []  # the pool's workers have exited


def test_closing_pools_accumulate_in_one_list():
    closing = []
    first = isolated_map(abs, [-1, -2], workers=2,
                         show_progress=False, closing=closing)
    second = isolated_map(abs, [-3], workers=1, show_progress=False, closing=closing)
    join_all(closing)
    assert (first, second, len(closing)) == ([1, 2], [3], 2)
    assert multiprocessing.active_children() == []


def test_no_items_start_no_pool():
    closing = []
    assert isolated_map(abs, [], workers=2, closing=closing) == []
    assert closing == []


def slow_square(x: int) -> int:
    import time

    time.sleep(0.05 * x)
    return x * x


def test_on_result_sees_each_item_as_it_finishes():
    seen = []
    out = isolated_map(square_or_fail, list(range(6)), workers=2, show_progress=False,
                       on_result=lambda i, r: seen.append((i, r)))
    assert sorted(seen, key=lambda p: p[0]) == list(enumerate(out))
    assert (3, ItemFailure("error", "ValueError: three")) in seen


def test_an_error_in_on_result_stops_the_map():
    def stop(i, r):
        raise RuntimeError(f"stop at {i}")

    with pytest.raises(RuntimeError, match="stop at"):
        isolated_map(slow_square, [0, 20, 20, 20], workers=1, show_progress=False, on_result=stop)
    assert multiprocessing.active_children() == []  # the pending items were not run
