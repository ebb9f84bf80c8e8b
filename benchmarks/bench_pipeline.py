"""The data stages at corpus scale: ``dvc repro`` from corpus through tokenize on N generated MIDI
files, then a no-op re-run and a re-run after adding 1% new files.

    .venv/bin/python benchmarks/bench_pipeline.py --files 100000 [--workers 2] [--seed 0]
                     [--model none|BPE] [--keep DIR] [--json out.json]

The corpus (from ``--seed`` alone, one numpy Generator per file, so the same arguments give the
same files): N distinct pieces of 1-4 pitched tracks on General MIDI programs (piano, guitar,
bass, strings, ...), four in ten with a drum track, 60-1,500 notes (log-uniform), random tempo;
each pitched track a scale-bound walk on a 16th-note grid. About 5% are planted variants of an
earlier piece (transposed, re-saved at another tempo and resolution, or with 5% of pitches
changed), so dedupe has work to do. Files go 1,000 to a folder. ``--corpus DIR`` keeps them for
later runs; the project's source folder holds hard links to them.

The project is a temporary copy of ``pipeline/``, ``models/``, ``dvc.yaml`` and ``params.yaml``
(``corpus.source`` pointing at the generated folder, ``runtime.workers`` = ``--workers``,
``tokenize.model`` = ``--model``, default none: no trained vocabulary), in a fresh DVC project.
Each stage runs as ``dvc repro -s <stage>``, so its time includes DVC's own work (hashing its
dependencies and outputs, writing ``dvc.lock``), measured as the wall time of the command and
the peak of its process tree's memory (sum of PSS, sampled every 0.1 s). Then:

- ``no-op``: ``dvc repro tokenize`` with nothing changed (corpus re-scans its folder);
- ``+1%``: N/100 new files are added and each stage runs again with ``dvc repro -s``.

Baselines, measured in the same run on the first ``--baseline-files`` files in one process: corpus
= a plain file copy loop, ingest = read once + sha256 + parse + notes in beats + the stage's
judgement, one file at a time (``plain_ingest.plain_inspect``), tokenize = a plain miditok
``encode`` loop. The ratio is the stage's files/s over the baseline's (> 1: faster than the plain
loop). dedupe and split have no single-process loop to compare with (``benchmarks/bench_dedupe.py``
compares dedupe with brute force). Timings are printed and written to ``--json``; nothing is
asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from measure import run_measured  # noqa: E402

STAGES = ("corpus", "ingest", "dedupe", "split", "tokenize")
PROGRAMS = (0, 4, 24, 25, 33, 40, 48, 56, 65, 73)  # piano, e-piano, guitars, bass, strings, ...
SCALE = np.array([0, 2, 4, 5, 7, 9, 11])
TPQ = 480
PER_FOLDER = 1000
AIMS = {"data stages (s)": 15 * 60, "peak memory (GiB)": 8.0, "no-op (s)": 10.0,
        "+1% / full": 0.10}


# ------------------------------------------------------------------------------------- corpus
def _track(rng: np.random.Generator, n: int, low: int, step: float):
    """A scale-bound walk of ``n`` notes on a 16th-note grid: (time, duration, pitch) in ticks."""
    sixteenth = TPQ // 4
    dur = rng.choice(np.array([1, 2, 2, 4, 4, 4, 8, 12, 16]), size=n) * sixteenth
    gap = np.where(rng.random(n) < 0.15, rng.choice(np.array([0, 2, 4]), size=n) * sixteenth, 0)
    start = np.concatenate([[0], np.cumsum(dur + gap)[:-1]])
    degree = np.cumsum(rng.choice(np.array([-2, -1, -1, 0, 1, 1, 2, 3, -3]), size=n))
    degree = np.clip(degree, -10, 14) + 7
    pitch = low + 12 * (degree // 7) + SCALE[degree % 7]
    return start, np.maximum(1, (dur * step).astype(np.int64)), np.clip(pitch, 21, 108)


def piece(seed: int, index: int) -> bytes:
    """File ``index`` of the corpus: MIDI bytes from its own Generator."""
    from symusic import Note, Score, Tempo, Track

    rng = np.random.default_rng([seed, index])
    n_total = int(np.exp(rng.uniform(np.log(60), np.log(1500))))
    tracks = int(rng.integers(1, 5))
    drums = rng.random() < 0.4
    score = Score(TPQ)
    score.tempos.append(Tempo(0, float(rng.integers(60, 181))))
    share = rng.dirichlet(np.ones(tracks + drums)) * n_total
    for t in range(tracks):
        n = max(8, int(share[t]))
        start, dur, pitch = _track(rng, n, low=int(rng.integers(36, 66)), step=rng.uniform(0.5, 1))
        track = Track(f"t{t}", int(rng.choice(PROGRAMS)), False)
        track.notes = Note.from_numpy(start.astype(np.int32), dur.astype(np.int32),
                                      pitch.astype(np.int8),
                                      rng.integers(40, 120, size=n).astype(np.int8))
        score.tracks.append(track)
    if drums:
        n = max(8, int(share[-1]))
        start = np.arange(n, dtype=np.int32) * (TPQ // 2)
        track = Track("drums", 0, True)
        track.notes = Note.from_numpy(start, np.full(n, TPQ // 4, np.int32),
                                      rng.choice(np.array([35, 36, 38, 42, 46, 49], np.int8), n),
                                      np.full(n, 90, np.int8))
        score.tracks.append(track)
    return score.dumps_midi()


def variant(seed: int, index: int, source: bytes) -> bytes:
    """A planted variant of an earlier file: transposed, re-saved or 5% of pitches changed."""
    from symusic import Note, Score

    rng = np.random.default_rng([seed, index, 1])
    score = Score.from_midi(source)
    kind = index % 3
    if kind == 1:  # re-saved: another resolution and tempo, the same music in beats
        score = score.resample(TPQ * 2)
        score.tempos[0].qpm = float(score.tempos[0].qpm) * 0.8
        return score.dumps_midi()
    shift = int(rng.choice([-5, -2, 3, 7]))  # one interval for every pitched track
    for track in score.tracks:
        if track.is_drum:
            continue
        arr = track.notes.numpy()
        pitch = arr["pitch"].astype(np.int64)
        if kind == 0:
            pitch = pitch + shift
        else:
            hit = rng.random(pitch.size) < 0.05
            pitch = np.where(hit, pitch + rng.choice([-2, -1, 1, 2], pitch.size), pitch)
        track.notes = Note.from_numpy(arr["time"], arr["duration"],
                                      np.clip(pitch, 0, 127).astype(np.int8), arr["velocity"])
    return score.dumps_midi()


def file_path(root: Path, index: int) -> Path:
    return root / f"{index // PER_FOLDER:04d}" / f"piece_{index:07d}.mid"


def write_corpus(root: Path, start: int, stop: int, seed: int) -> None:
    """Files ``start..stop-1``; every 20th is a variant of a file 1-1000 places before it."""
    for i in range(start, stop):
        path = file_path(root, i)
        path.parent.mkdir(parents=True, exist_ok=True)
        if i % 20 == 19:
            src = i - 1 - int(np.random.default_rng([seed, i, 2]).integers(0, min(i, 1000)))
            data = variant(seed, i, file_path(root, src).read_bytes())
        else:
            data = piece(seed, i)
        path.write_bytes(data)


def link_corpus(store: Path, corpus: Path, n: int) -> None:
    """Files ``0..n-1`` of ``store`` as hard links (copies across file systems) in ``corpus``,
    the project's source folder; the +1% files are then written there only."""
    for i in range(n):
        src, dst = file_path(store, i), file_path(corpus, i)
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


