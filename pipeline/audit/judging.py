"""The memorisation audit's work: the ``audit`` stage's (:mod:`pipeline.stages.audit` documents
its measures, inputs and outputs), also used by ``adapt-audit`` on an adaptation experiment's
arms against each of its corpora."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field

from models.base import SequenceModel
from pipeline.audit.memorisation import (
    Extraction,
    extraction_test,
    judge_extraction,
    judge_flag_rate,
    judge_membership,
    membership_auc,
    tpr_at_fpr,
    union_extraction,
    window_offsets,
)
from pipeline.audit.overlap import (
    Shingling,
    bar_tokens_per_id,
    build_training_index,
    measure_all,
)
from pipeline.core import artifacts
from pipeline.core.artifacts import stable_int
from pipeline.core.config import StageConfig
from pipeline.music.descriptors import STATS, quality_guard
from pipeline.music.midi import score_notes
from pipeline.tokens.contract import TokenInfo, never_sampled
from pipeline.tokens.spans import span_mask
from pipeline.tokens.tokenizer import decode_ids, load_tokenizer

TOKEN_COLUMNS = ["sha256", "split", "track", "ids", "n_tokens", "n_notes"]
"""The token table's columns :func:`run` reads."""

FlagMetric = Literal["lcs_tokens", "nn_jaccard", "nn_containment"]


class AuditConfig(StageConfig):
    """``audit`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "audit"

    models: list[Literal["ngram", "transformer"]] = Field(
        default_factory=lambda: ["ngram", "transformer"], min_length=1)
    ngram_sizes: list[int] = Field(default_factory=lambda: [8, 16, 32], min_length=1)
    interval_ngram_sizes: list[int] = Field(default_factory=lambda: [4, 8, 16], min_length=1)
    human_window: int = Field(128, ge=8)
    human_stride: int = Field(64, ge=1)
    human_windows: int = Field(4, ge=1)
    flag_metrics: list[FlagMetric] = Field(
        default_factory=lambda: ["lcs_tokens", "nn_jaccard"], min_length=1)
    flag_quantile: float = Field(0.95, gt=0.0, le=1.0)
    extraction_pieces: int = Field(256, ge=1)
    extraction_prefix: int = Field(32, ge=1)
    extraction_tokens: int = Field(32, ge=1)
    membership_pieces: int = Field(256, ge=2)
    membership_fpr: float = Field(0.1, gt=0.0, lt=1.0)
    beats_per_bar: int = Field(4, ge=1)
    groove_resolution: int = Field(4, ge=1)
    n_boot: int = Field(2000, ge=100, le=100000)
    ci_level: float = Field(0.95, gt=0.5, lt=1.0)
    quality_bins: int = Field(10, ge=2, le=100)
    quality_alpha: float = Field(0.05, gt=0.0, lt=0.5)
    seed: int = Field(1234, ge=0)
    device: str = "cpu"


@dataclass(frozen=True)
class AuditSummary:
    n_rows: int
    sample_flag_rate: float | None
    human_flag_rate: float | None


# --- aggregation ------------------------------------------------------------------------------


def thresholds(val: pd.DataFrame, metrics: Sequence[str], q: float) -> dict[str, float | None]:
    """Per-metric ``q`` quantile of the val human rows (an observed value: method "higher")."""
    out: dict[str, float | None] = {}
    for m in metrics:
        v = val[m].to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        out[m] = float(np.quantile(v, q, method="higher")) if v.size else None
    return out


def flag(df: pd.DataFrame, limits: Mapping[str, float | None]) -> np.ndarray:
    """A row is flagged when any metric is above its threshold (missing thresholds never flag)."""
    flagged = np.zeros(len(df), dtype=bool)
    for m, t in limits.items():
        if t is not None:
            flagged |= np.nan_to_num(df[m].to_numpy(dtype=float), nan=-np.inf) > t
    return flagged


def summarise(df: pd.DataFrame, cols: Sequence[str]) -> dict[str, Any]:
    """Count, flag rate, decode failures and the mean / median / max of each numeric column."""
    out: dict[str, Any] = {"n": len(df)}
    if not len(df):
        return out
    out["flag_rate"] = float(df["flagged"].mean())
    out["decode_failures"] = int((~df["decode_ok"].astype(bool)).sum())
    for c in cols:
        v = df[c].to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        if v.size:
            out[f"{c}_mean"] = float(v.mean())
            out[f"{c}_median"] = float(np.median(v))
            out[f"{c}_max"] = float(v.max())
    return out


def _schema(columns: Sequence[str]) -> pa.Schema:
    strings = {"source", "model", "kind", "sha256", "lcs_train_sha256", "nn_sha256"}
    ints = {"index", "offset", "track", "seed", "n_tokens", "lcs_start", "lcs_train_track",
            "lcs_train_start"}
    bools = {"decode_ok", "flagged"}
    return pa.schema([(c, pa.string() if c in strings else pa.int64() if c in ints
                       else pa.bool_() if c in bools else pa.float64()) for c in columns])


def _pick_rows(df: pd.DataFrame, n: int, rng: np.random.Generator, min_len: int
               ) -> pd.DataFrame:
    """``n`` rows (all when fewer) of at least ``min_len`` ids, drawn by ``rng``, in table order."""
    df = df[df["n_tokens"] >= min_len]
    rows = np.sort(rng.choice(len(df), size=min(n, len(df)), replace=False)) if len(df) else []
    return df.iloc[np.asarray(rows, dtype=np.int64)]


def _ids(df: pd.DataFrame) -> list[np.ndarray]:
    return [np.asarray(v, dtype=np.int64) for v in df["ids"]]


def _rng(cfg: AuditConfig, purpose: str, name: str = "") -> np.random.Generator:
    """The generator of one purpose (and model): adding a model leaves the others' draws alone."""
    return np.random.default_rng([cfg.seed, stable_int(purpose), stable_int(name)])


