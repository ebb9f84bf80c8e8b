"""The report's samples: the first of each model and kind in turn, each with its piano roll, its
audio and its nearest training excerpt (the longest run of ids it shares with training)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.core.artifacts import read_table_or_none
from pipeline.render.audio import midi_to_flac, notes_to_flac
from pipeline.render.document import Audio, Document, Figure, Heading, Para, fmt
from pipeline.render.figures import pair_rolls_png
from pipeline.report.context import ReportContext
from pipeline.report.sections.common import not_available


def render(doc: Document, ctx: ReportContext) -> None:
    cfg, audit, inputs, params = ctx.cfg, ctx.reports.get("audit"), ctx.inputs, ctx.params
    doc.add(Heading("Samples"))
    table = read_table_or_none(inputs["per_sample"])
    if table is not None and "source" in table.columns:
        s = table[table["source"] == "sample"]
        failed = int((~s["decode_ok"].astype(bool)).sum()) if "decode_ok" in s.columns else None
        doc.add(Para(f"{len(s)} samples audited; {fmt(failed)} failed to decode (counted, not "
                     "dropped)."))
    folder = Path(inputs["samples_dir"])
    pngs = sorted(folder.glob("*.png")) if folder.is_dir() else []
    if not pngs:
        not_available(doc, "sample piano rolls (reports/samples/)")
        return
    shown = pick_samples(pngs, cfg.max_samples_shown)
    report_dir = Path(inputs["md_out"]).parent
    doc.add(Para(f"{len(shown)} of {len(pngs)} samples, the first of each model and kind in "
                 "turn. Each has its piano roll and, rendered from its MIDI file with a sine "
                 f"synthesiser (pretty_midi), its first {AUDIO_SECONDS:g} seconds as audio. A "
                 "continuation "
                 "starts with the test piece's own opening (the prompt, grey in its piano "
                 "roll, up to the dashed line), then the model's notes (blue).", "note"))
    neighbours = shared_spans(table, shown, Path(inputs["spans"]))
    limits = audit.get("thresholds", {}) if isinstance(audit, dict) else {}
    quantile = ((params or {}).get("audit") or {}).get("flag_quantile")
    for p in shown:
        model, kind, index = _sample_parts(p.stem)
        title = f"{model}, {kind} sample {index}"
        doc.add(Heading(title, 3))
        try:
            rel = Path(os.path.relpath(p, report_dir)).as_posix()
        except ValueError:
            rel = None
        doc.add(Figure(f"Piano roll of the {title}", p.read_bytes(), rel))
        mid = p.with_suffix(".mid")
        flac = None
        if mid.is_file():
            try:
                flac = midi_to_flac(mid.read_bytes(), sample_rate=AUDIO_RATE,
                                    max_seconds=AUDIO_SECONDS)
            except ValueError as e:
                doc.add(Para(f"Audio of the {title}: {e}.", "note"))
        if flac is not None:
            doc.add(Audio(f"the {title}, at most its first {AUDIO_SECONDS:g} s", flac))
        doc.add(*span_blocks(title, neighbours.get(p.stem), limits.get("lcs_tokens"), quantile))
    if len(pngs) > len(shown):
        doc.add(Para(f"{len(pngs) - len(shown)} more piano rolls and every MIDI file are in "
                     f"{folder.name}/.", "note"))


AUDIO_SECONDS = 10.0
AUDIO_RATE = 8000
"""The players' length and sample rate. The sine synthesiser sounds fundamentals only, and an
8 kHz rate carries every one up to 4 kHz (MIDI pitch 107) without aliasing; 16 players of 10 s
are about 0.75 MB, so report.html stays small enough to track in git."""
SAMPLE_BPM = 120.0
"""Tempo at which a training piece's notes (in beats) are played beside a sample: the tempo
miditok writes into the samples' MIDI files, so both play at one speed."""


SPAN_MARGIN = 2.0
"""Beats shown either side of a shared span in its pair of piano rolls."""


def shared_spans(table: pd.DataFrame | None, shown: list[Path],
                 spans_path: Path) -> dict[str, dict[str, Any]]:
    """For each shown sample (by file stem): its audit row (``lcs_*`` and ``nn_*`` measures)
    and, from the audit's spans.parquet, the notes of the sample and of the training piece with
    the longest shared span marked (``sample`` / ``train``, absent when not recorded)."""
    need = {"source", "model", "kind", "index", "lcs_tokens"}
    if table is None or not need <= set(table.columns):
        return {}
    spans = read_table_or_none(spans_path)
    out = {}
    samples = table[table["source"] == "sample"]

    def pick(df: pd.DataFrame, stem: str) -> pd.DataFrame:
        model, kind, index = _sample_parts(stem)
        return df[(df["model"] == model) & (df["kind"] == kind)
                  & (df["index"].astype(str) == index)]

    for p in shown:
        hit = pick(samples, p.stem)
        if not len(hit):
            continue
        entry = {"audit": hit.iloc[0].to_dict()}
        if spans is not None and {"model", "side", "in_span"} <= set(spans.columns):
            for _, r in pick(spans, p.stem).iterrows():
                entry[str(r["side"])] = r.to_dict()
        out[p.stem] = entry
    return out


