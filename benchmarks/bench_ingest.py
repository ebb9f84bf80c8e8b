"""Ingest throughput: files/s with 1 and N workers against a plain single-process loop.

The baseline (measured in the same run) is the bare work with no isolation, in one process, one
file at a time, written plainly in ``plain_ingest.py`` (independent of the stage's code): read
each file, sha256 its bytes, parse it with symusic into notes in beats in canonical order, and
judge it as the stage does (limits, longest silence, the note hash); the run checks that it finds
the same note hashes as the stage. The stage (``ingestion.run``, no result cache) adds the listing,
worker processes, per-chunk timeouts, crash isolation, duplicate resolution and writing the
manifest and notes tables, and judges each worker's chunk of files together (``inspect_many``); the
ratios show what that costs and what it gains back. As in the pipeline, the stage is given the
corpus stage's index of the files' sha256 (written before the timings: the corpus stage's work),
so it sends the files to its workers in sha256 order and writes the notes table, sorted by sha256,
while they work; the workers still read and hash every file they parse. A last line times a
re-run through a warm result cache. Each timing is the minimum (and median) of ``--repeat`` runs;
the load average is printed beside them.

Two more lines time what ``dvc repro`` runs: ``symkit ingest`` in a fresh process (interpreter
start, imports and reading params.yaml included) against the plain loop in a fresh process (its
own imports: numpy, symusic), each started as a subprocess. On a few thousand files these fixed
costs are most of a run; at 100k files they are a second or two.

    python benchmarks/bench_ingest.py --files 4000 [--workers 2] [--corpus tiny|pipeline]

``tiny``: 50-400 notes in 1-4 voices per file; ``pipeline``: the corpus of
``benchmarks/bench_pipeline.py`` (60-1,500 notes, drums, 5% planted variants).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plain_ingest import baseline  # this folder: first on the path when run as a script

from pipeline.core.artifacts import read_table
from pipeline.core.config import RuntimeConfig
from pipeline.music.ingestion import run
from pipeline.music.manifest import IngestConfig
from pipeline.stages.corpus import scan_tree, write_index
from tests.midi_utils import make_midi, random_piece

ROOT = Path(__file__).resolve().parents[1]


def make_corpus(root: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(n):
        piece = random_piece(rng, n=int(rng.integers(50, 400)), voices=int(rng.integers(1, 5)))
        (root / f"{i // 1000:03d}").mkdir(exist_ok=True)
        (root / f"{i // 1000:03d}" / f"piece{i:06d}.mid").write_bytes(make_midi(piece))


def fresh_process(argv: list[str]) -> None:
    """Run ``python argv...`` from the repository root; fail loudly if it fails."""
    import subprocess

    subprocess.run([sys.executable, *argv], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def timed(fn, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--corpus", choices=("tiny", "pipeline"), default="tiny")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw"
        raw.mkdir()
        t = time.perf_counter()
        if args.corpus == "tiny":
            make_corpus(raw, args.files)
        else:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from bench_pipeline import write_corpus

            write_corpus(raw, 0, args.files, 0)
        print(f"generated {args.files} {args.corpus} files in {time.perf_counter() - t:.1f} s; "
              f"{os.cpu_count()} CPUs")
        paths = sorted(raw.rglob("*.mid"))
        cfg = IngestConfig()
        index = Path(tmp) / "raw_index.parquet"  # the corpus stage's work, as in the pipeline
        write_index(raw, scan_tree(raw)[0], index, None)

        def stage(w: int, cache: Path | None = None) -> None:
            out = Path(tmp) / f"out{w}"
            run(cfg, RuntimeConfig(workers=w, progress=False), raw_dir=raw, metadata=None,
                manifest=out / "m.parquet", notes=out / "n.parquet", report=out / "r.json",
                cache_dir=cache, index=index)

        def line(name: str, best: float, median: float, base: float | None = None) -> None:
            ratio = f"  ratio to baseline {base / best:5.2f}" if base else ""
            print(f"{name:32s}: {len(paths) / best:8.0f} files/s  min {best:6.3f} s  median "
                  f"{median:6.3f} s{ratio}  (load {os.getloadavg()[0]:.1f})", flush=True)

        base, base_med = timed(lambda: baseline(paths, cfg), args.repeat)
        line("baseline single-process loop", base, base_med)
        for w in sorted({1, args.workers}):
            line(f"ingest stage, {w} worker(s)", *timed(lambda w=w: stage(w), args.repeat), base)
        params = Path(tmp) / "params.yaml"  # the defaults, as IngestConfig() above
        params.write_text("ingest: {}\n", encoding="utf-8")
        listing = Path(tmp) / "files.txt"
        listing.write_text("\n".join(map(str, paths)), encoding="utf-8")
        limits = [str(getattr(cfg, k)) for k in ("min_notes", "max_notes", "max_gap_beats",
                                                  "max_duration_s")]
        plain = timed(lambda: fresh_process([str(Path(__file__).with_name("plain_ingest.py")),
                                             str(listing), *limits]), args.repeat)
        line("plain loop, fresh process", *plain)
        cli = [
            "-m", "pipeline.cli", "ingest", "--params", str(params), "--raw", str(raw),
            "--index", str(index), "--metadata", str(Path(tmp) / "none.csv"), "--manifest",
            str(Path(tmp) / "cli" / "m.parquet"), "--notes", str(Path(tmp) / "cli" / "n.parquet"),
            "--report", str(Path(tmp) / "cli" / "r.json"), "--no-cache",
            "--workers", str(args.workers)]
        line(f"symkit ingest, fresh process, {args.workers} worker(s)",
             *timed(lambda: fresh_process(cli), args.repeat), plain[0])
        cache = Path(tmp) / "cache"
        stage(args.workers, cache)
        line(f"  again, warm cache, {args.workers} worker(s)",
             *timed(lambda: stage(args.workers, cache), args.repeat), base)
        stage_hashes = read_table(Path(tmp) / "out1" / "m.parquet", ["note_hash"])
        print("the baseline finds the same note hashes as the stage: "
              f"{baseline(paths, cfg) == stage_hashes['note_hash'].to_pylist()}")
        same = all((Path(tmp) / "out1" / n).read_bytes() ==
                   (Path(tmp) / f"out{args.workers}" / n).read_bytes()
                   for n in ("m.parquet", "n.parquet", "r.json"))
        same = same and all((Path(tmp) / "out1" / n).read_bytes() ==
                            (Path(tmp) / "cli" / n).read_bytes()
                            for n in ("m.parquet", "n.parquet", "r.json"))
        print(f"outputs identical for 1 and {args.workers} workers (cached, and from the "
              f"command line): {same}")


if __name__ == "__main__":
    main()
