"""The ``symkit`` commands, found in the code rather than in a table.

A command is a module of ``pipeline/stages/`` or ``pipeline/tools/`` with a one-line
``HELP = "..."`` at the top level, beside its ``add_arguments(parser)`` and ``main(args)``. Its
name is the file's name with ``-`` for ``_``: ``stages/train_ngram.py`` is ``symkit
train-ngram``. A module without ``HELP`` is a library its folder shares (``tools/runs.py``).

Listing the commands imports nothing: each file's ``HELP`` line is read as text, so
``symkit ingest`` never imports torch. :func:`run` parses one command's arguments and maps the
project's two user errors to exit codes, for the ``symkit`` entry point and for a tool that runs
another command in process (``symkit sweep`` runs ``symkit compare``).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pipeline.core.artifacts import ArtifactError
from pipeline.core.config import ParamsError

PIPELINE = Path(__file__).resolve().parents[1]
"""The ``pipeline`` package folder."""
FOLDERS = ("stages", "tools")
"""Where commands live, in the order ``symkit --help`` lists them."""
_HELP = re.compile(r'^HELP = ("(?:[^"\\\n]|\\.)*")[ \t]*(?:#[^\n]*)?$', re.MULTILINE)


@dataclass(frozen=True)
class Command:
    name: str  # e.g. train-ngram
    module: str  # e.g. pipeline.stages.train_ngram
    help: str
    path: Path


def read_help(path: Path) -> str | None:
    """The module's one-line ``HELP`` string, read as text; None when it declares none."""
    m = _HELP.search(path.read_text(encoding="utf-8"))
    return ast.literal_eval(m.group(1)) if m else None


@cache
def commands(pipeline_dir: Path = PIPELINE) -> dict[str, Command]:
    """command name -> :class:`Command`, stages first, then tools, each sorted by name. Two
    modules that would make the same command are refused."""
    found: dict[str, Command] = {}
    for folder in FOLDERS:
        for path in sorted((Path(pipeline_dir) / folder).glob("*.py")):
            help_ = None if path.name.startswith("_") else read_help(path)
            if help_ is None:
                continue
            name = path.stem.replace("_", "-")
            if name in found:
                raise ValueError(f"{path}: command {name!r} is already {found[name].path}")
            found[name] = Command(name, f"pipeline.{folder}.{path.stem}", help_, path)
    return found


def add_params_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", type=Path, default=Path("params.yaml"),
                        help="parameters file (default: ./params.yaml)")


def run(name: str, args: argparse.Namespace) -> int:
    """Run command ``name`` on parsed ``args``: its exit code, 2 for invalid parameters and 1
    for a missing or unreadable input, each said in one line without a traceback."""
    module = importlib.import_module(commands()[name].module)
    try:
        rc = module.main(args)
    except ParamsError as e:
        print(f"symkit {name}: invalid parameters\n{e}", file=sys.stderr)
        return 2
    except ArtifactError as e:  # a missing or unreadable input: one line naming its stage
        print(f"symkit {name}: {e}", file=sys.stderr)
        return 1
    return int(rc or 0)


def run_argv(name: str, argv: list[str]) -> int:
    """Parse ``argv`` (the words after ``symkit NAME``) as command ``name`` does, then
    :func:`run` it."""
    parser = argparse.ArgumentParser(prog=f"symkit {name}")
    add_params_argument(parser)
    module = importlib.import_module(commands()[name].module)
    if hasattr(module, "add_arguments"):
        module.add_arguments(parser)
    return run(name, parser.parse_args(argv))