@dataclass(frozen=True)
class ModelCheck:
    """What the extraction test and membership inference measured for one model."""

    extraction_train: Extraction
    extraction_test: Extraction
    nll_train: np.ndarray
    """Membership: NLL per note of each train piece (nats, summed over its ids / its notes)."""
    nll_heldout: np.ndarray
    """... and of each held-out (val and test) piece."""
    groups_train: np.ndarray
    groups_heldout: np.ndarray


def per_note_nll(model: SequenceModel, rows: pd.DataFrame) -> np.ndarray:
    """NLL per note of each row: the summed NLL of its ids over its ``n_notes`` (evaluate's unit,
    so the membership signal is on the scale of the generalisation gap and not tied to how
    densely BPE, fitted on train, tokenises train against held-out pieces); NaN without
    notes."""
    seqs = _ids(rows)
    if not seqs:
        return np.zeros(0)
    sums = np.asarray([float(np.sum(v)) for v in model.token_nll(seqs)])
    notes = rows["n_notes"].to_numpy(dtype=np.float64)
    return np.where(notes > 0, sums / np.where(notes > 0, notes, 1.0), np.nan)


def model_checks(models: Mapping[str, SequenceModel], train: pd.DataFrame, heldout: pd.DataFrame,
                 test: pd.DataFrame, cfg: AuditConfig, forbid: Sequence[int],
                 groups: Mapping[str, Any] | None = None) -> dict[str, ModelCheck]:
    """Extraction test (train against test pieces) and membership inference (train against
    held-out val and test pieces, NLL per note), the same seeded pieces for every model;
    ``groups`` maps sha256 to the split's group (absent: each piece its own group)."""
    need = cfg.extraction_prefix + cfg.extraction_tokens
    rng = np.random.default_rng([cfg.seed, stable_int("extraction")])
    ext_train, ext_test = _ids(_pick_rows(train, cfg.extraction_pieces, rng, need)), \
        _ids(_pick_rows(test, cfg.extraction_pieces, rng, need))
    rng = np.random.default_rng([cfg.seed, stable_int("membership")])
    mem_train = _pick_rows(train, cfg.membership_pieces, rng, 1)
    mem_held = _pick_rows(heldout, cfg.membership_pieces, rng, 1)

    def group_of(rows: pd.DataFrame) -> np.ndarray:
        shas = rows["sha256"].astype(str)
        return np.asarray([groups.get(h, h) if groups else h for h in shas], dtype=object)

    out = {}
    for name in sorted(models):
        m = models[name]
        out[name] = ModelCheck(
            extraction_test(m, ext_train, cfg.extraction_prefix, cfg.extraction_tokens, forbid),
            extraction_test(m, ext_test, cfg.extraction_prefix, cfg.extraction_tokens, forbid),
            per_note_nll(m, mem_train), per_note_nll(m, mem_held),
            group_of(mem_train), group_of(mem_held))
    return out


