"""The memorisation audit of compound tokens (CPWord, Octuple): each step is one symbol.

The audit's id measures (longest shared span, id n-gram novelty, the extraction test) compare
sequences of ids for equality, and a compound sequence is a sequence of steps, each a tuple of K
ids, one per codebook. Here a step is one symbol: two steps are the same symbol exactly when all
their K ids are equal, so a shared span is a run of identical steps (for Octuple, identical
notes with their bar and position), an n-gram is n consecutive steps, and an extraction is exact
when every codebook of every step matches. The measures then run unchanged on the symbol stream
(:mod:`pipeline.audit.judging`):

- :class:`StepSymbols` numbers the distinct steps of everything audited (training, held-out and
  sample rows) densely, in the order of their mixed-radix value (``sum_k id_k · prod_{j<k}
  size_j``), so the numbering is exact (no hash collisions), deterministic, and fits the
  suffix index's ids below 2**31;
- :class:`SymbolTokenizer` decodes symbols back to steps and hands them to miditok, so the
  decoded notes (nearest-neighbour Jaccard, interval novelty, the music statistics and the
  quality guard) are those of the real sequence;
- :class:`SymbolModel` scores symbols with the compound scorer (membership: the joint NLL per
  note, :class:`pipeline.inference.scorer.CompoundScorer`) and continues them greedily step by
  step (extraction: :func:`pipeline.inference.sampling.sample_steps` at temperature 0, under
  the generate stage's step rules).

Not applicable, with the reason in audit.json (:data:`NOT_APPLICABLE`): ``lcs_bars`` (a step
symbol stands for no fixed number of Bar tokens: Octuple carries each note's bar in a codebook)
is NaN for every row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from pipeline.inference.sampling import SamplingParams, StepRules, compound_rules, sample_steps
from pipeline.tokens.contract import TokenInfo
from pipeline.tokens.tokenizer import decode_ids, steps_from_codes

STEP_SYMBOL = ("each step (one id per codebook) is one symbol: two steps are equal when all "
               "their codebooks' ids are; spans, id n-grams and extraction count steps")
NOT_APPLICABLE = {
    "lcs_bars": "a step symbol stands for no fixed number of Bar tokens (Octuple carries each "
                "note's bar in a codebook), so the shared span is counted in steps only "
                "(lcs_tokens)",
}
"""Measures with no meaning for compound tokens, and why: audit.json ``compound``."""


def _steps(codes: Any, k: int) -> np.ndarray:
    """A row's ``codes`` (one list per codebook) as an (n, K) int64 array."""
    if codes is None or len(codes) == 0:
        return np.zeros((0, k), dtype=np.int64)
    return np.asarray(steps_from_codes(codes), dtype=np.int64).reshape(-1, k)


class StepSymbols:
    """Dense symbols of the distinct steps seen by :meth:`fit` (module docstring)."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        radix = np.concatenate([[1], np.cumprod(self.sizes)[:-1]])
        if float(np.prod(self.sizes.astype(float))) >= 2.0**62:
            raise ValueError(f"codebook sizes {list(sizes)}: too many distinct steps to number")
        self.radix = radix.astype(np.int64)
        self.values = np.zeros(0, dtype=np.int64)

    def value(self, steps: np.ndarray) -> np.ndarray:
        """Mixed-radix value of each (n, K) step."""
        return np.asarray(steps, dtype=np.int64).reshape(-1, len(self.sizes)) @ self.radix

    def fit(self, seqs: Sequence[np.ndarray]) -> StepSymbols:
        parts = [self.value(s) for s in seqs]
        self.values = np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
        if len(self.values) >= 2**31:
            raise ValueError("too many distinct steps for the suffix index")
        return self

    def encode(self, steps: np.ndarray, unknown: int | None = None) -> np.ndarray:
        """Symbols of (n, K) steps; a step :meth:`fit` never saw is ``unknown`` (None: an
        error)."""
        v = self.value(steps)
        at = np.searchsorted(self.values, v)
        known = np.zeros(len(v), dtype=bool)
        if len(self.values):
            known = (at < len(self.values)) & (self.values[np.minimum(at, len(self.values) - 1)]
                                               == v)
        if not known.all():
            if unknown is None:
                raise ValueError("a step outside the fitted symbols")
            at = np.where(known, at, unknown)
        return at.astype(np.int64)

    def decode(self, symbols: Sequence[int] | np.ndarray) -> np.ndarray:
        """(n, K) steps of symbols."""
        v = self.values[np.asarray(symbols, dtype=np.int64)]
        return (v[:, None] // self.radix[None, :]) % self.sizes[None, :]

    def __len__(self) -> int:
        return len(self.values)


class SymbolTokenizer:
    """The compound tokenizer read through step symbols, as the audit's single-stream code reads
    a tokenizer: :func:`pipeline.tokens.tokenizer.decode_ids` decodes a symbol list (one token
    stream), and every step is one whole token to :mod:`pipeline.tokens.spans` (a compound step
    holds its notes whole, so no note is left open at a step boundary). Other attributes are the
    tokenizer's own."""

    one_token_stream = True
    is_trained = False
    is_multi_voc = False

    def __init__(self, tok: Any, symbols: StepSymbols) -> None:
        self.tok = tok
        self.symbols = symbols

    def decode(self, ids: Sequence[int]) -> Any:
        score, err = decode_ids(self.tok, self.symbols.decode(ids).tolist())
        if err is not None:
            raise ValueError(err)
        return score

    def complete_sequence(self, seq: Any) -> None:
        seq.tokens = ["Step"] * len(seq.ids)

    def __len__(self) -> int:
        return len(self.symbols)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tok, name)


