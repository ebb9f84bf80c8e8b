"""Ordered, isolated parallel maps.

``isolated_map`` runs each item in a worker process (pebble), so a parser that segfaults, hangs or
leaks only costs that one item: the caller gets an :class:`ItemFailure` in its place and carries
on. Results come back in input order, so output never depends on the number of workers or on
scheduling. ``workers=1`` still uses one worker process, keeping the same isolation.

Closing a pebble pool waits on its own polling loops (about 0.1 s, idle): a caller with work of
its own to do passes ``closing`` and joins the pool later (:func:`join_all`).
"""

from __future__ import annotations

import concurrent.futures
import gc
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pebble import ProcessExpired, ProcessPool

from pipeline.core.progress import progress

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class ItemFailure:
    """Why one item produced no result: ``kind`` is ``timeout``, ``crash`` or ``error``."""

    kind: str
    message: str


def isolated_map(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    workers: int,
    timeout_s: float | None = None,
    desc: str = "",
    show_progress: bool | str = "auto",
    initializer: Callable[..., Any] | None = None,
    initargs: tuple = (),
    closing: list[threading.Thread] | None = None,
    on_result: Callable[[int, R | ItemFailure], None] | None = None,
) -> list[R | ItemFailure]:
    """Apply ``fn`` to every item in worker processes; results (or failures) in input order.

    ``on_result(i, result)`` is called in the calling process as each item finishes (in the
    order they finish), so the caller can consume results while the workers go on; an exception
    it raises stops the map.

    Without ``closing`` the pool is closed and joined before returning. With it, once every
    result is in, the idle pool is joined in a thread appended to ``closing`` (join it with
    :func:`join_all`): pebble's shutdown sleeps up to 0.1 s in its polling loops, time the
    caller can spend on its own work.
    """
    results: list[R | ItemFailure | None] = [None] * len(items)
    if not items:
        return []
    # max_tasks bounds memory growth in long runs; a crashed worker is replaced by pebble.
    pool = ProcessPool(max_workers=workers, max_tasks=2000, initializer=_start_worker,
                       initargs=(initializer, initargs))
    try:
        futures = {
            pool.schedule(fn, args=(item,), timeout=timeout_s): i for i, item in enumerate(items)
        }
        bar = progress(total=len(items), desc=desc, enabled=show_progress)
        for fut in concurrent.futures.as_completed(futures):
            i = futures[fut]
            try:
                results[i] = fut.result()
            except concurrent.futures.TimeoutError:
                results[i] = ItemFailure("timeout", f"timed out after {timeout_s:g} s")
            except ProcessExpired as e:
                results[i] = ItemFailure("crash", f"worker process died (exit code {e.exitcode})")
            except Exception as e:  # the item's own error, reported in its row
                results[i] = ItemFailure("error", f"{type(e).__name__}: {e}")
            if on_result is not None:
                on_result(i, results[i])  # type: ignore[arg-type]
            bar.update(1)
        bar.close()
    except BaseException:  # interrupted, or on_result raised: pending items are not run
        pool.stop()
        pool.join()
        raise
    pool.close()
    if closing is None:
        pool.join()
    else:  # every task is done: the workers only wait to be stopped
        closing.append(threading.Thread(target=pool.join, name="isolated_map-join"))
        closing[-1].start()
    return results  # type: ignore[return-value]


def join_all(threads: list[threading.Thread]) -> None:
    """Wait for the pools :func:`isolated_map` left closing in ``threads``."""
    for thread in threads:
        thread.join()


def _start_worker(initializer: Callable[..., Any] | None, initargs: tuple) -> None:
    """Worker start: the objects inherited from the parent at fork are never garbage here, so
    the collector is kept off them (``gc.freeze``); otherwise every full collection walks the
    parent's whole heap and touches its pages (copying them). Then the caller's initializer."""
    gc.freeze()
    if initializer is not None:
        initializer(*initargs)


def chunked(items: Sequence[T], size: int) -> list[Sequence[T]]:
    """Split ``items`` into consecutive chunks of at most ``size`` (order kept)."""
    size = max(1, size)
    return [items[i : i + size] for i in range(0, len(items), size)]


def ordered_map(
    fn: Callable[[T], R],
    items: Iterable[T],
    *,
    workers: int,
    desc: str = "",
    show_progress: bool | str = "auto",
    initializer: Callable[..., Any] | None = None,
    initargs: tuple = (),
) -> list[R]:
    """Plain ordered map for trusted work (no isolation needed); in-process when ``workers == 1``.

    Exceptions propagate. Use chunks as items when per-item work is tiny.
    """
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        if initializer is not None:
            initializer(*initargs)
        bar = progress(total=len(items), desc=desc, enabled=show_progress)
        out = []
        for item in items:
            out.append(fn(item))
            bar.update(1)
        bar.close()
        return out
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, initializer=initializer, initargs=initargs
    ) as pool:
        bar = progress(total=len(items), desc=desc, enabled=show_progress)
        out = []
        for r in pool.map(fn, items):
            out.append(r)
            bar.update(1)
        bar.close()
    return out
