"""The contract every sequence model meets, as checks anyone can run on their own model (as
scikit-learn's ``check_estimator`` does for estimators).

    from models.checks import check_sequence_model, sample_sequences
    from models.ngram import NGramLM

    seqs = sample_sequences(range(3, 40))       # ids the model may see: no BOS, EOS or PAD
    check_sequence_model(lambda: NGramLM(order=3, vocab_size=40, bos_id=1, eos_id=2, pad_id=0),
                         seqs, save=lambda m, d: m.save(d), load=NGramLM.load)

:func:`check_sequence_model` takes a factory of the model (each call gives a fresh one, unfitted
when the model has ``fit``) and sequences of ids, fits the model on them where it has ``fit``,
runs every check below and returns their names; the first broken rule raises
:class:`ContractError`, naming the check, the sequence or row and the numbers. Each check is also
a function of its own:

- :func:`check_fit` (models with ``fit``): ``fit(seqs)`` returns the model itself; it leaves the
  hyper-parameters (``get_params()``, where the model has it) as they were, and every attribute
  it adds ends in ``_`` (scikit-learn's estimator contract); ``type(model)(**get_params())``
  builds a model with the same parameters.
- :func:`check_attributes`: ``vocab_size`` (an int >= 2) and ``eos_id`` (an id below it), the
  two attributes of :class:`models.base.SequenceModel`.
- :func:`check_token_nll`: ``len(seq) + 1`` finite, non-negative values per sequence (its ids,
  then EOS; an empty sequence has one), whatever else is in the batch.
- :func:`check_next_logprobs`: a ``(B, vocab_size)`` array whose rows are log-distributions
  (no NaN, no ``+inf``, probabilities summing to 1) with a non-zero probability of EOS,
  whatever else is in the batch.
- :func:`check_chain_rule`: on a short sequence, each NLL is minus the log-probability
  ``next_logprobs`` gives that id after the ids before it, and the last one is minus the EOS
  column after the whole sequence: the two methods describe one distribution, and EOS means end.
- :func:`check_score` (models with ``score``): minus the mean NLL per target, EOS included.
- :func:`check_deterministic`: two models from the factory, fitted alike, give the same numbers,
  bit for bit, call after call, and leave their inputs unchanged.
- :func:`check_round_trip` (given ``save`` and ``load``): the loaded model gives bit for bit the
  numbers of the saved one.

Sequences never contain BOS, EOS or PAD: the model adds BOS and EOS itself (``models.base``).
Numbers compared between two methods or two batchings agree within ``atol``; numbers of the same
call repeated, or of a reloaded model, must be equal.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ModelFactory = Callable[[], Any]
CHAIN_RULE_IDS = 8
"""Ids of the sequence the chain rule is checked on: short enough for any model's context."""


class ContractError(AssertionError):
    """A model breaks the sequence-model contract; the message names the check."""


def _fail(check: str, model: Any, what: str) -> ContractError:
    return ContractError(f"{check}: {type(model).__name__}: {what}")


def sample_sequences(ids: Iterable[int], n: int = 12, max_len: int = 24,
                     seed: int = 0) -> list[np.ndarray]:
    """``n`` sequences over ``ids`` (int64 arrays): an empty one, one of length 1, then random
    walks of up to ``max_len`` ids, so they share n-grams. The same for the same arguments."""
    pool = np.asarray(sorted(set(int(i) for i in ids)), dtype=np.int64)
    if pool.size < 2:
        raise ValueError(f"sample_sequences needs at least 2 ids, got {pool.tolist()}")
    rng = np.random.default_rng(seed)
    out = [pool[:0].copy(), pool[:1].copy()]
    for _ in range(max(0, n - 2)):
        steps = rng.integers(-2, 3, size=int(rng.integers(2, max_len + 1)))
        out.append(pool[(int(rng.integers(pool.size)) + np.cumsum(steps)) % pool.size])
    return out[:n]


def _as_arrays(seqs: Sequence) -> list[np.ndarray]:
    return [np.asarray(s, dtype=np.int64).reshape(-1) for s in seqs]


def _ready(make_model: ModelFactory, seqs: Sequence[np.ndarray]) -> Any:
    """A model from the factory, fitted on ``seqs`` where it has ``fit``."""
    model = make_model()
    if hasattr(model, "fit"):
        model.fit(seqs)
    return model


