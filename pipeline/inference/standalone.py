"""A trained transformer used outside the DVC stages: ``symkit sample`` and ``symkit score``
(docs/inference.md).

- :func:`open_model` reads a model folder (``model.json`` + ``model.safetensors``) and a
  tokenizer file and **refuses a mismatch**: the tokenizer's :func:`tokenizer_hash` must be the
  ``tokenizer_hash`` the model recorded, or its ids would mean other tokens. No torch yet; the
  scorer comes from :meth:`Inference.scorer`.
- :func:`parse_conditions` reads ``NAME=LABEL`` pairs against the model's condition vocabulary:
  conditions for an unconditioned model, a name the model lacks and a label its vocabulary lacks
  are refused, naming the vocabulary (its hash, names and labels).
- :func:`read_files` reads, checks and encodes MIDI files in isolated worker processes, as the
  tokenize stage does (:func:`encode_midi`: the stage's base encoding, then its trained
  vocabulary, so a piece gets the ids of ``data/tokens/tokens.parquet``), counts notes as ingest
  does and measures the built-in conditions as the conditions stage does. A bad file is a
  :class:`FileResult` with a ``status``, never an exception; one that crashes or hangs the
  parser costs only its own worker.

A model of compound tokens (CPWord, Octuple; docs/transformer.md) is served as one of one
stream: its ``info`` carries ``model.json``'s codebooks, :meth:`Inference.scorer` gives a
:class:`pipeline.inference.scorer.CompoundScorer`, and a file's sequences are its steps, an
(n, K) array of one id per codebook each (the token tables' ``codes``, transposed), cleaned by
the protocol's compound rules (:func:`pipeline.inference.protocol.clean_compound`).

Refusals are :class:`InferenceError`: one message that names what is wrong and what to do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.conditions.assign import model_vocab
from pipeline.conditions.config import BUILTIN, ConditionConfig
from pipeline.conditions.extract import meter_and_tempo
from pipeline.conditions.table import measure
from pipeline.conditions.vocab import NONE_LABEL, ConditionVocab
from pipeline.core.artifacts import read_json, sha256_file
from pipeline.core.parallel import ItemFailure, isolated_map
from pipeline.inference.protocol import clean_rows
from pipeline.music.parsing import looks_like_midi, parse_many
from pipeline.tokens.contract import TokenInfo
from pipeline.tokens.encoding import encode_score
from pipeline.tokens.entries import pack, parse_block
from pipeline.tokens.tokenizer import is_compound, load_tokenizer, prepare_score, tokenizer_hash
from pipeline.tokens.vocabulary import apply_model

TIMEOUT_S = 120.0
"""Seconds one file may take to read, parse and encode in its worker (``tokenize.timeout_s``'s
default) before it is given up as ``timeout``."""

STATUSES = {
    "ok": "scored",
    "missing": "no such file",
    "read_error": "the file could not be read",
    "empty_file": "the file has zero bytes",
    "not_midi": "the file does not start with a MIDI header (MThd)",
    "corrupt": "the MIDI parser rejected the file (its message is in `detail`)",
    "no_notes": "the file holds no notes",
    "encode_error": "the tokenizer could not encode the file",
    "not_encoded": "the tokenizer gave no token sequence",
    "id_out_of_range": "the tokenizer gave an id outside the model's vocabulary",
    "timeout": f"reading and encoding took longer than {TIMEOUT_S:g} s",
    "crash": "the file killed its worker process",
    "error": "reading the file raised an unexpected error (its message is in `detail`)",
}
"""``status`` of a file and what it means; every status but ``ok`` leaves the file unscored."""


class InferenceError(ValueError):
    """A refused request: the message names the problem and what to do."""


# ------------------------------------------------------------------------------ model + tokenizer
@dataclass(frozen=True)
class Inference:
    """A model folder and a tokenizer checked to belong together."""

    model_dir: Path
    meta: dict[str, Any] = field(repr=False)
    """``model.json``."""
    tokenizer_path: Path
    tokenizer: Any = field(repr=False)
    info: TokenInfo
    """The special ids and vocabulary size the model recorded, with its tokenizer hash."""
    vocab: ConditionVocab | None
    """The model's condition vocabulary; None for an unconditioned model."""

    @property
    def vocab_hash(self) -> str | None:
        """``model.json``'s ``condition.vocab_hash`` (the vocabulary's own hash if absent)."""
        if self.vocab is None:
            return None
        return str(self.meta["condition"].get("vocab_hash") or self.vocab.hash)

    def identity(self) -> dict[str, Any]:
        """What an output records of the model and tokenizer: hashes, never paths."""
        return {"tokenizer_hash": self.info.tokenizer_hash,
                "weights_sha256": sha256_file(self.model_dir / "model.safetensors"),
                "config_hash": self.meta.get("config_hash"),
                "split_hash": self.meta.get("split_hash"),
                "seed": self.meta.get("seed"),
                "condition_vocab_hash": self.vocab_hash,
                "condition_names": list(self.vocab.names) if self.vocab is not None else []}

    def scorer(self, device: str = "cpu", stride: int | None = None, batch_size: int = 32,
               torch_threads: int | None = None) -> Any:
        """The model as a :class:`pipeline.inference.scorer.TransformerScorer` (fp32, eval mode;
        a :class:`~pipeline.inference.scorer.CompoundScorer` for compound tokens, as evaluate
        loads it); ``stride``: its sliding-window step (None: the scorer's default,
        ``max_seq_len // 4``). ``torch_threads`` fixes torch's CPU threads first (results depend
        on it)."""
        import torch

        from models.loading import load_trained
        from pipeline.inference.scorer import CompoundScorer, TransformerScorer

        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        model, meta = load_trained(self.model_dir, device)
        limit = model.config.max_seq_len
        if stride is not None and not 1 <= stride <= limit:
            unit = "steps" if self.info.compound else "tokens"
            raise InferenceError(f"--stride {stride}: the model's context is {limit} {unit}; "
                                 f"use 1..{limit}")
        if self.info.compound:
            return CompoundScorer(model, codebooks=meta["codebooks"], device=device,
                                  stride=stride, batch_size=batch_size)
        return TransformerScorer(model, bos_id=meta["bos_id"], eos_id=meta["eos_id"],
                                 pad_id=meta.get("pad_id"), device=device, stride=stride,
                                 batch_size=batch_size, condition=meta.get("condition"))


