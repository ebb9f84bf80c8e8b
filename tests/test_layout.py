"""The tests mirror the code: every module ``pipeline/<a>/<b>.py`` has its own test file
``tests/<a>/test_<b>.py`` (``models/<m>.py``: ``tests/models/test_<m>.py``; ``pipeline/cli.py``:
``tests/test_cli.py``) that imports it, so a module's tests are found in one hop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p.relative_to(ROOT) for pkg in ("pipeline", "models")
                 for p in (ROOT / pkg).rglob("*.py") if p.name != "__init__.py")


def mirror(module: Path) -> Path:
    """The test file of a module, by the rule above."""
    parts = module.with_suffix("").parts
    inner = parts[1:-1] if parts[0] == "pipeline" else parts[:-1]
    return Path("tests", *inner, f"test_{parts[-1]}.py")


def imported(test_file: Path) -> set[str]:
    """Dotted names a test file imports (``from a.b import c`` gives a.b and a.b.c)."""
    names = set()
    for node in ast.walk(ast.parse((ROOT / test_file).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


@pytest.mark.parametrize("module", MODULES, ids=str)
def test_each_module_has_a_test_file_that_imports_it(module: Path) -> None:
    test_file = mirror(module)
    assert (ROOT / test_file).is_file(), f"{module}: no {test_file}"
    dotted = ".".join(module.with_suffix("").parts)
    assert dotted in imported(test_file), f"{test_file} does not import {dotted}"


def test_the_rule_maps_a_module_and_a_sub_package_module() -> None:
    assert mirror(Path("pipeline/audit/overlap.py")) == Path("tests/audit/test_overlap.py")
    assert mirror(Path("pipeline/report/sections/samples.py")) == Path(
        "tests/report/sections/test_samples.py")
    assert mirror(Path("models/ngram.py")) == Path("tests/models/test_ngram.py")
    assert mirror(Path("pipeline/cli.py")) == Path("tests/test_cli.py")
