"""``symkit diagnose``: what a finished or failed training run's logs show, seed by seed.

Reads each seed's log (``reports/plots/train_log/seed-<s>.tsv``, what ``train_transformer``
writes) with the run's facts (``reports/train.json``: why each seed stopped; params.yaml: the step
budget, patience and validation windows), or, for a run that died before writing its outputs,
the log rows its newest checkpoint keeps (``--checkpoints data/transformer/checkpoints``: one
``run-*`` folder per seed). Each flag names the step, the evidence and the likely cause
(:mod:`pipeline.training.diagnosis` states the rules). ``--json`` writes the flags too.

The exit status is 1 when any seed is flagged, 0 when none is, 2 when there is nothing to read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.core import artifacts
from pipeline.core.config import read_params
from pipeline.training import checkpoint as ckpt
from pipeline.training.diagnosis import Flag, RunFacts, diagnose

HELP = "flag loss spikes, divergence, plateaus, overfitting and noisy early stops in training logs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--logs", type=Path, default=Path("reports/plots/train_log"),
                        help="folder of seed-<s>.tsv logs (default reports/plots/train_log)")
    parser.add_argument("--train-report", type=Path, default=Path("reports/train.json"),
                        help="the training summary: why each seed stopped")
    parser.add_argument("--checkpoints", type=Path, default=None,
                        help="read the newest checkpoint's log of each run-* folder here instead "
                             "(a run that died before writing its logs)")
    parser.add_argument("--json", type=Path, default=None, help="also write the flags here")


def logs_from_tsv(folder: Path, train_report: Path, params: dict[str, Any]
                  ) -> dict[str, tuple[pd.DataFrame, RunFacts]]:
    """Seed -> (log, facts) from a folder of TSV logs and the training summary."""
    summary = artifacts.read_json_or_none(train_report)
    replicates = (summary or {}).get("replicates") if isinstance(summary, dict) else None
    out = {}
    for f in sorted(Path(folder).glob("seed-*.tsv"), key=lambda f: (len(f.stem), f.stem)):
        seed = f.stem.removeprefix("seed-")
        log = artifacts.read_table_or_none(f)
        if log is None:
            continue
        stop = ((replicates or {}).get(seed) or {}).get("stop_reason")
        out[seed] = (log, RunFacts.of(params.get("transformer") or {}, stop))
    return out


def logs_from_checkpoints(folder: Path) -> dict[str, tuple[pd.DataFrame, RunFacts]]:
    """Seed -> (log, facts) from the newest readable checkpoint of each ``run-*`` folder: its
    log rows, and its config's step budget and patience."""
    out = {}
    for run in sorted(Path(folder).glob("run-*")):
        for path in reversed(ckpt.list_checkpoints(run)):
            try:
                state = ckpt.read_state(path)
            except ckpt.CheckpointUnreadable:
                continue
            cfg, ts = state.get("config") or {}, state.get("train_state") or {}
            seed = str(cfg.get("seed", run.name))
            out[seed] = (pd.DataFrame(ts.get("log") or []),
                         RunFacts.of(cfg, ts.get("stop_reason")))
            break
    return dict(sorted(out.items(), key=lambda kv: (len(kv[0]), kv[0])))


def run(logs: dict[str, tuple[pd.DataFrame, RunFacts]]) -> dict[str, list[Flag]]:
    """Seed -> its flags."""
    return {seed: diagnose(log, facts) for seed, (log, facts) in logs.items()}


def main(args: argparse.Namespace) -> int:
    if args.checkpoints is not None:
        logs = logs_from_checkpoints(args.checkpoints)
        where = str(args.checkpoints)
    else:
        logs = logs_from_tsv(args.logs, args.train_report, read_params(args.params))
        where = str(args.logs)
    if not logs:
        print(f"symkit diagnose: no training log in {where}", file=sys.stderr)
        return 2
    found = run(logs)
    for seed, flags in found.items():
        steps = int(pd.to_numeric(logs[seed][0].get("step"), errors="coerce").max())
        if not flags:
            print(f"seed {seed}: {steps} steps, nothing flagged")
            continue
        print(f"seed {seed}: {steps} steps, {len(flags)} flag{'s' * (len(flags) != 1)}")
        for f in flags:
            print(f"  step {f.step}: {f.kind}: {f.evidence}")
            print(f"    likely: {f.cause}")
    if args.json is not None:
        artifacts.write_json(args.json, {"source": where, "seeds": {
            s: [f.to_dict() for f in flags] for s, flags in found.items()}})
    return 1 if any(found.values()) else 0
