"""Sampling from trained models: the ``generate`` stage's work (:mod:`pipeline.stages.generate`
documents its inputs, outputs and seeding), also used by ``adapt-audit`` on an adaptation
experiment's arms."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field, model_validator

from models.base import SequenceModel
from pipeline.conditions.assign import model_vocab
from pipeline.conditions.vocab import ConditionVocab
from pipeline.core import artifacts
from pipeline.core.artifacts import stable_int
from pipeline.core.config import StageConfig
from pipeline.inference.sampling import (
    SamplingParams,
    StepRules,
    compound_rules,
    sample_sequences,
    sample_steps,
)
from pipeline.music.midi import score_notes
from pipeline.tokens.contract import CODES_FIELD, TokenInfo, never_sampled
from pipeline.tokens.spans import prefix_mask
from pipeline.tokens.tokenizer import (
    codes_from_steps,
    decode_ids,
    load_tokenizer,
    steps_from_codes,
)

KINDS = ("unconditional", "continuation")
PROMPT_COLUMNS = ["sha256", "split", "track", "ids", "n_tokens"]
"""The token table's columns the continuations' prompts are drawn from."""
CONDITIONED = "conditioned"
"""The kind of a conditioned model's samples drawn under requested conditions (after KINDS)."""

SAMPLES_SCHEMA = pa.schema([
    ("model", pa.string()), ("kind", pa.string()), ("index", pa.int32()), ("seed", pa.int64()),
    ("prompt_sha256", pa.string()), ("prompt_len", pa.int32()), ("ids", pa.list_(pa.int32())),
    ("n_tokens", pa.int32()), ("decode_ok", pa.bool_()), ("decode_error", pa.string()),
])
CONDITIONED_SCHEMA = pa.schema([*SAMPLES_SCHEMA, ("condition", pa.string()),
                                ("request_sha256", pa.string())])
"""samples.parquet when a model is conditioned: ``condition`` (the requested labels as sorted
JSON, ``null`` for a label not requested; null for unconditioned kinds) and ``request_sha256``
(the held-out piece whose labels were requested)."""
COMPOUND_SCHEMA = SAMPLES_SCHEMA.insert(7, CODES_FIELD)
"""samples.parquet of compound tokens (CPWord, Octuple): ``codes`` after ``ids`` as the token
tables have it (one list per codebook, one id per step; ``ids`` empty), and ``n_tokens`` and
``prompt_len`` count steps. Single-stream runs keep :data:`SAMPLES_SCHEMA`."""


class GenerateConfig(StageConfig):
    """``generate`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "generate"

    models: list[Literal["ngram", "transformer"]] = Field(
        default_factory=lambda: ["ngram", "transformer"], min_length=1)
    n_samples: int = Field(4096, ge=1, le=10000)
    n_continuations: int = Field(16, ge=0, le=10000)
    max_new_tokens: int = Field(128, ge=1, le=100000)
    prompt_tokens: int = Field(64, ge=1, le=100000)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    seed: int = Field(1234, ge=0)
    n_conditioned: int = Field(240, ge=0, le=10000)
    guidance: float = Field(1.0, ge=0.0, le=100.0)
    batch_size: int = Field(8, ge=1, le=4096)
    files_per_kind: int = Field(32, ge=0, le=10000)
    device: str = "cpu"

    @model_validator(mode="after")
    def _unique_models(self) -> GenerateConfig:
        if len(set(self.models)) != len(self.models):
            raise ValueError(f"models: {self.models} lists a model twice")
        return self

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


@dataclass(frozen=True)
class GenerateSummary:
    n_samples: int
    n_decode_failures: int
    n_prompts: int


# --- prompts and sampling ---------------------------------------------------------------------


def select_prompts(tokens: Any, n: int, length: int, seed: int,
                   split: str = "test") -> list[tuple[str, np.ndarray]]:
    """Choose ``n`` sequences of ``split`` longer than ``length``; return (sha256, prefix) pairs.

    Candidates are sorted by (sha256, track) before a seeded draw, so the choice is a pure function
    of the token table and the seed. Fewer candidates than ``n`` gives fewer prompts. Rows with
    compound ``codes`` (not null) give their first ``length`` steps as a (length, K) prefix.
    """
    df = tokens[(tokens["split"] == split) & (tokens["n_tokens"] > length)]
    sort_cols = [c for c in ("sha256", "track") if c in df.columns]
    df = df.sort_values(sort_cols, kind="stable").reset_index(drop=True)
    if df.empty or n == 0:
        return []
    rng = np.random.default_rng([seed, stable_int("prompts")])
    rows = np.sort(rng.choice(len(df), size=min(n, len(df)), replace=False))
    if "codes" in df.columns and df["codes"].notna().all():
        return [(str(df.at[int(r), "sha256"]),
                 np.asarray(steps_from_codes(df.at[int(r), "codes"])[:length], dtype=np.int32))
                for r in rows]
    return [(str(df.at[int(r), "sha256"]),
             np.asarray(df.at[int(r), "ids"][:length], dtype=np.int32)) for r in rows]


def select_requests(table: Any, n: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """``n`` requested conditions: the label rows of held-out (val and test) pieces of the
    condition table, drawn with replacement by a generator seeded with ``seed``, so requests
    follow the labels' real frequencies. (sha256, {column: label}) pairs."""
    held = table[table["split"].isin(["val", "test"])].sort_values("sha256", kind="stable")
    if held.empty or n == 0:
        return []
    rng = np.random.default_rng([seed, stable_int("requests")])
    rows = held.reset_index(drop=True).to_dict("records")
    return [(str(rows[int(i)]["sha256"]), rows[int(i)]) for i in rng.integers(0, len(rows), n)]


