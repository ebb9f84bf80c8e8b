"""``NGramLM``: n-gram language models with interpolated modified Kneser-Ney smoothing.

Estimator contract (scikit-learn style): hyper-parameters are stored unmodified in ``__init__``;
``fit(seqs)`` learns attributes ending in ``_``; ``score(seqs)`` is minus the mean NLL.

Sequences and the id space. A sequence is a 1-D array of token ids that never contains BOS or
EOS: the model wraps every sequence as ``BOS x_1..x_n EOS``. Given ``bos_id``/``eos_id`` (the
tokenizer's, from ``data/tokens/info.json``) the model works in the tokenizer's id space and meets
``models.base.SequenceModel``; without them it appends EOS then BOS after the largest id.
Targets are ``x_1..x_n, EOS`` (``len + 1`` per sequence, so an empty sequence has exactly one
target, EOS given BOS); BOS is only ever context and, like PAD (``pad_id``), has probability 0
as a target (its log-probability column is ``-inf``), matching the transformer's scorer.

Unseen tokens: every id in ``[0, vocab_size_)`` but BOS and PAD has a non-zero probability,
because every smoothing interpolates down to a uniform distribution over those targetable ids;
unseen contexts back off to shorter ones. Ids outside ``[0, vocab_size_)``, and BOS/EOS/PAD
inside a sequence, are rejected with a ``ValueError`` naming the sequence.

Smoothing (``p_0`` is that uniform distribution, ``h'`` is ``h`` without its first token):

- ``kneser_ney``: interpolated modified Kneser-Ney (Chen & Goodman 1998, as in KenLM)::

      p_n(w|h) = max(a(hw) - D_n(a(hw)), 0) / a(h•) + γ_n(h) · p_{n-1}(w|h')
      γ_n(h)   = (D_n1·N1(h•) + D_n2·N2(h•) + D_n3+·N3+(h•)) / a(h•)

  ``a`` is the raw count at the top order and for n-grams starting with BOS (they have no left
  extension); below, it is the continuation count ``N1+(•hw)``. The three discounts of each order
  come from its count-of-counts ``n_1..n_4`` of ``a``: ``Y = n1/(n1+2 n2)``,
  ``D_k = k - (k+1)·Y·n_{k+1}/n_k``. When a count-of-count is zero or a discount falls outside
  ``(0, k)`` (tiny data), that order uses ``FALLBACK_DISCOUNTS`` and is listed in
  ``discount_fallback_``. A context never seen at order n passes straight to order n-1.
- ``add_k``: ``(c(hw) + k) / (c(h) + k·|V'|)`` with the longest available context (shorter only
  at the start of a sequence); an unseen context gives the uniform distribution.
- ``unigram``: add-k on unigram counts (``order`` is ignored, ``order_ == 1``).
- ``uniform``: ``p_0`` itself.

All four share one representation: per order n, ``alpha_n`` (one value per n-gram) and
``gamma_n`` (one per context), with ``p_n(w|h) = alpha_n[hw] + gamma_n[h] · p_{n-1}(w|h')``, so a
single vectorised scorer serves them all.
"""

from __future__ import annotations

import inspect
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from models.ngram_counts import (
    IdSpace,
    NGramCounts,
    as_id_arrays,
    build_stream,
    count_ngrams,
    level_ids,
    resolve_id_space,
)
from pipeline.core.artifacts import atomic_path, read_json, write_json

Smoothing = Literal["kneser_ney", "add_k", "unigram", "uniform"]
SMOOTHINGS: tuple[str, ...] = ("kneser_ney", "add_k", "unigram", "uniform")
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)
MODEL_FORMAT = "symkit-ngram-v1"
CHUNK_TOKENS = 1 << 21  # scoring works on ~2M-token slices of the stream to bound memory


def kn_discounts(adjusted: np.ndarray) -> tuple[tuple[float, float, float], bool]:
    """``((D1, D2, D3+), fallback)`` from the count-of-counts of one order's adjusted counts."""
    n = [int(np.count_nonzero(adjusted == k)) for k in (1, 2, 3, 4)]
    if min(n) > 0:
        y = n[0] / (n[0] + 2 * n[1])
        d = tuple(k - (k + 1) * y * n[k] / n[k - 1] for k in (1, 2, 3))
        if all(0.0 < d[k - 1] < k for k in (1, 2, 3)):
            return (float(d[0]), float(d[1]), float(d[2])), False
    return FALLBACK_DISCOUNTS, True


def _with_sentinel(values: np.ndarray, sentinel: float) -> np.ndarray:
    """Append the value used for row -1 (unseen n-gram / unseen context)."""
    return np.append(values.astype(np.float64), sentinel)