def checks_json(checks: Mapping[str, ModelCheck], fpr: float) -> tuple[dict, dict]:
    """The ``extraction`` and ``membership`` blocks of audit.json (point values)."""
    extraction, membership = {}, {}
    for name, c in sorted(checks.items()):
        a, b = c.extraction_train, c.extraction_test
        extraction[name] = {"n_train": a.n, "n_test": b.n, "train_exact": a.exact_rate,
                            "test_exact": b.exact_rate, "exact_gap": a.exact_rate - b.exact_rate,
                            "train_token_match": a.token_match, "test_token_match": b.token_match,
                            "token_match_gap": a.token_match - b.token_match}
        membership[name] = {"n_train": len(c.nll_train), "n_heldout": len(c.nll_heldout),
                            "heldout": "val+test", "unit": "nats per note",
                            "auc": membership_auc(c.nll_train, c.nll_heldout), "fpr": fpr,
                            "tpr": float(tpr_at_fpr(c.nll_train[np.isfinite(c.nll_train)],
                                                    c.nll_heldout[np.isfinite(c.nll_heldout)],
                                                    fpr)[0])
                            if len(c.nll_train) and len(c.nll_heldout) else float("nan")}
    return extraction, membership


def judge(df: pd.DataFrame, checks: Mapping[str, ModelCheck], cfg: AuditConfig,
          seed_checks: Mapping[str, Mapping[str, ModelCheck]] | None = None) -> dict[str, Any]:
    """``judged.<model>``: flag rate against the human test windows (resampled by piece: a
    piece tokenised as several sequences, one per track, keeps all its windows together),
    membership AUC against 0.5,
    extraction on train against test pieces, and the sample quality guard; each with its
    interval or band (see :mod:`pipeline.audit.memorisation` and
    :func:`pipeline.music.descriptors.quality_guard`).

    A model with ``seed_checks`` (its training seeds' checks, two or more, on the same pieces)
    is judged over every seed: its samples, drawn from every seed, are pooled and the flag rate
    gets the seeds' t term; membership is the seeds' mean AUC with that term; extraction counts
    a piece when any seed reproduces it (:func:`union_extraction`); quality judges the pooled
    samples. ``seeds`` then lists them.

    ``per_seed.<seed>`` holds every seed's own judgement, each with its own interval: its
    membership and extraction (:func:`per_seed_checks`) and, for samples drawn by two or more
    seeds, its flag rate (:func:`per_seed_flag_rates`). The criteria judge the memorisation
    guards on these, since a guard must hold for every seed."""
    human = df[df["source"] == "human"]
    val, test = human[human["kind"] == "val"], human[human["kind"] == "test"]
    samp = df[df["source"] == "sample"]

    def stats(part: pd.DataFrame) -> dict[str, np.ndarray]:
        ok = part["decode_ok"].to_numpy(dtype=bool)  # an undecodable sample has no statistics
        return {s: np.where(ok, part[s].to_numpy(dtype=float), np.nan) for s in STATS}

    boot = {"n_boot": cfg.n_boot, "level": cfg.ci_level}
    out: dict[str, Any] = {}
    for name in sorted(set(samp["model"].astype(str)) | set(checks)):
        block: dict[str, Any] = {}
        by_seed = dict((seed_checks or {}).get(name) or {})
        keys = sorted(by_seed, key=int) if len(by_seed) > 1 else []
        part = samp[samp["model"] == name]
        per_seed: dict[str, dict[str, Any]] = {}
        if len(part):
            drawn_by = part["seed"].to_numpy() if "seed" in part.columns else None
            if drawn_by is not None and pd.isna(drawn_by).any():
                drawn_by = None  # not every sample names its seed: one model
            block["flag_rate"] = judge_flag_rate(
                part["flagged"].to_numpy(), part["kind"].to_numpy(), test["flagged"].to_numpy(),
                test["sha256"].astype(str).to_numpy(), rng=_rng(cfg, "flag_rate", name),
                sample_seeds=None if drawn_by is None else drawn_by.astype(np.int64), **boot)
            if drawn_by is not None:
                for seed, rate in per_seed_flag_rates(part, drawn_by.astype(np.int64), test,
                                                      cfg, name).items():
                    per_seed.setdefault(seed, {})["flag_rate"] = rate
            block["quality"] = {
                **quality_guard(stats(part), stats(test), stats(val),
                                rng=_rng(cfg, "quality", name), bins=cfg.quality_bins,
                                alpha=cfg.quality_alpha, n_boot=cfg.n_boot),
                "decode_rate": float(part["decode_ok"].astype(bool).mean())}
        if name in checks:
            c = checks[name]
            if keys:
                cs = [by_seed[k] for k in keys]
                block["membership_auc"] = judge_membership(
                    np.stack([x.nll_train for x in cs]), np.stack([x.nll_heldout for x in cs]),
                    rng=_rng(cfg, "membership_auc", name), train_groups=cs[0].groups_train,
                    heldout_groups=cs[0].groups_heldout, fpr=cfg.membership_fpr, seeds=keys,
                    **boot)
                block["extraction_rate"] = judge_extraction(
                    union_extraction([x.extraction_train for x in cs]),
                    union_extraction([x.extraction_test for x in cs]), level=cfg.ci_level)
                block["extraction_rate"]["over_seeds"] = "any"
                block["seeds"] = [int(k) for k in keys]
                for seed, own in per_seed_checks(by_seed, cfg).items():
                    per_seed.setdefault(seed, {}).update(own)
            else:
                block["membership_auc"] = judge_membership(
                    c.nll_train, c.nll_heldout, rng=_rng(cfg, "membership_auc", name),
                    train_groups=c.groups_train, heldout_groups=c.groups_heldout,
                    fpr=cfg.membership_fpr, **boot)
                block["extraction_rate"] = judge_extraction(
                    c.extraction_train, c.extraction_test, level=cfg.ci_level)
        if per_seed:
            block["per_seed"] = {k: per_seed[k] for k in sorted(per_seed, key=int)}
        out[name] = block
    return out