def request_labels(vocab: ConditionVocab, row: Mapping[str, Any]) -> dict[str, str | None]:
    """A request's labels for the model's conditions; a label the model never learned is None
    (asked as "none")."""
    return vocab.decode(vocab.encode(row))


def generate_for_model(model: SequenceModel, name: str, cfg: GenerateConfig,
                       prompts: Sequence[tuple[str, np.ndarray]],
                       forbid: Sequence[int],
                       by_seed: Mapping[int, SequenceModel] | None = None,
                       requests: Sequence[tuple[str, Mapping[str, Any]]] = (),
                       rules: StepRules | None = None) -> list[dict[str, Any]]:
    """All samples of one model as rows (without decode columns). ``by_seed``: the model's
    training seeds (two or more), which share the samples out: sample ``i`` of a kind comes
    from the ``i mod S``-th seed, ``model`` is then unused. A conditioned model also draws one
    ``conditioned`` sample per request, under its labels (guidance ``cfg.guidance``).
    ``rules``: compound tokens, drawn step by step (:func:`sample_steps`, ``forbid`` unused);
    the rows then hold ``codes`` (one list per codebook) and empty ``ids``, and ``n_tokens``
    and ``prompt_len`` count steps. Seeding is the same as for one stream."""
    seeds = sorted(by_seed) if by_seed and len(by_seed) > 1 else [None]
    vocab = model_vocab(getattr(model, "condition", None))
    kinds = [*KINDS, *([CONDITIONED] if vocab is not None and requests else [])]
    rows = []
    for k, kind in enumerate(kinds):
        conds = labels = None
        if kind == "unconditional":
            empty = (np.zeros(0, dtype=np.int32) if rules is None
                     else np.zeros((0, len(rules.forbid)), dtype=np.int32))
            starts = [("", empty)] * cfg.n_samples
        elif kind == CONDITIONED:
            starts = [(sha, np.zeros(0, dtype=np.int32)) for sha, _ in requests]
            labels = [request_labels(vocab, r) for _, r in requests]
            conds = vocab.encode_many(labels)
        else:
            starts = list(prompts)
        new: list[np.ndarray | None] = [None] * len(starts)
        for j, seed in enumerate(seeds):
            mine = list(range(j, len(starts), len(seeds)))
            rngs = [np.random.default_rng([cfg.seed, stable_int(name), k, i]) for i in mine]
            cond_kw = {} if conds is None else {
                "conds": conds[mine], "guidance": cfg.guidance, "none_ids": vocab.none_ids()}
            who = model if seed is None else by_seed[seed]
            if rules is not None:
                drawn = sample_steps(who, [starts[i][1] for i in mine],
                                     max_new_steps=cfg.max_new_tokens, params=cfg.sampling(),
                                     rngs=rngs, rules=rules, batch_size=cfg.batch_size)
            else:
                drawn = sample_sequences(who, [starts[i][1] for i in mine],
                                         max_new_tokens=cfg.max_new_tokens,
                                         params=cfg.sampling(), rngs=rngs, forbid=forbid,
                                         batch_size=cfg.batch_size, **cond_kw)
            for i, gen in zip(mine, drawn, strict=True):
                new[i] = gen
        for i, ((sha, prompt), gen) in enumerate(zip(starts, new, strict=True)):
            ids = np.concatenate([prompt, gen]).astype(np.int32)
            row = {"model": name, "kind": kind, "index": i,
                   "seed": seeds[i % len(seeds)], "prompt_sha256": None if labels else sha or None,
                   "prompt_len": len(prompt), "ids": ids.tolist(), "n_tokens": len(ids)}
            if rules is not None:
                row["ids"], row["codes"] = [], codes_from_steps(ids, len(rules.forbid)).tolist()
            if labels is not None:
                row["condition"] = json.dumps(labels[i], sort_keys=True)
                row["request_sha256"] = sha
            rows.append(row)
    return rows


