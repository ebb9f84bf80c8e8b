"""params.yaml and the config models agree: one default per parameter, every key documented once
beside its value, and every value a comment lists accepted as written (unquoted) with the meaning
it says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from pipeline.core.config import (
    EXPERIMENT_SECTIONS,
    check_all,
    read_params,
    section_class,
    sections,
)

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"
EXPERIMENT_PARAMS = {"adaptation": ROOT / "experiments" / "adaptation" / "params.yaml"}
"""Each experiment section's own params file, which documents that section beside its values."""

# "a | b (why) | c": two or more words joined by "|", each maybe followed by a parenthesis.
_WORD = r"[A-Za-z_][\w:.-]*"
ALTERNATIVES = re.compile(rf"({_WORD}(?:\s*\([^)]*\))?(?:\s*\|\s*{_WORD}(?:\s*\([^)]*\))?)+)")
LINE = re.compile(r"^(?P<indent> *)(?P<key>[a-z_0-9]+):(?P<value>[^#]*?)\s*(?:#\s*(?P<doc>.*))?$")


def _mismatches(model: BaseModel, prefix: str) -> list[str]:
    """Fields whose code default differs from the value parsed from params.yaml."""
    out = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out += _mismatches(value, f"{prefix}.{name}")
            continue
        if field.is_required():
            continue
        default = field.get_default(call_default_factory=True)
        if default is PydanticUndefined:
            continue
        if default != value:
            out.append(f"{prefix}.{name}: code default {default!r}, params.yaml {value!r}")
    return out


def test_every_code_default_equals_params_yaml() -> None:
    problems = []
    for section, cfg in check_all(PARAMS).items():
        problems += _mismatches(cfg, section)
    for section, path in EXPERIMENT_PARAMS.items():
        problems += _mismatches(check_all(path)[section], section)
    assert problems == []


def _missing(model: type[BaseModel], raw: Any, prefix: str) -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        key = field.alias or name  # tokenize.from is spelled from_ in Python
        if not isinstance(raw, dict) or key not in raw:
            out.append(f"{prefix}.{key}")
            continue
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _missing(ann, raw[key], f"{prefix}.{key}")
    return out


def test_params_yaml_has_every_section_and_key() -> None:
    """No key falls back to a hidden default: params.yaml spells out the whole experiment, and
    an experiment's params file spells out its own section."""
    data = read_params(PARAMS)
    main = [s for s in sections() if s not in EXPERIMENT_SECTIONS]
    assert set(data) == set(main)
    assert [k for s in main for k in _missing(section_class(s), data[s], s)] == []
    assert set(EXPERIMENT_PARAMS) == set(EXPERIMENT_SECTIONS)
    for section, path in EXPERIMENT_PARAMS.items():
        assert _missing(section_class(section), read_params(path)[section], section) == []


def _lines(path: Path = PARAMS) -> list[tuple[int, re.Match]]:
    return [(i, m) for i, line in enumerate(path.read_text(encoding="utf-8").splitlines())
            if (m := LINE.match(line))]


def _undocumented(path: Path, sections: Any = None) -> list[str]:
    undocumented = []
    stack: list[tuple[int, str]] = []
    for _, m in _lines(path):
        indent = len(m["indent"])
        stack = [(d, k) for d, k in stack if d < indent] + [(indent, m["key"])]
        if indent == 0 or stack[0][1] == "criteria" or [k for _, k in stack[:2]] == [
                "compare", "rules"]:
            continue  # sections are documented by their modules; rules carry a rationale
        if sections is not None and stack[0][1] not in sections:
            continue
        if not m["doc"]:
            undocumented.append(".".join(k for _, k in stack))
    return undocumented


def test_every_key_is_documented_beside_its_value() -> None:
    """Each key has its comment on its own line (or, for a block, on its first line), so there is
    one place that says what it does; an experiment's file documents its own section."""
    assert _undocumented(PARAMS) == []
    for section, path in EXPERIMENT_PARAMS.items():
        assert _undocumented(path, {section}) == []


def _listed_values() -> list[tuple[str, int, str]]:
    """(dotted key, line index, value) for every value a comment lists as allowed."""
    lines = PARAMS.read_text(encoding="utf-8").splitlines()
    found, stack = [], []
    parsed = _lines()
    for pos, (i, m) in enumerate(parsed):
        indent = len(m["indent"])
        stack = [(d, k) for d, k in stack if d < indent] + [(indent, m["key"])]
        alts = ALTERNATIVES.search(m["doc"] or "")
        if not alts:
            continue
        words = [re.sub(r"\s*\(.*", "", w).strip() for w in alts.group(1).split("|")]
        words = [w.replace(":N", ":1") for w in words]
        key = ".".join(k for _, k in stack)
        if m["value"].strip():
            found += [(key, i, w) for w in words]
        else:  # a block: the alternatives apply to each of its scalar children
            for j, c in parsed[pos + 1:]:
                if len(c["indent"]) <= indent:
                    break
                found += [(f"{key}.{c['key']}", j, w) for w in words]
    assert len(lines) and found
    return found


LISTED = _listed_values()


def test_listed_values_are_found() -> None:
    """The scan reads the comments it must (guards the parametrised test below)."""
    keys = {k for k, _, _ in LISTED}
    assert {"dedupe.policy.near", "runtime.progress", "transformer.precision",
            "tokenize.tokenizer", "report.nll_unit", "corpus.link"} <= keys
    assert ("dedupe.policy.near", "off") in {(k, v) for k, _, v in LISTED}


@pytest.mark.parametrize(("key", "line", "value"), LISTED,
                         ids=[f"{k}={v}" for k, _, v in LISTED])
def test_every_listed_value_is_accepted_as_written(tmp_path: Path, key: str, line: int,
                                                   value: str) -> None:
    lines = PARAMS.read_text(encoding="utf-8").splitlines()
    m = LINE.match(lines[line])
    assert m is not None
    doc = f"  # {m['doc']}" if m["doc"] else ""
    lines[line] = f"{m['indent']}{m['key']}: {value}{doc}"
    params = tmp_path / "params.yaml"
    params.write_text("\n".join(lines) + "\n", encoding="utf-8")
    section, *path = key.split(".")
    cfg: Any = check_all(params)[section]
    for part in path:
        cfg = getattr(cfg, part)
    expected = {"true": True, "false": False}.get(value, value)
    assert cfg == expected, f"{key}: wrote {value} unquoted, read {cfg!r}"

