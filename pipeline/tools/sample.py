"""``symkit sample``: MIDI samples from a trained transformer, outside the DVC stages
(docs/inference.md).

Each of ``--n`` samples starts from BOS or continues a prompt: the first ``--prompt-tokens`` ids
of a MIDI file encoded as the tokenize stage encodes it (its first token sequence: the whole
piece with a one-stream tokenizer), sample ``i`` taking prompt ``i mod len(prompts)``. A
conditioned model samples with the ``--condition NAME=LABEL`` labels (the other slots "none"; no
``--condition``: every slot "none", as ``generate`` samples), optionally with classifier-free
guidance (``--guidance``). The sampler is the generate stage's
(:func:`pipeline.inference.sampling.sample_sequences`): temperature, top-k, top-p, PAD/BOS and the
tokenizer's other specials never drawn, EOS ends a sample.

A compound model (CPWord, Octuple) draws its samples step by step as ``generate`` does
(:func:`run_compound`): a "token" is then a step, one id per codebook, so ``--prompt-tokens``
and ``--max-new-tokens`` count steps, and a prompt is its file's first steps (encoded as the
tokenize stage encodes it, the protocol's compound rules applied).

Sample ``i`` draws from its own ``numpy.random.default_rng([seed, i])``, so the same seed, model,
tokenizer, settings, device and torch threads give byte-identical files.

Outputs, in ``--out``: ``sample-000.mid``, ``sample-001.mid``, ... (a sample that does not decode
has no file; earlier ``sample-NNN.mid`` files there are removed first) and ``samples.json``: the
model's and tokenizer's hashes (``model``), the settings, the prompts (file name, sha256, ids
used) and per sample its ``ids`` (prompt ids, then the generated ones), ``prompt_len``,
``prompt`` (index into ``prompts``, or null), ``conditions``, ``condition_ids``, ``ended_by_eos``,
``file``, ``decode_ok`` and ``decode_error``. A compound model's samples have ``codes`` (one
list per codebook: the prompt's steps, then the generated ones) and empty ``ids``; its prompts
list ``n_steps`` instead of ``n_ids``, and ``prompt_len`` counts steps.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.artifacts import write_bytes, write_json
from pipeline.core.progress import progress
from pipeline.inference.sampling import (
    SamplingParams,
    compound_rules,
    sample_sequences,
    sample_steps,
)
from pipeline.inference.standalone import (
    STATUSES,
    Inference,
    InferenceError,
    labels_of,
    open_model,
    parse_conditions,
    read_files,
)
from pipeline.tokens.contract import never_sampled
from pipeline.tokens.tokenizer import codes_from_steps, decode_ids

HELP = "sample MIDI from a trained transformer (prompts, conditions, guidance)"

SAMPLE_FILE = re.compile(r"sample-\d{3,}\.mid")


def prompt_ids(inf: Inference, paths: list[Path], length: int) -> list[dict[str, Any]]:
    """Each prompt file's first ``length`` ids (its first token sequence; fewer when it is
    shorter), with its name and sha256; for compound tokens its first ``length`` steps, an
    (n, K) array. A file that cannot be encoded, or gives no ids, is refused."""
    results = read_files([p.as_posix() for p in paths], inf, show_progress=False)
    out = []
    for path, r in zip(paths, results, strict=True):
        ids = next((ids for _, ids in r.rows if len(ids)), None)
        if r.status != "ok" or ids is None:
            why = f"{r.status} ({r.detail or STATUSES[r.status]})" if r.status != "ok" \
                else "no token ids"
            raise InferenceError(f"--prompt {path.as_posix()}: cannot be a prompt: {why}")
        out.append({"name": path.name, "sha256": r.sha256,
                    "ids": np.asarray(ids[:length], dtype=np.int64)})
    return out


def run(inf: Inference, scorer: Any, *, n: int, prompts: list[dict[str, Any]],
        conditions: dict[str, str | None], guidance: float, params: SamplingParams,
        max_new_tokens: int, seed: int, batch_size: int, out_dir: Path,
        settings: dict[str, Any], show_progress: bool | str = "auto") -> dict[str, Any]:
    """Draw ``n`` samples, write their MIDI files and ``samples.json``; return its content."""
    if inf.info.compound:
        return run_compound(inf, scorer, n=n, prompts=prompts, params=params,
                            max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size,
                            out_dir=out_dir, settings=settings, show_progress=show_progress)
    vocab = inf.vocab
    cond_row = vocab.encode(conditions) if vocab is not None and conditions else None
    starts = [prompts[i % len(prompts)]["ids"] if prompts else np.zeros(0, np.int64)
              for i in range(n)]
    rngs = [np.random.default_rng([seed, i]) for i in range(n)]
    forbid = never_sampled(inf.info, inf.tokenizer)
    new: list[np.ndarray] = []
    bar = progress(total=n, desc="sample", enabled=show_progress)
    for lo in range(0, n, batch_size):  # the sampler's own batches, one progress step each
        hi = min(n, lo + batch_size)
        new += sample_sequences(
            scorer, starts[lo:hi], max_new_tokens=max_new_tokens, params=params,
            rngs=rngs[lo:hi], forbid=forbid, batch_size=batch_size,
            conds=None if cond_row is None else np.tile(cond_row, (hi - lo, 1)),
            guidance=guidance, none_ids=vocab.none_ids() if vocab is not None else None)
        bar.update(hi - lo)
    bar.close()

    shown = labels_of(inf, conditions) if vocab is not None else {}
    cond_ids = (cond_row if cond_row is not None
                else vocab.none_ids() if vocab is not None else np.zeros(0, np.int64))
    return write_samples(inf, out_dir, starts, new, prompts=prompts, settings=settings,
                         max_new_tokens=max_new_tokens, size="n_ids",
                         fields=lambda ids: {"ids": ids.tolist(), "conditions": shown,
                                             "condition_ids": cond_ids.tolist()})


def write_samples(inf: Inference, out_dir: Path, starts: list[np.ndarray],
                  new: list[np.ndarray], *, prompts: list[dict[str, Any]],
                  settings: dict[str, Any], max_new_tokens: int, size: str,
                  fields: Callable[[np.ndarray], dict[str, Any]]) -> dict[str, Any]:
    """Decode each sample (its prompt, then what was drawn: ids, or (n, K) steps), write its
    MIDI file and ``samples.json`` after removing an earlier run's sample files, which
    samples.json would no longer list; return the record. ``fields`` gives a sample's
    token fields from its whole sequence, and ``size`` names a prompt's length."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in sorted(p for p in out_dir.iterdir() if SAMPLE_FILE.fullmatch(p.name)):
        stale.unlink()
    samples = []
    for i, (start, gen) in enumerate(zip(starts, new, strict=True)):
        seq = np.concatenate([start, gen]).astype(np.int64)
        score, err = decode_ids(inf.tokenizer, seq.tolist() if seq.ndim == 2 else seq)
        name = f"sample-{i:03d}.mid"
        if err is None:
            write_bytes(out_dir / name, score.dumps_midi())
        samples.append({"index": i, "file": name if err is None else None,
                        "prompt": i % len(prompts) if prompts else None,
                        "prompt_len": len(start), "ended_by_eos": len(gen) < max_new_tokens,
                        "decode_ok": err is None, "decode_error": err, **fields(seq)})
    record = {"model": inf.identity(), "settings": settings,
              "prompts": [{"name": p["name"], "sha256": p["sha256"], size: len(p["ids"])}
                          for p in prompts],
              "samples": samples}
    write_json(out_dir / "samples.json", record)
    return record


