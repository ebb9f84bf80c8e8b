"""The ingest, dedupe, split and token caches' keys hash the code their entries depend on: every
symkit module a listed module imports is listed too, save those that cannot change a cached
result (named below, with why)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

from pipeline.music import ingest_cache
from pipeline.similarity import dedupe_cache, duplicates, leakage_cache
from pipeline.tokens import store as token_store
from pipeline.training import resume

CODE_LISTS = {
    "ingest results": ingest_cache.CACHE_CODE,
    "dedupe features": dedupe_cache.FEATURES_CODE,
    "dedupe verdicts": duplicates.VERDICT_CODE,
    "split audit and features": leakage_cache.AUDIT_CODE,
    "token entries": token_store.ENTRY_CODE,
    "training run identity": resume.TRAIN_CODE,
}
CANNOT_CHANGE_RESULTS = {
    "pipeline.core.artifacts": "reads and writes files; hashes",
    "pipeline.core.config": "parses parameters (the settings are in the keys)",
    "pipeline.core.parallel": "schedules work; results come back in input order",
    "pipeline.core.segments": "the stores themselves",
    "pipeline.core.row_groups": "reads the stores' row groups",
    "pipeline.core.progress": "progress bars",
    "pipeline.music.midi": "lists source files",
    "pipeline.similarity.dedupe_cache": "reads and writes the dedupe stores",
}


def imported_modules(name: str) -> set[str]:
    """The symkit modules ``name``'s source imports, wherever in the module."""
    tree = ast.parse(Path(importlib.import_module(name).__file__).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(("pipeline.", "models."))}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                ("pipeline", "models")):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if _is_module(sub) else node.module)
    return found


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("cache", sorted(CODE_LISTS))
def test_a_cache_key_lists_every_module_its_code_imports(cache):
    listed = set(CODE_LISTS[cache])
    missing = {name: sorted(imported_modules(name) - listed - set(CANNOT_CHANGE_RESULTS))
               for name in sorted(listed)}
    assert {name: mods for name, mods in missing.items() if mods} == {}


def test_the_code_digest_follows_each_listed_file(tmp_path, monkeypatch):
    """A change to any listed module's bytes changes the digest (arrays.py was once left out
    of the ingest key: a change there would have reused stale results)."""
    from pipeline.core import arrays, artifacts

    before = artifacts.code_digest(ingest_cache.CACHE_CODE)
    copy = tmp_path / "arrays.py"
    copy.write_bytes(Path(arrays.__file__).read_bytes() + b"\n# changed\n")
    monkeypatch.setattr(arrays, "__file__", str(copy))
    assert artifacts.code_digest(ingest_cache.CACHE_CODE) != before


def test_the_token_cache_key_follows_the_encoding_code(tmp_path, monkeypatch):
    """The token store is keyed by the code that makes its entries as well as by the tokenizer's
    configuration and the library versions: a change there makes a new store."""
    from pipeline.tokens import tokenizer

    before = token_store.config_key("REMI", {"beat_res": {"0_4": 8}})
    assert token_store.config_key("REMI", {"beat_res": {"0_4": 8}}) == before
    copy = tmp_path / "tokenizer.py"
    copy.write_bytes(Path(tokenizer.__file__).read_bytes() + b"\n# changed\n")
    monkeypatch.setattr(tokenizer, "__file__", str(copy))
    assert token_store.config_key("REMI", {"beat_res": {"0_4": 8}}) != before
