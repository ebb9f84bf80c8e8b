"""Dedupe at corpus scale: time and peak memory of ``symkit dedupe`` on generated note tables,
against brute-force pairwise exact Jaccard measured on a subset in the same run (extrapolated
quadratically), plus the recall of planted duplicates.

    .venv/bin/python benchmarks/bench_dedupe.py [--pieces 100000] [--workers 2]
                     [--corpus walks|tunes] [--params params.yaml]

The stage runs with an empty cache of its own (a first run: every candidate measured, the
project's ``.cache/dedupe`` untouched). Pieces are generated directly as note tables (no MIDI).
``walks`` (the default): random chordal pieces (1-4 voices, 30-120 onsets), 10% of them planted
variants of another piece (transposed, ~5% of notes edited/dropped, first 75% only, or re-saved
with other velocities). ``tunes``: the monophonic dance tunes of one style of
``benchmarks/dance_tunes.py`` (40-120 notes, AABB), 10% of them edited copies of another (an
edit mix of that module, 2-8% of the notes): the case where every piece is a short melody of
one style, the worst for the short-melody candidates.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.core import artifacts  # noqa: E402
from pipeline.music.manifest import MANIFEST_SCHEMA, NOTES_SCHEMA  # noqa: E402
from pipeline.music.parsing import note_hash  # noqa: E402
from pipeline.similarity import fingerprints as fp  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from measure import run_measured  # noqa: E402

KINDS = ("transposed", "edited", "prefix", "resaved")


def _segment_arange(lengths: np.ndarray) -> np.ndarray:
    """0..len-1 for each segment, concatenated."""
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(lengths.sum()) - starts


def generate(n: int, seed: int = 0, planted_share: float = 0.1):
    """Flat notes of ``n`` pieces; returns (notes dict, offsets, planted (base, variant) pairs)."""
    rng = np.random.default_rng(seed)
    n_var = int(n * planted_share)
    n_base = n - n_var
    events = rng.integers(30, 121, size=n_base)
    voices = rng.integers(1, 5, size=n_base)
    ev_piece = np.repeat(np.arange(n_base), events)
    ioi = rng.choice(np.array([0.25, 0.5, 1.0, 1.0, 1.5, 2.0]), size=ev_piece.size)
    onset = np.cumsum(ioi) - ioi
    onset -= np.repeat(onset[np.cumsum(events) - events], events)
    step = rng.integers(-5, 6, size=ev_piece.size)
    walk = np.cumsum(step)
    walk -= np.repeat(walk[np.cumsum(events) - events], events)
    top = np.repeat(rng.integers(64, 80, size=n_base), events) + np.clip(walk, -14, 14)
    reps = voices[ev_piece]  # notes per event
    note_ev = np.repeat(np.arange(ev_piece.size), reps)
    voice = _segment_arange(reps)
    pitch = top[note_ev] - np.where(voice > 0, rng.integers(3, 9, size=note_ev.size) + 5 * voice, 0)
    base = {"onset": onset[note_ev], "duration": ioi[note_ev], "pitch": pitch.astype(np.int16),
            "velocity": np.full(note_ev.size, 80, np.int16), "track": voice.astype(np.int16),
            "program": np.zeros(note_ev.size, np.int16), "is_drum": np.zeros(note_ev.size, bool)}
    lengths = np.bincount(ev_piece[note_ev], minlength=n_base)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    # planted variants: copy a random base piece, then transform it
    src = rng.choice(n_base, size=n_var, replace=False)
    kind = np.arange(n_var) % len(KINDS)
    take = np.repeat(offsets[src], lengths[src]) + _segment_arange(lengths[src])
    vpiece = np.repeat(np.arange(n_var), lengths[src])
    var = {k: v[take].copy() for k, v in base.items()}
    vk = kind[vpiece]
    var["pitch"] = (var["pitch"] + np.where(vk == 0, rng.choice([-5, 2, 7], n_var)[vpiece], 0))
    hit = (vk == 1) & (rng.random(vpiece.size) < 0.05)
    var["pitch"] = np.where(hit, var["pitch"] + 1, var["pitch"]).astype(np.int16)
    end = np.repeat(np.array([np.max(base["onset"][offsets[s]:offsets[s + 1]]) for s in src]),
                    lengths[src])
    keep = ~((vk == 1) & hit & (rng.random(vpiece.size) < 0.5)) & ~((vk == 2) &
                                                                     (var["onset"] > 0.75 * end))
    var["velocity"] = np.where(vk == 3, 100, var["velocity"]).astype(np.int16)
    var = {k: v[keep] for k, v in var.items()}
    vlen = np.bincount(vpiece[keep], minlength=n_var)
    notes = {k: np.concatenate([base[k], var[k]]) for k in base}
    all_len = np.concatenate([lengths, vlen])
    offsets = np.concatenate([[0], np.cumsum(all_len)])
    planted = list(zip(src.tolist(), (n_base + np.arange(n_var)).tolist(), strict=True))
    return notes, offsets, planted


def generate_tunes(n: int, seed: int = 0, planted_share: float = 0.1):
    """:func:`generate`'s output for dance tunes (see the module docstring)."""
    from benchmarks import dance_tunes as tunes

    style = tunes.make_style(seed)
    n_var = int(n * planted_share)
    n_base = n - n_var
    made = []
    for i in range(n_base):
        rng = np.random.default_rng([seed, 1, i])
        made.append(tunes.compose(rng, style, int(rng.integers(40, 121)), tunes.make_plan(rng)))
    rng = np.random.default_rng([seed, 2])
    src = rng.choice(n_base, size=n_var, replace=False)
    mixes = list(tunes.MIXES.values())
    for v, s in enumerate(src.tolist()):
        vr = np.random.default_rng([seed, 3, v])
        rate = float(vr.uniform(0.02, 0.08))
        made.append(tunes.edit(vr, made[s], mixes[v % len(mixes)], rate)[0])
    lengths = np.array([t.n for t in made])
    size = int(lengths.sum())
    notes = {"onset": np.concatenate([t.onset for t in made]) / 4.0,
             "duration": np.concatenate([t.dur for t in made]) / 4.0,
             "pitch": np.concatenate([t.pitch for t in made]).astype(np.int16),
             "velocity": np.full(size, 80, np.int16), "track": np.zeros(size, np.int16),
             "program": np.zeros(size, np.int16), "is_drum": np.zeros(size, bool)}
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    planted = list(zip(src.tolist(), (n_base + np.arange(n_var)).tolist(), strict=True))
    return notes, offsets, planted