def run_compound(inf: Inference, scorer: Any, *, n: int, prompts: list[dict[str, Any]],
                 params: SamplingParams, max_new_tokens: int, seed: int, batch_size: int,
                 out_dir: Path, settings: dict[str, Any], show_progress: bool | str = "auto"
                 ) -> dict[str, Any]:
    """:func:`run` for a compound model (CPWord, Octuple): samples drawn step by step as
    ``generate`` draws them (:func:`pipeline.inference.sampling.sample_steps`: one id per
    codebook from the same hidden state, under the tokenizer's step rules), from BOS or after a
    prompt's (n, K) steps; ``--max-new-tokens`` counts steps. samples.json has per sample
    ``codes`` (one list per codebook: the prompt's steps, then the generated ones), empty
    ``ids`` and ``prompt_len`` in steps; sample ``i`` takes prompt ``i mod len(prompts)`` and
    draws from ``default_rng([seed, i])`` as for one stream."""
    k = len(inf.info.codebooks or [])
    rules = compound_rules(inf.info, inf.tokenizer)
    starts = [prompts[i % len(prompts)]["ids"] if prompts else np.zeros((0, k), np.int64)
              for i in range(n)]
    rngs = [np.random.default_rng([seed, i]) for i in range(n)]
    new: list[np.ndarray] = []
    bar = progress(total=n, desc="sample", enabled=show_progress)
    for lo in range(0, n, batch_size):
        hi = min(n, lo + batch_size)
        new += sample_steps(scorer, starts[lo:hi], max_new_steps=max_new_tokens, params=params,
                            rngs=rngs[lo:hi], rules=rules, batch_size=batch_size)
        bar.update(hi - lo)
    bar.close()
    return write_samples(inf, out_dir, starts, new, prompts=prompts, settings=settings,
                         max_new_tokens=max_new_tokens, size="n_steps",
                         fields=lambda steps: {"ids": [],
                                               "codes": codes_from_steps(steps, k).tolist(),
                                               "conditions": {}, "condition_ids": []})