@dataclass
class SymbolModel:
    """A compound scorer read through step symbols (module docstring)."""

    scorer: Any
    symbols: StepSymbols
    rules: StepRules

    def token_nll(self, seqs: Sequence[np.ndarray],
                  conds: np.ndarray | None = None) -> list[np.ndarray]:
        """Joint NLL of every target step (the steps, then EOS) of each symbol sequence."""
        return self.scorer.token_nll([self.symbols.decode(s) for s in seqs], conds)

    def greedy_continue(self, prefixes: Sequence[np.ndarray], m: int) -> list[np.ndarray]:
        """Up to ``m`` greedy steps after each symbol prefix, as symbols; a step no audited
        sequence holds is -1 (it matches nothing)."""
        gens = sample_steps(self.scorer, [self.symbols.decode(p) for p in prefixes],
                            max_new_steps=m, params=SamplingParams(temperature=0.0), rngs=None,
                            rules=self.rules)
        return [self.symbols.encode(g, unknown=-1) for g in gens]


@dataclass
class CompoundView:
    """Everything :func:`pipeline.audit.judging.run` reads, seen through step symbols: the
    token table and the samples with ``ids`` replaced by their steps' symbols, the tokenizer
    and the models wrapped."""

    symbols: StepSymbols
    tokenizer: SymbolTokenizer
    table: pd.DataFrame
    samples: pd.DataFrame
    rules: StepRules

    @classmethod
    def of(cls, info: TokenInfo, tok: Any, table: pd.DataFrame,
           samples: pd.DataFrame) -> CompoundView:
        """``table``: the token rows with ``codes``; ``samples``: samples.parquet with
        ``codes``."""
        k = len(info.codebooks or [])
        if "codes" not in table or "codes" not in samples:
            raise ValueError("auditing compound tokens needs the codes of the token table and "
                             "of the samples (samples.parquet written by generate for these "
                             "tokens)")
        t_steps = [_steps(c, k) for c in table["codes"]]
        s_steps = [_steps(c, k) for c in samples["codes"]]
        symbols = StepSymbols(info.codebook_sizes()).fit([*t_steps, *s_steps])
        return cls(symbols, SymbolTokenizer(tok, symbols),
                   table.assign(ids=[symbols.encode(s) for s in t_steps]).drop(columns="codes"),
                   samples.assign(ids=[symbols.encode(s) for s in s_steps]),
                   compound_rules(info, tok))

    def model(self, scorer: Any) -> SymbolModel:
        return SymbolModel(scorer, self.symbols, self.rules)

    def models(self, models: Mapping[str, Any]) -> dict[str, Any]:
        return {n: self.model(m) for n, m in models.items()}

    def report(self) -> dict[str, Any]:
        """audit.json's ``compound`` block: the step symbol's definition and what is not
        applicable, with the reason."""
        return {"step_symbol": STEP_SYMBOL, "n_symbols": len(self.symbols),
                "not_applicable": dict(sorted(NOT_APPLICABLE.items()))}