def write_inputs(root: Path, notes: dict, offsets: np.ndarray) -> list[str]:
    n = offsets.size - 1
    shas = [f"{i:064x}" for i in range(n)]  # stand-ins for file hashes
    # notes within a piece sorted by (onset, pitch) as ingest writes them
    piece = np.repeat(np.arange(n), np.diff(offsets))
    order = np.lexsort((notes["track"], notes["duration"], notes["pitch"], notes["onset"], piece))
    notes = {k: v[order] for k, v in notes.items()}
    cols = {"sha256": pa.array(shas)}
    for k, t in zip(NOTES_SCHEMA.names[1:], NOTES_SCHEMA.types[1:], strict=True):
        cols[k] = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                           pa.array(notes[k], type=t.value_type))
    artifacts.write_parquet(root / "notes.parquet", pa.table(cols, schema=NOTES_SCHEMA))
    hashes = [note_hash({k: notes[k][offsets[i]:offsets[i + 1]] for k in notes}) for i in range(n)]
    man = pd.DataFrame({"path": [f"{s[-8:]}.mid" for s in shas], "sha256": shas, "status": "ok",
                        "reason": "", "detail": "", "duplicate_of": "", "group": "",
                        "n_notes": np.diff(offsets), "n_tracks": 1, "tpq": 480,
                        "duration_s": 1.0, "duration_beats": 1.0, "note_hash": hashes,
                        "size_bytes": 1})
    artifacts.write_parquet(root / "manifest.parquet",
                            pa.Table.from_pandas(man, schema=MANIFEST_SCHEMA, preserve_index=False))
    return shas