def kneser_ney_tables(counts: NGramCounts, order: int):
    """``(alpha, gamma, discounts, fallback)`` lists for interpolated modified KN of ``order``."""
    alpha, gamma, discounts, fallback = [], [], [], []
    n_ctx = 1
    for n in range(1, order + 1):
        i = n - 1
        if n == order:
            a = counts.raw[i]
        else:
            a = np.where(counts.bos_start[i], counts.raw[i], counts.left_ext[i])
        if n == 1:
            a = np.where(counts.bos_start[0], 0, a)  # BOS is never a target
        d, fb = kn_discounts(a)
        disc = np.select([a == 1, a == 2, a >= 3], d, 0.0)
        ctx = counts.contexts(n) if n > 1 else np.zeros(len(a), dtype=np.int64)
        total = np.bincount(ctx, weights=a, minlength=n_ctx)
        dsum = np.bincount(ctx, weights=disc, minlength=n_ctx)
        seen = total > 0
        g = np.ones(n_ctx)
        g[seen] = dsum[seen] / total[seen]
        al = np.zeros(len(a))
        pos = a > 0
        al[pos] = (a[pos] - disc[pos]) / total[ctx[pos]]
        alpha.append(_with_sentinel(al, 0.0))
        gamma.append(_with_sentinel(g, 1.0))
        discounts.append(list(d))
        fallback.append(fb)
        n_ctx = len(a)
    return alpha, gamma, discounts, fallback


def add_k_tables(counts: NGramCounts, order: int, k: float):
    """``(alpha, gamma)`` lists for add-k smoothing with the longest available context."""
    n_targetable = counts.space.n_targetable
    alpha, gamma = [], []
    n_ctx = 1
    for n in range(1, order + 1):
        i = n - 1
        raw = counts.raw[i].astype(np.float64)
        if n == 1:
            raw = np.where(counts.bos_start[0], 0.0, raw)
        ctx = counts.contexts(n) if n > 1 else np.zeros(len(raw), dtype=np.int64)
        # Only the longest available context speaks: every context at the top order, and below
        # it only contexts that start with BOS (the start of a sequence). Others pass through.
        if n == order:
            active = np.ones(n_ctx, dtype=bool)
        elif n > 1:
            active = counts.bos_start[i - 1]
        else:
            active = np.zeros(1, dtype=bool)
        denom = np.bincount(ctx, weights=raw, minlength=n_ctx) + k * n_targetable
        g = np.where(active, k * n_targetable / denom, 1.0)
        al = np.where(active[ctx], raw / denom[ctx], 0.0)
        alpha.append(_with_sentinel(al, 0.0))
        gamma.append(_with_sentinel(g, 1.0))
        n_ctx = len(raw)
    return alpha, gamma


