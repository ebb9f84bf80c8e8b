"""miditok tokenizers: which are supported, how one is built from params, loaded from
``data/tokenizer.json`` and decoded. The only place that constructs or loads a tokenizer.

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

from pipeline.core.artifacts import ArtifactError, read_json, sha256_bytes
from pipeline.tokens.contract import SPECIAL_TOKENS

SUPPORTED = ("REMI", "TSD", "MIDILike", "Structured")
REFUSED = {
    "CPWord": "multi-vocabulary (several ids per step): gives no single id stream and cannot be "
              "trained with BPE",
    "Octuple": "multi-vocabulary (several ids per step): gives no single id stream and cannot be "
               "trained with BPE; it also truncates long pieces (max_bar_embedding)",
    "MuMIDI": "multi-vocabulary (several ids per step): gives no single id stream and cannot be "
              "trained with BPE",
    "MMM": "needs a base tokenizer (config.additional_params) and is not supported here",
    "PerTok": "needs ticks_per_quarter and microtiming settings and is not supported here",
    "BEAT": "not validated end to end by this stage",
}
MODELS = ("none", "BPE", "WordPiece")
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


def decode_ids(tokenizer: Any, ids: Sequence[int]) -> tuple[Any, str | None]:
    """ids -> (symusic Score or None, error message or None). Never raises."""
    ids = [int(i) for i in ids]
    try:
        if not ids:
            import symusic

            return symusic.Score(tokenizer.time_division), None
        one_stream = bool(getattr(tokenizer, "one_token_stream", False))
        return tokenizer.decode(ids if one_stream else [ids]), None
    except Exception as e:  # malformed sequences are data, reported per sample
        return None, f"{type(e).__name__}: {e}"[:500]
