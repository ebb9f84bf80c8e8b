"""Planted notes and conditions shared by the conditions tests: scales whose key and density
are known, and pieces with metadata labels of known origin."""

from __future__ import annotations

import numpy as np
import pandas as pd


def scale_notes(tonic: int, mode: str = "major", per_beat: int = 1) -> dict[str, np.ndarray]:
    """Two octaves of a scale with its tonic triad stressed, ``per_beat`` notes per beat."""
    steps = [0, 2, 4, 5, 7, 9, 11] if mode == "major" else [0, 2, 3, 5, 7, 8, 10]
    pitch = [60 + tonic + s for s in steps] + [72 + tonic + s for s in steps]
    pitch += [60 + tonic, 64 + tonic - (mode == "minor"), 67 + tonic] * 4
    n = len(pitch)
    return {"onset": np.arange(n) / per_beat, "duration": np.full(n, 1.0 / per_beat),
            "pitch": np.asarray(pitch)}


def planted_metadata(tmp_path):
    """60 random pieces (a third in four voices, 2 per group) with three metadata columns:
    ``ending`` computed from the last note, ``collection`` equal to the texture (a declared
    condition says it), ``composer`` drawn at random."""
    import pyarrow as pa

    from pipeline.conditions.config import ConditionConfig
    from pipeline.conditions.table import measured_labels
    from pipeline.core.artifacts import write_parquet

    rng = np.random.default_rng(7)
    cfg, rows, labels = ConditionConfig(), [], []
    for i in range(60):
        voices = 1 if i % 3 else 4
        n = int(rng.integers(20, 40))
        pitch = np.concatenate([rng.integers(55, 80, size=n) for _ in range(voices)])
        onset = np.tile(np.arange(n, dtype=float), voices)
        notes = {"onset": onset, "duration": np.ones(len(pitch)), "pitch": pitch,
                 "is_drum": np.zeros(len(pitch), dtype=bool)}
        rows.append({"sha256": f"p{i:02d}", **{k: v.tolist() for k, v in notes.items()}})
        last = pitch[onset == onset.max()].min()
        labels.append({"sha256": f"p{i:02d}", "split": "train",
                       **{k: measured_labels(notes, cfg)[k] for k in
                          ("key", "mode", "density", "polyphony")},
                       "ending": "high" if last >= 68 else "low",
                       "collection": "mono" if voices == 1 else "choral",
                       "composer": str(rng.choice(["a", "b", "c"]))})
    write_parquet(tmp_path / "notes.parquet", pa.Table.from_pylist(rows))
    table = pd.DataFrame(labels)
    splits = pd.DataFrame({"sha256": table["sha256"],
                           "group_id": [f"g{i // 2}" for i in range(60)]})
    return table, splits, tmp_path / "notes.parquet"
