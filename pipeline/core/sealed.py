"""The raw reader of test rows, which only :mod:`pipeline.decision.looks` may import.

Every scoring of test pieces spends the test set, so every symkit path that reads test rows to
score them goes through :mod:`pipeline.decision.looks`, which records the look in the
test-access ledger before it hands the rows over. This module is what it reads them with; an
import-linter ``forbidden`` contract in ``pyproject.toml`` keeps every other module from
importing it, and :func:`pipeline.tokens.contract.read_tokens` refuses the test split.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from pipeline.core.artifacts import read_parquet

TEST = "test"


def select_test(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``table`` whose ``split`` is test, sorted by (sha256, track) where present."""
    rows = table[table["split"] == TEST]
    keys = [c for c in ("sha256", "track") if c in rows.columns]
    return (rows.sort_values(keys, kind="stable") if keys else rows).reset_index(drop=True)


def read_test_tokens(path: Path | str, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """The test rows of a token table (``columns`` must include ``split``)."""
    return select_test(read_parquet(path, columns=list(columns) if columns is not None else None))