class NGramLM:
    """n-gram language model over integer token ids (see the module docstring for the maths).

    Parameters
    ----------
    order: longest n-gram (context of ``order - 1`` tokens), >= 1.
    smoothing: ``kneser_ney`` | ``add_k`` | ``unigram`` | ``uniform``.
    vocab_size, bos_id, eos_id: the tokenizer's id space; ``None`` to infer/append (module doc).
    pad_id: the tokenizer's PAD id, or ``None``; like BOS it is never a target (probability 0).
    k: pseudo-count for ``add_k`` and ``unigram`` (> 0).
    """

    def __init__(self, order: int = 5, smoothing: Smoothing = "kneser_ney",
                 vocab_size: int | None = None, bos_id: int | None = None,
                 eos_id: int | None = None, pad_id: int | None = None, k: float = 1.0) -> None:
        self.order = order
        self.smoothing = smoothing
        self.vocab_size = vocab_size
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.k = k

    # -- estimator plumbing ------------------------------------------------------------------
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Hyper-parameters as given (scikit-learn's contract without importing scikit-learn)."""
        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {name: getattr(self, name) for name in names}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def _check_params(self) -> None:
        if self.smoothing not in SMOOTHINGS:
            raise ValueError(f"smoothing={self.smoothing!r}; allowed: {', '.join(SMOOTHINGS)}")
        if not isinstance(self.order, int | np.integer) or self.order < 1:
            raise ValueError(f"order={self.order!r} must be an integer >= 1")
        if self.smoothing in ("add_k", "unigram") and not self.k > 0:
            raise ValueError(f"k={self.k!r} must be > 0 for smoothing={self.smoothing!r}")

    def _effective_order(self) -> int:
        return int(self.order) if self.smoothing in ("kneser_ney", "add_k") else 1

    # -- fitting -----------------------------------------------------------------------------
    def fit(self, seqs: Sequence) -> NGramLM:
        """Learn from sequences of ids (no BOS/EOS inside). Returns ``self``."""
        self._check_params()
        arrays = [np.asarray(s, dtype=np.int64).reshape(-1) for s in seqs]
        if not arrays:
            raise ValueError("fit needs at least one sequence")
        space = resolve_id_space(arrays, self.vocab_size, self.bos_id, self.eos_id, self.pad_id)
        arrays = as_id_arrays(arrays, space)
        return self.fit_counts(count_ngrams(arrays, self._effective_order(), space))

    def fit_counts(self, counts: NGramCounts) -> NGramLM:
        """Learn from precomputed counts (``counts.max_order`` >= the effective order).

        Lets one counting pass serve several orders (the ``train_ngram`` stage fits 1..8).
        """
        self._check_params()
        order = self._effective_order()
        if counts.max_order < order:
            raise ValueError(f"counts go up to order {counts.max_order}, need {order}")
        for name in ("vocab_size", "bos_id", "eos_id", "pad_id"):
            mine, theirs = getattr(self, name), getattr(counts.space, name)
            if mine is not None and mine != theirs:
                raise ValueError(f"{name}={mine} but the counts were made with {theirs}")
        self.space_ = counts.space
        self.vocab_size_ = counts.space.vocab_size
        self.bos_id_ = counts.space.bos_id
        self.eos_id_ = counts.space.eos_id
        self.order_ = order
        self.discounts_: list[list[float]] = []
        self.discount_fallback_: list[int] = []
        if self.smoothing == "kneser_ney":
            alpha, gamma, disc, fb = kneser_ney_tables(counts, order)
            self.discounts_ = disc
            self.discount_fallback_ = [n + 1 for n, f in enumerate(fb) if f]
        elif self.smoothing == "uniform":
            alpha = [np.zeros(self.vocab_size_ + 1)]
            gamma = [np.ones(2)]
        else:
            alpha, gamma = add_k_tables(counts, order, float(self.k))
        self.alpha_ = alpha
        self.gamma_ = gamma
        self.keys_ = [counts.keys[n] for n in range(order)]
        base = np.full(self.vocab_size_, 1.0 / counts.space.n_targetable)
        base[counts.space.never_targets()] = 0.0
        self.base_ = base
        self.n_ngrams_ = [len(k) for k in self.keys_]
        self.n_ngrams_[0] = int(np.count_nonzero(counts.raw[0]))
        self.n_train_sequences_ = counts.n_sequences
        self.n_train_tokens_ = counts.n_targets
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "alpha_"):
            raise RuntimeError("NGramLM is not fitted: call fit() or NGramLM.load() first")

    # -- scoring -----------------------------------------------------------------------------
    def _stream_probs(self, tok: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Probability of the token at every stream position given its left context."""
        ids = level_ids(self.keys_, tok, pos, self.vocab_size_)
        p = self.base_[tok]
        for n in range(1, self.order_ + 1):
            if n == 1:
                g = self.gamma_[0][0]
            else:
                ctx = np.empty_like(tok)
                ctx[0] = -1
                ctx[1:] = ids[n - 2][:-1]
                g = self.gamma_[n - 1][ctx]
            p = self.alpha_[n - 1][ids[n - 1]] + g * p
        return p

    def token_nll(self, seqs: Sequence) -> list[np.ndarray]:
        """NLL in nats of every target: ``len(seq) + 1`` float64 values per sequence."""
        self._check_fitted()
        arrays = as_id_arrays(seqs, self.space_)
        out: list[np.ndarray] = []
        start = 0
        while start < len(arrays):
            stop, size = start, 0
            while stop < len(arrays) and (size == 0 or size + len(arrays[stop]) < CHUNK_TOKENS):
                size += len(arrays[stop]) + 2
                stop += 1
            chunk = arrays[start:stop]
            tok, pos = build_stream(chunk, self.space_)
            with np.errstate(divide="ignore"):
                nll = -np.log(self._stream_probs(tok, pos)[pos > 0])
            bounds = np.cumsum([len(s) + 1 for s in chunk])[:-1]
            out.extend(np.split(nll, bounds))
            start = stop
        return out

    def nll_per_piece(self, seqs: Sequence) -> np.ndarray:
        """Total NLL in nats of each sequence (its ``len + 1`` targets)."""
        return np.array([float(t.sum()) for t in self.token_nll(seqs)], dtype=np.float64)

    def nll(self, seqs: Sequence) -> float:
        """Mean NLL in nats per target over all sequences (EOS included); NaN for no sequences."""
        per = self.token_nll(seqs)
        n = sum(len(t) for t in per)
        return float(sum(float(t.sum()) for t in per) / n) if n else float("nan")

    def score(self, seqs: Sequence) -> float:
        """Minus :meth:`nll` (higher is better, as scikit-learn expects)."""
        return -self.nll(seqs)

    def next_logprobs(self, contexts: Sequence) -> np.ndarray:
        """``(B, vocab_size_)`` log-distribution of the next token after each context.

        A context is a sequence prefix without BOS (BOS is implied before it); only its last
        ``order_ - 1`` tokens matter.
        """
        self._check_fitted()
        arrays = as_id_arrays(contexts, self.space_)
        B, V, N = len(arrays), self.vocab_size_, self.order_
        probs = np.tile(self.alpha_[0][:V] + self.gamma_[0][0] * self.base_, (B, 1))
        if N > 1 and B:
            # History = BOS + context, cut to its last N-1 tokens; its n-gram rows per level.
            hist = [np.concatenate([[self.bos_id_], a])[-(N - 1):] for a in arrays]
            lengths = np.array([len(h) for h in hist])
            tok = np.concatenate(hist)
            pos = np.arange(len(tok)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            last = np.cumsum(lengths) - 1
            ids = level_ids(self.keys_[: N - 1], tok, pos, V)
            for n in range(2, N + 1):
                ctx = ids[n - 2][last]  # row at level n-1 of the last n-1 tokens, or -1
                probs *= self.gamma_[n - 1][ctx][:, None]
                rows = np.flatnonzero(ctx >= 0)
                keys = self.keys_[n - 1]
                lo = np.searchsorted(keys, ctx[rows] * V)
                hi = np.searchsorted(keys, ctx[rows] * V + V)
                counts = hi - lo
                grams = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
                probs[np.repeat(rows, counts), keys[grams] % V] += self.alpha_[n - 1][grams]
        with np.errstate(divide="ignore"):
            return np.log(probs)

    def logprobs(self, context: np.ndarray | Sequence[int]) -> np.ndarray:
        """``(vocab_size_,)`` log-distribution of the next token after one context."""
        return self.next_logprobs([context])[0]

    # -- persistence -------------------------------------------------------------------------
    def _arrays(self) -> dict[str, np.ndarray]:
        arrays = {"base": self.base_}
        for n in range(1, self.order_ + 1):
            arrays[f"alpha_{n}"] = self.alpha_[n - 1]
            arrays[f"gamma_{n}"] = self.gamma_[n - 1]
            if n > 1:
                arrays[f"keys_{n}"] = self.keys_[n - 1]
        return arrays

    def save(self, model_dir: Path | str, metadata: dict[str, Any] | None = None) -> None:
        """Write ``model.npz`` (arrays) and ``model.json`` (params, learned scalars, metadata)."""
        self._check_fitted()
        model_dir = Path(model_dir)
        write_npz(model_dir / "model.npz", self._arrays())
        write_json(model_dir / "model.json", {
            "format": MODEL_FORMAT,
            "params": self.get_params(),
            "order_": self.order_,
            "vocab_size_": self.vocab_size_,
            "bos_id_": self.bos_id_,
            "eos_id_": self.eos_id_,
            "discounts_": self.discounts_,
            "discount_fallback_": self.discount_fallback_,
            "n_ngrams_": self.n_ngrams_,
            "n_train_sequences_": self.n_train_sequences_,
            "n_train_tokens_": self.n_train_tokens_,
            "metadata": metadata or {},
        })

    @classmethod
    def load(cls, model_dir: Path | str) -> NGramLM:
        """Read a model written by :meth:`save`; it scores exactly as the saved one did."""
        model_dir = Path(model_dir)
        meta = read_json(model_dir / "model.json")
        if meta.get("format") != MODEL_FORMAT:
            raise ValueError(f"{model_dir / 'model.json'}: format {meta.get('format')!r}, "
                             f"expected {MODEL_FORMAT!r}")
        model = cls(**meta["params"])
        for key in ("order_", "vocab_size_", "bos_id_", "eos_id_", "discounts_",
                    "discount_fallback_", "n_ngrams_", "n_train_sequences_", "n_train_tokens_"):
            setattr(model, key, meta[key])
        model.space_ = IdSpace(model.vocab_size_, model.bos_id_, model.eos_id_, model.pad_id)
        model.metadata_ = meta.get("metadata", {})
        with np.load(model_dir / "model.npz", allow_pickle=False) as z:
            model.base_ = z["base"]
            model.alpha_ = [z[f"alpha_{n}"] for n in range(1, model.order_ + 1)]
            model.gamma_ = [z[f"gamma_{n}"] for n in range(1, model.order_ + 1)]
            model.keys_ = [np.arange(model.vocab_size_, dtype=np.int64)]
            model.keys_ += [z[f"keys_{n}"] for n in range(2, model.order_ + 1)]
        return model


def write_npz(path: Path | str, arrays: dict[str, np.ndarray]) -> None:
    """Atomic, byte-reproducible ``.npz`` (readable by ``np.load(allow_pickle=False)``).

    ``np.savez`` stamps each zip entry with the current time, so the same arrays would give
    different bytes; here entries get a fixed timestamp and sorted names.
    """
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            with zf.open(info, "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.ascontiguousarray(arrays[name]),
                                          allow_pickle=False)