def prompt_notes(tok: Any, row: Mapping[str, Any],
                 notes: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """For a continuation, which of its notes (``notes``, as :func:`score_notes` gives them)
    come from the prompt (:func:`pipeline.tokens.spans.prefix_mask`), so a note cut by the
    prompt's end counts as the model's. None for an unconditional sample or when the prompt
    does not decode."""
    if not row["prompt_len"]:
        return None
    return prefix_mask(tok, sample_ids(row), int(row["prompt_len"]), notes)


def sample_ids(row: Mapping[str, Any]) -> Any:
    """A samples.parquet row's sequence as :func:`decode_ids` takes it: ``ids``, or for
    compound tokens the steps of its ``codes``."""
    codes = row.get("codes")
    return row["ids"] if codes is None else steps_from_codes(codes)


def run(cfg: GenerateConfig, models: Mapping[str, SequenceModel], *,
        prompt_rows: pd.DataFrame | None, info: Path, tokenizer: Path, samples_out: Path,
        samples_dir: Path, seeds: Mapping[str, Mapping[int, SequenceModel]] | None = None,
        names: Sequence[str] | None = None, conditions: Path | None = None) -> GenerateSummary:
    """Sample, decode and write samples.parquet plus one MIDI and one PNG per decodable sample
    among the first ``cfg.files_per_kind`` of its model and kind. ``prompt_rows``: the test
    rows of the token table (columns :data:`PROMPT_COLUMNS`) the continuations' prompts are
    drawn from (:func:`select_prompts`), which the stage reads through
    :mod:`pipeline.decision.looks` (the look recorded first; this library keeps no ledger);
    None when ``cfg.n_continuations`` is 0. ``seeds``: per model trained over several seeds,
    every seed's model (:func:`generate_for_model`). ``names``: the models to sample, in order
    (default ``cfg.models``; an adaptation experiment's arms). ``conditions``: the condition
    table, read only when a model is conditioned (its requests are :func:`select_requests`)."""
    from pipeline.render.figures import piano_roll_png

    tok_info = TokenInfo.read(info)
    tok = load_tokenizer(tokenizer)
    if prompt_rows is None and cfg.n_continuations:
        raise ValueError(f"generate.n_continuations = {cfg.n_continuations} needs the test rows "
                         "its prompts are drawn from (prompt_rows)")
    prompts = ([] if prompt_rows is None else
               select_prompts(prompt_rows, cfg.n_continuations, cfg.prompt_tokens, cfg.seed))
    forbid = never_sampled(tok_info, tok)
    rules = compound_rules(tok_info, tok) if tok_info.compound else None
    order = list(cfg.models if names is None else names)
    requests: list[tuple[str, dict[str, Any]]] = []
    if any(getattr(models[n], "condition", None) is not None for n in order):
        from pipeline.conditions.table import read_conditions

        if conditions is None:
            raise ValueError("a conditioned model needs the condition table (--conditions)")
        requests = select_requests(read_conditions(conditions), cfg.n_conditioned, cfg.seed)
    rows: list[dict[str, Any]] = []
    for name in order:
        rows.extend(generate_for_model(models[name], name, cfg, prompts, forbid,
                                       (seeds or {}).get(name), requests, rules))
    samples_dir = Path(samples_dir)
    samples_dir.mkdir(parents=True, exist_ok=True)
    for stale in sorted([*samples_dir.glob("*.mid"), *samples_dir.glob("*.png")]):
        stale.unlink()  # outputs of an earlier run with other params
    failures = 0
    for row in rows:
        score, err = decode_ids(tok, sample_ids(row))
        row["decode_ok"], row["decode_error"] = err is None, err
        if err is not None:
            failures += 1
            continue
        if row["index"] >= cfg.files_per_kind:
            continue
        stem = f"{row['model']}_{row['kind']}_{row['index']}"
        artifacts.write_bytes(samples_dir / f"{stem}.mid", score.dumps_midi())
        title = f"{row['model']} {row['kind']} #{row['index']}"
        notes = score_notes(score)
        png = piano_roll_png(notes, title, prompt_notes(tok, row, notes))
        artifacts.write_bytes(samples_dir / f"{stem}.png", png)
    rows.sort(key=lambda r: (r["model"], r["kind"], r["index"]))
    conditioned = any(r["kind"] == CONDITIONED for r in rows)
    schema = (CONDITIONED_SCHEMA if conditioned else
              COMPOUND_SCHEMA if rules is not None else SAMPLES_SCHEMA)
    artifacts.write_parquet(samples_out, pa.Table.from_pylist(
        [{**{"condition": None, "request_sha256": None}, **r} if conditioned else r
         for r in rows], schema=schema))
    return GenerateSummary(n_samples=len(rows), n_decode_failures=failures, n_prompts=len(prompts))
