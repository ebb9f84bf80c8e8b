"""What several sections of the report share: a stage report's values folded away, value counts
as table rows, and the "not available" note."""

from __future__ import annotations

from typing import Any

import pandas as pd

from pipeline.decision.metrics import flatten
from pipeline.render.document import NA, Details, Document, Para, Table, fmt


def kv_rows(obj: Any, prefix: str, digits: int, limit: int = 200) -> list[list[str]]:
    flat = flatten(obj, prefix) if obj is not None else {}
    return [[k, fmt(v, digits)] for k, v in list(flat.items())[:limit]]


def not_available(doc: Document, what: str) -> None:
    doc.add(Para(f"{what}: {NA}.", "note"))


def kv_block(obj: Any, stem: str, digits: int) -> Details | Para:
    """A stage report's every value, folded away under a one-line summary (reference material,
    not reading matter), or a "not available" note."""
    rows = kv_rows(obj, stem, digits)
    return Details(f"Every value in reports/{stem}.json ({len(rows)})",
                   [Table(["key", "value"], rows)]) if rows else \
        Para(f"reports/{stem}.json: {NA}.", "note")


def count_rows(df: pd.DataFrame | None, col: str) -> list[list[str]]:
    if df is None or col not in df.columns:
        return []
    vc = df[col].fillna("").astype(str).value_counts()
    return [[k or "(none)", str(int(vc[k]))] for k in sorted(vc.index)]
