"""pipeline.decision.bound_code: the code a registration binds, and what a change names."""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.decision.bound_code import PARTS, bound_code, bound_files, changes, judging_digest

ROOT = Path(__file__).resolve().parents[2]


def test_the_parts_bind_the_judging_closure_the_recipe_and_the_stopping_rule():
    files = bound_files()
    assert set(files) == set(PARTS)
    assert {"pipeline/stages/evaluate.py", "pipeline/audit/judging.py",
            "pipeline/decision/criteria.py", "pipeline/decision/metrics.py",
            "pipeline/decision/criteria_controls.py"} <= set(files["judging"])
    assert "pipeline/training/loop.py" in files["recipe"]
    assert "pipeline/training/loop.py::_track_best" in files["stopping"]
    code = bound_code()
    assert all(isinstance(d, str) and len(d) == 64 for part in code.values() for d in part.values())


def test_a_judging_edit_is_named_and_a_docstring_edit_is_not(tmp_path):
    for pkg in ("pipeline", "models"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = bound_code(tmp_path)
    assert before == bound_code()
    metrics = tmp_path / "pipeline" / "decision" / "metrics.py"
    text = metrics.read_text()
    metrics.write_text(text.replace('"""The flat metrics', '"""Reworded: the flat metrics', 1))
    assert changes(before, bound_code(tmp_path)) == []
    # judge the gain on the groups-only interval: the two-line change a look could suggest
    metrics.write_text(text.replace(
        '"eval.paired.ngram_minus_transformer.test.rel_improvement", interval=True',
        '"eval.paired.ngram_minus_transformer.test.rel_improvement.groups", interval=True'))
    after = bound_code(tmp_path)
    assert changes(before, after) == ["judging: pipeline/decision/metrics.py changed"]
    assert judging_digest(after) != judging_digest(before)
    loop = tmp_path / "pipeline" / "training" / "loop.py"
    loop.write_text(loop.read_text().replace("state.evals_since_best >= patience",
                                             "state.evals_since_best > patience"))
    said = changes(before, bound_code(tmp_path))
    assert "stopping: pipeline/training/loop.py::_track_best changed" in said
    assert any(s.startswith("recipe: ") and "pipeline/training/loop.py changed" in s
               for s in said)
