"""Sampling from any :class:`models.base.SequenceModel`: temperature, top-k, top-p, greedy.

Only the protocol is used (``next_logprobs``, ``vocab_size``, ``eos_id``), so an n-gram and a
transformer are sampled by the same loop. Every sequence has its own seeded
``numpy.random.Generator``; a batch draws one uniform per live sequence per step, so a sample's
tokens do not depend on the batch size or on which other sequences are in the batch.

A conditioned transformer (docs/conditioning.md) takes one row of condition ids per prompt
(``conds``); a ``guidance`` scale other than 1 mixes its conditioned and unconditioned
next-token log-probabilities as classifier-free guidance does (MusicGen samples this way):
``log p_u + guidance · (log p_c − log p_u)``, renormalised. 1 is the conditioned model alone, 0
the unconditioned one, above 1 pushes away from the unconditioned distribution.

Invariants: ``temperature == 0`` is greedy (argmax, lowest id on ties) and draws no random
numbers; forbidden ids (PAD, BOS, other specials) are never produced; EOS ends a sequence and is
not part of the returned ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.base import SequenceModel


@dataclass(frozen=True)
class SamplingParams:
    """How one next token is chosen from a log-probability row."""

    temperature: float = 1.0
    """0 = greedy; otherwise log-probabilities are divided by it before normalising."""
    top_k: int = 0
    """Keep only the k most probable ids (0 = no limit)."""
    top_p: float = 1.0
    """Keep the smallest set of most probable ids whose probability reaches p (1.0 = no limit)."""


def filtered_probs(logp: np.ndarray, params: SamplingParams,
                   forbid: Sequence[int] = ()) -> np.ndarray:
    """Turn one ``(V,)`` log-probability row into the sampling distribution (sums to 1).

    Ties in top-k/top-p are broken by the lower id (stable sort), so the result is a pure function
    of the row. If filtering would remove every id, the single most probable allowed id is kept.
    """
    x = np.asarray(logp, dtype=np.float64).copy()
    if forbid:
        x[np.asarray(forbid, dtype=np.int64)] = -np.inf
    if not np.isfinite(x).any():
        raise ValueError("every token has zero probability after masking")
    if params.temperature == 0:
        out = np.zeros_like(x)
        out[int(np.argmax(x))] = 1.0
        return out
    x = x / params.temperature
    order = np.argsort(-x, kind="stable")  # most probable first, lower id first on ties
    keep = np.isfinite(x[order])
    if params.top_k > 0:
        keep[params.top_k:] = False
    p = np.exp(x[order] - x[order[0]])
    p[~keep] = 0.0
    p /= p.sum()
    if params.top_p < 1.0:
        # keep ids up to and including the one where the cumulative mass first reaches top_p
        cum = np.cumsum(p)
        cut = int(np.searchsorted(cum, params.top_p - 1e-12)) + 1
        p[cut:] = 0.0
        p /= p.sum()
    out = np.zeros_like(x)
    out[order] = p
    return out


def draw(probs: np.ndarray, rng: np.random.Generator | None) -> int:
    """Inverse-CDF draw with one uniform; ``rng=None`` only for a one-hot (greedy) row."""
    if rng is None:
        return int(np.argmax(probs))
    cum = np.cumsum(probs)
    u = rng.random() * cum[-1]
    return int(min(np.searchsorted(cum, u, side="right"), len(cum) - 1))


def guided(logp_cond: np.ndarray, logp_uncond: np.ndarray, scale: float) -> np.ndarray:
    """Classifier-free guidance on (B, V) log-probabilities, renormalised per row. An id
    impossible under both stays impossible; one impossible under either alone follows the mix
    (impossible whenever its weight is positive)."""
    c = np.asarray(logp_cond, dtype=np.float64)
    u = np.asarray(logp_uncond, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        mixed = u + scale * (c - u)
    mixed = np.where(np.isneginf(c) & np.isneginf(u), -np.inf, mixed)
    mixed = np.where(np.isnan(mixed), -np.inf, mixed)
    top = np.max(mixed, axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return mixed - top - np.log(np.sum(np.exp(mixed - top), axis=1, keepdims=True))


def eos_id(model: SequenceModel) -> int:
    """The model's EOS column (``eos_id``; an estimator that inferred it keeps ``eos_id_``)."""
    eos = getattr(model, "eos_id", None)
    if eos is None:
        eos = getattr(model, "eos_id_", None)
    if eos is None:
        raise ValueError(f"{type(model).__name__} has no eos_id: generation could never stop")
    return int(eos)


