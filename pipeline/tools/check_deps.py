"""``symkit check-deps``: the code each DVC stage runs must be exactly the code it lists.

A stage's code is the import closure of its module (``pipeline/stages/<stage>.py``) inside this
repository, read from the source with :mod:`ast` (imports inside functions included, since they
run too). ``dvc.yaml`` must list every ``.py`` file of that closure under the stage's ``deps``
(a folder dep covers the files below it), or a change to that code would leave stale results
looking current; and it must list no code outside the closure, or unrelated edits re-run the
stage. Package ``__init__.py`` files hold only a docstring (checked too), so they are not listed.

Also checked: every stage in ``dvc.yaml`` runs ``symkit <command>`` whose module is
``pipeline.stages.<stage>``, and stages are listed in pipeline order (each after the stages whose
outputs it reads).

``symkit check-deps`` prints each problem on one line and
exits 1 when there is any; ``--print`` shows the ``deps`` code list each stage should have, and
``--write`` puts it into ``dvc.yaml`` and every experiment's ``dvc.yaml``: in each stage's
``deps``, the code entries are replaced by the closure, sorted, where the first code entry stood
(paths relative to that file, as DVC reads them); data entries, comments and everything else
keep their bytes.

Which package may import which (the floors, stages never importing each other, no cycles) is
import-linter's job, with the contracts in ``pyproject.toml`` (``tests/test_layers.py`` runs
them); this module checks what is the project's own: that each stage lists the code it runs.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.code import PACKAGES, Module, closure, code_files, scan
from pipeline.core.commands import commands

HELP = "check that dvc.yaml lists exactly the code each stage runs"

def _is_docstring_only(root: Path, path: Path) -> bool:
    tree = ast.parse((root / path).read_text(encoding="utf-8"))
    body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) else tree.body
    return all(isinstance(n, ast.Assign | ast.AnnAssign)
               and all(isinstance(t, ast.Name) and t.id.startswith("__")
                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
               for n in body)


def _paths(entries: Iterable[Any]) -> list[str]:
    return [str(next(iter(e)) if isinstance(e, dict) else e).rstrip("/") for e in entries or []]


def _covers(dep: str, file: str) -> bool:
    return file == dep or file.startswith(dep + "/")


def _is_code_dep(dep: str) -> bool:
    return dep.split("/")[0] in PACKAGES


def _stage_spec(spec: Any) -> Mapping[str, Any]:
    """A stage's definition; for a ``foreach`` stage, its ``do`` template (every generated
    stage runs the same command with the same code)."""
    spec = spec or {}
    return spec.get("do", spec) if "foreach" in spec or "matrix" in spec else spec


def _command(cmd: Any) -> list[str]:
    """The words of a stage's command after any leading ``NAME=value`` environment settings."""
    words = str(cmd or "").split()
    while words and "=" in words[0] and not words[0].startswith("-"):
        words.pop(0)
    return words


def stage_modules(stages: Mapping[str, Any], commands: Mapping[str, str]) -> dict[str, str]:
    """stage -> module run by its ``symkit <command>`` (stages with another command omitted)."""
    out = {}
    for stage, spec in stages.items():
        words = _command(_stage_spec(spec).get("cmd"))
        if len(words) >= 2 and words[0] == "symkit" and words[1] in commands:
            out[stage] = commands[words[1]]
    return out


def experiment_files(root: Path) -> list[Path]:
    """The experiments' own pipelines: ``experiments/*/dvc.yaml``, sorted."""
    return sorted((Path(root) / "experiments").glob("*/dvc.yaml"))


def check(root: Path, dvc_yaml: Path | None = None) -> list[str]:
    """Every problem found, one line each (empty when the pipelines and the code agree): the
    repository-wide rules, the top-level ``dvc.yaml`` (or ``dvc_yaml``) and every experiment's
    ``dvc.yaml``."""
    root = Path(root)
    modules = scan(root)
    problems = _repository_problems(root, modules)
    problems += check_file(root, dvc_yaml or root / "dvc.yaml", modules, main=True)
    if dvc_yaml is None:
        for f in experiment_files(root):
            problems += check_file(root, f, modules, main=False)
    return problems


