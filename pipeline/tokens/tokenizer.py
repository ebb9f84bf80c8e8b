"""miditok tokenizers: which are supported, how one is built from params, loaded from
``data/tokenizer.json`` and decoded. The only place that constructs or loads a tokenizer.

Compound tokenizers (:data:`COMPOUND`: CPWord, Octuple) have one vocabulary per position of a
step (a *codebook*): each step is one id per codebook. miditok calls the steps' ids a list of
lists (``[[pitch, position, bar, ...], ...]``); the token tables keep one list per codebook
(``codes``, :mod:`pipeline.tokens.contract`). :func:`steps_from_codes` and
:func:`codes_from_steps` turn one into the other; :func:`codebooks` describes the codebooks.

``import miditok`` pulls in torch (2-4 s) through its optional ``miditok.pytorch_data``, which
nothing here uses; :func:`import_miditok` imports miditok without it when torch is not loaded
yet, and is called inside the functions.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.artifacts import ArtifactError, read_json, sha256_bytes
from pipeline.tokens.contract import COMPOUND, SPECIAL_TOKENS

SUPPORTED = ("REMI", "TSD", "MIDILike", "Structured", *COMPOUND)
REFUSED = {
    "MuMIDI": "multi-vocabulary with steps of varying width (3 ids for a Bar, Position or "
              "Program step, 5 for a note), so its ids form no table of one column per "
              "codebook; it also clips pieces longer than max_bar_embedding bars",
    "MMM": "needs a base tokenizer (config.additional_params) and is not supported here",
    "PerTok": "needs ticks_per_quarter and microtiming settings and is not supported here",
    "BEAT": "not validated end to end by this stage",
}
MODELS = ("none", "BPE", "WordPiece")
EXTRA_CONFIG = {"max_bar_embedding": ("Octuple",)}
"""``tokenize.config`` keys that are not ``TokenizerConfig`` arguments but miditok reads from its
``additional_params``, and the tokenizers that read them. Octuple encodes a note's bar as a token
of its Bar codebook, ``Bar_0`` to ``Bar_<max_bar_embedding - 1>`` (miditok's default: 60), and
clips a longer piece; the tokenize stage flags such pieces ``truncated_bars``."""
PROGRAM_KEY = "symkit_program"
"""Where a tokenizer keeps ``tokenize.program`` (the program every pitched track is encoded as):
in miditok's ``config.additional_params``, which ``tokenizer.json`` saves and loads, so a saved
tokenizer encodes new files (``symkit score``, ``tokenize.from``) as its own pieces were encoded,
and the setting is part of the tokenizer's identity (:func:`tokenizer_hash`)."""


def import_miditok() -> Any:
    """The ``miditok`` module, imported without torch when torch is not already loaded.

    miditok's ``__init__`` imports its optional ``pytorch_data`` inside ``try/except
    ImportError``; a ``None`` in ``sys.modules`` makes that import fail, so torch is not loaded.
    The placeholder is removed afterwards: ``import miditok.pytorch_data`` later imports it (and
    torch) as usual. Should a miditok release not catch that ImportError, the partial import is
    undone and miditok imported plainly.
    """
    if "miditok" in sys.modules:
        return sys.modules["miditok"]
    name = "miditok.pytorch_data"
    if "torch" in sys.modules or name in sys.modules:
        return importlib.import_module("miditok")
    sys.modules[name] = None  # type: ignore[assignment]
    try:
        return importlib.import_module("miditok")
    except ImportError:
        for mod in [m for m in sys.modules if m == "miditok" or m.startswith("miditok.")]:
            del sys.modules[mod]  # the placeholder included
        return importlib.import_module("miditok")
    finally:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]


def tokenizer_config_args() -> set[str]:
    """Keyword arguments of miditok's ``TokenizerConfig`` (its ``**kwargs`` excluded)."""
    params = inspect.signature(import_miditok().TokenizerConfig.__init__).parameters.values()
    return {p.name for p in params if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD}


def _from_yaml(key: str, value: Any) -> Any:
    """YAML value -> what TokenizerConfig expects (tuples, tuple-keyed beat resolutions)."""
    if key in {"beat_res", "beat_res_rest"} and isinstance(value, dict):
        return {tuple(int(x) for x in str(k).split("_")): r for k, r in value.items()}
    if isinstance(value, list) and (key.endswith("_range") or key == "chord_unknown"):
        return tuple(value)
    if key == "chord_maps" and isinstance(value, dict):
        return {k: tuple(m) for k, m in value.items()}
    return value


