"""The plain ingest loop that ``bench_ingest.py`` and ``bench_pipeline.py`` measure the stage
against: read each file, sha256 its bytes, parse it with symusic into notes in beats in canonical
order, and judge it as the stage does (limits, longest silence, the note hash), one file at a
time, in one process, without isolation. Written plainly here, independent of the stage's code,
and importing nothing but numpy and symusic, so that run as a script it also times what a fresh
process pays for the loop alone:

    python benchmarks/plain_ingest.py FILE_LIST MIN_NOTES MAX_NOTES MAX_GAP_BEATS MAX_DURATION_S
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np


def plain_inspect(data: bytes, cfg: Any) -> str:
    """One file's core work, plainly: parse, notes in beats sorted by (onset, pitch, duration,
    track), longest silence, limits, and the note hash of an ok file ('' otherwise: the stage
    also hashes only ok files)."""
    import symusic

    if data[:4] != b"MThd":
        return ""
    try:
        score = symusic.Score.from_midi(data)
    except RuntimeError:
        return ""
    tpq = score.ticks_per_quarter
    cols: dict[str, list[np.ndarray]] = {c: [] for c in ("on", "du", "pitch", "track", "drum")}
    for index, track in enumerate(score.tracks):
        arr = track.notes.numpy()
        if arr["pitch"].size:
            cols["on"].append(arr["time"] / tpq)
            cols["du"].append(arr["duration"] / tpq)
            cols["pitch"].append(arr["pitch"].astype(np.int64))
            cols["track"].append(np.full(arr["pitch"].size, index))
            cols["drum"].append(np.full(arr["pitch"].size, int(track.is_drum)))
    if not cols["on"]:
        return ""
    n = {c: np.concatenate(v) for c, v in cols.items()}
    order = np.lexsort((n["track"], n["du"], n["pitch"], n["on"]))
    n = {c: v[order] for c, v in n.items()}
    end = n["on"] + n["du"]
    gap = max(n["on"][0], (n["on"][1:] - np.maximum.accumulate(end)[:-1]).max(initial=0.0))
    seconds = score.to("second").end()
    if not cfg.min_notes <= n["on"].size <= cfg.max_notes or gap > cfg.max_gap_beats \
            or seconds > cfg.max_duration_s:
        return ""
    rows = np.stack([np.rint(n["on"] * 48), n["pitch"], np.maximum(np.rint(n["du"] * 48), 1),
                     n["drum"]], axis=1).astype("<i8")
    return hashlib.sha256(rows[np.lexsort(rows.T[::-1])].tobytes()).hexdigest()


def baseline(paths: list[Path], cfg: Any) -> list[str]:
    """Read + sha256 + :func:`plain_inspect`, one file at a time, one process, no isolation."""
    hashes = []
    for p in paths:
        data = p.read_bytes()
        hashlib.sha256(data).hexdigest()
        hashes.append(plain_inspect(data, cfg))
    return hashes


if __name__ == "__main__":
    listing, lo, hi, gap, dur = sys.argv[1:6]
    baseline([Path(p) for p in Path(listing).read_text(encoding="utf-8").splitlines()],
             SimpleNamespace(min_notes=int(lo), max_notes=int(hi), max_gap_beats=float(gap),
                             max_duration_s=float(dur)))