# ------------------------------------------------------------------------------- measurement
def baselines(paths: list[Path], model: str) -> dict[str, float]:
    """Files/s of the plain single-process loops (see the module docstring)."""
    from plain_ingest import plain_inspect
    from symusic import Score

    from pipeline.music.manifest import IngestConfig
    from pipeline.tokens.tokenizer import make_tokenizer

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        for k, p in enumerate(paths):
            shutil.copyfile(p, Path(tmp) / f"{k}.mid")
        out["corpus"] = len(paths) / (time.perf_counter() - t)
    cfg = IngestConfig()
    t = time.perf_counter()
    for p in paths:
        data = p.read_bytes()
        hashlib.sha256(data).hexdigest()
        plain_inspect(data, cfg)
    out["ingest"] = len(paths) / (time.perf_counter() - t)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())["tokenize"]
    tok = make_tokenizer(params["tokenizer"], params["config"])
    t = time.perf_counter()
    for p in paths:
        tok.encode(Score(p))
    out["tokenize"] = len(paths) / (time.perf_counter() - t)
    return out


def make_project(root: Path, corpus: Path, workers: int, model: str) -> None:
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("pipeline", "models"):
        shutil.copytree(ROOT / name, root / name, ignore=ignore)
    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["corpus"].update(source=os.path.relpath(corpus, root), metadata=None)
    params["runtime"].update(workers=workers, progress=False)
    params["tokenize"]["model"] = model
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "reports").mkdir()
    for cmd in (["dvc", "init", "--no-scm", "-q"], ["dvc", "config", "core.analytics", "false"]):
        run_measured(cmd, root)