def per_seed_flag_rates(part: pd.DataFrame, drawn_by: np.ndarray, test: pd.DataFrame,
                        cfg: AuditConfig, name: str) -> dict[str, dict[str, Any]]:
    """Each training seed's own flag rate against the same human test windows, for a model
    whose samples (``part``) were drawn by two or more seeds (``drawn_by``, one a sample):
    :func:`judge_flag_rate` on that seed's samples alone, so its interval is the samples' and
    the windows' (no seed term: one seed), from a generator of its own. Empty for one seed."""
    seeds = sorted(np.unique(drawn_by).tolist())
    if len(seeds) < 2:
        return {}
    boot = {"n_boot": cfg.n_boot, "level": cfg.ci_level}
    out = {}
    for seed in seeds:
        mine = part[drawn_by == seed]
        out[str(seed)] = judge_flag_rate(
            mine["flagged"].to_numpy(), mine["kind"].to_numpy(), test["flagged"].to_numpy(),
            test["sha256"].astype(str).to_numpy(),
            rng=_rng(cfg, "flag_rate", f"{name}@seed-{seed}"), **boot)
    return out


def per_seed_checks(checks: Mapping[str, ModelCheck], cfg: AuditConfig
                    ) -> dict[str, dict[str, Any]]:
    """Membership and extraction of every training seed of one model (``checks``, by seed), on
    the same pieces, each with its own interval: what the criteria judge the memorisation
    guards on, every seed on its own (the judged block beside them pools the seeds)."""
    boot = {"n_boot": cfg.n_boot, "level": cfg.ci_level}
    out = {}
    for key in sorted(checks, key=int):
        c = checks[key]
        out[key] = {
            "membership_auc": judge_membership(
                c.nll_train, c.nll_heldout, rng=_rng(cfg, "membership_auc", f"seed-{key}"),
                train_groups=c.groups_train, heldout_groups=c.groups_heldout,
                fpr=cfg.membership_fpr, **boot),
            "extraction_rate": judge_extraction(c.extraction_train, c.extraction_test,
                                                level=cfg.ci_level)}
    return out