def brute_force_seconds(notes: dict, offsets: np.ndarray, n_sub: int) -> float:
    """Exact Jaccard + containment of every pair among the first ``n_sub`` pieces."""
    sub_off = offsets[: n_sub + 1]
    na = fp.NoteArrays(np.arange(n_sub).astype(str).astype(object), sub_off,
                       notes["onset"][: sub_off[-1]], notes["duration"][: sub_off[-1]],
                       notes["pitch"][: sub_off[-1]], notes["is_drum"][: sub_off[-1]],
                       notes["track"][: sub_off[-1]])
    t0 = time.perf_counter()
    off, vals = fp.shingles(na, 4, 4)
    sets = [vals[off[i]:off[i + 1]] for i in range(n_sub)]
    for i in range(n_sub):
        for j in range(i + 1, n_sub):
            fp.jaccard_containment(sets[i], sets[j])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pieces", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--brute-subset", type=int, default=1000)
    ap.add_argument("--corpus", choices=("walks", "tunes"), default="walks")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml",
                    help="the dedupe settings are read from this file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        make = generate if args.corpus == "walks" else generate_tunes
        notes, offsets, planted = make(args.pieces)
        shas = write_inputs(root, notes, offsets)
        print(f"generated {args.pieces} pieces, {offsets[-1]:,} notes, {len(planted)} planted "
              f"variants in {time.perf_counter() - t0:.1f} s")
        (root / "params.yaml").write_text(args.params.read_text())
        cmd = [sys.executable, "-m", "pipeline.cli", "dedupe",
               "--params", str(root / "params.yaml"),
               "--manifest", str(root / "manifest.parquet"), "--notes", str(root / "notes.parquet"),
               "--out-dir", str(root / "dedupe"), "--report", str(root / "dedupe.json"),
               "--cache-dir", str(root / "cache"), "--workers", str(args.workers)]
        seconds, peak, max_rss, out = run_measured(cmd, ROOT)
        print(out.strip())
        clusters = artifacts.read_parquet(root / "dedupe" / "clusters.parquet").set_index("sha256")
        cid = clusters["cluster_id"]
        recall = np.mean([cid[shas[a]] == cid[shas[b]] for a, b in planted])
        base_of = {b: a for a, b in planted}
        family = pd.Series([base_of.get(i, i) for i in range(len(shas))], index=shas)
        impure = int((family.groupby(cid.reindex(shas).to_numpy()).nunique() > 1).sum())
        brute = brute_force_seconds(notes, offsets, args.brute_subset)
        n, m = args.pieces, args.brute_subset
        brute_full = brute * (n * (n - 1)) / (m * (m - 1))
        report = artifacts.read_json(root / "dedupe.json")
        env = artifacts.read_json(root / "dedupe.env.json")
    print(f"dedupe: {seconds:.1f} s wall (incl. interpreter start), peak memory "
          f"{peak / 2**30:.2f} GiB (process tree PSS, workers={args.workers}); largest process "
          f"peak RSS {max_rss / 2**30:.2f} GiB")
    print(f"  inside the stage: fingerprints {env['seconds_fingerprints']:.1f} s, linking "
          f"{env['seconds_linking']:.1f} s; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    print(f"planted-pair recall {recall:.4f}; clusters mixing unrelated pieces: {impure}; "
          f"pairs {report['pairs']}, near candidates {report.get('near_candidates')} "
          f"(short melodies: {report.get('near_short_aligned')} aligned, "
          f"{report.get('near_candidates_short')} kept)")
    print(f"brute force: {brute:.1f} s for {m} pieces ({m * (m - 1) // 2:,} pairs) -> "
          f"~{brute_full / 3600:.1f} h extrapolated to {n} pieces")
    print(f"ratio brute-force / dedupe: {brute_full / seconds:,.0f}x")


if __name__ == "__main__":
    main()
