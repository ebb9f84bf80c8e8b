"""pipeline.core.commands: commands found in the files (a ``HELP`` line read as text), a clash
refused, and :func:`run` mapping the two user errors to exit codes without a traceback."""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import pytest

from pipeline.core import commands as commands_mod
from pipeline.core.artifacts import ArtifactError
from pipeline.core.commands import Command, add_params_argument, commands, read_help, run, run_argv
from pipeline.core.config import ParamsError

ROOT = Path(__file__).resolve().parents[2]


def test_every_stage_and_tool_module_with_help_is_a_command():
    """Commands come from the files, not a table: each stage of dvc.yaml and each tool."""
    found = commands()
    root = Path(__file__).resolve().parents[2] / "pipeline"
    for folder in ("stages", "tools"):
        for path in (root / folder).glob("*.py"):
            if path.name == "__init__.py":
                continue
            name = path.stem.replace("_", "-")
            if read_help(path) is None:  # a library its folder shares
                assert name not in found
                continue
            assert found[name].module == f"pipeline.{folder}.{path.stem}"
            assert found[name].help and "\n" not in found[name].help
    assert {"ingest", "train-transformer", "check-deps", "ledger", "compare"} <= set(found)
    assert "runs" not in found and (root / "tools" / "runs.py").is_file()


def test_a_module_without_help_is_a_library_and_a_clash_is_refused(tmp_path: Path):
    for folder in ("stages", "tools"):
        (tmp_path / folder).mkdir()
    (tmp_path / "stages" / "toy_stage.py").write_text('"""doc"""\n\nHELP = "make \\"toys\\""\n')
    (tmp_path / "tools" / "runs.py").write_text('"""shared by two tools"""\n')
    found = commands(tmp_path)
    assert list(found) == ["toy-stage"] and found["toy-stage"].help == 'make "toys"'
    (tmp_path / "tools" / "toy_stage.py").write_text('HELP = "again"\n')
    commands.cache_clear()
    with pytest.raises(ValueError, match="toy-stage"):
        commands(tmp_path)


@pytest.mark.parametrize(("text", "expected"), [
    ('HELP = "one line"\n', "one line"),
    ('"""doc"""\nimport x\n\nHELP = "a \\"quoted\\" word"  \n', 'a "quoted" word'),
    ('def f():\n    HELP = "inside a function"\n', None),  # not at the top level
    ('HELP_TEXT = "another name"\n', None),
    ('# HELP = "a comment"\n', None),
    ('HELP = "with a comment after it"  # shown by symkit --help\n', "with a comment after it"),
    ("", None),
])
def test_read_help_reads_the_top_level_line_as_text(tmp_path: Path, text: str, expected):
    path = tmp_path / "mod.py"
    path.write_text(text + "raise SystemExit('never imported')\n", encoding="utf-8")
    assert read_help(path) == expected


def test_stages_come_before_tools_each_sorted_and_private_files_are_skipped(tmp_path: Path):
    for folder in ("stages", "tools"):
        (tmp_path / folder).mkdir()
    for folder, stem in [("tools", "alpha"), ("stages", "zeta"), ("stages", "beta"),
                         ("tools", "_hidden"), ("stages", "__init__")]:
        (tmp_path / folder / f"{stem}.py").write_text(f'HELP = "{stem}"\n')
    found = commands(tmp_path)
    assert list(found) == ["beta", "zeta", "alpha"]
    assert found["alpha"] == Command("alpha", "pipeline.tools.alpha", "alpha",
                                     tmp_path / "tools" / "alpha.py")


@pytest.fixture
def toy(monkeypatch) -> types.ModuleType:
    """A command ``toy`` whose ``main`` does what ``module.behaviour`` says."""
    module = types.ModuleType("toy_command")

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--n", type=int, default=0)

    def main(args: argparse.Namespace):
        return module.behaviour(args)

    module.add_arguments, module.main = add_arguments, main
    monkeypatch.setitem(sys.modules, "toy_command", module)
    monkeypatch.setattr(commands_mod, "commands", lambda: {
        "toy": Command("toy", "toy_command", "a toy", Path("toy.py"))})
    return module


def test_run_returns_the_exit_code_of_main(toy):
    toy.behaviour = lambda args: None
    assert run("toy", argparse.Namespace()) == 0
    toy.behaviour = lambda args: 3
    assert run("toy", argparse.Namespace()) == 3


def test_run_says_bad_params_and_missing_inputs_in_one_line(toy, capsys):
    def bad_params(args):
        raise ParamsError("params.yaml: toy.n = 'x': not a number")

    toy.behaviour = bad_params
    assert run("toy", argparse.Namespace()) == 2
    assert capsys.readouterr().err == ("symkit toy: invalid parameters\n"
                                       "params.yaml: toy.n = 'x': not a number\n")

    def missing(args):
        raise ArtifactError("data/x.parquet does not exist: re-run `dvc repro x`")

    toy.behaviour = missing
    assert run("toy", argparse.Namespace()) == 1
    assert capsys.readouterr().err == ("symkit toy: data/x.parquet does not exist: "
                                       "re-run `dvc repro x`\n")

    def bug(args):
        raise KeyError("a bug is not a user error")

    toy.behaviour = bug
    with pytest.raises(KeyError):  # anything else keeps its traceback
        run("toy", argparse.Namespace())


def test_run_argv_parses_the_params_file_and_the_command_s_own_arguments(toy, capsys):
    seen = []
    toy.behaviour = lambda args: seen.append(args) or args.n
    assert run_argv("toy", ["--n", "4", "--params", "other.yaml"]) == 4
    assert seen[-1].params == Path("other.yaml")
    assert run_argv("toy", []) == 0 and seen[-1].params == Path("params.yaml")
    with pytest.raises(SystemExit):
        run_argv("toy", ["--unknown"])
    assert "symkit toy" in capsys.readouterr().err  # the usage line names the command


def test_add_params_argument_defaults_to_params_yaml():
    parser = argparse.ArgumentParser()
    add_params_argument(parser)
    assert parser.parse_args([]).params == Path("params.yaml")
    assert parser.parse_args(["--params", "p.yaml"]).params == Path("p.yaml")
    assert commands_mod.PIPELINE == ROOT / "pipeline"
