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
- :func:`check_target_information`: a metadata condition (composer, collection) comes from
  outside the notes; one that the piece's own notes decide (the final pitch, the range) tells
  the model about the notes it is scored on, beyond the declared note conditions. Fails when a
  classifier reads the label from the notes of held-out groups nearly always, and clearly more
  often than from the declared conditions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from pipeline.conditions.config import BUILTIN, ConditionConfig
from pipeline.conditions.table import (
    FROM_NOTES,
    GROUP_SHARE_LIMIT,
    group_unique_share,
    measured_labels,
)


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


TARGET_ACCURACY = 0.95
"""A metadata label read from the piece's own notes at least this often (held-out groups) is
treated as a function of the notes: a label the notes decide up to one piece in twenty (a data
error, an ambiguous piece) is, for the model, a summary of the notes it predicts."""

TARGET_MARGIN = 0.10
"""... and read that much more often than the declared conditions (or the most common label)
read it: below that the notes add nothing the declared conditions do not already say."""

def note_descriptors(notes: Mapping[str, np.ndarray]) -> np.ndarray:
    """A piece's notes summarised as numbers a label computed from them would likely use: size,
    span, range, first and last pitches (lowest and highest at the first and last onsets) and
    their pitch classes, mean pitch and duration, and the duration-weighted pitch-class
    profile (12). Drum notes are left out; an empty piece is all zeros."""
    keep = ~np.asarray(notes["is_drum"], dtype=bool)
    onset = np.asarray(notes["onset"], dtype=float)[keep]
    dur = np.asarray(notes["duration"], dtype=float)[keep]
    pitch = np.asarray(notes["pitch"], dtype=float)[keep]
    if len(pitch) == 0:
        return np.zeros(29)
    first, last = onset == onset.min(), onset == onset.max()
    ends = [pitch[first].min(), pitch[first].max(), pitch[last].min(), pitch[last].max()]
    pcp = np.bincount(pitch.astype(int) % 12, weights=np.maximum(dur, 1e-9), minlength=12)
    return np.array([len(pitch), float((onset + dur).max() - onset.min()), pitch.min(),
                     pitch.max(), pitch.max() - pitch.min(), pitch.mean(), dur.mean(), *ends,
                     *[e % 12 for e in ends], *(pcp / pcp.sum())])


def _held_out_accuracy(x: np.ndarray, y: np.ndarray, groups: np.ndarray, seed: int,
                       model: Any = None) -> float:
    """Accuracy on held-out groups (group k-fold, at most 5 folds) of ``model``, by default a
    seeded random forest whose every split may choose among all features."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.model_selection import GroupKFold, cross_val_score

    if model is None:
        model = RandomForestClassifier(n_estimators=50, max_features=None, random_state=seed,
                                       n_jobs=1)
    folds = GroupKFold(n_splits=min(5, len(np.unique(groups))))
    return float(cross_val_score(model, x, y, groups=groups, cv=folds).mean())


def check_target_information(table: pd.DataFrame, notes: Path, splits: pd.DataFrame,
                             names: Sequence[str], *, max_pieces: int = 2000,
                             seed: int = 0) -> tuple[bool, str]:
    """(ok, detail): no metadata condition in ``names`` is a function of the notes beyond what
    the declared conditions say.

    A metadata column enters as information from outside the notes (who wrote it, which
    collection). One computed from the notes (the final pitch, the range, the length) tells
    the model about the very notes it is scored on, and the n-gram beside it is not told.
    For each metadata condition in use, a random forest reads the label from
    :func:`note_descriptors` of each labelled piece, and another from the declared conditions
    (:data:`~pipeline.conditions.config.BUILTIN`), both scored on held-out groups; fails when
    the notes give the label at least :data:`TARGET_ACCURACY` of the time and
    :data:`TARGET_MARGIN` more often than both the declared conditions and the most common label
    do. Built-in conditions are declared functions of the notes (``check_alignment`` checks
    that they are exactly those)."""
    metadata = [n for n in names if n not in BUILTIN]
    if not metadata:
        return True, f"{list(names)}: no metadata condition (built-in ones are declared)"
    table = table.merge(splits[["sha256", "group_id"]], on="sha256")
    lines, bad = [], []
    for name in metadata:
        rows = table[table[name].notna()] if name in table.columns else table.iloc[:0]
        if len(rows) > max_pieces:
            rows = rows.sample(n=max_pieces, random_state=seed).sort_values("sha256")
        y = rows[name].astype(str).to_numpy() if len(rows) else np.array([])
        groups = rows["group_id"].astype(str).to_numpy() if len(rows) else np.array([])
        if len(set(y)) < 2 or len(set(groups)) < 2:
            lines.append(f"{name}: {len(rows)} labelled pieces, {len(set(y))} labels, "
                         f"{len(set(groups))} groups: nothing to test")
            continue
        shas = rows["sha256"].astype(str).tolist()
        cols = ["sha256", "onset", "duration", "pitch", "is_drum"]
        found = {r["sha256"]: r for r in pq.read_table(
            notes, columns=cols, filters=[("sha256", "in", shas)]).to_pylist()}
        x_notes = np.stack([note_descriptors(found[s]) if s in found else np.zeros(29)
                            for s in shas])
        declared = [c for c in BUILTIN if c in rows.columns]
        x_declared = (pd.get_dummies(rows[declared].astype(str), dtype=float).to_numpy()
                      if declared else np.zeros((len(rows), 1)))
        from sklearn.dummy import DummyClassifier

        from_notes = _held_out_accuracy(x_notes, y, groups, seed)
        from_declared = _held_out_accuracy(x_declared, y, groups, seed)
        majority = _held_out_accuracy(np.zeros((len(y), 1)), y, groups, seed,
                                      DummyClassifier(strategy="most_frequent"))
        beyond = from_notes - max(from_declared, majority)
        failed = from_notes >= TARGET_ACCURACY and beyond >= TARGET_MARGIN
        bad += [name] if failed else []
        lines.append(f"{name}: read from the notes {from_notes:.1%}, from the declared "
                     f"conditions {from_declared:.1%}, most common label {majority:.1%} "
                     f"({len(rows)} pieces, held-out groups)")
    detail = "; ".join(lines)
    if bad:
        detail += (f"; {bad} behave as functions of the notes the model predicts (limit "
                   f"{TARGET_ACCURACY:.0%} and {TARGET_MARGIN:.0%} over the declared "
                   f"conditions): they tell the model about the notes it is scored on; drop "
                   f"them from condition.use")
    return not bad, detail
