"""``symkit sweep``: the grid, validation before any run, and real sweeps on a tiny DVC project.

The tiny project (built once, copied per test) has one stage whose script writes
``reports/eval.json`` and ``reports/eval/per_piece.parquet`` with NLLs scaled by
``1 - fake.effect``; a negative effect makes the script exit 1. Its ``fake`` section is unknown
to symkit, so only DVC's key-existence check applies to it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.core.config import ParamsError
from pipeline.tools.sweep import (
    SweepArm,
    SweepError,
    check_sections,
    child_env,
    default_prefix,
    expand_grid,
    parse_set,
    validate,
)

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = '''\
"""Stand-in for `symkit evaluate`: per-piece NLLs that shrink by fake.effect."""
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from ruamel.yaml import YAML

cfg = YAML(typ="safe").load(Path("params.yaml").read_text())["fake"]
if cfg["effect"] < 0:
    print(f"fake_eval: effect {cfg['effect']} < 0 is not allowed", file=sys.stderr)
    sys.exit(1)
n = 40
rows = {"sha256": [f"{i:064x}" for i in range(n)], "split": ["val"] * n,
        "model": ["transformer"] * n, "seed": [cfg["seed"]] * n,
        "group_id": [f"g{i // 2}" for i in range(n)], "n_tokens": [100 + i for i in range(n)],
        "n_notes": [50 + i for i in range(n)], "duration_s": [10.0 + i for i in range(n)]}
rows["nll_nats"] = [notes * (2.0 + ((i * 37) % 11) / 11) * (1 - cfg["effect"])
                    for i, notes in enumerate(rows["n_notes"])]
Path("reports/eval").mkdir(parents=True, exist_ok=True)
pq.write_table(pa.table(rows), "reports/eval/per_piece.parquet")
protocol = {"split_hash": "s" * 64, "tokenizer_hash": "t" * 64, "transformer_stride": 64,
            "bootstrap": {"n_boot": 100, "seed": 0}}
Path("reports/eval.json").write_text(json.dumps({"protocol": protocol}, sort_keys=True))
'''
DVC_YAML = """\
stages:
  evaluate:
    cmd: python fake_eval.py
    deps: [fake_eval.py]
    params: [fake]
    outs:
      - reports/eval.json: {cache: false}
      - reports/eval/per_piece.parquet: {cache: false}
