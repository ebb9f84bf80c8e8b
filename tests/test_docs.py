"""Every repository path and every ``pipeline.``/``models.`` name that the docs mention exists."""

from __future__ import annotations

import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])
CODE = sorted(p for pkg in ("pipeline", "models") for p in (ROOT / pkg).rglob("*.py"))

# A path into the code or docs: pipeline/..., models/..., tests/..., benchmarks/..., docs/...
# (templates such as tests/test_<module>.py are skipped).
PATH = re.compile(r"(?<![\w./-])((?:pipeline|models|tests|benchmarks|docs)/[\w./-]*\w/?)"
                  r"(?![\w<./-])")
# A dotted name in the code's packages: pipeline.stages.ingest, models.base.SequenceModel, ...
DOTTED = re.compile(r"(?<![\w./-])((?:pipeline|models)(?:\.[A-Za-z_]\w*)+)(?![\w<])")


def _prose(path: Path) -> str:
    """A Markdown file whole; of a Python file only its strings and comments (where docs live)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return text
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return "\n".join(t.string for t in tokens if t.type in (tokenize.STRING, tokenize.COMMENT))


def _mentions(pattern: re.Pattern, files: list[Path]) -> list[tuple[str, str]]:
    found = set()
    for f in files:
        for m in pattern.finditer(_prose(f)):
            found.add((f.relative_to(ROOT).as_posix(), m.group(1).rstrip(".")))
    return sorted(found)


def _resolves(dotted: str) -> bool:
    """An importable module, or an attribute reached from the longest importable prefix."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


PATHS = _mentions(PATH, DOCS)
NAMES = _mentions(DOTTED, DOCS + CODE)


def test_the_scan_finds_mentions() -> None:
    assert ("README.md", "pipeline/stages") in {(f, p.rstrip("/")) for f, p in PATHS}
    assert any(n == "pipeline.tokens.dataset" for _, n in NAMES)


@pytest.mark.parametrize(("doc", "path"), PATHS, ids=[f"{d}:{p}" for d, p in PATHS])
def test_documented_path_exists(doc: str, path: str) -> None:
    assert (ROOT / path).exists(), f"{doc} names {path}, which does not exist"


@pytest.mark.parametrize(("source", "name"), NAMES, ids=[f"{s}:{n}" for s, n in NAMES])
def test_documented_name_resolves(source: str, name: str) -> None:
    assert _resolves(name), f"{source} names {name}, which does not resolve"