def open_model(model_dir: Path | str, tokenizer_path: Path | str) -> Inference:
    """Read ``model_dir/model.json`` and the tokenizer; refuse them when they do not belong
    together (module docstring). torch is not imported. A compound model's ``info`` has its
    ``codebooks`` (``model.json``'s); one with conditions is refused (training never writes
    one: ``condition.use`` is refused for compound tokens)."""
    model_dir, tokenizer_path = Path(model_dir), Path(tokenizer_path)
    meta_path = model_dir / "model.json"
    for p in (meta_path, model_dir / "model.safetensors"):
        if not p.is_file():
            raise InferenceError(f"{p.as_posix()}: no such file; --model takes a trained "
                                 "transformer's folder (data/transformer after `dvc repro "
                                 "train_transformer`, or one of data/transformer/replicates/)")
    meta = read_json(meta_path)
    missing = [k for k in ("tokenizer_hash", "vocab_size", "bos_id", "eos_id")
               if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise InferenceError(f"{meta_path.as_posix()}: not a transformer's model.json (it lacks "
                             f"{', '.join(missing)})")
    if not tokenizer_path.is_file():
        raise InferenceError(f"{tokenizer_path.as_posix()}: no such file; --tokenizer takes the "
                             "tokenizer.json the model was trained with (data/tokenizer.json)")
    tokenizer = load_tokenizer(tokenizer_path)
    ours, theirs = tokenizer_hash(tokenizer), str(meta["tokenizer_hash"])
    if ours != theirs:
        raise InferenceError(
            f"the tokenizer does not match the model: {tokenizer_path.as_posix()} has "
            f"tokenizer_hash {ours}, but {meta_path.as_posix()} was trained with tokenizer_hash "
            f"{theirs}; its ids would mean other tokens. Pass the tokenizer.json the model was "
            "trained with (--tokenizer), or a model trained with this tokenizer (--model)")
    bos, eos = int(meta["bos_id"]), int(meta["eos_id"])
    info = TokenInfo(vocab_size=int(meta["vocab_size"]), pad_id=int(meta.get("pad_id", bos)),
                     bos_id=bos, eos_id=eos,
                     tokenizer_hash=theirs, split_hash=str(meta.get("split_hash", "")))
    if is_compound(tokenizer):
        if not meta.get("codebooks"):
            raise InferenceError(f"{meta_path.as_posix()}: not a compound transformer's "
                                 "model.json (it lacks codebooks), but the tokenizer is "
                                 f"{type(tokenizer).__name__}")
        if meta.get("condition"):
            raise InferenceError(f"{meta_path.as_posix()}: a compound model ("
                                 f"{type(tokenizer).__name__}) with a `condition` entry; "
                                 "compound models are trained without conditions "
                                 "(condition.use is refused for compound tokens), so this "
                                 "model.json was not written by train-transformer")
        info = replace(info, tokenizer=type(tokenizer).__name__, compound=True,
                       codebooks=list(meta["codebooks"]))
    if len(tokenizer) != info.vocab_size:
        raise InferenceError(f"{tokenizer_path.as_posix()} has {len(tokenizer)} tokens but "
                             f"{meta_path.as_posix()} a vocabulary of {info.vocab_size}")
    return Inference(model_dir, meta, tokenizer_path, tokenizer, info,
                     model_vocab(meta.get("condition")))


# ------------------------------------------------------------------------------------ conditions
def describe_vocab(inf: Inference) -> str:
    """The model's condition vocabulary in one line: its hash, each name with its labels."""
    assert inf.vocab is not None
    slots = "; ".join(f"{n}: {', '.join(labels) or '(no labels)'}"
                      for n, labels in zip(inf.vocab.names, inf.vocab.labels, strict=True))
    return f"condition vocabulary {inf.vocab_hash} ({slots})"


def parse_conditions(pairs: Sequence[str], inf: Inference) -> dict[str, str | None]:
    """``NAME=LABEL`` pairs (``--condition``) -> ``{name: label}``; ``LABEL`` may be
    ``<none>`` (or ``none``, unless that is one of the slot's labels) for the slot's "no
    condition". Refused: any pair for an unconditioned model, a malformed pair, a name given
    twice, a name or a label the model's vocabulary lacks."""
    if not pairs:
        return {}
    if inf.vocab is None:
        raise InferenceError(f"--condition {pairs[0]}: the model in {inf.model_dir.as_posix()} "
                             "was trained without conditions (its model.json has no "
                             "`condition` entry); leave out --condition, or use a model trained "
                             "with condition.use")
    out: dict[str, str | None] = {}
    for pair in pairs:
        name, sep, label = pair.partition("=")
        name, label = name.strip(), label.strip()
        if not sep or not name or not label:
            raise InferenceError(f"--condition {pair!r}: expected NAME=LABEL, e.g. "
                                 f"{inf.vocab.names[0]}=<label>; {describe_vocab(inf)}")
        if name in out:
            raise InferenceError(f"--condition {pair!r}: {name} is given twice")
        if name not in inf.vocab.names:
            raise InferenceError(f"--condition {pair!r}: the model has no condition {name!r}; "
                                 f"it has {', '.join(inf.vocab.names)}. {describe_vocab(inf)}")
        labels = inf.vocab.labels[inf.vocab.names.index(name)]
        if label == NONE_LABEL or (label == "none" and "none" not in labels):
            out[name] = None
        elif label not in labels:
            raise InferenceError(f"--condition {pair!r}: the model's vocabulary has no label "
                                 f"{label!r} for {name}; its labels are "
                                 f"{', '.join(labels) or '(none)'}. {describe_vocab(inf)}")
        else:
            out[name] = label
    return out


def labels_of(inf: Inference, given: Mapping[str, str | None]) -> dict[str, str]:
    """Every slot's label as outputs list it (``<none>`` for "no condition")."""
    assert inf.vocab is not None
    return {n: given.get(n) or NONE_LABEL for n in inf.vocab.names}


def measured_conditions(inf: Inference, measured: Mapping[str, Any] | None
                        ) -> tuple[dict[str, str | None], list[str]]:
    """A file's measured conditions in the model's vocabulary: ``{name: label or None}`` and the
    ``name=label`` pairs measured but unknown to the vocabulary (they become "none"). A
    condition the file cannot give (a metadata column such as ``composer``) is None."""
    assert inf.vocab is not None
    out: dict[str, str | None] = {}
    unknown = []
    for name, labels in zip(inf.vocab.names, inf.vocab.labels, strict=True):
        value = (measured or {}).get(name) if name in BUILTIN else None
        if value is not None and str(value) not in labels:
            unknown.append(f"{name}={value}")
            value = None
        out[name] = None if value is None else str(value)
    return out, unknown


# ------------------------------------------------------------------------------------ MIDI files
@dataclass(frozen=True)
class FileResult:
    """One file read, checked and encoded (:func:`read_files`)."""

    status: str
    """``ok`` or why the file cannot be scored (:data:`STATUSES`)."""
    detail: str = ""
    sha256: str | None = None
    n_notes: int = 0
    """Notes in the file, counted as ingest counts them (``n_notes`` of the manifest)."""
    rows: tuple[tuple[int, np.ndarray], ...] = ()
    """(track, ids) of each token sequence, as ``tokens.parquet`` holds them; for compound
    tokens ids are the (steps, K) array of its ``codes``, transposed."""
    measured: dict[str, Any] | None = None
    """The built-in conditions measured from the file (as the conditions stage measures them)."""


def encode_midi(tokenizer: Any, data: bytes) -> list[tuple[int, np.ndarray]]:
    """MIDI bytes -> ``(track, ids)`` per token sequence, exactly as the tokenize stage encodes a
    piece (:func:`pipeline.tokens.encoding.encode_file`, then the trained vocabulary as
    :func:`pipeline.tokens.vocabulary.apply_model` applies it): one sequence for a one-stream
    tokenizer (``track`` -1), one per track otherwise; a piece without sequences is one row of
    ``track`` -1 and no ids, as in ``tokens.parquet``. A compound tokenizer's ids are its steps,
    a (steps, K) array: row ``i`` holds step ``i``'s id in each of the K codebooks (its
    ``codes`` in ``tokens.parquet``, transposed). Raises what symusic or miditok raise."""
    from symusic import Score

    width = len(tokenizer.vocab) if is_compound(tokenizer) else 0
    score = Score.from_midi(data)
    pre = prepare_score(tokenizer, score)
    enc = encode_score(tokenizer, pre, int(score.note_num()), check=False)
    if not enc.seqs:
        return [(-1, np.zeros((0, width) if width else 0, np.int32))]
    block = parse_block([("", 0)], [pack(enc)])
    final = apply_model(tokenizer, block)
    rows = [(int(s.track), np.asarray(final[j] if final is not None else s.ids, np.int32))
            for j, s in enumerate(enc.seqs)]
    return [(t, ids.reshape(-1, width)) for t, ids in rows] if width else rows


_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_path: str, with_conditions: bool) -> None:
    _WORKER["tokenizer"] = load_tokenizer(tokenizer_path)
    _WORKER["conditions"] = with_conditions