"""
PARAMS = "fake:\n  effect: 0.0\n  seed: 1\n"


def sh(args: list[str], cwd: Path) -> str:
    """Run a command in ``cwd`` with the sweep's child environment; its stdout."""
    done = subprocess.run(args, cwd=cwd, env=child_env(), capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    return done.stdout.strip()


def git(repo: Path, *args: str) -> str:
    return sh(["git", *args], repo)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """The tiny project, committed with its evaluated baseline."""
    repo = tmp_path_factory.mktemp("sweep") / "template"
    repo.mkdir()
    (repo / "fake_eval.py").write_text(SCRIPT)
    (repo / "dvc.yaml").write_text(DVC_YAML)
    (repo / "params.yaml").write_text(PARAMS)
    git(repo, "init", "-q")
    git(repo, "config", "user.name", "sweep test")
    git(repo, "config", "user.email", "sweep@test")
    dvc = [sys.executable, "-m", "dvc"]
    sh([*dvc, "init", "-q"], repo)
    sh([*dvc, "config", "core.analytics", "false"], repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "project")
    sh([*dvc, "repro", "-q"], repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "baseline results")
    return repo


@pytest.fixture
def project(template: Path, tmp_path: Path, monkeypatch) -> Path:
    """A fresh copy of the tiny project as the current directory."""
    repo = shutil.copytree(template, tmp_path / "project", symlinks=True)
    monkeypatch.chdir(repo)
    return repo


def exp_names(repo: Path) -> list[str]:
    refs = git(repo, "for-each-ref", "--format=%(refname)", "refs/exps").split()
    return sorted(r.rsplit("/", 1)[-1] for r in refs if r.count("/") >= 4)


# ---- 1. the grid ------------------------------------------------------------------------------
def test_the_grid_is_the_product_in_order_with_lists_and_quoted_commas_kept():
    arms = expand_grid(["a.x=1,2", "b.y=[3,5],[8]", "c.z='u,v'"], "p")
    assert [a.name for a in arms] == ["p-1", "p-2", "p-3", "p-4"]
    assert [a.overrides for a in arms] == [
        ("a.x=1", "b.y=[3,5]", "c.z='u,v'"),
        ("a.x=1", "b.y=[8]", "c.z='u,v'"),
        ("a.x=2", "b.y=[3,5]", "c.z='u,v'"),
        ("a.x=2", "b.y=[8]", "c.z='u,v'"),
    ]
    assert expand_grid(["a.x=1,2"], "p") == [SweepArm("p-1", ("a.x=1",)),
                                             SweepArm("p-2", ("a.x=2",))]


@pytest.mark.parametrize(("text", "key", "values"), [
    ("ngram.smoothing=kneser_ney,add_k", "ngram.smoothing", ["kneser_ney", "add_k"]),
    ("ngram.orders=[3,5],[8]", "ngram.orders", ["[3,5]", "[8]"]),
    ("a.b='x,y',z", "a.b", ["'x,y'", "z"]),
    ("a.b=range(1,4)", "a.b", ["1", "2", "3"]),
    ("+a.new=1,2", "+a.new", ["1", "2"]),
    ("a.b=0.001", "a.b", ["0.001"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_values_are_split_as_dvc_splits_them(text, key, values):
    assert parse_set(text) == (key, values)


@pytest.mark.parametrize(("sets", "prefix", "words"), [
    (["a.x=1", "a.x=2"], "p", "more than once"),
    (["other.yaml:a.x=1,2"], "p", "params.yaml only"),
    (["~a.x"], "p", "deleting a key"),
    (["a.x=interval(0,1)"], "p", "interval"),
    (["a.x=1,,2"], "p", "not an override"),
    ([], "p", "at least one"),
    (["a.x=1"], "bad/name", "--name"),
])
def test_a_bad_grid_is_refused(sets, prefix, words):
    with pytest.raises(SweepError, match=words):
        expand_grid(sets, prefix)


def test_default_prefix_names_the_keys_and_the_commit():
    assert default_prefix(["ngram.smoothing=a,b", "+x.y_z=1"], "f412521abc") == \
        "smoothing-y_z-f412521"


def test_children_find_this_venv_first_and_send_no_analytics():
    env = child_env({"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "4"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["PATH"].endswith("/usr/bin:/bin")
    assert env["DVC_NO_ANALYTICS"] == "1" and env["OMP_NUM_THREADS"] == "4"


# ---- 2. validation before anything runs ----------------------------------------------------
def test_bad_values_are_named_against_the_real_schema(tmp_path):
    params = tmp_path / "params.yaml"
    shutil.copyfile(ROOT / "params.yaml", params)
    arms = expand_grid(["ngram.smoothing=add_k,bogus", "ngram.k=0.5"], "p")
    with pytest.raises(ParamsError) as e:
        validate(params, arms)
    lines = str(e.value).splitlines()
    assert len(lines) == 2 and lines[-1] == "Nothing was run."
    assert lines[0].startswith("arm p-2 (ngram.smoothing=bogus ngram.k=0.5): ngram.smoothing = "
                               "'bogus': Input should be 'kneser_ney'")
    same = validate(params, expand_grid(["ngram.smoothing=kneser_ney,add_k"], "p"))
    assert same == {"p-1": True, "p-2": False}


def test_a_key_that_does_not_exist_is_refused_unless_added(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(PARAMS)
    with pytest.raises(ParamsError, match=r"arm p-1: -S fake\.nokey=1: .*\+fake\.nokey=1"):
        validate(params, expand_grid(["fake.nokey=1"], "p"))
    assert validate(params, expand_grid(["+fake.nokey=1"], "p")) == {"p-1": False}


def test_unknown_sections_are_not_checked_but_known_ones_are():
    assert check_sections({"fake": {"anything": 1}}, "src") == []
    problems = check_sections({"fake": {}, "ngram": {"k": "1"}}, "src")
    assert len(problems) == 1 and problems[0].startswith("src: ngram.k = '1'")


def test_bad_params_stop_the_sweep_before_any_experiment(project, capsys):
    assert main(["sweep", "-S", "fake.effect=0.1", "-S", "fake.nokey=1,2"]) == 2
    err = capsys.readouterr().err
    assert "invalid parameters" in err and "-S fake.nokey=1" in err and "-S fake.nokey=2" in err
    assert exp_names(project) == [] and not (project / "reports" / "sweep").exists()


# ---- 5. and 6. refusals and dry runs -----------------------------------------------------------
def test_uncommitted_params_are_refused(project, capsys):
    (project / "params.yaml").write_text(PARAMS.replace("seed: 1", "seed: 2"))
    assert main(["sweep", "-S", "fake.effect=0.1,0.2"]) == 2
    err = capsys.readouterr().err
    assert "uncommitted changes to params.yaml" in err and "git stash" in err
    assert exp_names(project) == []


def test_an_uncommitted_comparison_registration_is_refused(project, capsys):
    """Arms run from a registration that HEAD lacks would look registered before their run."""
    reg = project / "reports" / "preregistration_compare.json"
    reg.write_text("{}")
    assert main(["sweep", "-S", "fake.effect=0.1,0.2"]) == 2
    err = capsys.readouterr().err
    assert "uncommitted changes to reports/preregistration_compare.json" in err
    assert exp_names(project) == []


def test_jobs_above_one_and_unknown_targets_are_refused(project, capsys):
    assert main(["sweep", "-S", "fake.effect=0.1", "--jobs", "2"]) == 2
    assert "one at a time" in capsys.readouterr().err
    assert main(["sweep", "-S", "fake.effect=0.1", "--target", "train"]) == 2
    assert "not a stage of dvc.yaml (stages: evaluate)" in capsys.readouterr().err


def test_dry_run_prints_the_plan_and_runs_nothing(project, capsys):
    status = git(project, "status", "--porcelain")
    assert main(["sweep", "-S", "fake.effect=0.0,0.05", "-S", "fake.seed=1",
                 "--name", "dry", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry-1: fake.effect=0.0 fake.seed=1  (same params as HEAD)" in out
    assert ("dvc exp run --temp --name dry-2 -S fake.effect=0.05 -S fake.seed=1 evaluate"
            in out)
    assert "symkit compare HEAD dry-1 dry-2 --out reports/sweep/dry" in out
    assert exp_names(project) == [] and git(project, "status", "--porcelain") == status
    assert not (project / "reports" / "sweep").exists()


# ---- 3. and 4. real sweeps ----------------------------------------------------------------------
def test_a_sweep_runs_every_arm_and_compares_them_with_head(project, tmp_path, capsys):
    params, status = (project / "params.yaml").read_bytes(), git(project, "status", "--porcelain")
    out = tmp_path / "out"
    assert main(["sweep", "-S", "fake.effect=0.0,0.05", "--name", "fx", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert exp_names(project) == ["fx-1", "fx-2"]
    assert (project / "params.yaml").read_bytes() == params
    assert git(project, "status", "--porcelain") == status
    record = json.loads((out / "sweep.json").read_text())
    assert [(a["name"], a["overrides"], a["status"]) for a in record["arms"]] == [
        ("fx-1", ["fake.effect=0.0"], "finished"), ("fx-2", ["fake.effect=0.05"], "finished")]
    result = json.loads((out / "compare.json").read_text())
    assert [a["label"] for a in result["arms"]] == ["HEAD", "fx-1", "fx-2"]
    same, better = (c["metrics"]["nats_per_note"] for c in result["comparisons"])
    assert same["diff"]["value"] == 0 and better["conclusion"] == "arm_lower"
    assert better["rel_improvement"]["value"] == pytest.approx(0.05)
    assert f"symkit compare HEAD fx-1 fx-2 --out {out.as_posix()}" in stdout
    assert (out / "logs" / "fx-2.log").read_text().count("Running stage 'evaluate'") == 1
    # the same names again are refused before anything runs
    assert main(["sweep", "-S", "fake.effect=0.0,0.05", "--name", "fx", "--out", str(out)]) == 2
    assert "experiment fx-1, fx-2 already exists" in capsys.readouterr().err


def test_a_failed_arm_is_reported_and_the_others_compared(project, capsys):
    assert main(["sweep", "-S", "fake.effect=-1,0.05", "--name", "bad"]) == 1
    captured = capsys.readouterr()
    out = project / "reports" / "sweep" / "bad"
    record = json.loads((out / "sweep.json").read_text())
    failed, ok = record["arms"]
    assert (failed["status"], ok["status"]) == ("failed", "finished")
    assert failed["exit_code"] != 0 and failed["ref"] is None
    assert any("effect -1 < 0 is not allowed" in line for line in failed["log_tail"])
    assert record["compare"]["arms"] == ["bad-2"] and record["compare"]["failed_arms"] == ["bad-1"]
    assert "1 arm failed: bad-1" in captured.out and "effect -1 < 0" in captured.err
    result = json.loads((out / "compare.json").read_text())
    assert [a["label"] for a in result["arms"]] == ["HEAD", "bad-2"]
    assert exp_names(project) == ["bad-2"]
