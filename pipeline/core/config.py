"""Typed, validated parameters.

``params.yaml`` has one top-level section per stage. Each section is parsed into a frozen, strict
pydantic model: unknown keys, wrong types and out-of-range values raise :class:`ParamsError` with
one line naming the key, the bad value and what is allowed — before any work starts.

Strict mode matters here: ``dvc exp run -S split.seed=042`` writes the *string* ``"042"``, which a
lax parser would silently turn into 42. We refuse it instead (a float field still accepts an int).
"""

from __future__ import annotations

import copy
import importlib
import os
import re
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from ruamel.yaml import YAML, YAMLError

DEFAULT_PARAMS = Path("params.yaml")

PIPELINE = Path(__file__).resolve().parents[1]
"""The ``pipeline`` package folder, where :func:`sections` looks for config models."""
_SECTION = re.compile(r'^class (\w+)\(|^    SECTION: ClassVar\[str\] = "(\w+)"', re.MULTILINE)


@cache
def sections(pipeline_dir: Path = PIPELINE) -> dict[str, str]:
    """Section name -> ``"module:Class"`` of its config model, found in the code: a config
    class declares its section with ``SECTION: ClassVar[str] = "<name>"``, wherever it lives (a
    stage module, or the library that needs it too). The files are read as text, so nothing is
    imported; only the tools that check every section (``symkit check-params``,
    ``symkit preregister``) import the classes, through :func:`section_class`. Two classes that
    claim one section are refused."""
    found: dict[str, str] = {}
    root = Path(pipeline_dir)
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "SECTION: ClassVar" not in text:
            continue
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        cls = None
        for m in _SECTION.finditer(text):
            if m.group(1):
                cls = m.group(1)
            elif cls is not None:
                if m.group(2) in found:
                    raise ValueError(f"{path}: section {m.group(2)!r} is already "
                                     f"{found[m.group(2)]}")
                found[m.group(2)] = f"{module}:{cls}"
    return found


EXPERIMENT_SECTIONS = ("adaptation",)
"""Sections only an experiment's own params.yaml holds (``experiments/<name>/params.yaml``), never
the top-level one."""


class ParamsError(ValueError):
    """A parameter is missing, unknown, mistyped or out of range. The message names the key."""