def run(cfg: AuditConfig, models: Mapping[str, SequenceModel], *, samples: Path,
        table: pd.DataFrame, info: Path, tokenizer: Path, per_sample: Path, report: Path,
        spans: Path, shingling: Shingling | None = None, splits: Path | None = None,
        seeds: Mapping[str, Mapping[int, SequenceModel]] | None = None,
        conditions: Path | None = None, condition_cfg: Any = None) -> AuditSummary:
    """Audit every sample and every val/test human window; write the table and audit.json.
    ``table``: the token table's train, val and test rows (columns :data:`TOKEN_COLUMNS`), as
    the stage reads them (its test rows through :mod:`pipeline.decision.looks`, which records
    the look; this library keeps no ledger). With a conditioned model's ``conditioned``
    samples, audit.json also gets ``adherence`` (:func:`pipeline.audit.adherence.audit_adherence`;
    ``conditions`` is the condition table, ``condition_cfg`` the ``condition`` section whose
    bands measure the windows). Compound tokens (``info.json``'s ``compound``): ``table`` and
    the samples also hold ``codes``, and every step is one symbol
    (:mod:`pipeline.audit.compound`); audit.json then has a ``compound`` block."""
    tok = load_tokenizer(tokenizer)
    view = None
    if TokenInfo.read(info).compound:
        from pipeline.audit.compound import CompoundView

        view = CompoundView.of(TokenInfo.read(info), tok, table, artifacts.read_parquet(samples))
        tok, table, models = view.tokenizer, view.table, view.models(models)
        seeds = {n: view.models(by_seed) for n, by_seed in (seeds or {}).items()}
    table = table[TOKEN_COLUMNS].sort_values(["sha256", "track"], kind="stable")
    table = table.reset_index(drop=True)
    split = {s: table[table["split"] == s].reset_index(drop=True) for s in ("train", "val", "test")}
    index = build_training_index(tok, split["train"], shingling or Shingling())
    bars = bar_tokens_per_id(tok) if view is None else None

    width = cfg.human_window
    heads: list[dict[str, Any]] = []
    seqs: list[np.ndarray] = []
    for s in ("val", "test"):
        for i, r in split[s].iterrows():
            ids = np.asarray(r["ids"], dtype=np.int64)
            for off in window_offsets(ids.size, width, cfg.human_stride, cfg.human_windows):
                heads.append({"source": "human", "model": "human", "kind": s, "index": int(i),
                              "offset": int(off), "sha256": str(r["sha256"]),
                              "track": int(r["track"]), "seed": None, "ok": True})
                seqs.append(ids[off: off + width])
    gen = artifacts.read_parquet(samples) if view is None else view.samples
    for _, r in gen.iterrows():
        start = int(r["prompt_len"])
        seed = r.get("seed")
        heads.append({"source": "sample", "model": str(r["model"]), "kind": str(r["kind"]),
                      "index": int(r["index"]), "offset": start, "sha256": r["prompt_sha256"],
                      "track": -1, "seed": None if pd.isna(seed) else int(seed),
                      "ok": bool(r["decode_ok"])})
        seqs.append(np.asarray(r["ids"], dtype=np.int64)[start: start + width])
    rows = []
    for head, row in zip(heads, measure_all(seqs, index, tok, cfg, bars), strict=True):
        row["decode_ok"] = bool(row["decode_ok"] and head.pop("ok"))  # full sample must decode too
        if row["lcs_start"] >= 0:  # where the span starts in the whole sequence, not the window
            row["lcs_start"] += head["offset"]
        rows.append({**head, **row})
    df = pd.DataFrame(rows)
    human_val = df[(df["source"] == "human") & (df["kind"] == "val")]
    limits = thresholds(human_val, cfg.flag_metrics, cfg.flag_quantile)
    df["flagged"] = flag(df, limits)
    df = df.sort_values(["source", "model", "kind", "index", "offset"],
                        kind="stable").reset_index(drop=True)
    cols = [c for c in df.columns if c.startswith(("lcs_tokens", "lcs_bars", "novelty_", "nn_j",
                                                   "nn_c"))] + [*STATS, "n_notes"]
    artifacts.write_parquet(per_sample, pa.Table.from_pandas(df, schema=_schema(list(df.columns)),
                                                             preserve_index=False))
    artifacts.write_parquet(spans, shared_spans(tok, df, gen, split["train"]))

    forbid = never_sampled(TokenInfo.read(info), tok)
    groups = None
    if splits is not None:
        sp = artifacts.read_parquet(splits, columns=["sha256", "group_id"])
        groups = dict(zip(sp["sha256"].astype(str), sp["group_id"].astype(str), strict=True))
    heldout = pd.concat([split["val"], split["test"]], ignore_index=True)
    # a measured model trained over several seeds is measured once per seed; the first seed is
    # the model itself (train_transformer writes the same weights to both), so its checks stand
    # for the model's point blocks instead of being computed a second time
    seed_checks = {name: model_checks({str(k): m for k, m in by_seed.items()}, split["train"],
                                      heldout, split["test"], cfg, forbid, groups)
                   for name, by_seed in sorted((seeds or {}).items())
                   if name in models and len(by_seed) > 1}
    checks = model_checks({n: m for n, m in models.items() if n not in seed_checks},
                          split["train"], heldout, split["test"], cfg, forbid, groups)
    checks.update({name: by_seed[min(by_seed, key=int)] for name, by_seed in seed_checks.items()})
    result = audit_json(df, cols, limits, *checks_json(checks, cfg.membership_fpr))
    result["judged"] = judge(df, checks, cfg, seed_checks)
    if view is not None:
        result["compound"] = view.report()
    if "kind" in gen and (gen["kind"] == "conditioned").any():
        from pipeline.audit.adherence import audit_adherence
        from pipeline.conditions.config import ConditionConfig
        from pipeline.conditions.table import read_conditions

        if conditions is None:
            raise ValueError("conditioned samples need the condition table (--conditions)")
        result["adherence"] = audit_adherence(
            gen, tok, heldout, read_conditions(conditions), width=width, stride=cfg.human_stride,
            max_windows=cfg.human_windows, cfg=condition_cfg or ConditionConfig(),
            seed=cfg.seed, n_boot=cfg.n_boot, level=cfg.ci_level)
    artifacts.write_json(report, result)
    fr = result["flag_rate"]
    return AuditSummary(len(df), fr["samples"], fr["human_test"])


