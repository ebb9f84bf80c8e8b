"""The code a registration binds: what judges, what trains, and the rule that stops training.

A registration that froze the criteria but not the code applying them could be talked into a
verdict after a look: a two-line change to how a metric is read turns INCONCLUSIVE into PASS
with every registered number unchanged. So ``symkit preregister`` records, beside the params, a
digest of each file of three parts of the code (:func:`bound_code`), and the report compares them
with the code that runs (:func:`changes`):

- ``judging``: the import closure of :data:`JUDGING`, the modules that score pieces (evaluate),
  audit samples, build the metrics, judge the criteria, simulate their controls and decide the
  registration's status;
- ``recipe``: the import closure of :data:`RECIPE`, the training stages;
- ``stopping``: the functions of :data:`STOPPING` that decide when training stops (the
  validation estimate, the patience rule, the length rules).

Each digest is :func:`pipeline.core.code.code_digest`: comments, docstrings and blank lines do
not count, so rewording prose is no change, and any change to what runs is one. The files are
read where the running code lives (the repository holding this package), whatever the working
directory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipeline.core import artifacts
from pipeline.core.code import closure, code_digest, code_files, function_digest, scan

CODE_ROOT = Path(__file__).resolve().parents[2]
"""The repository the running code comes from (paths below are relative to it)."""

JUDGING = ("pipeline.stages.evaluate", "pipeline.stages.audit", "pipeline.decision.metrics",
           "pipeline.decision.criteria", "pipeline.decision.criteria_controls",
           "pipeline.decision.preregistration", "pipeline.decision.looks")
"""Modules whose import closure computes metrics, verdicts and the registration's status."""
RECIPE = ("pipeline.stages.train_transformer", "pipeline.stages.train_ngram")
"""Modules whose import closure trains the models."""
STOPPING = (("pipeline/training/loop.py", "_track_best"),
            ("pipeline/training/loop.py", "_length_rule"),
            ("pipeline/training/loop.py", "evaluate"),
            ("pipeline/training/data.py", "val_window_plan"))
"""(file, function): the validation estimate and the rules that end a training run."""
PARTS = ("judging", "recipe", "stopping")


def bound_files(root: Path = CODE_ROOT) -> dict[str, list[str]]:
    """Part -> the files it binds (POSIX paths relative to ``root``), sorted; the stopping part
    lists ``file::function``."""
    modules = scan(root)

    def files(roots: tuple[str, ...]) -> list[str]:
        return sorted(set().union(*(code_files(modules, closure(modules, r)) for r in roots)))

    return {"judging": files(JUDGING), "recipe": files(RECIPE),
            "stopping": [f"{f}::{fn}" for f, fn in STOPPING]}


def _digest(read: Callable[[str], str | None], entry: str) -> str | None:
    path, _, function = entry.partition("::")
    source = read(path)
    if source is None:
        return None
    try:
        return function_digest(source, function) if function else code_digest(source)
    except (SyntaxError, ValueError):
        return "unparsable"


def bound_code(root: Path = CODE_ROOT,
               read: Callable[[str], str | None] | None = None) -> dict[str, dict[str, Any]]:
    """Part -> {file (or ``file::function``): digest}. ``read`` gives a file's text by path (the
    default reads under ``root``; a reader of a git commit gives the code as it was then, for
    the same files); None for a file it lacks."""
    def from_disk(path: str) -> str | None:
        p = root / path
        return p.read_text(encoding="utf-8") if p.is_file() else None

    reader = read or from_disk
    return {part: {entry: _digest(reader, entry) for entry in entries}
            for part, entries in bound_files(root).items()}


def judging_digest(code: Mapping[str, Any] | None = None) -> str:
    """One hash of the judging part (what a look records)."""
    return artifacts.sha256_json((code or bound_code())["judging"])


def changes(registered: Mapping[str, Any] | None, current: Mapping[str, Any]) -> list[str]:
    """One line per part whose files differ: ``judging: pipeline/audit/judging.py changed, ...``
    (files changed, added to or gone from the part). Empty when equal."""
    out = []
    for part in PARTS:
        then = (registered or {}).get(part) or {}
        now = current.get(part) or {}
        changed = [f"{f} changed" for f in sorted(set(then) & set(now)) if then[f] != now[f]]
        changed += [f"{f} added" for f in sorted(set(now) - set(then))]
        changed += [f"{f} gone" for f in sorted(set(then) - set(now))]
        if changed:
            shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more"
                                              if len(changed) > 6 else "")
            out.append(f"{part}: {shown}")
    return out
