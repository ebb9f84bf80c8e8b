"""``symkit`` command line: one subcommand per stage plus a few tools.

Each command lives in its own module exposing ``add_arguments(parser)`` and ``main(args)``; this
file only maps names to modules and imports the chosen one, so ``symkit ingest`` never imports
torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from pipeline.core.artifacts import ArtifactError
from pipeline.core.config import ParamsError

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "corpus": ("pipeline.stages.corpus", "materialise the MIDI sources into data/raw/"),
    "ingest": ("pipeline.stages.ingest",
               "hash, parse and quarantine sources -> data/manifest.parquet"),
    "dedupe": ("pipeline.stages.dedupe", "exact, transposed, melody and near-duplicate clusters"),
    "split": ("pipeline.stages.split", "grouped train/val/test split and leakage audit"),
    "contamination": ("pipeline.stages.contamination",
                      "which val/test pieces also appear in other corpora (--against DIR)"),
    "conditions": ("pipeline.stages.conditions",
                   "per-piece key, meter, density, polyphony, tempo and metadata conditions"),
    "tokenize": ("pipeline.stages.tokenize",
                 "miditok tokenizer (BPE on train only) and token tables"),
    "train-ngram": ("pipeline.stages.train_ngram", "fit n-gram baselines, choose the order on val"),
    "train-transformer": ("pipeline.stages.train_transformer", "train the transformer (resumable)"),
    "evaluate": ("pipeline.stages.evaluate", "score every model on val/test with one protocol"),
    "generate": ("pipeline.stages.generate", "sample music from trained models"),
    "audit": ("pipeline.stages.audit", "memorisation audit and music statistics"),
    "report": ("pipeline.stages.report", "decision report against pre-registered criteria"),
    "adapt-train": ("pipeline.stages.adapt_train",
                    "train one arm of an adaptation experiment (experiments/adaptation)"),
    "adapt-evaluate": ("pipeline.stages.adapt_evaluate",
                       "score every adaptation arm on target and source; choose the arm"),
    "adapt-audit": ("pipeline.stages.adapt_audit",
                    "memorisation audit of every adaptation arm against target and source"),
    "sample": ("pipeline.tools.sample",
               "sample MIDI from a trained transformer (prompts, conditions, guidance)"),
    "score": ("pipeline.tools.score",
              "NLL per note of MIDI files under a trained transformer"),
    "preregister": ("pipeline.tools.preregister",
                    "freeze the decision criteria before scoring test"),
    "ledger": ("pipeline.tools.looks",
               "the test-access ledger: every look at the test pieces (--rebuild from git)"),
    "controls": ("pipeline.tools.controls",
                 "how often each criterion passes a good and a bad model at the default sizes"),
    "estimate": ("pipeline.tools.estimate", "memory and compute estimate for a transformer config"),
    "doctor": ("pipeline.tools.doctor", "fast checks that tell a data bug from a model bug"),
    "check-params": ("pipeline.tools.check_params", "validate every section of params.yaml"),
    "check-deps": ("pipeline.tools.deps",
                   "check that dvc.yaml lists exactly the code each stage runs"),
    "compare": ("pipeline.tools.compare",
                "compare evaluated runs on the same pieces: is the difference real?"),
    "reproduce": ("pipeline.tools.reproduce",
                  "did a re-run reproduce the committed experiment? (artifacts, verdicts, "
                  "metrics)"),
    "sweep": ("pipeline.tools.sweep",
              "run a grid of DVC experiments (-S key=v1,v2), one at a time, then compare them"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="symkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument(
            "--params",
            type=Path,
            default=Path("params.yaml"),
            help="parameters file (default: ./params.yaml)",
        )
        p.set_defaults(_module=module)
    return parser


def _version() -> str:
    from pipeline import __version__

    return f"symkit {__version__}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # The chosen command's module adds its own arguments before parsing (so --help shows them).
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in COMMANDS:
        module = importlib.import_module(COMMANDS[command][0])
        if hasattr(module, "add_arguments"):
            subparsers = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
            module.add_arguments(subparsers[command])
    args = parser.parse_args(argv)
    module = importlib.import_module(args._module)
    try:
        rc = module.main(args)
    except ParamsError as e:
        print(f"symkit {args.command}: invalid parameters\n{e}", file=sys.stderr)
        return 2
    except ArtifactError as e:  # a missing or unreadable input: one line naming its stage
        print(f"symkit {args.command}: {e}", file=sys.stderr)
        return 1
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