def sample_sequences(
    model: SequenceModel,
    prompts: Sequence[np.ndarray],
    *,
    max_new_tokens: int,
    params: SamplingParams,
    rngs: Sequence[np.random.Generator] | None,
    forbid: Sequence[int] = (),
    batch_size: int = 16,
    conds: np.ndarray | None = None,
    guidance: float = 1.0,
    none_ids: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Continue each prompt (may be empty) by up to ``max_new_tokens`` ids; stop at EOS.

    Returns only the new ids (int32), one array per prompt, in prompt order. ``rngs`` has one
    generator per prompt (ignored and may be ``None`` when ``temperature == 0``). ``conds``
    (N, K): each prompt's condition ids for a conditioned model; with ``guidance != 1`` the
    unconditioned side uses ``none_ids`` (K,) in every row.
    """
    greedy = params.temperature == 0
    eos = eos_id(model)
    if not greedy and (rngs is None or len(rngs) != len(prompts)):
        raise ValueError("sampling with temperature > 0 needs one generator per prompt")
    if conds is not None:
        conds = np.asarray(conds, dtype=np.int64)
        if len(conds) != len(prompts):
            raise ValueError(f"{len(conds)} condition rows for {len(prompts)} prompts")
        if guidance != 1.0 and none_ids is None:
            raise ValueError("guidance needs the model's 'none' condition ids (none_ids)")
    elif guidance != 1.0:
        raise ValueError("guidance needs conditions (conds)")
    results: list[np.ndarray] = []
    for start in range(0, len(prompts), max(1, batch_size)):
        idx = range(start, min(start + batch_size, len(prompts)))
        ctx = [np.asarray(prompts[i], dtype=np.int64) for i in idx]
        new: list[list[int]] = [[] for _ in idx]
        live = [True] * len(new)
        for _ in range(max_new_tokens):
            rows = [j for j, alive in enumerate(live) if alive]
            if not rows:
                break
            contexts = [np.concatenate([ctx[j], np.asarray(new[j], dtype=np.int64)]) for j in rows]
            if conds is None:
                logp = np.asarray(model.next_logprobs(contexts))
            else:
                c = conds[[idx[j] for j in rows]]
                logp = np.asarray(model.next_logprobs(contexts, conds=c))
                if guidance != 1.0:
                    none = np.broadcast_to(np.asarray(none_ids, dtype=np.int64), c.shape).copy()
                    logp = guided(logp, model.next_logprobs(contexts, conds=none), guidance)
            for r, j in enumerate(rows):
                probs = filtered_probs(logp[r], params, forbid)
                tok = draw(probs, None if greedy else rngs[idx[j]])  # type: ignore[index]
                if tok == eos:
                    live[j] = False
                else:
                    new[j].append(tok)
        results.extend(np.asarray(s, dtype=np.int32) for s in new)
    return results


@dataclass(frozen=True)
class StepRules:
    """What a compound step may hold, per codebook (:func:`compound_rules` builds it from the
    tokens' ``info.json``).

    ``forbid[k]``: ids codebook ``k`` never draws (its PAD and BOS, its ``Ignore_None``, and its
    EOS except in the first codebook). ``eos``: the first codebook's EOS, which ends a sample.
    ``ignore[k]``: CPWord's ``Ignore_None`` id of codebook ``k`` (-1 without one). ``used``: for
    CPWord, per first-codebook id (the step's family) the codebooks drawn for that family, and
    ``then``: per codebook ``k``, per id drawn there, the later codebooks that value makes
    drawn too (a Position brings its Tempo, a Bar its TimeSig); every other codebook of the
    step is written as its ``ignore`` id without a draw. Both empty: every codebook is drawn in
    every step (Octuple).
    """

    forbid: tuple[tuple[int, ...], ...]
    eos: int
    ignore: tuple[int, ...]
    used: dict[int, tuple[int, ...]]
    then: dict[int, dict[int, tuple[int, ...]]] = field(default_factory=dict)


def sample_steps(
    model,
    prompts: Sequence[np.ndarray],
    *,
    max_new_steps: int,
    params: SamplingParams,
    rngs: Sequence[np.random.Generator] | None,
    rules: StepRules,
    batch_size: int = 16,
) -> list[np.ndarray]:
    """Continue each (n, K) compound prompt by up to ``max_new_steps`` steps; stop at EOS.

    The model's K heads read one hidden state and are independent given it, so a step is drawn
    codebook by codebook in codebook order from that one state (``model.next_step_logprobs``),
    each id from its own codebook's distribution with ``params`` (temperature, top-k, top-p)
    applied to that codebook alone, ``rules.forbid[k]`` removed first. The first codebook is
    drawn first: its EOS ends the sample (and the step is not kept); the other codebooks never
    draw EOS, so a step is never half ended. With ``rules.used`` (CPWord) only the codebooks the
    drawn family uses (and ``rules.then`` adds) are drawn; the others hold ``Ignore_None``.
    Each prompt has its own generator and each drawn codebook takes one uniform from it, so a
    sample's steps depend only on its own draws, never on the batch size or on the other
    samples of the batch.
    Returns the new steps only, (m, K) int32 per prompt, in prompt order.
    """
    greedy = params.temperature == 0
    if not greedy and (rngs is None or len(rngs) != len(prompts)):
        raise ValueError("sampling with temperature > 0 needs one generator per prompt")
    K = len(rules.forbid)
    every = tuple(range(1, K))
    results: list[np.ndarray] = []
    for start in range(0, len(prompts), max(1, batch_size)):
        idx = range(start, min(start + batch_size, len(prompts)))
        ctx = [np.asarray(prompts[i], dtype=np.int64).reshape(-1, K) for i in idx]
        new: list[list[list[int]]] = [[] for _ in idx]
        live = [True] * len(new)
        for _ in range(max_new_steps):
            rows = [j for j, alive in enumerate(live) if alive]
            if not rows:
                break
            contexts = [np.concatenate([ctx[j], np.asarray(new[j], dtype=np.int64)
                                        .reshape(-1, K)]) for j in rows]
            logp = model.next_step_logprobs(contexts)
            for r, j in enumerate(rows):
                rng = None if greedy else rngs[idx[j]]  # type: ignore[index]
                first = draw(filtered_probs(logp[0][r], params, rules.forbid[0]), rng)
                if first == rules.eos:
                    live[j] = False
                    continue
                step = [first] + [rules.ignore[k] for k in range(1, K)]
                todo = set(rules.used.get(first, every) if rules.used else every)
                for k in range(1, K):
                    if k in todo:
                        step[k] = draw(filtered_probs(logp[k][r], params, rules.forbid[k]), rng)
                        todo.update(rules.then.get(k, {}).get(step[k], ()))
                new[j].append(step)
        results.extend(np.asarray(s, dtype=np.int32).reshape(-1, K) for s in new)
    return results


NOTE_BOOKS = ("Pitch", "PitchDrum", "Velocity", "Duration", "Program")
"""CPWord: the token types a Note step carries (miditok's ``_create_cp_token``)."""
METRIC_BOOKS = {"Position": ("Tempo", "Chord"), "Bar": ("TimeSig",)}
"""CPWord: a Metric step carries a Position or a Bar (its Position/Bar codebook), a Position also
its Tempo (and Chord), a Bar its TimeSig, where the tokenizer has them: miditok's decoder reads
those codebooks on such steps (:func:`compound_rules`)."""


def compound_rules(info: Any, tok: Any) -> StepRules:
    """How a compound step is drawn (:class:`StepRules`), from the tokens' ``info``
    (:class:`pipeline.tokens.contract.TokenInfo`) and their tokenizer: per
    codebook never its special tokens (PAD, BOS, MASK; EOS but in the first codebook) nor its
    ``Ignore_None``. For CPWord (codebooks with ``Ignore_None``) the first codebook is the step's
    family: a ``Family_Note`` step draws the codebooks of :data:`NOTE_BOOKS`, a
    ``Family_Metric`` step its Position/Bar codebook, then what :data:`METRIC_BOOKS` says the
    drawn Position or Bar carries; the rest hold ``Ignore_None``, as miditok writes them. A
    sample has no Rest steps (a Metric step whose Position/Bar is ``Ignore_None``): the heads
    were trained only on targets that carry a value (``Ignore_None`` masked), so they cannot say
    that a codebook is empty, only which value it holds when it has one."""
    books = info.codebooks or []
    specials = set(getattr(tok, "special_tokens", ()))
    forbid, ignore = [], []
    for k, (book, vocab) in enumerate(zip(books, tok.vocab, strict=True)):
        ids = {int(i) for t, i in vocab.items() if t in specials or t == "Ignore_None"}
        forbid.append(tuple(sorted(ids - ({int(book["eos_id"])} if k == 0 else set()))))
        ignore.append(int(book.get("ignore_id", -1)))
    used: dict[int, tuple[int, ...]] = {}
    then: dict[int, dict[int, tuple[int, ...]]] = {}
    if any(i >= 0 for i in ignore):
        types = [set(str(b["name"]).split("/")) for b in books]
        family = tok.vocab[0]
        note = tuple(k for k in range(1, len(books)) if types[k] & set(NOTE_BOOKS))
        bar_pos = [k for k in range(1, len(books)) if types[k] & set(METRIC_BOOKS)]
        used = {int(family["Family_Note"]): note, int(family["Family_Metric"]): tuple(bar_pos)}
        then = {k: {int(i): tuple(j for j in range(k + 1, len(books))
                                  if types[j] & set(METRIC_BOOKS[t.split("_")[0]]))
                    for t, i in tok.vocab[k].items() if t.split("_")[0] in METRIC_BOOKS}
                for k in bar_pos}
    return StepRules(forbid=tuple(forbid), eos=int(books[0]["eos_id"]), ignore=tuple(ignore),
                     used=used, then=then)
