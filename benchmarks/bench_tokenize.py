"""Tokenize-stage throughput and incremental cost, against baselines measured in the same run.

Generates N small MIDI files with symusic (default 5,000, two tracks of 30 notes each), then:

1. baseline: a plain single-process miditok loop (``tokenizer.encode(Score(path))``);
2. ``symkit tokenize`` with 1 worker and with W workers, cache off (full encode + round-trip
   decode + check); parallel efficiency = t(1) / (W * t(W)) on the encoding phase; the
   round-trip check's share of the workers' time is printed separately (it is always on);
3. a cached full run, then the same after adding 1% new files: incremental time / full time.

With ``--repeat N`` the plain loop and the W-worker run are measured N times, interleaved, and
their min and median printed; so are the cached full run (each from an empty cache) and the +1%
run (each from the cache the full run left), and the ratio is that of their medians. Timings
on a shared machine are noisy: the load average is printed beside each figure.

Usage: ``python benchmarks/bench_tokenize.py [--files 5000] [--workers W] [--model none|BPE]
[--repeat N]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.artifacts import read_json, sha256_bytes, write_parquet
from pipeline.core.config import RuntimeConfig
from pipeline.stages.tokenize import TokenizeConfig, make_tokenizer, run


def make_file(seed: int) -> bytes:
    from symusic import Note, Score, Tempo, Track

    rng = np.random.default_rng(seed)
    score = Score(480)
    score.tempos.append(Tempo(0, 120.0))
    for t in range(2):
        track = Track(name=f"t{t}", program=(0, 33)[t], is_drum=False)
        tick = 0
        for _ in range(30):
            track.notes.append(Note(tick, int(rng.integers(1, 5)) * 120,
                                    int(rng.integers(36, 84)), int(rng.integers(40, 110))))
            tick += int(rng.integers(0, 4)) * 120
        score.tracks.append(track)
    return score.dumps_midi()


def write_inputs(root: Path, n: int, start: int = 0, rows: list[dict] | None = None) -> list[dict]:
    raw = root / "data" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rows = list(rows or [])
    for i in range(start, start + n):
        data = make_file(i)
        (raw / f"{i:06d}.mid").write_bytes(data)
        rows.append({"path": f"{i:06d}.mid", "sha256": sha256_bytes(data), "status": "ok"})
    write_parquet(root / "data" / "manifest.parquet", pd.DataFrame(rows))
    shas = sorted(r["sha256"] for r in rows)
    split = ["val" if int(s[:6], 16) % 10 == 0 else "test" if int(s[:6], 16) % 10 == 1
             else "train" for s in shas]
    write_parquet(root / "data" / "splits.parquet",
                  pd.DataFrame({"sha256": shas, "group_id": shas, "split": split, "fold": 0}))
    return rows


def stage(root: Path, cfg: TokenizeConfig, workers: int, cache: bool) -> tuple[float, dict]:
    """Wall seconds of one in-process run, and its timing sidecar."""
    t = time.perf_counter()
    run(cfg, RuntimeConfig(workers=workers, progress=False), raw_dir=root / "data/raw",
        manifest=root / "data/manifest.parquet", splits=root / "data/splits.parquet",
        split_report=None, tokenizer_out=root / "data/tokenizer.json",
        tokens_dir=root / "data/tokens", cache_dir=root / "data/token_cache" if cache else None,
        report=root / "reports/tokenize.json")
    return time.perf_counter() - t, read_json(root / "reports/tokenize.env.json")


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"


def spread(xs: list[float]) -> str:
    return f"min {min(xs):.2f} s, median {statistics.median(xs):.2f} s" if len(xs) > 1 else ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=5000)
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--model", default="none", choices=["none", "BPE"])
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    cfg = TokenizeConfig(model=args.model, vocab_size=1000)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        rows = write_inputs(root, args.files)
        print(f"generated {args.files} files in {time.perf_counter() - t:.1f} s; "
              f"{args.workers} workers; model {args.model}")

        from symusic import Score

        tok = make_tokenizer(cfg.tokenizer, cfg.config)
        paths = sorted((root / "data/raw").glob("*.mid"))

        def plain() -> tuple[float, int]:
            t = time.perf_counter()
            n_tokens = sum(len(tok.encode(Score(p)).ids) for p in paths)
            return time.perf_counter() - t, n_tokens

        t1, env1 = stage(root, cfg, 1, cache=False)
        plains, stages = [], []
        for _ in range(args.repeat):
            t_plain, n_tokens = plain()
            plains.append(t_plain)
            tw, envw = stage(root, cfg, args.workers, cache=False)
            stages.append(tw)
        t_plain, tw = min(plains), min(stages)
        print(f"plain miditok loop (1 process, encode only): {len(paths) / t_plain:8.0f} files/s "
              f"({n_tokens / t_plain:,.0f} tokens/s) {spread(plains)} ({load()})")
        s1, sw = env1["seconds"], envw["seconds"]
        print(f"stage, 1 worker  (encode+decode+check): {len(paths) / t1:8.0f} files/s "
              f"= {t_plain / t1:.2f}x the plain loop; encode phase {s1['encode']:.1f} s")
        print(f"stage, {args.workers} workers: {len(paths) / tw:8.0f} files/s "
              f"= {t_plain / tw:.2f}x the plain loop (best against best; median "
              f"{statistics.median(plains) / statistics.median(stages):.2f}x); encode phase "
              f"{sw['encode']:.1f} s {spread(stages)} ({load()})")
        ws = env1["worker_seconds"]
        print(f"round-trip check (decode + note comparison, always on): {ws['check']:.1f} s of "
              f"{ws['encode']:.1f} s worker time, 1 worker ({ws['check'] / ws['encode']:.0%}); "
              f"without it the {args.workers}-worker run would take about "
              f"{tw - envw['worker_seconds']['check'] / args.workers:.1f} s")
        # Efficiency only means something on otherwise idle cores: print the load alongside.
        eff_encode = s1["encode"] / (args.workers * sw["encode"])
        eff_total = t1 / (args.workers * tw)
        print(f"parallel efficiency: encode phase {eff_encode:.2f}, end to end {eff_total:.2f} "
              f"({load()})")

        fulls = []
        for _ in range(args.repeat):  # each from an empty cache
            shutil.rmtree(root / "data/token_cache", ignore_errors=True)
            t_full, env_full = stage(root, cfg, args.workers, cache=True)
            fulls.append(t_full)
        shutil.copytree(root / "data/token_cache", root / "cache_after_full")
        n_new = max(1, args.files // 100)
        write_inputs(root, n_new, start=args.files, rows=rows)
        incs = []
        for _ in range(args.repeat):  # each from the cache the full run left
            shutil.rmtree(root / "data/token_cache")
            shutil.copytree(root / "cache_after_full", root / "data/token_cache")
            os.sync()
            t_inc, env_inc = stage(root, cfg, args.workers, cache=True)
            incs.append(t_inc)
        t_full, t_inc = statistics.median(fulls), statistics.median(incs)
        s_inc = env_inc["seconds"]
        rest = s_inc["total"] - s_inc["plan"] - s_inc["encode"]
        print(f"cached full run {t_full:.2f} s {spread(fulls)} (of which writing the cache "
              f"{env_full['worker_seconds']['cache_write']:.2f} s worker time); after adding "
              f"{n_new} files (1%): {t_inc:.2f} s {spread(incs)} = {t_inc / t_full:.3f} of the "
              f"full run (medians; last run: plan {s_inc['plan']:.2f} s, encode "
              f"{s_inc['encode']:.2f} s, cache merge + assemble + write {rest:.2f} s) ({load()})")

if __name__ == "__main__":
    main()
