"""The repository's own code as data: which modules import which, and a digest of what code
does rather than how it is worded.

:func:`scan` reads every module of :data:`PACKAGES` with :mod:`ast` (imports inside functions
included, since they run too) and :func:`closure` follows them: ``symkit check-deps`` holds each
DVC stage to the closure of its module, and the pre-registration binds the closure of the code
that judges (:mod:`pipeline.decision.bound_code`).

:func:`code_digest` hashes a module's tokens without its comments and docstrings, so editing
prose leaves the digest as it was while any change to what runs changes it. It reads tokens
(:mod:`tokenize`), not the syntax tree's printout, so the same source gives the same digest under
every Python version that parses it. :func:`function_digest` does the same for one function.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("pipeline", "models")
"""Top-level packages whose modules count as the repository's code."""


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. pipeline.stages.ingest
    path: Path  # relative to the repository root
    imports: frozenset[str]  # repository modules it imports, anywhere in the file


def _module_name(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(name: str, known: Mapping[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a repository module (``a.b.func`` -> ``a.b``)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in known:
            return candidate
    return None


def _imported_names(tree: ast.AST, current: str, is_package: bool) -> Iterable[str]:
    """Dotted names a module imports; ``from x import y`` yields ``x.y`` (a module or not)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = current.split(".") if is_package else current.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)


_SCANS: dict[tuple, dict[str, Module]] = {}


def scan(root: Path) -> dict[str, Module]:
    """Every module of :data:`PACKAGES` under ``root`` with the repository modules it imports.
    Remembered for the process while no file changes (path, size and modification time)."""
    files = sorted(p.relative_to(root) for pkg in PACKAGES for p in (root / pkg).rglob("*.py"))
    key = (str(root.resolve()), *((str(f), (root / f).stat().st_mtime_ns,
                                   (root / f).stat().st_size) for f in files))
    if key not in _SCANS:
        _SCANS.clear()
        _SCANS[key] = _scan(root, files)
    return _SCANS[key]


def _scan(root: Path, files: list[Path]) -> dict[str, Module]:
    known = {_module_name(p): p for p in files}
    modules = {}
    for name, path in known.items():
        tree = ast.parse((root / path).read_text(encoding="utf-8"), filename=str(path))
        found = set()
        for imported in _imported_names(tree, name, path.name == "__init__.py"):
            target = _resolve(imported, known)
            if target is not None and target != name:
                found.add(target)
        modules[name] = Module(name, path, frozenset(found))
    return modules


def closure(modules: Mapping[str, Module], start: str) -> set[str]:
    """``start`` and every repository module it imports, directly or not."""
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(modules[m].imports)
    return seen


def code_files(modules: Mapping[str, Module], names: Iterable[str]) -> set[str]:
    """POSIX paths of the non-package modules among ``names``."""
    return {modules[n].path.as_posix() for n in names if modules[n].path.name != "__init__.py"}


def _docstring_spans(tree: ast.AST) -> set[tuple[int, int]]:
    """(line, column) where each docstring of ``tree`` starts: the first statement of the module,
    of a class or of a function when it is a string constant."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.add((body[0].lineno, body[0].col_offset))
    return out


_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}


def code_tokens(source: str) -> list[str]:
    """The tokens of ``source`` that make what it does: comments, blank lines and docstrings
    left out, and each token written as its type and text (indentation as INDENT/DEDENT)."""
    docstrings = _docstring_spans(ast.parse(source))
    out, after_docstring = [], False
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING and tok.start in docstrings:
            after_docstring = True  # its statement's NEWLINE goes too
            continue
        if tok.type in _SKIPPED or (after_docstring and tok.type == tokenize.NEWLINE):
            after_docstring = after_docstring and tok.type != tokenize.NEWLINE
            continue
        after_docstring = False
        text = "" if tok.type in (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE) \
            else tok.string
        out.append(f"{tokenize.tok_name[tok.type]}:{text}")
    return out


@functools.lru_cache(maxsize=4096)
def code_digest(source: str) -> str:
    """sha256 of :func:`code_tokens`: equal for two sources that differ only in comments,
    docstrings, blank lines or the width of their indentation."""
    return hashlib.sha256("\n".join(code_tokens(source)).encode()).hexdigest()


def function_digest(source: str, name: str) -> str | None:
    """:func:`code_digest` of the top-level function or class ``name`` of ``source`` (None when
    the module defines none)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) \
                and node.name == name:
            segment = ast.get_source_segment(source, node)
            return code_digest(segment) if segment is not None else None
    return None


def file_digests(root: Path, paths: Iterable[str]) -> dict[str, str]:
    """:func:`code_digest` of each file of ``paths`` (POSIX, relative to ``root``), sorted by
    path."""
    return {p: code_digest((root / p).read_text(encoding="utf-8")) for p in sorted(paths)}
