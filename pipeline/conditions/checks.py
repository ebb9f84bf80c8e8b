"""``symkit doctor``'s conditioning checks: is each piece's condition its own, and do the
conditions together tell the model more than they should?

- :func:`check_alignment`: re-measures the note conditions (key, mode, density, polyphony) of a
  seeded sample of pieces from ``data/notes.parquet`` and compares them with the condition
  table. A mismatch means the table's rows are attached to other pieces (or were measured with
  other bands): a conditioned model would then learn, and be scored on, wrong labels.
- :func:`check_combination`: the conditions in ``condition.use`` are refused one by one when a
  label identifies groups (the conditions stage); together they can still do it (key × density ×
  polyphony × meter can name a work). Fails when over half of the labelled train pieces carry a
  combination of labels found in one group only, the stage's rule applied to the combination.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from pipeline.conditions.adherence import FROM_NOTES, measured_labels
from pipeline.conditions.config import ConditionConfig
from pipeline.conditions.table import GROUP_SHARE_LIMIT, group_unique_share


def check_alignment(table: pd.DataFrame, notes: Path, cfg: ConditionConfig, *,
                    max_pieces: int = 50, seed: int = 0) -> tuple[bool, str]:
    """(ok, detail): the table's note labels equal those re-measured from each piece's notes."""
    have = table["sha256"].astype(str).tolist()
    if not have:
        return False, "the condition table lists no piece"
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(have, size=min(max_pieces, len(have)), replace=False).tolist())
    cols = ["sha256", "onset", "duration", "pitch", "is_drum"]
    rows = pq.read_table(notes, columns=cols, filters=[("sha256", "in", chosen)]).to_pylist()
    by_sha = {r["sha256"]: r for r in rows}
    own = table.set_index("sha256")
    wrong = []
    for sha in chosen:
        r = by_sha.get(sha)
        notes_of = None if r is None else {k: np.asarray(r[k]) for k in cols[1:]}
        measured = measured_labels(notes_of, cfg)
        for name in FROM_NOTES:
            want = own.at[sha, name] if name in own.columns else None
            want = None if want is None or (isinstance(want, float) and np.isnan(want)) else want
            if measured.get(name) != want:
                wrong.append(f"{sha[:12]} {name}: table {want!r}, notes {measured.get(name)!r}")
    detail = (f"{len(chosen)} pieces re-measured from their notes ({', '.join(FROM_NOTES)}): "
              f"{len(wrong)} labels differ")
    return not wrong, detail + ("" if not wrong else "; e.g. " + "; ".join(wrong[:3]))


def check_combination(table: pd.DataFrame, splits: pd.DataFrame,
                      names: Sequence[str]) -> tuple[bool, str]:
    """(ok, detail): the labels of ``names`` taken together do not identify train groups."""
    train = table[table["split"] == "train"].merge(splits[["sha256", "group_id"]], on="sha256")
    combo: list[Any] = []
    for _, r in train.iterrows():
        labels = [r.get(n) for n in names]
        if all(v is None or (isinstance(v, float) and np.isnan(v)) for v in labels):
            combo.append(None)
        else:
            combo.append(" | ".join("" if v is None or (isinstance(v, float) and np.isnan(v))
                                    else str(v) for v in labels))
    share = group_unique_share(combo, train["group_id"].astype(str).tolist())
    groups = train["group_id"].nunique()
    if share is None:
        return True, f"no train piece has a label for {list(names)}"
    ok = groups < 2 or share <= GROUP_SHARE_LIMIT
    return ok, (f"{list(names)} together: {share:.1%} of labelled train pieces carry a "
                f"combination found in one of {groups} groups only (limit "
                f"{GROUP_SHARE_LIMIT:.0%})" + ("" if ok else "; the combination identifies "
                                               "groups: drop a condition from condition.use"))
