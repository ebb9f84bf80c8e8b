"""pipeline.core.code: the import scan and the digest of what code does, not how it is worded."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.code import closure, code_digest, code_files, function_digest, scan

ROOT = Path(__file__).resolve().parents[2]

SOURCE = '''"""Module prose."""
import math


def area(r):
    """The area."""
    # a comment
    return math.pi * r * r


class Box:
    """A box."""

    def volume(self):
        return 1
'''


def test_prose_comments_and_indent_width_do_not_count():
    reworded = SOURCE.replace("Module prose.", "Other words.").replace("# a comment", "# x")
    narrower = reworded.replace("    ", "  ")
    assert code_digest(reworded) == code_digest(SOURCE) == code_digest(narrower)
    assert code_digest(SOURCE.replace("r * r", "r ** 2")) != code_digest(SOURCE)
    # a string that is not a docstring is code
    assert code_digest(SOURCE.replace('return 1', 'return "1"')) != code_digest(SOURCE)


def test_a_function_digest_sees_only_that_function():
    other = SOURCE.replace("return 1", "return 2")
    assert function_digest(SOURCE, "area") == function_digest(other, "area")
    assert function_digest(SOURCE, "Box") != function_digest(other, "Box")
    assert function_digest(SOURCE, "missing") is None


def test_the_scan_follows_imports_into_the_closure():
    modules = scan(ROOT)
    found = code_files(modules, closure(modules, "pipeline.stages.evaluate"))
    assert "pipeline/stages/evaluate.py" in found and "pipeline/decision/looks.py" in found
    assert "pipeline/core/sealed.py" in found
    assert not any(f.endswith("__init__.py") for f in found)