SPANS_SCHEMA = pa.schema([
    ("model", pa.string()), ("kind", pa.string()), ("index", pa.int64()), ("side", pa.string()),
    ("sha256", pa.string()), ("start", pa.int64()), ("length", pa.int64()),
    ("onset", pa.list_(pa.float64())), ("duration", pa.list_(pa.float64())),
    ("pitch", pa.list_(pa.int64())), ("in_span", pa.list_(pa.bool_()))])


def shared_spans(tok: Any, df: pd.DataFrame, gen: pd.DataFrame,
                 train: pd.DataFrame) -> pa.Table:
    """Per sample that shares at least one id with a training piece: two rows, ``side`` sample
    and train, each the notes of its whole sequence decoded (in beats) with ``in_span`` marking
    the notes of the longest shared span (:func:`pipeline.tokens.spans.span_mask`); ``start``
    and ``length`` are the span's ids. A side whose ids or span prefixes do not decode has no
    row (the per-sample table still holds its measures)."""
    ids_of = {(str(r["model"]), str(r["kind"]), int(r["index"])): r["ids"]
              for _, r in gen.iterrows()}
    train_ids = {(str(r["sha256"]), int(r["track"])): r["ids"] for _, r in train.iterrows()}
    rows: list[dict[str, Any]] = []
    hits = df[(df["source"] == "sample") & (df["lcs_start"] >= 0)]
    for _, r in hits.iterrows():
        key = (str(r["model"]), str(r["kind"]), int(r["index"]))
        length = int(r["lcs_tokens"])
        sides = (("sample", r["sha256"], ids_of[key], int(r["lcs_start"])),
                 ("train", r["lcs_train_sha256"],
                  train_ids[(str(r["lcs_train_sha256"]), int(r["lcs_train_track"]))],
                  int(r["lcs_train_start"])))
        for side, sha, ids, start in sides:
            ids = np.asarray(ids, dtype=np.int64)
            score, err = decode_ids(tok, ids)
            if err is not None:
                continue
            notes = score_notes(score)
            mask = span_mask(tok, ids, start, start + length, notes)
            if mask is None:
                continue
            rows.append({"model": key[0], "kind": key[1], "index": key[2], "side": side,
                         "sha256": sha if isinstance(sha, str) else None, "start": start,
                         "length": length, "onset": notes["onset"].tolist(),
                         "duration": notes["duration"].tolist(),
                         "pitch": notes["pitch"].tolist(), "in_span": mask.tolist()})
    return pa.Table.from_pylist(rows, schema=SPANS_SCHEMA)