def command_modules(root: Path) -> dict[str, str]:
    """command name -> module, as ``symkit`` finds them under ``root``'s ``pipeline/``."""
    return {c.name: c.module for c in commands(Path(root).resolve() / "pipeline").values()}


def _repository_problems(root: Path, modules: Mapping[str, Module]) -> list[str]:
    problems = []
    for path in sorted(m.path for m in modules.values() if m.path.name == "__init__.py"):
        if not _is_docstring_only(root, path):
            problems.append(f"{path.as_posix()}: a package __init__ may hold only a docstring "
                            "(and dunder names), so that no stage needs to list it")
    return problems


def check_file(root: Path, dvc_yaml: Path, modules: Mapping[str, Module], *, main: bool
               ) -> list[str]:
    """The problems of one pipeline file. Its paths are relative to its folder (an experiment's
    ``../../pipeline/x.py`` is the repository's ``pipeline/x.py``). In the top-level file a
    stage is named after its module (``ingest`` runs ``pipeline.stages.ingest``); an
    experiment's stages may run any stage module (``pretrain`` runs ``train-transformer``)."""
    root = Path(root)
    label = dvc_yaml.relative_to(root).as_posix() if dvc_yaml.is_relative_to(root) else str(
        dvc_yaml)
    stages = (yaml.safe_load(dvc_yaml.read_text(encoding="utf-8")) or {}).get("stages", {})
    base = dvc_yaml.parent.resolve()

    def in_repo(dep: str) -> str:
        full = Path(os.path.normpath(base / dep))
        return full.relative_to(root.resolve()).as_posix() if full.is_relative_to(
            root.resolve()) else dep

    problems = []
    run_by = stage_modules(stages, command_modules(root))
    for stage in stages:
        if stage not in run_by:
            problems.append(f"{label}: stage {stage!r} does not run a `symkit <command>`")
        elif main and run_by[stage] != f"pipeline.stages.{stage}":
            problems.append(f"{label}: stage {stage!r} runs {run_by[stage]}; a stage's module is "
                            f"pipeline.stages.{stage}")
    for stage, module in run_by.items():
        if module not in modules:
            continue
        needed = code_files(modules, closure(modules, module))
        deps = [in_repo(d) for d in _paths(_stage_spec(stages[stage]).get("deps"))]
        code_deps = [d for d in deps if _is_code_dep(d)]
        for f in sorted(needed):
            if not any(_covers(d, f) for d in code_deps):
                problems.append(f"{label}: stage {stage!r} runs {f} but does not list it under "
                                "deps (a change to it would not re-run the stage)")
        for d in code_deps:
            if not any(_covers(d, f) for f in needed):
                problems.append(f"{label}: stage {stage!r} lists {d} under deps but never "
                                "imports it (an edit there would re-run the stage for nothing)")
    problems += [f"{label}: {p}" for p in _order_problems(
        {k: _stage_spec(v) for k, v in stages.items()})]
    return problems


def _order_problems(stages: Mapping[str, Any]) -> list[str]:
    """Each stage must come after the stages that write the data it reads."""
    producer: dict[str, str] = {}
    for stage, spec in stages.items():
        for kind in ("outs", "metrics", "plots"):
            for out in _paths((spec or {}).get(kind)):
                producer[out] = stage
    order = {s: i for i, s in enumerate(stages)}
    problems = []
    for stage, spec in stages.items():
        for dep in _paths((spec or {}).get("deps")):
            maker = next((p for out, p in producer.items() if _covers(out, dep)), None)
            if maker is not None and maker != stage and order[maker] > order[stage]:
                problems.append(f"stage {stage!r} reads {dep} from {maker!r}, which is "
                                "listed after it; list stages in pipeline order")
    return problems


