"""Row groups of Parquet files read on demand and held within a memory limit.

A stage that reads a large store's rows in the order the store holds them (ingest's cached
notes through :meth:`pipeline.core.segments.SegmentStore.take`, tokenize's entries through
:class:`pipeline.tokens.store.Entries`) reads each row group once and holds a few, whatever the
store's size.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HELD_BYTES = 256 << 20
"""Most bytes of row groups a :class:`RowGroups` holds at once."""


OPEN_FILES = 32
"""Most files a :class:`RowGroups` keeps open (a file's footer is parsed once while it is)."""


class RowGroups:
    """Row groups of Parquet files read on demand and held, least recently used let go first
    once they pass ``HELD_BYTES``: reading rows in the order a file holds them reads each row
    group once, and memory stays a few row groups whatever the file's size. Files stay open
    (``OPEN_FILES`` at most): a segment appended in small chunks has thousands of row groups,
    and parsing its footer for each of them cost 30 s at 100,000 pieces."""

    def __init__(self) -> None:
        self._files: OrderedDict[Path, tuple[pq.ParquetFile, list[int]]] = OrderedDict()
        self._held: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
        self._bytes = 0

    def _file(self, path: Path) -> tuple[pq.ParquetFile, list[int]]:
        """The open file and the first row of each of its row groups (then its row count)."""
        if path in self._files:
            self._files.move_to_end(path)
        else:
            f = pq.ParquetFile(path)
            meta = f.metadata
            self._files[path] = f, np.cumsum([0] + [meta.row_group(g).num_rows
                                                    for g in range(meta.num_row_groups)]
                                             ).tolist()
            if len(self._files) > OPEN_FILES:
                self._files.popitem(last=False)[1][0].close()
        return self._files[path]

    def row(self, path: Path, row: int, columns: list[str],
            convert: Callable[[pa.Table], Any] | None = None) -> tuple[Any, int]:
        """The row group of ``path`` holding ``row`` (``columns`` of it, passed through
        ``convert`` when given, once per read) and the row's position in it."""
        f, starts = self._file(path)
        g = bisect.bisect_right(starts, row) - 1  # per row: numpy's cost per call was 3 us
        if not 0 <= g < len(starts) - 1:
            raise IndexError(f"row {row} is not in {path.name}")
        key = (path, g, tuple(columns))
        if key in self._held:
            self._held.move_to_end(key)
        else:
            table = f.read_row_group(g, columns=columns)
            self._held[key] = (convert(table) if convert else table), table.nbytes
            self._bytes += table.nbytes
            self._let_go()
        return self._held[key][0], row - starts[g]

    def hold(self, path: Path, group: int, columns: list[str], value: Any, nbytes: int) -> None:
        """Hold ``value``, read elsewhere, as :meth:`row` would hold row group ``group`` of
        ``path`` (``columns`` of it, converted)."""
        key = (path, group, tuple(columns))
        if key in self._held:
            self._bytes -= self._held[key][1]
        self._held[key] = value, nbytes
        self._held.move_to_end(key)
        self._bytes += nbytes
        self._let_go()

    def _let_go(self) -> None:
        while self._bytes > HELD_BYTES and len(self._held) > 1:
            _, (_, n) = self._held.popitem(last=False)
            self._bytes -= n

    def clear(self) -> None:
        """Let go of held row groups and close the files."""
        self._held.clear()
        self._bytes = 0
        for f, _ in self._files.values():
            f.close()
        self._files.clear()