def _same(a: Any, b: Any) -> bool:
    def norm(x: Any) -> Any:
        return (sorted(x) if isinstance(x, set | frozenset) else
                list(x) if isinstance(x, tuple | list) else x)

    return norm(a) == norm(b)


def make_tokenizer(name: str, config: dict[str, Any], program: int | None = None) -> Any:
    """Base (untrained) miditok tokenizer; ValueError naming ``config.<key>`` when refused.
    ``program``: ``tokenize.program``, kept in the tokenizer (:data:`PROGRAM_KEY`)."""
    import warnings

    miditok = import_miditok()
    kwargs = {k: _from_yaml(k, v) for k, v in config.items()}
    extra = {PROGRAM_KEY: int(program)} if program is not None else {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tok = getattr(miditok, name)(miditok.TokenizerConfig(**kwargs, **extra))
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"config: miditok refused it: {e}") from None
    for key, value in kwargs.items():
        if key in EXTRA_CONFIG:
            if name not in EXTRA_CONFIG[key]:
                raise ValueError(f"config.{key}: read by {', '.join(EXTRA_CONFIG[key])} only, "
                                 f"not by {name}")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config.{key} = {value!r}: must be a positive integer")
            continue
        if key != "special_tokens" and not _same(getattr(tok.config, key), value):
            raise ValueError(f"config.{key} = {config[key]!r}: not supported by {name} "
                             f"(it uses {getattr(tok.config, key)!r})")
    missing = [t for t in SPECIAL_TOKENS if t not in tok.special_tokens]
    if missing:
        raise ValueError(f"config.special_tokens must include PAD, BOS and EOS (missing "
                         f"{', '.join(missing)})")
    return tok


def encoded_program(tokenizer: Any) -> int | None:
    """The program this tokenizer encodes every pitched track as (``tokenize.program``), or None
    when it keeps each track's own."""
    value = tokenizer.config.additional_params.get(PROGRAM_KEY)
    return None if value is None else int(value)


def prepare_score(tokenizer: Any, score: Any) -> Any:
    """``score`` as the tokenizer encodes it: every pitched (non-drum) track set to
    :func:`encoded_program` when there is one (tracks that then share a program are merged by
    miditok's preprocessing, as tracks of one program always are), then miditok's
    ``preprocess_score``. The one way every path (tokenize, ``symkit score``) turns a parsed file
    into what is encoded. Changes ``score``'s tracks in place."""
    program = encoded_program(tokenizer)
    if program is not None:
        for track in score.tracks:
            if not track.is_drum:
                track.program = program
    return tokenizer.preprocess_score(score)


def load_tokenizer(path: Path | str) -> Any:
    """Load a saved miditok tokenizer by the class name stored in its JSON."""
    miditok = import_miditok()
    raw = read_json(path)
    name = raw.get("tokenization") if isinstance(raw, dict) else None
    cls = getattr(miditok, str(name), None) if name else None
    if cls is None:
        raise ArtifactError.for_path(path, f"names no miditok tokenization ({name!r})")
    return cls(params=Path(path))


def tokenizer_text(tokenizer: Any) -> str:
    """The tokenizer as ``data/tokenizer.json`` holds it: miditok's JSON layout, version strings
    left out (they do not change a single id)."""
    tok_dict = {k: v for k, v in tokenizer.to_dict().items() if not k.endswith("_version")}
    return json.dumps(tok_dict, indent=4)


def tokenizer_hash(tokenizer: Any) -> str:
    """The tokenizer's identity, as ``data/tokens/info.json`` and every model record it: the
    sha256 of :func:`tokenizer_text`."""
    return sha256_bytes(tokenizer_text(tokenizer).encode("utf-8"))


