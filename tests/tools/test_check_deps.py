"""pipeline.tools.check_deps: dvc.yaml lists exactly the code each stage runs, in pipeline order,
and ``--write`` puts it there. Each rule is shown to fail on a deliberately broken copy (the
layering rules are import-linter's: tests/test_layers.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.tools.check_deps import (
    check,
    closure,
    command_modules,
    expected_code_deps,
    experiment_files,
    scan,
    stage_modules,
    write,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def copy(tmp_path: Path) -> Path:
    """The repository's code and dvc.yaml, to break on purpose."""
    for pkg in ("pipeline", "models"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    for f in experiment_files(ROOT):
        dest = tmp_path / f.relative_to(ROOT)
        dest.parent.mkdir(parents=True)
        shutil.copy(f, dest)
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_repository_passes() -> None:
    assert check(ROOT) == []


def test_stage_modules_map_one_to_one_to_dvc_stages() -> None:
    """Every stage module is a stage of the top-level pipeline or runs in an experiment's."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    modules = {p.stem for p in (ROOT / "pipeline" / "stages").glob("*.py")} - {"__init__"}
    commands = command_modules(ROOT)
    in_experiments = set()
    for f in experiment_files(ROOT):
        exp = yaml.safe_load(f.read_text(encoding="utf-8"))["stages"]
        assert set(stage_modules(exp, commands)) == set(exp), f  # every stage runs symkit
        in_experiments |= {m.rsplit(".", 1)[1] for m in stage_modules(exp, commands).values()}
    assert experiment_files(ROOT), "the adaptation experiment's pipeline is checked"
    assert modules == set(stages) | in_experiments
    assert not (in_experiments - modules)
    assert set(expected_code_deps(ROOT)) == set(stages)


def test_an_experiment_stage_missing_a_dep_is_named(copy: Path) -> None:
    """Experiment paths are relative to their folder; foreach stages and commands behind an
    environment setting (``NAME=value symkit ...``) are checked like the others."""
    f = copy / "experiments" / "adaptation" / "dvc.yaml"
    _edit(f, "        - ../../pipeline/core/memory.py\n", "")
    problems = check(copy)
    assert len(problems) == 1, problems
    assert problems[0].startswith("experiments/adaptation/dvc.yaml: stage 'adapt_train'")
    assert "pipeline/core/memory.py" in problems[0] and "does not list it" in problems[0]


def test_an_experiment_stage_listing_unused_code_is_named(copy: Path) -> None:
    f = copy / "experiments" / "adaptation" / "dvc.yaml"
    _edit(f, "      - ../../pipeline/stages/split.py\n",
          "      - ../../pipeline/stages/split.py\n      - ../../pipeline/stages/ingest.py\n")
    problems = check(copy)
    assert len(problems) == 1, problems
    assert "'split'" in problems[0] and "pipeline/stages/ingest.py" in problems[0]
    assert "never imports" in problems[0]


def test_a_removed_dep_is_named(copy: Path) -> None:
    kept = "      - pipeline/render/figures.py\n"
    _edit(copy / "dvc.yaml", "      - pipeline/core/splits.py\n" + kept, kept)
    problems = check(copy)
    assert len(problems) == 1, problems
    assert "'split'" in problems[0] and "pipeline/core/splits.py" in problems[0]
    assert "does not list it" in problems[0]


def test_a_dep_on_code_the_stage_never_runs_is_named(copy: Path) -> None:
    _edit(copy / "dvc.yaml", "      - pipeline/stages/train_ngram.py\n",
          "      - pipeline/stages/train_ngram.py\n      - pipeline/stages/evaluate.py\n")
    problems = check(copy)
    assert problems == [p for p in problems if "'train_ngram'" in p] and len(problems) == 1
    assert "pipeline/stages/evaluate.py" in problems[0] and "never imports" in problems[0]


def test_stages_out_of_pipeline_order_are_named(copy: Path) -> None:
    text = (copy / "dvc.yaml").read_text(encoding="utf-8")
    stages, top_level, after = text.partition("\nplots:\n")  # top-level plots follow the stages
    head, _, rest = stages.partition("  tokenize:\n")
    tokenize, _, tail = rest.partition("  train_ngram:\n")
    (copy / "dvc.yaml").write_text(f"{head}  train_ngram:\n{tail.rstrip()}\n\n"
                                   f"  tokenize:\n{tokenize.rstrip()}\n{top_level}{after}",
                                   encoding="utf-8")
    problems = check(copy)
    assert problems and all("listed after it" in p for p in problems), problems
    assert any("'train_ngram' reads data/tokens" in p and "'tokenize'" in p for p in problems)


def test_package_init_with_code_is_refused(copy: Path) -> None:
    init = copy / "pipeline" / "music" / "__init__.py"
    init.write_text(init.read_text(encoding="utf-8")
                    + "from pipeline.music.parsing import parse_midi\n", encoding="utf-8")
    problems = check(copy)
    assert any(p.startswith("pipeline/music/__init__.py: a package __init__") for p in problems)


def test_scan_sees_every_import_form(tmp_path: Path) -> None:
    pkg = tmp_path / "pipeline"
    (pkg / "sub").mkdir(parents=True)
    for f in ("__init__.py", "sub/__init__.py"):
        (pkg / f).write_text('"""doc"""\n')
    (pkg / "a.py").write_text("X = 1\n")
    (pkg / "b.py").write_text("def f():\n    import pipeline.a\n")
    (pkg / "c.py").write_text("from pipeline import a\n")
    (pkg / "d.py").write_text("from pipeline.a import X\nfrom . import c\n")
    (pkg / "sub" / "e.py").write_text("from ..d import X\nimport numpy\n")
    (tmp_path / "models").mkdir()
    mods = scan(tmp_path)
    assert mods["pipeline.b"].imports == {"pipeline.a"}
    assert mods["pipeline.c"].imports == {"pipeline", "pipeline.a"}
    assert mods["pipeline.d"].imports == {"pipeline", "pipeline.a", "pipeline.c"}
    assert mods["pipeline.sub.e"].imports == {"pipeline.d"}
    assert closure(mods, "pipeline.sub.e") == {"pipeline.sub.e", "pipeline", "pipeline.d",
                                               "pipeline.a", "pipeline.c"}



def test_write_regenerates_both_pipelines_byte_for_byte(copy: Path) -> None:
    files = [copy / "dvc.yaml", *experiment_files(copy)]
    before = [f.read_bytes() for f in files]
    assert write(copy) == []
    assert [f.read_bytes() for f in files] == before


def test_write_mends_stale_code_deps_and_keeps_the_rest(copy: Path) -> None:
    """A missing entry, an entry the stage never runs and a shuffled order are mended in both
    files; data deps, comments and the other lines keep their bytes."""
    top, exp = copy / "dvc.yaml", copy / "experiments" / "adaptation" / "dvc.yaml"
    committed = {f: f.read_text(encoding="utf-8") for f in (top, exp)}
    _edit(top, "      - pipeline/core/splits.py\n      - pipeline/render/figures.py\n",
          "      - pipeline/render/figures.py\n      # a note kept where it is\n")
    _edit(top, "      - pipeline/stages/train_ngram.py\n",
          "      - pipeline/stages/evaluate.py\n      - pipeline/stages/train_ngram.py\n")
    _edit(exp, "        - ../../pipeline/core/memory.py\n", "")
    assert len(check(copy)) == 3
    assert write(copy) == [top, exp]
    assert check(copy) == []
    assert exp.read_text(encoding="utf-8") == committed[exp]
    assert top.read_text(encoding="utf-8") == committed[top].replace(
        "      - pipeline/stages/split.py\n",
        "      - pipeline/stages/split.py\n      # a note kept where it is\n", 1)
