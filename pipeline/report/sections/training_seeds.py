"""The report's training seeds: per seed, the transformer's best val loss, test NLL, gain over
the n-gram and generalisation gap, with their spread; the per-seed training logs, each seed's
gradient norm and learning rate, and what the diagnosis flags in each log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.core.artifacts import read_table_or_none
from pipeline.render.document import NA, Document, Figure, Heading, Para, Table, fmt
from pipeline.render.figures import training_dynamics_png
from pipeline.report.context import ReportContext
from pipeline.report.sections.common import not_available
from pipeline.training.diagnosis import RunFacts, diagnose


def train_logs(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """The per-step training logs: a folder of ``seed-<s>.tsv`` (one per training seed, labelled
    ``seed <s>``) or one TSV file (unlabelled). Unreadable files are left out."""
    path = Path(path)
    files = (sorted(path.glob("seed-*.tsv"), key=lambda f: (len(f.stem), f.stem))
             if path.is_dir() else [path])
    out = {}
    for f in files:
        log = read_table_or_none(f)
        if log is None or "step" not in log.columns:
            continue
        label = f.stem.replace("seed-", "seed ") if path.is_dir() else ""
        out[label] = {c: pd.to_numeric(log[c], errors="coerce").to_numpy(dtype=float)
                      for c in ("step", "train_loss", "val_loss", "lr", "grad_norm")
                      if c in log.columns}
    return out


def dynamics(doc: Document, ctx: ReportContext) -> None:
    """Each seed's gradient norm and learning rate beside the loss curves, and what
    :func:`pipeline.training.diagnosis.diagnose` flags in each seed's log (``symkit diagnose``
    prints the same with the evidence)."""
    path = ctx.inputs.get("train_log")
    logs = train_logs(Path(path)) if path else {}
    if not logs:
        return
    doc.add(Figure("Gradient norm before clipping (log scale) and learning rate of each training "
                   "seed, step by step: a spike in the norm marks a batch or a step the model "
                   "found far harder than its neighbours.", training_dynamics_png(logs)))
    train = ctx.reports.get("train") if isinstance(ctx.reports.get("train"), dict) else {}
    replicates = train.get("replicates") if isinstance(train.get("replicates"), dict) else {}
    rows = []
    for label, log in logs.items():
        seed = label.removeprefix("seed ").strip()
        stop = (replicates.get(seed) or {}).get("stop_reason")
        flags = diagnose(pd.DataFrame(log), RunFacts.of(ctx.params.get("transformer") or {},
                                                        stop))
        rows.append([label or "run", ", ".join(f"{f.kind} at step {f.step}" for f in flags)
                     or "nothing"])
    doc.add(Para("What the training logs show (`symkit diagnose` gives each flag's evidence and "
                 "likely cause; pipeline/training/diagnosis.py states the rules):", "note"),
            Table(["seed", "flagged"], rows))


def render(doc: Document, ctx: ReportContext) -> None:
    """The spread over training seeds: per seed, the transformer's best val loss, test NLL,
    relative improvement over the n-gram and generalisation gap."""
    doc.add(Heading("Training seeds", 3))
    _seeds(doc, ctx)
    dynamics(doc, ctx)


def _seeds(doc: Document, ctx: ReportContext) -> None:
    d, reports = ctx.digits, ctx.reports
    train = reports.get("train") if isinstance(reports.get("train"), dict) else {}
    ev = reports.get("eval") if isinstance(reports.get("eval"), dict) else {}
    seeds = [str(x) for x in train.get("seeds") or []]
    if not seeds:
        not_available(doc, "reports/train.json: seeds")
        return
    if len(seeds) == 1:
        doc.add(Para(f"The transformer was trained once (seed {seeds[0]}): its intervals cover "
                     "the sampling of test pieces, not training variance. Set "
                     "transformer.replicates to 2 or more to measure it."))
        return

    def get(obj: Any, *keys: str) -> Any:
        for k in keys:
            obj = obj.get(k) if isinstance(obj, dict) else None
        return obj

    per_note = get(ev, "models", "transformer", "test", "per_seed") or {}
    rel = get(ev, "paired", "ngram_minus_transformer", "test", "rel_improvement") or {}
    gap = get(ev, "gap", "transformer", "nats_per_note", "per_seed") or {}
    replicates = train.get("replicates") if isinstance(train.get("replicates"), dict) else {}
    columns = {
        "best val loss (nats/token)": {s: get(replicates, s, "best_val_loss") for s in seeds},
        "test NLL (nats/note)": {s: get(per_note, s, "nats_per_note") for s in seeds},
        "gain over n-gram (test)": {s: get(rel, "per_seed", s) for s in seeds},
        "held-out − train gap (nats/note)": {s: gap.get(s) for s in seeds},
    }
    rows = [[s, *(fmt(col[s], d) for col in columns.values())] for s in seeds]
    for label, fn in (("mean", np.mean), ("sd", lambda v: np.std(v, ddof=1))):
        cells = []
        for col in columns.values():
            v = [x for x in col.values() if isinstance(x, int | float)]
            cells.append(fmt(float(fn(v)), d) if len(v) >= 2 else NA)
        rows.append([label, *cells])
    judged = get(reports.get("audit"), "judged", "transformer") or {}
    if judged.get("seeds"):
        audit_seeds = ("The audit judges every seed as well: generate shares the samples out "
                       "among the seeds, and quality judges the pooled samples. The guards "
                       "(membership, copying, extraction and the gap) must hold for every "
                       "seed: the criteria judge each seed's own block, and one seed failing "
                       "fails the guard.")
    else:
        audit_seeds = (f"Samples, copying and quality use the first seed's model (seed "
                       f"{seeds[0]}); membership and extraction run on every seed and judge "
                       "the first.")
    split_terms = ""
    if all(isinstance(rel.get(k), int | float) for k in ("groups_ci_low", "groups_ci_high",
                                                         "seed_half_width")):
        split_terms = (f" For the gain over the n-gram the groups alone give "
                       f"{fmt(rel['groups_ci_low'], d)} to {fmt(rel['groups_ci_high'], d)}; the "
                       f"seeds' term, ±{fmt(rel['seed_half_width'], d)}, widens it to "
                       f"{fmt(rel.get('ci_low'), d)} to {fmt(rel.get('ci_high'), d)}.")
    doc.add(Para(f"The transformer was trained {len(seeds)} times, with seeds "
                 f"{', '.join(seeds)} (transformer.seed, transformer.replicates) on the same "
                 "split. Its test NLL, the comparison with the n-gram and the gap average each "
                 "piece's NLL over the seeds. Their intervals take the group bootstrap of that "
                 "average and add, in quadrature on each side, a Student-t term over the "
                 f"per-seed values ({len(seeds) - 1} degrees of freedom), so they include "
                 f"training variance.{split_terms} {audit_seeds}"),
            Table(["seed", *columns], rows))
