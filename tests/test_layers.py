"""The floors of the code, as import-linter checks them (contracts in pyproject.toml): the
repository keeps every contract, and each contract breaks on a copy with a planted import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` run in ``root``, on that folder's packages and pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


def broken(result: subprocess.CompletedProcess) -> set[str]:
    """The names of the contracts the run reports broken."""
    return {line.rsplit(" ", 1)[0] for line in result.stdout.splitlines()
            if line.endswith(" BROKEN")}


@pytest.fixture()
def copy(tmp_path: Path) -> Path:
    for pkg in ("pipeline", "models"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")


FLOORS = "Floors: a package imports only from the floors below it"
STAGES = "Stages never import each other (what two stages share lives in a library)"
ACYCLIC = "No import cycle between the modules or sub-packages of a package"


def test_the_repository_keeps_every_contract() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout


def test_an_import_running_up_a_floor_breaks_the_floors(copy: Path) -> None:
    """A model importing the token contract (as models/transformer.py once did)."""
    _append(copy / "models" / "base.py", "\nfrom pipeline.tokens import contract  # noqa\n")
    result = lint(copy)
    assert result.returncode == 1
    assert broken(result) == {FLOORS}
    assert "models is not allowed to import pipeline.tokens" in result.stdout


def test_rooms_of_one_floor_stay_apart(copy: Path) -> None:
    """Training and inference share a floor and never import each other."""
    _append(copy / "pipeline" / "training" / "data.py",
            "\n\ndef _late():\n    from pipeline.inference import protocol  # noqa\n")
    result = lint(copy)
    assert FLOORS in broken(result)
    assert "pipeline.training is not allowed to import pipeline.inference" in result.stdout


def test_a_stage_importing_another_stage_breaks_the_stage_contract(copy: Path) -> None:
    _append(copy / "pipeline" / "stages" / "split.py",
            "\nfrom pipeline.stages.dedupe import DedupeConfig  # noqa\n")
    result = lint(copy)
    assert broken(result) == {STAGES}
    assert "pipeline.stages.split is not allowed to import pipeline.stages.dedupe" in (
        result.stdout)


def test_a_function_level_import_that_closes_a_cycle_breaks_the_acyclic_contract(
        copy: Path) -> None:
    """An import inside a function counts: it is for heavy optional dependencies, never to hide
    a cycle (core/parallel.py imports core/progress.py)."""
    _append(copy / "pipeline" / "core" / "progress.py",
            "\n\ndef _late():\n    from pipeline.core import parallel\n\n    return parallel\n")
    result = lint(copy)
    assert broken(result) == {ACYCLIC}


def test_reading_test_rows_outside_the_gate_breaks_the_test_rows_contract(copy: Path) -> None:
    """The audit reading test token rows itself, without recording the look."""
    _append(copy / "pipeline" / "audit" / "judging.py",
            "\nfrom pipeline.core.sealed import read_test_tokens  # noqa\n")
    result = lint(copy)
    assert "pipeline.audit.judging -> pipeline.core.sealed" in result.stdout
    assert result.returncode == 1
    # import-linter wraps the contract's name: "... each look" / "first BROKEN"
    assert "first BROKEN (1 ignored import)" in result.stdout.splitlines(), result.stdout