def audit_json(df: pd.DataFrame, cols: Sequence[str], limits: Mapping[str, float | None],
               extraction: dict, membership: dict) -> dict[str, Any]:
    """Nested summary; ``reports/metrics.json`` flattens it under ``audit.``."""
    human = df[df["source"] == "human"]
    samp = df[df["source"] == "sample"]
    out: dict[str, Any] = {
        "thresholds": dict(limits),
        "human": {},
        "samples": {"all": summarise(samp, cols)},
        "extraction": extraction,
        "membership": membership,
    }
    for k in ("val", "test"):
        part = human[human["kind"] == k]
        out["human"][k] = {**summarise(part, cols), "n_pieces": int(part["sha256"].nunique())}
    for name in sorted(samp["model"].unique()):
        part = samp[samp["model"] == name]
        out["samples"][name] = {"all": summarise(part, cols)}
        for kind in sorted(part["kind"].unique()):
            out["samples"][name][kind] = summarise(part[part["kind"] == kind], cols)
    test = human[human["kind"] == "test"]
    human_rate = float(test["flagged"].mean()) if len(test) else None
    sample_rate = float(samp["flagged"].mean()) if len(samp) else None
    out["flag_rate"] = {
        "samples": sample_rate, "human_test": human_rate,
        "excess": (sample_rate - human_rate) if None not in (sample_rate, human_rate) else None,
        "by_model": {m: float(samp[samp["model"] == m]["flagged"].mean())
                     for m in sorted(samp["model"].unique())},
    }
    test_means = {s: out["human"]["test"].get(f"{s}_mean") for s in STATS}
    music: dict[str, Any] = {"test": test_means}
    for name in sorted(samp["model"].unique()):
        means = {s: out["samples"][name]["all"].get(f"{s}_mean") for s in STATS}
        music[name] = means
        music[f"{name}_abs_diff"] = {s: abs(means[s] - test_means[s])
                                     if None not in (means[s], test_means[s]) else None
                                     for s in STATS}
    out["music"] = music
    return out
