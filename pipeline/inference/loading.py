"""Loading trained models for scoring, sampling and auditing: one function, two behaviours.

``load_models(specs, ..., strict=False)`` (evaluation) reports each model that cannot be used
and goes on with the others; ``strict=True`` (generation, audit: the models are named in params)
raises :class:`ModelUnavailable` on the first one. The checks are the same either way: the folder
exists and is not empty, the model was trained on the tokens in ``data/tokens/info.json`` (same
tokenizer and split hashes; with ``any_split=True`` the tokenizer hash only, for a model trained
on another corpus or split with this very tokenizer, e.g. a pretrained model scored zero-shot), it
loads, and its vocabulary size and EOS id match. A loader option
the model cannot take (``evaluate.stride`` beyond its context) is a :class:`ParamsError`, raised
in both modes: it is a setting to fix, not a model to skip.

torch is imported only when a transformer is loaded.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from models.base import SequenceModel
from pipeline.core.artifacts import read_json
from pipeline.core.config import ParamsError
from pipeline.inference.protocol import NOT_APPLICABLE
from pipeline.tokens.contract import TokenInfo

Loader = Callable[[Path, str], SequenceModel]
MODEL_NAMES = ("ngram", "transformer")


class ModelUnavailable(RuntimeError):
    """A model named in params cannot be used (missing, stale, unloadable or incompatible)."""


@dataclass(frozen=True)
class ModelSpec:
    """A model to load: its report name, its folder, how to load it and, for one replicate of a
    model trained over several seeds, its training seed."""

    name: str
    model_dir: Path
    loader: Loader
    seed: int | None = None

    @property
    def key(self) -> str:
        """``name``, or ``name@seed-<seed>`` for a replicate: unique among a stage's specs."""
        return self.name if self.seed is None else f"{self.name}@seed-{self.seed}"


def load_ngram(model_dir: Path, device: str = "cpu") -> SequenceModel:
    from models.ngram import NGramLM

    return NGramLM.load(model_dir)


def load_transformer(model_dir: Path, device: str = "cpu",
                     stride: int | None = None) -> SequenceModel:
    """The transformer scorer; ``stride`` (``evaluate.stride``) is its sliding-window step, by
    default the scorer's own (``max_seq_len // 4``). A stride outside ``1..max_seq_len`` raises
    :class:`ParamsError` naming ``evaluate.stride``."""
    from pipeline.inference.scorer import (  # torch: only when needed
        CompoundScorer,
        TransformerScorer,
        load_scorer,
    )

    scorer = load_scorer(model_dir, device=device)
    if stride is None:
        return scorer
    limit = scorer.model.config.max_seq_len
    if not 1 <= stride <= limit:
        raise ParamsError(f"evaluate.stride: {stride} does not fit the transformer in "
                          f"{Path(model_dir).as_posix()} (max_seq_len {limit}); use 1..{limit}")
    if isinstance(scorer, CompoundScorer):
        return CompoundScorer(scorer.model, codebooks=scorer.codebooks, device=device,
                              stride=stride, batch_size=scorer.batch_size)
    return TransformerScorer(scorer.model, bos_id=scorer.bos_id, eos_id=scorer.eos_id,
                             pad_id=scorer.pad_id, device=device, stride=stride,
                             batch_size=scorer.batch_size, condition=scorer.condition)


def default_specs(ngram_dir: Path, transformer_dir: Path, names: Sequence[str] = MODEL_NAMES,
                  *, stride: int | None = None) -> list[ModelSpec]:
    """Specs of the named models at the stage output folders (in ``names`` order); ``stride``
    is the transformer's scoring stride (``evaluate.stride``; None: the scorer's default)."""
    transformer = (load_transformer if stride is None
                   else functools.partial(load_transformer, stride=stride))
    loaders = {"ngram": (Path(ngram_dir), load_ngram),
               "transformer": (Path(transformer_dir), transformer)}
    return [ModelSpec(n, *loaders[n]) for n in names]


REPLICATES_INDEX = Path("replicates") / "index.json"
"""Inside a transformer output folder: the seeds trained and their model folders (written by
``train_transformer``)."""


def replicate_specs(spec: ModelSpec) -> list[ModelSpec]:
    """One spec per training seed of ``spec``'s model: the folders listed in
    ``<model_dir>/replicates/index.json``, in seed order. A folder without that index (a model
    trained before replicates, or any single model folder) is one spec, unchanged."""
    index_path = spec.model_dir / REPLICATES_INDEX
    if not index_path.exists():
        return [spec]
    index = read_json(index_path)
    folders = index.get("folders", {}) if isinstance(index, dict) else {}
    return [ModelSpec(spec.name, index_path.parent / folders.get(str(s), f"seed-{s}"),
                      spec.loader, int(s))
            for s in sorted(int(s) for s in index.get("seeds", []))] or [spec]


def _stale_reason(model_dir: Path, info: TokenInfo, any_split: bool = False) -> str | None:
    """A model trained on another tokenizer or split must not be scored against this one; with
    ``any_split`` only the tokenizer must match (the caller scores a model trained elsewhere and
    answers for what its training data held)."""
    meta_path = model_dir / "model.json"
    if not meta_path.exists():
        return None
    meta = read_json(meta_path)
    for key in ("tokenizer_hash",) if any_split else ("tokenizer_hash", "split_hash"):
        theirs = meta.get(key, meta.get("metadata", {}).get(key))
        ours = getattr(info, key)
        if theirs is not None and theirs != ours:
            return f"stale: {key} {theirs} != {ours} in data/tokens/info.json"
    return None