def is_compound(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` has several vocabularies (one id per codebook per step)."""
    return bool(getattr(tokenizer, "is_multi_voc", False))


def codebooks(tokenizer: Any) -> list[dict[str, Any]]:
    """The codebooks of a compound tokenizer, in miditok's order: per codebook its ``name`` (the
    token types miditok puts there, ``/``-joined in miditok's order, e.g. ``Pitch`` or
    CPWord's ``Position/Bar``), its ``size`` and its own PAD, BOS and EOS ids (each vocabulary
    has its own special tokens: miditok puts them first in every one), plus ``ignore_id`` where
    the vocabulary has miditok's ``Ignore_None`` (CPWord writes it in a codebook a step leaves
    empty; a model masks it, never predicts it). Empty for a single-stream tokenizer."""
    if not is_compound(tokenizer):
        return []
    names: dict[int, list[str]] = {}
    for type_, k in getattr(tokenizer, "vocab_types_idx", {}).items():
        if k >= 0:
            names.setdefault(int(k), []).append(type_)
    out = []
    for k, vocab in enumerate(tokenizer.vocab):
        out.append({"name": "/".join(names.get(k, [f"codebook{k}"])), "size": len(vocab),
                    "pad_id": int(vocab["PAD_None"]), "bos_id": int(vocab["BOS_None"]),
                    "eos_id": int(vocab["EOS_None"]),
                    **({"ignore_id": int(vocab["Ignore_None"])} if "Ignore_None" in vocab
                       else {})})
    return out


def steps_from_codes(codes: Sequence[Sequence[int]] | np.ndarray) -> list[list[int]]:
    """A compound sequence as the token tables store it (``codes``: one list per codebook, each
    one id per step) -> miditok's ids (one list of an id per codebook for each step), the input
    of ``tokenizer.decode``. Inverse of :func:`codes_from_steps`."""
    arr = np.asarray([np.asarray(c, dtype=np.int64) for c in codes], dtype=np.int64)
    if arr.ndim != 2:
        raise ValueError("codes: one list per codebook, all of the same length")
    return arr.T.tolist()


def codes_from_steps(steps: Sequence[Sequence[int]] | np.ndarray, n_codebooks: int
                     ) -> np.ndarray:
    """miditok's ids of a compound sequence (one list of ``n_codebooks`` ids per step) -> the
    (``n_codebooks``, steps) int32 array the token tables store as ``codes``. A step of another
    width is a ValueError."""
    arr = np.asarray(steps, dtype=np.int64)
    if arr.size == 0:
        arr = arr.reshape(0, n_codebooks)
    if arr.ndim != 2 or arr.shape[1] != n_codebooks:
        raise ValueError(f"compound steps must each hold {n_codebooks} ids (one per codebook)")
    return np.ascontiguousarray(arr.T, dtype=np.int32)


def miditok_ids(tokenizer: Any, ids: np.ndarray | Sequence[Any]) -> list[Any]:
    """Base ids as miditok's ``TokSequence(ids=...)`` takes them: a flat list of ints, or for a
    compound tokenizer one list per step (``ids`` given as steps, or flat, step after step, as
    the token store packs them)."""
    if not is_compound(tokenizer):
        return [int(i) for i in ids]
    k = len(tokenizer.vocab)
    return np.asarray(ids, dtype=np.int64).reshape(-1, k).tolist()


def decode_ids(tokenizer: Any, ids: Sequence[Any] | np.ndarray) -> tuple[Any, str | None]:
    """ids -> (symusic Score or None, error message or None). Never raises. For a compound
    tokenizer ``ids`` are its steps (one id per codebook each: :func:`steps_from_codes` of a
    row's ``codes``); steps that decode to a note before time 0 are an error."""
    try:
        ids = miditok_ids(tokenizer, ids)
        if not ids:
            import symusic

            return symusic.Score(tokenizer.time_division), None
        one_stream = bool(getattr(tokenizer, "one_token_stream", False))
        if is_compound(tokenizer):  # a TokSequence: miditok cannot tell steps from sequences
            from miditok import TokSequence

            seq = TokSequence(ids=ids)
            score = tokenizer.decode(seq if one_stream else [seq])
            if any(len(t.notes) and int(t.notes.numpy()["time"].min()) < 0 for t in score.tracks):
                # Octuple steps whose bars run backwards across time-signature changes decode
                # to negative times (miditok 3.1): not music, and no notes table accepts them
                return None, "ValueError: the steps decode to notes before time 0"
            return score, None
        return tokenizer.decode(ids if one_stream else [ids]), None
    except Exception as e:  # malformed sequences are data, reported per sample
        return None, f"{type(e).__name__}: {e}"[:500]
