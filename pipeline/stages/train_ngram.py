"""``symkit train-ngram``: fit n-gram baselines of several orders, choose the order on val.

Inputs: ``data/tokens/tokens.parquet`` (``sha256``, ``split``, ``track``, ``ids``),
``data/tokens/info.json`` (``vocab_size``, ``pad_id``, ``bos_id``, ``eos_id``,
``tokenizer_hash``, ``split_hash``) and, when ``ngram.use_augmented``, the train-only
``data/tokens/augmented.parquet``. Outputs:

- ``data/ngram/``: the best order's ``model.npz`` + ``model.json`` (``NGramLM.save``; its
  ``metadata`` holds the tokenizer and split hashes, which ``symkit evaluate`` checks);
- ``reports/ngram.json``: val metrics per order, the chosen order, what was excluded;
- ``reports/plots/ngram_orders.tsv``: the per-order curve (DVC plot);
- ``reports/ngram.env.json``: timings (sidecar).

Sequences follow the evaluation protocol (:func:`pipeline.inference.protocol.clean_sequences`):
special ids are removed, pieces that were not encoded or hold out-of-range ids are excluded and
counted. All n-grams up to the largest order are counted once on train; every order is smoothed
from those counts and scored on val (mean NLL per target, EOS included). The lowest val NLL wins;
a tie goes to the smaller order. The test split is never read past its ``split`` label.

Compound tokens (CPWord, Octuple): the n-gram baseline is not applicable (:data:`NOT_APPLICABLE`).
The stage then writes ``data/ngram/not_applicable.json`` (``applicable: false``, ``reason``, the
token hashes) and no model, ``reports/ngram.json`` with the same ``applicable: false`` and
``reason`` (no order, no val figure), and a plot with its header only; ``symkit evaluate`` lists
the n-gram as not applicable with that reason, and the report says so.
"""

from __future__ import annotations

import argparse
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from models.ngram import NGramLM, Smoothing
from models.ngram_counts import IdSpace, count_ngrams
from pipeline.core.artifacts import read_parquet, write_json, write_sidecar, write_text
from pipeline.core.config import RuntimeConfig, StageConfig, load_section
from pipeline.inference.protocol import NOT_APPLICABLE as NOT_APPLICABLE_FILE
from pipeline.inference.protocol import clean_sequences
from pipeline.tokens.contract import TokenInfo, read_tokens

HELP = "fit n-gram baselines, choose the order on val"

MAX_ORDER = 12


class NGramConfig(StageConfig):
    """``ngram`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "ngram"

    orders: list[int] = Field(default_factory=lambda: [1, 2, 3, 4, 5, 6, 8], min_length=1)
    smoothing: Smoothing = "kneser_ney"
    k: float = Field(1.0, gt=0.0)
    use_augmented: bool = True

    @field_validator("orders")
    @classmethod
    def _orders(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("must not repeat an order")
        if min(v) < 1 or max(v) > MAX_ORDER:
            raise ValueError(f"every order must be in 1..{MAX_ORDER}")
        return sorted(v)


@dataclass(frozen=True)
class NGramSummary:
    best_order: int | None  # None: not applicable (compound tokens)
    val_nats_per_token: float | None
    n_train_targets: int
    n_val_targets: int


NOT_APPLICABLE = (
    "the n-gram baseline is not applicable to compound tokens: a step is a tuple of one id per "
    "codebook, and an n-gram over such tuples is too sparse to estimate at this corpus size, while "
    "one n-gram per codebook would not be a joint model of the steps (its NLL would not be "
    "comparable with the transformer's joint NLL)")
"""Why ``train-ngram`` fits nothing for a compound tokenizer (in ``reports/ngram.json``)."""
def not_applicable(info: TokenInfo, model_dir: Path, report: Path, plot: Path) -> None:
    """Compound tokens: the outputs that say the baseline is not applicable (module docstring),
    so DVC's outputs exist and every reader downstream sees why there is no n-gram."""
    block = {"applicable": False, "reason": NOT_APPLICABLE, "tokenizer": info.tokenizer,
             "tokenizer_hash": info.tokenizer_hash, "split_hash": info.split_hash}
    shutil.rmtree(model_dir, ignore_errors=True)  # no model left from another tokenizer
    write_json(Path(model_dir) / NOT_APPLICABLE_FILE, block)
    write_json(report, block)
    write_text(plot, plot_tsv({}))