def _contexts(seqs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Prefixes of the first sequences: empty, one id, half, whole."""
    return [s[:k] for s in seqs[:4] for k in sorted({0, min(1, len(s)), len(s) // 2, len(s)})]


# --------------------------------------------------------------------------- the checks
def check_fit(model: Any, seqs: Sequence[np.ndarray]) -> None:
    """``fit`` returns the model, leaves its input and hyper-parameters as they were, and names
    what it learns with a trailing ``_``."""
    name = "check_fit"
    params = copy.deepcopy(model.get_params()) if hasattr(model, "get_params") else None
    before = set(getattr(model, "__dict__", {}))
    seqs = _as_arrays(seqs)
    kept = [s.copy() for s in seqs]
    out = model.fit(seqs)
    _check_unchanged(name, model, "fit", seqs, kept)
    if out is not model:
        raise _fail(name, model, f"fit returned {type(out).__name__}, not the model itself")
    added = sorted(a for a in set(getattr(model, "__dict__", {})) - before
                   if not a.endswith("_") and not a.startswith("_"))
    if added:
        raise _fail(name, model, f"fit added attributes {added}: learned state ends in '_'")
    if params is not None:
        after = model.get_params()
        changed = sorted(k for k in set(params) | set(after) if params.get(k) != after.get(k))
        if changed:
            k = changed[0]
            raise _fail(name, model, f"fit changed hyper-parameter {k!r} from {params.get(k)!r} "
                        f"to {after.get(k)!r}: __init__ and fit leave them as given")
        clone = type(model)(**params).get_params()
        if clone != params:
            raise _fail(name, model, f"{type(model).__name__}(**get_params()) has parameters "
                        f"{clone}, not {params}")


def check_attributes(model: Any) -> None:
    """``vocab_size`` is an int >= 2 and ``eos_id`` an id below it."""
    name = "check_attributes"
    for attr in ("vocab_size", "eos_id", "token_nll", "next_logprobs"):
        if not hasattr(model, attr):
            raise _fail(name, model, f"has no {attr!r} (models.base.SequenceModel)")
    v, eos = model.vocab_size, model.eos_id
    if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < 2:
        raise _fail(name, model, f"vocab_size is {v!r}, expected an int >= 2")
    if not isinstance(eos, int | np.integer) or isinstance(eos, bool) or not 0 <= eos < v:
        raise _fail(name, model, f"eos_id is {eos!r}, expected an id in [0, {v})")


def check_token_nll(model: Any, seqs: Sequence[np.ndarray], atol: float = 1e-5) -> None:
    """``len(seq) + 1`` finite non-negative NLLs per sequence, the same alone as in a batch."""
    name = "check_token_nll"
    seqs = _as_arrays(seqs)
    kept = [s.copy() for s in seqs]
    out = list(model.token_nll(seqs))
    _check_unchanged(name, model, "token_nll", seqs, kept)
    if len(out) != len(seqs):
        raise _fail(name, model, f"{len(out)} results for {len(seqs)} sequences")
    for i, (seq, nll) in enumerate(zip(seqs, out, strict=True)):
        nll = np.asarray(nll, dtype=np.float64)
        if nll.shape != (len(seq) + 1,):
            raise _fail(name, model, f"sequence {i} (length {len(seq)}): values of shape "
                        f"{nll.shape}, expected ({len(seq) + 1},): its ids, then EOS")
        if not np.isfinite(nll).all():
            k = int(np.flatnonzero(~np.isfinite(nll))[0])
            raise _fail(name, model, f"sequence {i}, target {k}: NLL {nll[k]} is not finite "
                        "(every id the model may see needs a non-zero probability)")
        if (nll < -atol).any():
            k = int(np.argmin(nll))
            raise _fail(name, model, f"sequence {i}, target {k}: NLL {nll[k]} is negative")
        alone = np.asarray(model.token_nll([seq])[0], dtype=np.float64)
        if alone.shape != nll.shape:
            raise _fail(name, model, f"sequence {i}: {alone.shape} values alone, {nll.shape} in a "
                        f"batch of {len(seqs)}")
        if not np.allclose(alone, nll, rtol=0, atol=atol):
            k = int(np.argmax(np.abs(alone - nll)))
            raise _fail(name, model, f"sequence {i}, target {k}: NLL {alone[k]:.6g} alone but "
                        f"{nll[k]:.6g} in a batch of {len(seqs)}")
    if len(list(model.token_nll([]))) != 0:
        raise _fail(name, model, "no sequences must give no results")


def _check_unchanged(name: str, model: Any, method: str, now: list[np.ndarray],
                     before: list[np.ndarray]) -> None:
    for i, (x, y) in enumerate(zip(now, before, strict=True)):
        if not np.array_equal(x, y):
            raise _fail(name, model, f"{method} changed sequence {i} it was given")


def _logsumexp(rows: np.ndarray) -> np.ndarray:
    top = rows.max(axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.exp(rows - top).sum(axis=1)) + top[:, 0]


def check_next_logprobs(model: Any, contexts: Sequence[np.ndarray], atol: float = 1e-5) -> None:
    """``(B, vocab_size)`` rows of log-probabilities summing to 1, EOS possible, batch-free."""
    name = "check_next_logprobs"
    contexts = _as_arrays(contexts)
    V, eos = int(model.vocab_size), int(model.eos_id)
    kept = [c.copy() for c in contexts]
    lp = np.asarray(model.next_logprobs(contexts))
    _check_unchanged(name, model, "next_logprobs", contexts, kept)
    if lp.shape != (len(contexts), V):
        raise _fail(name, model, f"shape {lp.shape} for {len(contexts)} contexts, expected "
                    f"({len(contexts)}, {V}) (vocab_size columns)")
    if not np.issubdtype(lp.dtype, np.floating):
        raise _fail(name, model, f"dtype {lp.dtype}, expected floating point")
    lp = lp.astype(np.float64)
    if np.isnan(lp).any() or np.isposinf(lp).any():
        r = int(np.flatnonzero((np.isnan(lp) | np.isposinf(lp)).any(axis=1))[0])
        raise _fail(name, model, f"row {r} holds NaN or +inf")
    total = _logsumexp(lp) if len(contexts) else np.zeros(0)
    bad = np.flatnonzero(np.abs(total) > atol)
    if bad.size:
        r = int(bad[0])
        raise _fail(name, model, f"row {r}: probabilities sum to {np.exp(total[r]):.6g}, "
                    "expected 1 (log-probabilities, natural log)")
    if np.isneginf(lp[:, eos]).any():
        r = int(np.flatnonzero(np.isneginf(lp[:, eos]))[0])
        raise _fail(name, model, f"row {r}: EOS (id {eos}) has probability 0: the sequence "
                    "could never end there")
    for r, c in enumerate(contexts):
        alone = np.asarray(model.next_logprobs([c]), dtype=np.float64)[0]
        if not np.allclose(alone, lp[r], rtol=0, atol=atol, equal_nan=False):
            k = int(np.argmax(np.abs(np.nan_to_num(alone - lp[r], nan=np.inf))))
            raise _fail(name, model, f"context {r}: id {k} has log-probability {alone[k]} "
                        f"alone but {lp[r, k]} in a batch of {len(contexts)}")


def check_chain_rule(model: Any, seq: Sequence[int], atol: float = 1e-5) -> None:
    """``token_nll(seq)[i] == -next_logprobs(seq[:i])[seq[i]]``, and the last is EOS's."""
    name = "check_chain_rule"
    seq = _as_arrays([seq])[0]
    n = len(seq)
    nll = np.asarray(model.token_nll([seq])[0], dtype=np.float64)
    lp = np.asarray(model.next_logprobs([seq[:i] for i in range(n + 1)]), dtype=np.float64)
    want = -lp[np.arange(n + 1), np.append(seq, int(model.eos_id))]
    for i in range(n + 1):
        if not abs(nll[i] - want[i]) <= atol:
            target = f"EOS after all {n} ids" if i == n else f"id {seq[i]} after {i} ids"
            raise _fail(name, model, f"target {i} ({target}): token_nll gives {nll[i]:.6g} but "
                        f"next_logprobs gives {want[i]:.6g}")


def check_score(model: Any, seqs: Sequence[np.ndarray], atol: float = 1e-5) -> None:
    """``score(seqs)`` is minus the mean NLL per target (EOS included)."""
    seqs = _as_arrays(seqs)
    nll = np.concatenate([np.asarray(t, dtype=np.float64) for t in model.token_nll(seqs)])
    got, want = float(model.score(seqs)), -float(nll.mean())
    if not abs(got - want) <= atol:
        raise _fail("check_score", model, f"score gives {got:.6g}, minus the mean NLL per "
                    f"target is {want:.6g}")


def _outputs(model: Any, seqs: list[np.ndarray], contexts: list[np.ndarray]
             ) -> list[np.ndarray]:
    return [np.asarray(t, dtype=np.float64) for t in model.token_nll(seqs)] + \
        [np.asarray(model.next_logprobs(contexts), dtype=np.float64)]


def _first_difference(a: list[np.ndarray], b: list[np.ndarray]) -> str | None:
    """Where two :func:`_outputs` differ (NaN equal to NaN), in words; None where nowhere."""
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        what = "next_logprobs" if k == len(a) - 1 else f"token_nll of sequence {k}"
        if x.shape != y.shape:
            return f"{what}: shape {x.shape} against {y.shape}"
        if not np.array_equal(x, y, equal_nan=True):
            i = int(np.flatnonzero((x != y) & ~(np.isnan(x) & np.isnan(y)))[0])
            return f"{what}, value {i}: {x.flat[i]:.17g} against {y.flat[i]:.17g}"
    return None


def check_deterministic(make_model: ModelFactory, fit_seqs: Sequence[np.ndarray],
                        seqs: Sequence[np.ndarray]) -> None:
    """The same inputs give the same outputs bit for bit (two fresh models, and one model called
    twice), and no method changes the sequences it is given."""
    name = "check_deterministic"
    fit_seqs, seqs = _as_arrays(fit_seqs), _as_arrays(seqs)
    kept = [s.copy() for s in fit_seqs], [s.copy() for s in seqs]
    contexts = _contexts(seqs)
    a = _ready(make_model, fit_seqs)
    first = _outputs(a, seqs, contexts)
    diff = _first_difference(first, _outputs(a, seqs, contexts))
    if diff:
        raise _fail(name, a, f"a second call gives other numbers: {diff}")
    diff = _first_difference(first, _outputs(_ready(make_model, fit_seqs), seqs, contexts))
    if diff:
        raise _fail(name, a, "a second model from the factory, fitted on the same sequences, "
                    f"gives other numbers (seed every random choice): {diff}")
    _check_unchanged(name, a, "fit", fit_seqs, kept[0])
    _check_unchanged(name, a, "scoring", seqs, kept[1])


def check_round_trip(model: Any, save: Callable[[Any, Path], Any],
                     load: Callable[[Path], Any], seqs: Sequence[np.ndarray]) -> None:
    """``load(folder)`` after ``save(model, folder)`` gives the saved model's numbers exactly."""
    name = "check_round_trip"
    seqs = _as_arrays(seqs)
    contexts = _contexts(seqs)
    with tempfile.TemporaryDirectory() as folder:
        save(model, Path(folder))
        loaded = load(Path(folder))
    for attr in ("vocab_size", "eos_id"):
        if getattr(loaded, attr, None) != getattr(model, attr):
            raise _fail(name, model, f"the loaded model's {attr} is "
                        f"{getattr(loaded, attr, None)!r}, the saved one's "
                        f"{getattr(model, attr)!r}")
    diff = _first_difference(_outputs(model, seqs, contexts), _outputs(loaded, seqs, contexts))
    if diff:
        raise _fail(name, model, f"the loaded model gives other numbers: {diff}")


# --------------------------------------------------------------------------- entry point
def check_sequence_model(make_model: ModelFactory, seqs: Sequence[Sequence[int]], *,
                         save: Callable[[Any, Path], Any] | None = None,
                         load: Callable[[Path], Any] | None = None,
                         atol: float = 1e-5) -> list[str]:
    """Run every check on models from ``make_model`` (module docstring); returns the names of
    the checks run, in order. ``seqs`` (ids the model may see; a few short sequences do) are
    what a model with ``fit`` is fitted on; the model scores them, their reversals (unseen
    n-grams) and an empty sequence. ``save(model, folder)`` and ``load(folder)``, given
    together, add the round trip."""
    if (save is None) != (load is None):
        raise ValueError("give save and load together, or neither")
    fit_seqs = _as_arrays(seqs)
    if not any(len(s) >= 2 for s in fit_seqs):
        raise ValueError("seqs need a sequence of at least 2 ids (see sample_sequences)")
    scored = [*(s.copy() for s in fit_seqs), *(s[::-1].copy() for s in fit_seqs),
              fit_seqs[0][:0].copy()]
    short = next(s for s in fit_seqs if len(s) >= 2)[:CHAIN_RULE_IDS]
    done = []
    model = make_model()
    if hasattr(model, "fit"):
        check_fit(model, fit_seqs)
        done.append("check_fit")
    check_attributes(model)
    check_token_nll(model, scored, atol)
    check_next_logprobs(model, _contexts(scored), atol)
    check_chain_rule(model, short, atol)
    done += ["check_attributes", "check_token_nll", "check_next_logprobs", "check_chain_rule"]
    if hasattr(model, "score"):
        check_score(model, scored, atol)
        done.append("check_score")
    check_deterministic(make_model, fit_seqs, scored)
    done.append("check_deterministic")
    if save is not None and load is not None:
        check_round_trip(model, save, load, scored)
        done.append("check_round_trip")
    return done
