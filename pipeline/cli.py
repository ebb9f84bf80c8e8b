"""``symkit`` command line: one subcommand per stage plus a few tools.

The commands are found in the code (:mod:`pipeline.core.commands`): each module of
``pipeline/stages/`` and ``pipeline/tools/`` that declares a ``HELP`` line, exposing
``add_arguments(parser)`` and ``main(args)``. Only the chosen command's module is imported, so
``symkit ingest`` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pipeline.core.commands import add_params_argument, commands, run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="symkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in commands().items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        add_params_argument(p)
    return parser


def _version() -> str:
    from pipeline import __version__

    return f"symkit {__version__}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # The chosen command's module adds its own arguments before parsing (so --help shows them).
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in commands():
        module = importlib.import_module(commands()[command].module)
        if hasattr(module, "add_arguments"):
            subparsers = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
            module.add_arguments(subparsers[command])
    args = parser.parse_args(argv)
    return run(args.command, args)


if __name__ == "__main__":
    sys.exit(main())