def training_sequences(rows: pd.DataFrame, augmented: pd.DataFrame | None,
                       info: TokenInfo) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Train sequences (+ augmented rows of train pieces) and what was excluded."""
    train = rows[rows["split"] == "train"]
    seqs = list(train["ids"])
    report: dict[str, Any] = {"train_pieces": int(train["sha256"].nunique()),
                              "train_sequences": len(seqs)}
    if augmented is not None:
        aug = augmented.assign(split="train")
        aug, aug_excluded = clean_sequences(aug, info)
        foreign = ~aug["sha256"].isin(set(train["sha256"]))  # never train on val/test music
        report["augmented_sequences"] = int((~foreign).sum())
        report["augmented_excluded"] = {
            "not_a_train_piece": int(foreign.sum()),
            "pieces": len(aug_excluded["pieces"]),
            "special_ids_removed": aug_excluded["special_ids_removed"]}
        seqs += list(aug.loc[~foreign, "ids"])
    return seqs, report


def plot_tsv(per_order: dict[int, dict[str, float]]) -> str:
    lines = ["order\tval_nats_per_token\tval_bits_per_token\tval_perplexity"]
    for order, m in sorted(per_order.items()):
        lines.append(f"{order}\t{m['val_nats_per_token']!r}\t{m['val_bits_per_token']!r}\t"
                     f"{m['val_perplexity']!r}")
    return "\n".join(lines) + "\n"


def run(cfg: NGramConfig, runtime: RuntimeConfig, *, tokens: Path, info: Path,
        augmented: Path, model_dir: Path, report: Path, plot: Path) -> NGramSummary:
    """Fit every order in ``cfg.orders`` on train, keep the best on val."""
    t0 = time.perf_counter()
    tok_info = TokenInfo.read(info)
    if tok_info.compound:
        not_applicable(tok_info, model_dir, report, plot)
        return NGramSummary(None, None, 0, 0)
    rows = read_tokens(tokens, ["sha256", "split", "track", "ids"], splits=["train", "val"])
    rows, excluded = clean_sequences(rows, tok_info)
    aug = None
    if cfg.use_augmented:
        aug = read_parquet(augmented)
        if "track" not in aug:
            aug["track"] = 0
        aug = aug[["sha256", "transpose", "track", "ids"]]
        aug = aug.sort_values(["sha256", "transpose", "track"], kind="stable")
        aug = aug.reset_index(drop=True)
    train, data_report = training_sequences(rows, aug, tok_info)
    val = list(rows.loc[rows["split"] == "val", "ids"])
    if not train or not val:
        raise ValueError(f"{tokens}: {len(train)} train and {len(val)} val sequences after "
                         "exclusions; both are needed to fit and choose an order")
    space = IdSpace(tok_info.vocab_size, tok_info.bos_id, tok_info.eos_id, tok_info.pad_id)
    t_read = time.perf_counter()
    top = max(cfg.orders) if cfg.smoothing in ("kneser_ney", "add_k") else 1
    counts = count_ngrams(train, top, space)
    t_count = time.perf_counter()

    per_order: dict[int, dict[str, Any]] = {}
    best: NGramLM | None = None
    n_val = sum(len(s) + 1 for s in val)
    for order in cfg.orders:
        model = NGramLM(order=order, smoothing=cfg.smoothing, vocab_size=space.vocab_size,
                        bos_id=space.bos_id, eos_id=space.eos_id, pad_id=space.pad_id,
                        k=cfg.k).fit_counts(counts)
        nats = math.fsum(model.nll_per_piece(val)) / n_val
        per_order[order] = {
            "val_nats_per_token": nats, "val_bits_per_token": nats / math.log(2),
            "val_perplexity": math.exp(nats), "n_ngrams": model.n_ngrams_,
            "discounts": model.discounts_, "discount_fallback_orders": model.discount_fallback_}
        if best is None or nats < per_order[best.order]["val_nats_per_token"]:
            best = model
    assert best is not None
    t_fit = time.perf_counter()

    chosen = per_order[best.order]
    best.save(model_dir, metadata={
        "tokenizer_hash": tok_info.tokenizer_hash, "split_hash": tok_info.split_hash,
        "chosen_on": "val", "val_nats_per_token": chosen["val_nats_per_token"],
        "orders_compared": cfg.orders, "use_augmented": cfg.use_augmented})
    write_json(report, {
        "best_order": best.order, "smoothing": cfg.smoothing,
        "val_nats_per_token": chosen["val_nats_per_token"],
        "val_bits_per_token": chosen["val_bits_per_token"],
        "val_perplexity": chosen["val_perplexity"],
        "orders": {str(o): m for o, m in per_order.items()},
        "data": {**data_report, "val_pieces": int(rows.loc[rows["split"] == "val", "sha256"]
                                                  .nunique()),
                 "val_sequences": len(val), "val_targets": n_val,
                 "train_targets": counts.n_targets},
        "excluded": excluded,
        "tokenizer_hash": tok_info.tokenizer_hash, "split_hash": tok_info.split_hash,
    })
    write_text(plot, plot_tsv(per_order))
    write_sidecar(report.with_name(report.stem + ".env.json"), {"seconds": {
        "read": t_read - t0, "count": t_count - t_read, "smooth_and_score": t_fit - t_count,
        "total": time.perf_counter() - t0}})
    return NGramSummary(best.order, chosen["val_nats_per_token"], counts.n_targets, n_val)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--tokens", type=Path, default=Path("data/tokens/tokens.parquet"))
    a("--info", type=Path, default=Path("data/tokens/info.json"))
    a("--augmented", type=Path, default=Path("data/tokens/augmented.parquet"))
    a("--model-dir", type=Path, default=Path("data/ngram"))
    a("--report", type=Path, default=Path("reports/ngram.json"))
    a("--plot", type=Path, default=Path("reports/plots/ngram_orders.tsv"))


def main(args: argparse.Namespace) -> int:
    cfg = load_section("ngram", args.params, NGramConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    s = run(cfg, runtime, tokens=args.tokens, info=args.info, augmented=args.augmented,
            model_dir=args.model_dir, report=args.report, plot=args.plot)
    if s.best_order is None:
        print(f"train-ngram: {NOT_APPLICABLE}")
        return 0
    print(f"train-ngram: best order {s.best_order} ({cfg.smoothing}), val "
          f"{s.val_nats_per_token:.4f} nats/token on {s.n_val_targets:,} targets; "
          f"trained on {s.n_train_targets:,} targets")
    return 0