def _span_range(side: Mapping[str, Any]) -> tuple[float, float] | None:
    """Beats from the span's first onset to its last note's end, with SPAN_MARGIN either side
    (at least 8 beats in all); None when the span holds no whole note."""
    mask = np.asarray(side["in_span"], dtype=bool)
    if not mask.any():
        return None
    onset = np.asarray(side["onset"], dtype=float)[mask]
    end = onset + np.asarray(side["duration"], dtype=float)[mask]
    lo = max(0.0, float(onset.min()) - SPAN_MARGIN)
    return lo, max(float(end.max()) + SPAN_MARGIN, lo + 8.0)


def span_blocks(title: str, entry: dict[str, Any] | None, limit: float | None = None,
                quantile: float | None = None) -> list[Any]:
    """Beside one sample: the audit's longest shared span with the training set, as two piano
    rolls (the sample and the training piece, the span's notes orange) and the training excerpt
    as audio; and the nearest training piece by shingle Jaccard, in words."""
    if entry is None:
        return []
    row = entry["audit"]
    n = int(row.get("lcs_tokens") or 0)
    nn = row.get("nn_sha256")
    near = (f" The nearest training piece by shingle Jaccard is {str(nn)[:12]} "
            f"({fmt(row.get('nn_jaccard'), 3)})" if isinstance(nn, str) else "")
    if not n or "sample" not in entry or "train" not in entry:
        why = "shares no ids with any training piece" if not n else \
            "shares a span with training whose notes could not be decoded"
        return [Para(f"This sample {why}.{near}{'.' if near else ''}", "note")]
    sha = str(row.get("lcs_train_sha256"))[:12]
    same = ", the same piece." if nn == row.get("lcs_train_sha256") else "."
    sample, train = entry["sample"], entry["train"]
    ranges = _span_range(sample), _span_range(train)
    if limit is None:
        context = " The audit's flag thresholds are in the memorisation section."
    else:
        of = f"the {quantile:g} quantile of" if quantile is not None else "set from"
        context = (f" The audit flags a run longer than {fmt(limit)} ids ({of} the runs of "
                   f"held-out val windows); this one is {'' if n > limit else 'not '}flagged.")
    out: list[Any] = [Para(
        f"Nearest training excerpt: the longest run of ids this sample shares with any training "
        f"piece is {n} ids ({fmt(row.get('lcs_bars'))} bars), with training piece {sha}; the "
        f"whole notes of that run are orange in both rolls below.{context}{near}{same}",
        "note")]
    if None in ranges:
        out.append(Para("The shared run holds no whole note (only time or bar ids), so no "
                        "notes are marked.", "note"))
        return out
    out.append(Figure(
        f"The {title} (left) and training piece {sha} (right), each cut to their longest shared "
        f"run of ids and {SPAN_MARGIN:g} beats around it; the run's notes are orange",
        pair_rolls_png(sample, train, ("this sample", f"training piece {sha}"),
                       ranges=ranges, marked=(sample["in_span"], train["in_span"]),
                       marked_label="longest run of ids shared with the training piece")))
    lo = ranges[1][0]
    onset = np.asarray(train["onset"], dtype=float)
    keep = (onset >= lo) & (onset < lo + AUDIO_SECONDS * SAMPLE_BPM / 60.0)
    excerpt = {"onset": onset[keep] - lo,
               **{k: np.asarray(train[k])[keep] for k in ("duration", "pitch")}}
    flac = notes_to_flac(excerpt, bpm=SAMPLE_BPM, sample_rate=AUDIO_RATE,
                         max_seconds=AUDIO_SECONDS) if keep.any() else None
    if flac is not None:
        out.append(Audio(f"training piece {sha} from beat {lo:g} ({SPAN_MARGIN:g} beats before "
                         f"the shared run), at most {AUDIO_SECONDS:g} s", flac))
    return out


def _sample_parts(stem: str) -> tuple[str, str, str]:
    """``<model>_<kind>_<index>`` -> its parts (a stem of another shape: itself, "", "")."""
    parts = stem.rsplit("_", 2)
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else (stem, "", "")


def pick_samples(pngs: list[Path], n: int) -> list[Path]:
    """Up to ``n`` samples, the lowest index of each (model, kind) in turn, so that every model
    and kind is shown before any second sample of one."""
    by_kind: dict[tuple[str, str], list[tuple[int, Path]]] = {}
    for p in pngs:
        model, kind, index = _sample_parts(p.stem)
        by_kind.setdefault((model, kind), []).append(
            (int(index) if index.isdigit() else 10**9, p))
    queues = [sorted(v) for _, v in sorted(by_kind.items())]
    out: list[Path] = []
    depth = 0
    while len(out) < n and any(depth < len(q) for q in queues):
        out += [q[depth][1] for q in queues if depth < len(q)][: n - len(out)]
        depth += 1
    return out