class StageConfig(BaseModel):
    """Base for every section: unknown keys are errors, values are immutable, types are strict."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class RuntimeConfig(StageConfig):
    """``runtime`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "runtime"

    workers: int | Literal["auto"] = "auto"
    progress: bool | Literal["auto"] = "auto"
    torch_threads: int = Field(2, ge=1, le=256)

    @field_validator("workers")
    @classmethod
    def _workers_positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be 'auto' or an integer >= 1")
        return v

    def n_workers(self) -> int:
        """Resolve ``workers`` to a concrete process count."""
        if self.workers == "auto":
            try:
                return max(1, len(os.sched_getaffinity(0)))
            except AttributeError:  # macOS has no sched_getaffinity
                return max(1, os.cpu_count() or 1)
        return int(self.workers)


T = TypeVar("T", bound=StageConfig)


def parse_yaml(text: str) -> Any:
    """Parse YAML exactly as DVC parses params.yaml: ruamel.yaml's safe loader, YAML 1.2.

    Under YAML 1.2 ``off``, ``on``, ``yes`` and ``no`` are strings and ``1e-3`` is a number;
    PyYAML (YAML 1.1) reads the first four as booleans and ``1e-3`` as a string. Reading params
    the way ``dvc exp run -S`` writes them keeps the two views of a value identical.
    """
    return YAML(typ="safe").load(text)


_PARSED: dict[tuple[str, bytes], Any] = {}
"""params files parsed in this process, by resolved path and content: a stage reads its section
and ``runtime`` from the same file, and ruamel.yaml's pure-Python parser takes about 0.07 s a
time on params.yaml."""


def read_params(path: Path | str = DEFAULT_PARAMS) -> dict[str, Any]:
    """Read ``params.yaml`` as a dict and reject unknown top-level sections."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: file not found (pass --params FILE or run from the repo root)")
    raw = path.read_bytes()
    key = (str(path.resolve()), raw)
    if key not in _PARSED:
        try:
            _PARSED.clear()  # one file's parse kept: the content is the key, never stale
            _PARSED[key] = parse_yaml(raw.decode("utf-8")) or {}
        except YAMLError as e:
            raise ParamsError(f"{path}: not valid YAML: {e}") from e
    data = copy.deepcopy(_PARSED[key])
    if not isinstance(data, dict):
        raise ParamsError(
            f"{path}: top level must be a mapping of sections, got {type(data).__name__}"
        )
    unknown = sorted(set(map(str, data)) - set(sections()))
    if unknown:
        raise ParamsError(
            f"{path}: unknown section {unknown[0]!r}; "
            f"allowed sections: {', '.join(sorted(sections()))}"
        )
    return data


def section_class(name: str) -> type[StageConfig]:
    module, _, cls = sections()[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def parse_section(name: str, raw: Any, cls: type[T], source: str = "params.yaml") -> T:
    """Validate one section's raw mapping into ``cls``; errors name ``section.key``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: {name} = {raw!r}: must be a mapping of keys to values")
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        raise ParamsError(_format_error(name, cls, e, source)) from None


def load_section(name: str, params: Path | str, cls: type[T]) -> T:
    """Load and validate section ``name`` of ``params`` into ``cls`` (unknown sections refused)."""
    data = read_params(params)
    return parse_section(name, data.get(name), cls, str(params))


def load_runtime(params: Path | str = DEFAULT_PARAMS, workers: str | None = None) -> RuntimeConfig:
    """The ``runtime`` section, with a command line ``--workers`` override (validated alike)."""
    runtime = load_section("runtime", params, RuntimeConfig)
    if workers is None:
        return runtime
    value: int | str = int(workers) if workers.isdigit() else workers
    return parse_section("runtime", {**runtime.model_dump(), "workers": value}, RuntimeConfig,
                         source="--workers")


def check_all(params: Path | str = DEFAULT_PARAMS) -> dict[str, StageConfig]:
    """Validate every section present in ``params``; used by ``symkit check-params``."""
    data = read_params(params)
    return {
        name: parse_section(name, data[name], section_class(name), str(params)) for name in data
    }


def _format_error(section: str, cls: type[BaseModel], err: ValidationError, source: str) -> str:
    """One line per problem: ``source: section.key = value: what is allowed``."""
    lines = []
    for e in err.errors(include_url=False):
        loc = [str(p) for p in e["loc"] if not str(p).startswith(("function-", "lax-"))]
        # pydantic adds union member names ('int', "literal['auto']") to loc; drop them.
        loc = [
            p
            for p in loc
            if not (
                p in {"int", "float", "str", "bool", "list", "dict"}
                or p.startswith(("literal[", "constrained-"))
            )
        ]
        key = ".".join([section, *loc])
        value = e.get("input")
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(cls, loc)
            msg = f"unknown key; allowed keys here: {allowed}" if allowed else "unknown key"
        elif e["type"] == "missing":
            msg = "required key is missing"
            value = "<missing>"
        else:
            msg = e["msg"]
            if e["type"] in {"int_type", "float_type", "bool_type", "string_type"} and isinstance(
                value, str
            ):
                msg += " (a quoted or zero-padded number is a string: write a plain number)"
        lines.append(f"{source}: {key} = {value!r}: {msg}")
    # A union reports one error per member; keep unique lines in order.
    return "\n".join(dict.fromkeys(lines))


def _allowed_keys(model: Any, loc: list[str]) -> str:
    for part in loc[:-1]:
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        if field is None or not (
            isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        ):
            return ""
        model = field.annotation
    return ", ".join(sorted(model.model_fields))
