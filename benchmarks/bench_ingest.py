"""Ingest throughput: files/s with 1 and N workers against a plain single-process loop.

The baseline (measured in the same run) is the bare work with no isolation: read, parse with
symusic, hash the notes, in one process. The stage adds worker processes, per-file timeouts and
crash isolation on top; the ratios show what that costs and what parallelism gains back.

    python benchmarks/bench_ingest.py --files 4000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core.config import RuntimeConfig
from pipeline.music.ingestion import IngestConfig, inspect_file, run
from tests.midi_utils import make_midi, random_piece


def make_corpus(root: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(n):
        piece = random_piece(rng, n=int(rng.integers(50, 400)), voices=int(rng.integers(1, 5)))
        (root / f"{i // 1000:03d}").mkdir(exist_ok=True)
        (root / f"{i // 1000:03d}" / f"piece{i:06d}.mid").write_bytes(make_midi(piece))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw"
        raw.mkdir()
        t = time.perf_counter()
        make_corpus(raw, args.files)
        print(f"generated {args.files} files in {time.perf_counter() - t:.1f} s")
        paths = sorted(str(p) for p in raw.rglob("*.mid"))
        cfg = IngestConfig()

        t = time.perf_counter()
        for p in paths:
            inspect_file(p, cfg)
        base = len(paths) / (time.perf_counter() - t)
        print(f"baseline single-process loop : {base:8.0f} files/s")

        for w in sorted({1, args.workers}):
            out = Path(tmp) / f"out{w}"
            t = time.perf_counter()
            run(cfg, RuntimeConfig(workers=w, progress=False), raw_dir=raw, metadata=None,
                manifest=out / "m.parquet", notes=out / "n.parquet", report=out / "r.json")
            rate = len(paths) / (time.perf_counter() - t)
            print(f"ingest stage, {w} worker(s)   : {rate:8.0f} files/s  "
                  f"ratio to baseline {rate / base:5.2f}")
        same = (Path(tmp) / "out1" / "m.parquet").read_bytes() == (
            Path(tmp) / f"out{args.workers}" / "m.parquet").read_bytes()
        print(f"manifest identical for 1 and {args.workers} workers: {same}")


if __name__ == "__main__":
    main()