def not_applicable(model_dir: Path) -> str | None:
    """``"not applicable: <reason>"`` when the model's training stage marked it so (the n-gram
    for compound tokens: ``not_applicable.json`` in its folder), else None."""
    path = Path(model_dir) / NOT_APPLICABLE
    if not path.exists():
        return None
    why = read_json(path)
    return "not applicable: " + str(why.get("reason") if isinstance(why, dict) else why)


def _problem(spec: ModelSpec, device: str, info: TokenInfo | None, any_split: bool = False
             ) -> tuple[SequenceModel | None, str | None]:
    d = spec.model_dir
    if not d.is_dir() or not any(d.iterdir()):
        return None, f"missing: {d.as_posix()} does not exist or is empty"
    why = not_applicable(d)
    if why is not None:
        return None, why
    try:
        stale = _stale_reason(d, info, any_split) if info is not None else None
        if stale:
            return None, stale
        model = spec.loader(d, device)
    except ParamsError:  # a setting to fix, not a model to skip
        raise
    except Exception as e:  # any loader failure is a reason, reported or raised by the caller
        return None, f"load failed: {type(e).__name__}: {e}"
    ids = (getattr(model, "vocab_size", None), getattr(model, "eos_id", None))
    if info is not None and ids != (info.vocab_size, info.eos_id):
        return None, (f"incompatible: vocab_size, eos_id = {ids} but info.json has "
                      f"{info.vocab_size}, {info.eos_id}")
    return model, None


def load_models(specs: Sequence[ModelSpec], device: str = "cpu", info: TokenInfo | None = None,
                *, strict: bool = False, any_split: bool = False
                ) -> tuple[dict[str, SequenceModel], dict[str, str]]:
    """Load each model: ``(models by key, unavailable: key -> reason)``; a spec's key is its
    name, or ``name@seed-<seed>`` for one replicate (:attr:`ModelSpec.key`).

    With ``strict`` the first unusable model raises :class:`ModelUnavailable` naming it and why.
    ``any_split``: accept models trained on another split when their tokenizer is this one.
    """
    models, unavailable = {}, {}
    for spec in specs:
        model, reason = _problem(spec, device, info, any_split)
        if reason is not None:
            if strict:
                raise ModelUnavailable(f"{spec.key} ({spec.model_dir.as_posix()}): {reason}")
            unavailable[spec.key] = reason
        else:
            models[spec.key] = model
    return models, unavailable


def load_named(names: Sequence[str], *, ngram_dir: Path, transformer_dir: Path, device: str,
               info: TokenInfo, torch_threads: int
               ) -> tuple[dict[str, SequenceModel], dict[str, str]]:
    """The models a stage's params name, loaded strictly (generation and audit): ``(models by
    name, skipped: name -> reason)``. Torch threads are fixed first. A model its training stage
    marked not applicable (:func:`not_applicable`: the n-gram for compound tokens) is skipped
    with that reason, so the default ``models: [ngram, transformer]`` serves every tokenizer;
    any other unusable model raises :class:`ModelUnavailable`, and so does a list that leaves
    no model."""
    set_torch_threads(torch_threads, names)
    specs = default_specs(ngram_dir, transformer_dir, names)
    skipped = {s.key: why for s in specs if (why := not_applicable(s.model_dir)) is not None}
    models, _ = load_models([s for s in specs if s.key not in skipped], device, info,
                            strict=True)
    if not models:
        raise ModelUnavailable(f"{', '.join(names) or 'no model'} listed, none usable: "
                               + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    return models, skipped


def load_seeds(spec: ModelSpec, device: str, info: TokenInfo, *, any_split: bool = False
               ) -> dict[int, SequenceModel]:
    """Every training seed of ``spec``'s model (:func:`replicate_specs`), loaded strictly, by
    seed; empty for a model trained once (its one folder has no replicates index).
    ``any_split`` as in :func:`load_models`."""
    specs = [s for s in replicate_specs(spec) if s.seed is not None]
    models, _ = load_models(specs, device, info, strict=True, any_split=any_split)
    return {int(s.seed): models[s.key] for s in specs}


def named_seeds(names: Sequence[str], *, transformer_dir: Path, device: str, info: TokenInfo
                ) -> dict[str, dict[int, SequenceModel]]:
    """Every training seed of the transformer when ``names`` lists it (:func:`load_seeds`):
    ``{"transformer": {seed: model}}``, empty for a model trained once; a seed that cannot be
    used raises :class:`ModelUnavailable`. What generate and audit judge the recipe on."""
    if "transformer" not in names:
        return {}
    spec = ModelSpec("transformer", Path(transformer_dir), load_transformer)
    return {"transformer": load_seeds(spec, device, info)}


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ngram-dir`` and ``--transformer-dir``, defaulting to the training stages' outputs."""
    parser.add_argument("--ngram-dir", type=Path, default=Path("data/ngram"))
    parser.add_argument("--transformer-dir", type=Path, default=Path("data/transformer"))


def set_torch_threads(threads: int, names: Sequence[str]) -> None:
    """Fix torch's CPU threads (``runtime.torch_threads``) when a transformer is among ``names``:
    its results depend on the thread count. ``names`` may be keys (``transformer@seed-1234``)."""
    if any(n.split("@")[0] == "transformer" for n in names):
        import torch

        torch.set_num_threads(threads)
