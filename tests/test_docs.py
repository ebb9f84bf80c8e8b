"""Every repository path and every ``pipeline.``/``models.`` name that the docs mention exists."""

from __future__ import annotations

import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# docs/**: the measured results under docs/results/ are checked too.
DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("**/*.md")])
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


def _mentions(pattern: re.Pattern, files: list[Path], tail: str = ".") -> list[tuple[str, str]]:
    """(file, mention) pairs; ``tail``: characters stripped from a mention's end (a sentence's
    full stop; for paths also Markdown's closing ``_`` of emphasis: no path ends in one)."""
    found = set()
    for f in files:
        for m in pattern.finditer(_prose(f)):
            found.add((f.relative_to(ROOT).as_posix(), m.group(1).rstrip(tail)))
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


PATHS = _mentions(PATH, DOCS, tail="._")
NAMES = _mentions(DOTTED, DOCS + CODE)


def test_the_scan_finds_mentions() -> None:
    assert ("README.md", "docs/images/report-first-screen.png") in PATHS
    assert ("docs/results/default_experiment.md", "docs/evaluation.md") in PATHS
    assert any(n == "pipeline.tokens.dataset" for _, n in NAMES)


@pytest.mark.parametrize(("doc", "path"), PATHS, ids=[f"{d}:{p}" for d, p in PATHS])
def test_documented_path_exists(doc: str, path: str) -> None:
    assert (ROOT / path).exists(), f"{doc} names {path}, which does not exist"


@pytest.mark.parametrize(("source", "name"), NAMES, ids=[f"{s}:{n}" for s, n in NAMES])
def test_documented_name_resolves(source: str, name: str) -> None:
    assert _resolves(name), f"{source} names {name}, which does not resolve"


FENCED = re.compile(r"^```[^\n]*\n.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    text = FENCED.sub("", path.read_text(encoding="utf-8"))
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+\s+(.*)$", text, re.M)}


def _broken_links(doc: Path) -> list[str]:
    """Relative Markdown links of ``doc`` whose file, or heading anchor, does not exist."""
    broken = []
    for target in LINK.findall(FENCED.sub("", doc.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=[d.relative_to(ROOT).as_posix() for d in DOCS])
def test_relative_links_resolve(doc: Path) -> None:
    """Links are relative to the file that holds them: moving a section between files (the
    README and docs/, docs/ and docs/results/) must move its links' targets with it."""
    assert _broken_links(doc) == [], f"{doc.relative_to(ROOT)} links nowhere"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A heading\n")
    doc = tmp_path / "b.md"
    doc.write_text("[ok](a.md#a-heading) [gone](c.md) [bad](a.md#nothing) [web](https://x.y)\n"
                   "```\n[in code](d.md)\n```\n")
    assert _broken_links(doc) == ["c.md (no such file)", "a.md#nothing (no such heading)"]