def expected_code_deps(root: Path, dvc_yaml: Path | None = None,
                       modules: Mapping[str, Module] | None = None) -> dict[str, list[str]]:
    """stage -> the code files its ``deps`` should list, as paths relative to the repository
    root (for ``--print`` and ``--write``); ``dvc_yaml`` defaults to the top-level file."""
    root = Path(root)
    dvc_yaml = dvc_yaml or root / "dvc.yaml"
    stages = (yaml.safe_load(dvc_yaml.read_text(encoding="utf-8")) or {}).get("stages", {})
    modules = modules or scan(root)
    run_by = stage_modules(stages, command_modules(root))
    return {s: sorted(code_files(modules, closure(modules, m))) for s, m in run_by.items()
            if m in modules}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def rewrite_code_deps(text: str, expected: Mapping[str, list[str]], prefix: str) -> str:
    """``text`` (a ``dvc.yaml``) with each stage's code deps replaced by ``expected[stage]``
    (repository paths, written as ``prefix + path``), sorted, at the place of the first code
    entry (the top of ``deps`` when there is none). Only those lines change."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    stage: str | None = None
    stage_indent = None
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            ind = _indent(line)
            if stage_indent is None and stripped == "stages:":
                stage_indent = ind + 2  # stage names sit one level below `stages:`
            elif stage_indent is not None and ind == stage_indent and stripped.endswith(":"):
                stage = stripped[:-1]
            elif stage_indent is not None and ind < stage_indent:
                stage = None
        if stage in expected and stripped == "deps:":
            out.append(line)
            deps_indent = _indent(line)
            block: list[str] = []
            i += 1
            while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")
                                      or _indent(lines[i]) > deps_indent):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():  # blank lines after the list stay after it
                i -= 1
                block.pop()
            item_indent = next((_indent(b) for b in block if b.lstrip().startswith("- ")),
                               deps_indent + 2)
            kept: list[str] = []
            at = None
            for b in block:
                entry = b.strip()[2:].strip() if b.lstrip().startswith("- ") else None
                if entry is not None and _is_code_dep(os.path.normpath(
                        entry[len(prefix):] if entry.startswith(prefix) else entry)):
                    at = len(kept) if at is None else at
                    continue
                kept.append(b)
            new = [f"{' ' * item_indent}- {prefix}{f}\n" for f in expected[stage]]
            at = 0 if at is None else at
            out.extend(kept[:at] + new + kept[at:])
            continue
        out.append(line)
        i += 1
    return "".join(out)


def write(root: Path) -> list[Path]:
    """Write each stage's code deps into ``dvc.yaml`` and every experiment's ``dvc.yaml``;
    returns the files that changed."""
    root = Path(root)
    modules = scan(root)
    changed = []
    for f in [root / "dvc.yaml", *experiment_files(root)]:
        prefix = os.path.relpath(root, f.parent)
        prefix = "" if prefix == "." else prefix + "/"
        text = f.read_text(encoding="utf-8")
        new = rewrite_code_deps(text, expected_code_deps(root, f, modules), prefix)
        if new != text:
            f.write_text(new, encoding="utf-8")
            changed.append(f)
    return changed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", type=Path, default=Path("."), help="repository root")
    parser.add_argument("--print", action="store_true", dest="show",
                        help="print the code each stage should list under deps")
    parser.add_argument("--write", action="store_true",
                        help="write each stage's code deps into dvc.yaml and every "
                             "experiment's dvc.yaml (data deps and comments are kept)")


def main(args: argparse.Namespace) -> int:
    if args.show:
        for stage, files in expected_code_deps(args.root).items():
            print(f"{stage}:")
            print("\n".join(f"  - {f}" for f in files))
        return 0
    if args.write:
        for f in write(args.root):
            print(f"check-deps: wrote {f}")
    problems = check(args.root)
    for p in problems:
        print(p, file=sys.stderr)
    print(f"check-deps: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    ns = argparse.ArgumentParser(prog="python -m pipeline.tools.check_deps")
    add_arguments(ns)
    sys.exit(main(ns.parse_args()))
