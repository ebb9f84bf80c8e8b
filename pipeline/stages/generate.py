"""``symkit generate``: sample music from every trained model.

Per model: ``n_samples`` unconditional samples (the unit the audit judges memorisation and
quality on: 240 by default, so the flag rate's interval resolves its margin) and
``n_continuations`` continuations of the first ``prompt_tokens`` ids of seeded test pieces (at
most one per test piece).

Inputs: ``data/tokens/tokens.parquet`` (test-piece prompts), ``data/tokens/info.json`` (special
ids), ``data/tokenizer.json`` (decoding), the models (``data/ngram/``, ``data/transformer/``, and
``data/transformer/replicates/`` for its training seeds).
Outputs:

- ``data/samples/samples.parquet``: one row per sample, sorted by (model, kind, index): ``model``,
  ``kind`` (``unconditional`` | ``continuation``), ``index``, ``seed`` (the training seed of
  the model that drew it; null for a model trained once), ``prompt_sha256`` (null when
  unconditional), ``prompt_len``, ``ids`` (list<int32>: prompt ids followed by generated ids),
  ``n_tokens`` (= len(ids)), ``decode_ok``, ``decode_error`` (null when ok). The generated part
  is ``ids[prompt_len:]``.
- ``reports/samples/<model>_<kind>_<index>.mid`` and ``.png`` (piano roll) for the first
  ``files_per_kind`` samples of each model and kind that decode (every sample's ids are in the
  table, and the audit judges them all). A sample that fails to decode keeps its row with
  ``decode_ok = false`` and is counted.

A conditioned transformer (``condition.use``, docs/conditioning.md) also draws
``n_conditioned`` samples of kind ``conditioned``, each under the labels of a held-out (val or
test) piece drawn with replacement from ``data/conditions.parquet`` (so requests follow the
labels' real frequencies), with classifier-free guidance ``guidance``; its unconditional samples
and continuations use no condition. samples.parquet then has two more columns, ``condition``
(the requested labels, JSON) and ``request_sha256``. The audit measures how often the samples
follow their request (:mod:`pipeline.audit.adherence`).

Each sample has its own generator seeded by (seed, model name, kind, index), so adding a model or
a sample leaves the other samples unchanged.

A model trained over several seeds (``transformer.replicates``) samples from every seed: sample
``i`` of each kind comes from the ``i mod S``-th of its ``S`` seeds in ascending order, so the
model's ``n_samples`` and ``n_continuations`` are shared out among the seeds (the stage's time
and the audit's sample count stay those of one model) and the audit judges what the training
recipe produces, seeds included, rather than one seed's luck.

Compound tokens (CPWord, Octuple) are drawn step by step, one id per codebook from the same
hidden state (:func:`pipeline.inference.sampling.sample_steps`, docs/tokenization.md): rows then
hold ``codes`` (one list per codebook, after ``ids``, which is empty), ``n_tokens`` and
``prompt_len`` count steps, and continuations start from a test piece's first ``prompt_tokens``
steps. Single-stream samples.parquet is unchanged.

A continuation's prompt is a test piece, so drawing continuations spends the test set: the stage
reads the test rows through :func:`pipeline.decision.looks.test_tokens`, which appends a look
(command ``generate``) to the test-access ledger ``reports/ledger.jsonl`` before handing them
over. With ``n_continuations`` 0 no test row is read and nothing is recorded. Called as a library
without ``ledger_path`` the look is recorded nowhere (tests); ``symkit generate`` always passes
it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from models.base import SequenceModel
from pipeline.core.config import RuntimeConfig, load_section
from pipeline.decision import ledger, looks
from pipeline.inference import generation
from pipeline.inference.generation import (  # noqa: F401  (the stage's API, re-exported)
    CONDITIONED,
    CONDITIONED_SCHEMA,
    KINDS,
    PROMPT_COLUMNS,
    SAMPLES_SCHEMA,
    GenerateConfig,
    GenerateSummary,
    generate_for_model,
    prompt_notes,
    select_prompts,
)
from pipeline.inference.loading import (
    ModelUnavailable,
    add_model_arguments,
    load_named,
    named_seeds,
)
from pipeline.tokens.contract import TokenInfo

HELP = "sample music from trained models"


def run(cfg: GenerateConfig, models: Mapping[str, SequenceModel], *, tokens: Path, info: Path,
        tokenizer: Path, samples_out: Path, samples_dir: Path,
        seeds: Mapping[str, Mapping[int, SequenceModel]] | None = None,
        names: Sequence[str] | None = None, conditions: Path | None = None,
        ledger_path: Path | None = None, preregistration: Path | None = None
        ) -> GenerateSummary:
    """:func:`pipeline.inference.generation.run`, the continuations' prompts drawn from the test
    rows of ``tokens`` read through the gate (module docstring): the look goes to
    ``ledger_path`` (None: nowhere) under the registration ``preregistration``."""
    compound = bool(TokenInfo.read(info).compound)
    prompt_rows = None
    if cfg.n_continuations:
        columns = [*PROMPT_COLUMNS, "codes"] if compound else PROMPT_COLUMNS
        prompt_rows, _ = looks.test_tokens("generate", tokens, columns,
                                           ledger_path=ledger_path,
                                           registration=preregistration)
    return generation.run(cfg, models, prompt_rows=prompt_rows, info=info, tokenizer=tokenizer,
                          samples_out=samples_out, samples_dir=samples_dir, seeds=seeds,
                          names=names, conditions=conditions)

# --- CLI -------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=Path, default=Path("data/tokens/tokens.parquet"))
    parser.add_argument("--info", type=Path, default=Path("data/tokens/info.json"))
    parser.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer.json"))
    add_model_arguments(parser)
    parser.add_argument("--samples-out", type=Path, default=Path("data/samples/samples.parquet"))
    parser.add_argument("--samples-dir", type=Path, default=Path("reports/samples"))
    parser.add_argument("--conditions", type=Path, default=Path("data/conditions.parquet"),
                        help="condition table (`symkit conditions`); read only for a "
                             "conditioned model")
    parser.add_argument("--preregistration", type=Path, default=ledger.REGISTRATION)
    parser.add_argument("--ledger", type=Path, default=ledger.LEDGER,
                        help="test-access ledger this run's look at the test pieces (the "
                             "continuations' prompts) is appended to")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("generate", args.params, GenerateConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    try:
        info = TokenInfo.read(args.info)
        models, skipped = load_named(cfg.models, ngram_dir=args.ngram_dir,
                                     transformer_dir=args.transformer_dir, device=cfg.device,
                                     info=info, torch_threads=runtime.torch_threads)
        seeds = named_seeds(cfg.models, transformer_dir=args.transformer_dir, device=cfg.device,
                            info=info)
    except ModelUnavailable as e:
        print(f"symkit generate: cannot use a model listed in generate.models: {e}",
              file=sys.stderr)
        return 1
    for name, why in skipped.items():
        print(f"generate: {name} skipped ({why})")
    s = run(cfg, models, tokens=args.tokens, info=args.info, tokenizer=args.tokenizer,
            samples_out=args.samples_out, samples_dir=args.samples_dir, seeds=seeds,
            names=[n for n in cfg.models if n in models], conditions=args.conditions,
            ledger_path=args.ledger, preregistration=args.preregistration)
    print(f"generate: {s.n_samples} samples ({s.n_decode_failures} failed to decode), "
          f"{s.n_prompts} prompts -> {args.samples_out}")
    return 0