# ----------------------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--model", type=Path, default=Path("data/transformer"),
      help="a trained transformer's folder: model.json + model.safetensors (default: "
           "data/transformer; a training seed: data/transformer/replicates/seed-<seed>)")
    a("--tokenizer", type=Path, default=Path("data/tokenizer.json"),
      help="the tokenizer the model was trained with (default: data/tokenizer.json)")
    a("--n", type=int, default=4, help="number of samples (default: 4)")
    a("--prompt", type=Path, action="append", default=[], metavar="MIDI",
      help="continue this MIDI file's first --prompt-tokens ids, or steps for a compound "
           "model (repeatable: samples cycle through the prompts; none: start from BOS)")
    a("--prompt-tokens", type=int, default=64,
      help="prompt ids kept (default: 64); a compound model (CPWord, Octuple) counts steps, "
           "one id per codebook each")
    a("--condition", action="append", default=[], metavar="NAME=LABEL",
      help="conditioned model: sample with this label (repeatable; other conditions 'none')")
    a("--guidance", type=float, default=1.0,
      help="classifier-free guidance scale (default 1.0 = the conditioned model alone; 0 = "
           "unconditioned; > 1 pushes away from it); needs --condition")
    a("--temperature", type=float, default=1.0, help="0 = greedy (default: 1.0)")
    a("--top-k", type=int, default=0, help="keep the k most probable ids (default: 0 = all)")
    a("--top-p", type=float, default=0.95, help="nucleus mass kept (default: 0.95; 1.0 = off)")
    a("--max-new-tokens", type=int, default=128, help="generated ids per sample at most "
      "(default: 128; steps for a compound model); EOS ends a sample earlier")
    a("--seed", type=int, default=1234, help="sample i draws from default_rng([seed, i]) "
      "(default: 1234)")
    a("--batch-size", type=int, default=8,
      help="samples per model call (default: 8); keep it for bit-identical samples")
    a("--device", default="cpu", help="torch device: cpu | cuda | cuda:N (default: cpu)")
    a("--torch-threads", type=int, default=2,
      help="torch CPU threads (default: 2, runtime.torch_threads' default; samples depend on it)")
    a("--out", type=Path, default=Path("samples"),
      help="folder for sample-NNN.mid and samples.json (default: samples/)")


def check_settings(args: argparse.Namespace) -> None:
    """Refuse settings outside their range, naming the option."""
    limits = [("n", args.n >= 1, ">= 1"), ("prompt-tokens", args.prompt_tokens >= 1, ">= 1"),
              ("temperature", args.temperature >= 0, ">= 0"), ("top-k", args.top_k >= 0, ">= 0"),
              ("top-p", 0 < args.top_p <= 1, "in (0, 1]"),
              ("max-new-tokens", args.max_new_tokens >= 1, ">= 1"),
              ("seed", args.seed >= 0, ">= 0"), ("batch-size", args.batch_size >= 1, ">= 1"),
              ("torch-threads", args.torch_threads >= 1, ">= 1")]
    for name, ok, allowed in limits:
        if not ok:
            raise InferenceError(f"--{name} {getattr(args, name.replace('-', '_'))}: must be "
                                 f"{allowed}")


def main(args: argparse.Namespace) -> int:
    try:
        return _main(args)
    except InferenceError as e:
        print(f"symkit sample: {e}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    check_settings(args)
    inf = open_model(args.model, args.tokenizer)
    conditions = parse_conditions(args.condition, inf)
    if args.guidance != 1.0 and not conditions:
        raise InferenceError(f"--guidance {args.guidance:g} needs --condition NAME=LABEL: "
                             "guidance mixes the conditioned and the unconditioned predictions")
    # Prompts are encoded in forked workers before torch loads the model.
    prompts = prompt_ids(inf, args.prompt, args.prompt_tokens)
    scorer = inf.scorer(args.device, torch_threads=args.torch_threads)
    settings = {"n": args.n, "seed": args.seed, "temperature": args.temperature,
                "top_k": args.top_k, "top_p": args.top_p, "max_new_tokens": args.max_new_tokens,
                "prompt_tokens": args.prompt_tokens, "guidance": args.guidance,
                "conditions": labels_of(inf, conditions) if inf.vocab is not None else {},
                "batch_size": args.batch_size, "device": args.device,
                "torch_threads": args.torch_threads}
    record = run(inf, scorer, n=args.n, prompts=prompts, conditions=conditions,
                 guidance=args.guidance,
                 params=SamplingParams(args.temperature, args.top_k, args.top_p),
                 max_new_tokens=args.max_new_tokens, seed=args.seed,
                 batch_size=args.batch_size, out_dir=args.out, settings=settings)
    written = sum(s["decode_ok"] for s in record["samples"])
    print(f"sample: {args.n} samples, {written} MIDI files in {args.out.as_posix()}/ "
          "(samples.json lists their ids, prompts, conditions and settings)")
    return 0