def read_file(path: str, tokenizer: Any, with_conditions: bool) -> FileResult:
    """Read, check, count, measure and encode one file; a bad file is a status, never raised."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return FileResult("missing")
    except OSError as e:  # strerror only: the message must not carry a machine's path
        return FileResult("read_error", f"{type(e).__name__}: {e.strerror}")
    sha = hashlib.sha256(data).hexdigest()
    if not data:
        return FileResult("empty_file", sha256=sha)
    if not looks_like_midi(data):
        return FileResult("not_midi", f"starts with {data[:8]!r}", sha256=sha)
    parsed = parse_many([data])  # ingest's parser: its note count and its notes
    if parsed.errors[0] is not None:
        return FileResult("corrupt", parsed.errors[0], sha256=sha)
    n_notes = int(parsed.counts[0])
    if n_notes == 0:
        return FileResult("no_notes", "0 notes", sha256=sha)
    measured = None
    if with_conditions:
        try:
            meter, tempo = meter_and_tempo(data)
        except (RuntimeError, ValueError, OverflowError):  # as the conditions stage: null
            meter, tempo = None, None
        measured = measure(parsed.notes, meter, tempo, ConditionConfig())
    try:
        rows = encode_midi(tokenizer, data)
    except Exception as e:  # a file miditok cannot encode is a status, as in the tokenize stage
        return FileResult("encode_error", f"{type(e).__name__}: {e}"[:500], sha, n_notes,
                          measured=measured)
    return FileResult("ok", "", sha, n_notes, tuple(rows), measured)


def _read_in_worker(path: str) -> FileResult:
    return read_file(path, _WORKER["tokenizer"], _WORKER["conditions"])


def read_files(paths: Sequence[str], inf: Inference, *, with_conditions: bool = False,
               workers: int = 1, show_progress: bool | str = "auto") -> list[FileResult]:
    """:func:`read_file` of every path in worker processes (a file that crashes or hangs its
    worker is ``crash`` or ``timeout``), in order; then the scoring protocol's token rules
    (:func:`pipeline.inference.protocol.clean_rows`: special ids removed, a file without a
    sequence or with an id outside the model's vocabulary unscored; for compound tokens a step
    holding a codebook's PAD, BOS or EOS removed, an id outside its codebook unscored)."""
    results = isolated_map(_read_in_worker, list(paths), workers=max(1, workers),
                           timeout_s=TIMEOUT_S, desc="read", show_progress=show_progress,
                           initializer=_init_worker,
                           initargs=(inf.tokenizer_path.as_posix(), with_conditions))
    out = [FileResult(r.kind, r.message) if isinstance(r, ItemFailure) else r for r in results]
    return [_cleaned(r, inf.info) for r in out]


def _cleaned(r: FileResult, info: TokenInfo) -> FileResult:
    if r.status != "ok":
        return r
    column = "codes" if info.compound else "ids"  # compound: as the token tables hold them
    rows = pd.DataFrame({"sha256": ["file"] * len(r.rows), "track": [t for t, _ in r.rows],
                         column: [ids.T if info.compound else ids for _, ids in r.rows]})
    kept, excluded = clean_rows(rows, info)
    if excluded["pieces"]:
        reason = excluded["pieces"][0]["reason"]
        return FileResult(reason, STATUSES[reason], r.sha256, r.n_notes, (), r.measured)
    return FileResult("ok", "", r.sha256, r.n_notes,
                      tuple(zip(kept["track"].tolist(), kept["ids"], strict=True)), r.measured)
