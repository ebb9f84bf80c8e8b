"""``symkit audit``: memorisation audit, per-model judgements and the sample quality guard, with
held-out human music as the baseline.

Every measure is computed for generated samples *and* for held-out human windows (val and test)
against the training set, so "how much does a model copy" is read against "how much does new
human music overlap with training anyway". The unit is a window of ``human_window`` ids, the span
a sample covers: a sample's generated part (``ids[prompt_len:]``, a continuation's prompt is a
test piece, not the model's work) cut to its first ``human_window`` ids, and from each held-out
piece windows starting every ``human_stride`` ids, at most ``human_windows`` per piece (evenly
spread; :func:`pipeline.audit.memorisation.window_offsets`). Several windows per piece make the
calibration thresholds quantiles of many values rather than the maximum of a few pieces; windows
of one piece are correlated, so every human interval resamples pieces, not windows.

Inputs: ``data/samples/samples.parquet``, ``data/tokens/tokens.parquet``, ``data/tokens/info.json``,
``data/tokenizer.json``, ``data/splits.parquet`` (the groups membership resamples), the models
(extraction test and membership inference).
Outputs:

- ``reports/audit/per_sample.parquet``: one row per audited sequence, sorted by (source, model,
  kind, index, offset): ``source`` (sample | human), ``model`` (``human`` for human rows),
  ``kind`` (unconditional | continuation | val | test), ``index`` (the sample's, or the piece's
  row in its split), ``offset`` (where the audited ids start: the window's offset, or the
  sample's ``prompt_len``), ``seed`` (the training seed that drew a sample; null for human rows
  and models trained once), ``sha256`` (human piece, or a sample's prompt), ``track``,
  ``n_tokens``, ``decode_ok``, ``lcs_tokens``, ``lcs_bars``, ``lcs_train_sha256``,
  ``lcs_start`` (the span's id position in the whole sequence), ``lcs_train_track``,
  ``lcs_train_start`` (its position in that training sequence; -1 when nothing is shared),
  ``novelty_tok_<n>``, ``novelty_int_<n>``, ``nn_sha256``, ``nn_jaccard``, ``nn_containment``,
  ``flagged``, and the music statistics of :mod:`pipeline.music.descriptors`.
- ``reports/audit/spans.parquet``: per sample sharing ids with training, its notes and the
  training piece's with the longest shared span's notes marked (:func:`shared_spans`), for the
  report's side-by-side piano rolls.
- ``reports/audit.json``: thresholds, summaries per group, flag rates, extraction test,
  membership AUC, music statistics, and ``judged.<model>``: each judged quantity with its
  interval and baseline. A model trained over several seeds is judged over all of them: samples
  from every seed (generate shares them out), the seeds' Student-t term on the flag rate and
  on membership (the seeds' mean AUC), extraction counted when any seed reproduces a piece;
  ``per_seed.<seed>`` keeps each seed's own membership, extraction and flag rate (its own
  samples against the same human windows), on which the criteria judge the memorisation
  guards, every seed alone (see docs/report.md for the keys).

A conditioned transformer's ``conditioned`` samples are also measured for **adherence**: how
often each sample's key, mode, density and polyphony, measured from its first ``human_window``
generated ids, equal the labels it was asked for, against the unconditioned samples (floor),
shuffled requests and held-out human windows against their own piece's labels (ceiling)
(:mod:`pipeline.audit.adherence`; inputs ``data/conditions.parquet`` and the ``condition``
section's bands); audit.json ``adherence.<model>``.

Flags: a row is flagged when any metric in ``flag_metrics`` exceeds its threshold, the
``flag_quantile`` of the val human windows. :func:`judge` then judges each model against its
baseline, with intervals: the flag rate against the test windows' rate, membership inference
(the loss attack on NLL per note, up to ``membership_pieces`` train pieces against as many
held-out val and test pieces, whole groups resampled; AUC against 0.5 and the true-positive
rate at ``membership_fpr``),
extraction on train against test pieces, and the quality guard
(:func:`pipeline.music.descriptors.quality_guard`), which fails silence, noise and undecodable
output.
Every random draw comes from a ``numpy.random.Generator`` seeded by (``seed``, purpose, model).

Compound tokens (CPWord, Octuple): the token rows and samples also carry ``codes`` and every
step is one symbol (:mod:`pipeline.audit.compound`): spans, id n-grams and extraction count
steps, membership reads the compound scorer's joint NLL per note, and audit.json has a
``compound`` block (the definition, and ``lcs_bars`` marked not applicable with its reason).

Auditing test pieces spends the test set like scoring them does: the human test windows, the
extraction test and membership all read test rows. So the stage reads the train and val rows with
:func:`~pipeline.tokens.contract.read_tokens` and the test rows through
:func:`pipeline.decision.looks.test_tokens`, which appends a look (command ``audit``) to the
test-access ledger ``reports/ledger.jsonl`` with the registration in force and the judging
code's digest before handing them over; once audit.json is written, the digest of its
``judged`` block follows (:meth:`pipeline.decision.looks.Look.scored`, kind ``audit``), so the
report can tell this run's judgements from earlier ones. An unchanged re-run adds nothing.
Called as a library without ``ledger_path`` the look is recorded nowhere (tests); ``symkit
audit`` always passes it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from models.base import SequenceModel
from pipeline.audit import judging
from pipeline.audit.judging import (  # noqa: F401  (the stage's API, re-exported)
    SPANS_SCHEMA,
    TOKEN_COLUMNS,
    AuditConfig,
    AuditSummary,
    ModelCheck,
    judge,
    model_checks,
    per_note_nll,
    shared_spans,
)
from pipeline.audit.overlap import Shingling
from pipeline.conditions.config import ConditionConfig
from pipeline.core.artifacts import read_json
from pipeline.core.config import RuntimeConfig, load_section
from pipeline.decision import ledger, looks
from pipeline.inference.loading import (
    ModelUnavailable,
    add_model_arguments,
    load_named,
    named_seeds,
)
from pipeline.tokens.contract import TokenInfo, read_tokens

HELP = "memorisation audit and music statistics"


def token_rows(tokens: Path, *, ledger_path: Path | None,
               preregistration: Path | None, compound: bool = False
               ) -> tuple[pd.DataFrame, looks.Look]:
    """The audit's rows of the token table: train and val read plainly, test through the gate
    (the look recorded in ``ledger_path`` first), sorted by (sha256, track); with ``codes``
    too for compound tokens."""
    columns = [*TOKEN_COLUMNS, "codes"] if compound else TOKEN_COLUMNS
    rows = read_tokens(tokens, columns, splits=["train", "val"])
    test, look = looks.test_tokens("audit", tokens, columns, ledger_path=ledger_path,
                                   registration=preregistration)
    table = pd.concat([rows, test], ignore_index=True)
    return table.sort_values(["sha256", "track"], kind="stable").reset_index(drop=True), look


def run(cfg: AuditConfig, models: Mapping[str, SequenceModel], *, samples: Path, tokens: Path,
        info: Path, tokenizer: Path, per_sample: Path, report: Path, spans: Path,
        shingling: Shingling | None = None, splits: Path | None = None,
        seeds: Mapping[str, Mapping[int, SequenceModel]] | None = None,
        conditions: Path | None = None, condition_cfg: Any = None,
        ledger_path: Path | None = None, preregistration: Path | None = None) -> AuditSummary:
    """:func:`pipeline.audit.judging.run` on the token table ``tokens``, its test rows read
    through the gate (module docstring): the look goes to ``ledger_path`` (None: nowhere) under
    the registration ``preregistration``, then the digest of audit.json's ``judged`` block."""
    table, look = token_rows(tokens, ledger_path=ledger_path, preregistration=preregistration,
                             compound=bool(TokenInfo.read(info).compound))
    summary = judging.run(cfg, models, samples=samples, table=table, info=info,
                          tokenizer=tokenizer, per_sample=per_sample, report=report,
                          spans=spans, shingling=shingling, splits=splits, seeds=seeds,
                          conditions=conditions, condition_cfg=condition_cfg)
    look.scored(looks.digest_of(read_json(report)["judged"]), "audit")
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=Path, default=Path("data/samples/samples.parquet"))
    parser.add_argument("--tokens", type=Path, default=Path("data/tokens/tokens.parquet"))
    parser.add_argument("--info", type=Path, default=Path("data/tokens/info.json"))
    parser.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer.json"))
    add_model_arguments(parser)
    parser.add_argument("--per-sample", type=Path, default=Path("reports/audit/per_sample.parquet"))
    parser.add_argument("--report", type=Path, default=Path("reports/audit.json"))
    parser.add_argument("--spans", type=Path, default=Path("reports/audit/spans.parquet"))
    parser.add_argument("--splits", type=Path, default=Path("data/splits.parquet"),
                        help="the split's groups, resampled whole in membership's interval")
    parser.add_argument("--fingerprint", type=Path, default=Path("data/dedupe/fingerprint.json"),
                        help="dedupe's shingle settings, reused for nearest-neighbour similarity")
    parser.add_argument("--conditions", type=Path, default=Path("data/conditions.parquet"),
                        help="condition table (`symkit conditions`); read only when the samples "
                             "include a conditioned model's")
    parser.add_argument("--preregistration", type=Path, default=ledger.REGISTRATION)
    parser.add_argument("--ledger", type=Path, default=ledger.LEDGER,
                        help="test-access ledger this run's look at the test pieces is "
                             "appended to")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("audit", args.params, AuditConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    try:
        info = TokenInfo.read(args.info)
        models, skipped = load_named(cfg.models, ngram_dir=args.ngram_dir,
                                     transformer_dir=args.transformer_dir, device=cfg.device,
                                     info=info, torch_threads=runtime.torch_threads)
        seeds = named_seeds(cfg.models, transformer_dir=args.transformer_dir, device=cfg.device,
                            info=info)
    except ModelUnavailable as e:
        print(f"symkit audit: cannot use a model listed in audit.models: {e}", file=sys.stderr)
        return 1
    for name, why in skipped.items():
        print(f"audit: {name} skipped ({why})")
    s = run(cfg, models, samples=args.samples, tokens=args.tokens, info=args.info,
            tokenizer=args.tokenizer, per_sample=args.per_sample, report=args.report,
            spans=args.spans, shingling=Shingling.read(args.fingerprint),
            splits=args.splits if args.splits.exists() else None, seeds=seeds,
            conditions=args.conditions,
            condition_cfg=load_section("condition", args.params, ConditionConfig),
            ledger_path=args.ledger, preregistration=args.preregistration)
    print(f"audit: {s.n_rows} sequences; flag rate samples {s.sample_flag_rate} vs "
          f"human test {s.human_flag_rate} -> {args.report}")
    return 0