def stages(root: Path, n_files: int) -> dict[str, dict]:
    out = {}
    for stage in STAGES:
        seconds, peak, _, _ = run_measured(["dvc", "repro", "-s", stage], root)
        out[stage] = {"seconds": round(seconds, 2), "files_per_s": round(n_files / seconds, 1),
                      "peak_gib": round(peak / 2**30, 3)}
        print(f"  {stage:9s} {seconds:8.1f} s  {n_files / seconds:9.0f} files/s  "
              f"peak {peak / 2**30:5.2f} GiB", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", choices=("none", "BPE"), default="none")
    ap.add_argument("--baseline-files", type=int, default=2000)
    ap.add_argument("--keep", type=Path, help="build the project here and keep it")
    ap.add_argument("--corpus", type=Path,
                    help="keep the generated files here and reuse them on a later run with the "
                         "same --files and --seed (generating 100,000 files takes minutes)")
    ap.add_argument("--json", type=Path, help="also write the measurements here")
    args = ap.parse_args()

    tmp = None
    if args.keep:
        work = args.keep.resolve()
        work.mkdir(parents=True, exist_ok=False)
    else:
        tmp = tempfile.TemporaryDirectory()
        work = Path(tmp.name)
    corpus, project = work / "corpus", work / "project"
    project.mkdir()
    t = time.perf_counter()
    store = (args.corpus or work / "generated").resolve()
    marker = store / f".complete-seed{args.seed}-files{args.files}"
    if not marker.exists():
        write_corpus(store, 0, args.files, args.seed)
        marker.write_text("")
    link_corpus(store, corpus, args.files)
    size = sum(p.stat().st_size for p in corpus.rglob("*.mid"))
    print(f"corpus of {args.files} files ({size / 2**20:.0f} MiB) ready in "
          f"{time.perf_counter() - t:.0f} s; {args.workers} workers; tokenize.model "
          f"{args.model}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
          flush=True)
    sample = sorted(corpus.rglob("*.mid"))[: args.baseline_files]
    base = baselines(sample, args.model)
    make_project(project, corpus, args.workers, args.model)

    print("full run (dvc repro -s <stage>):", flush=True)
    full = stages(project, args.files)
    noop, noop_peak, _, _ = run_measured(["dvc", "repro", "tokenize"], project)
    n_new = max(1, args.files // 100)
    write_corpus(corpus, args.files, args.files + n_new, args.seed)
    print(f"after adding {n_new} files (dvc repro -s <stage>):", flush=True)
    inc = stages(project, args.files + n_new)

    total_full = sum(s["seconds"] for s in full.values())
    total_inc = sum(s["seconds"] for s in inc.values())
    peak = max(s["peak_gib"] for s in (*full.values(), *inc.values()))
    print(f"\n{'stage':10s} {'seconds':>8s} {'files/s':>9s} {'peak GiB':>9s} "
          f"{'baseline files/s':>17s} {'ratio':>6s} {'+1% s':>7s} {'+1%/full':>9s}")
    for stage in STAGES:
        f, i = full[stage], inc[stage]
        b = base.get(stage)
        ratio = f"{f['files_per_s'] / b:6.2f}" if b else f"{'-':>6s}"
        base_rate = f"{b:17.0f}" if b else f"{'-':>17s}"
        print(f"{stage:10s} {f['seconds']:8.1f} {f['files_per_s']:9.0f} {f['peak_gib']:9.2f} "
              f"{base_rate} {ratio} {i['seconds']:7.1f} {i['seconds'] / f['seconds']:9.3f}")
    print(f"{'total':10s} {total_full:8.1f} {args.files / total_full:9.0f} {peak:9.2f} "
          f"{'':17s} {'':6s} {total_inc:7.1f} {total_inc / total_full:9.3f}")
    measured = {"data stages (s)": total_full, "peak memory (GiB)": peak, "no-op (s)": noop,
                "+1% / full": total_inc / total_full}
    print(f"\nno-op dvc repro: {noop:.1f} s (peak {noop_peak / 2**30:.2f} GiB)")
    for k, aim in AIMS.items():
        print(f"aim {k:18s} <= {aim:<7g} measured {measured[k]:.3g}  "
              f"{'met' if measured[k] <= aim else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({
            "files": args.files, "workers": args.workers, "model": args.model,
            "seed": args.seed, "baseline_files_per_s": base, "full": full, "plus_1pct": inc,
            "noop_seconds": round(noop, 2), "aims": AIMS, "measured": measured,
            "cpu_count": os.cpu_count()}, indent=2, sort_keys=True) + "\n")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
