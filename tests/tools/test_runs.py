"""The reader of an evaluated run (pipeline.tools.runs): where a run comes from (a directory,
``workspace``, a git revision, a DVC experiment), its files read the same from each, the errors
that name a missing or unreadable file, and the training logs behind compare's learning curves.

Runs are built in ``tmp_path`` from tests/tools/test_compare.py's synthetic per-piece scores.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipeline.core.artifacts import ArtifactError
from pipeline.core.config import ParamsError
from pipeline.tools.runs import (
    EVAL,
    PARAMS,
    PER_PIECE,
    TRAIN,
    Gate,
    RunSource,
    RunSourceError,
    params_section,
    read_curves,
    read_run,
    relative_name,
    resolve_source,
    with_test_rows,
)
from tests.tools.test_compare import PARAMS as PARAM_VALUES
from tests.tools.test_compare import log_text, simulate, write_arm, write_logs


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=x", "-c", "user.email=x@y",
                           "-c", "commit.gpgsign=false", *args], cwd=repo, check=True,
                          capture_output=True, text=True)
    return done.stdout.strip()


@pytest.fixture
def rows() -> pd.DataFrame:
    """One run's per-piece rows: 3 training seeds, 8 groups of 2 val pieces."""
    a, _ = simulate(np.random.default_rng(21), 0.0, n_groups=8, per_group=2, seeds=(1, 2, 3),
                    seed_sd=0.01)
    return a


@pytest.fixture
def repo(tmp_path: Path, monkeypatch, rows: pd.DataFrame) -> Path:
    """A git repository whose one commit holds a run (with train.json), and the current
    directory; its working tree is then changed, which a revision must never read."""
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    write_arm(root, rows)
    (root / TRAIN).write_text(json.dumps({"config_hash": "c0ffee"}))
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "a run")
    _git(root, "tag", "v1")
    (root / EVAL).write_text("not json")
    monkeypatch.chdir(root)
    return root


# ---- where a run comes from -----------------------------------------------------------------
def test_a_revision_is_resolved_to_its_commit(repo):
    head = _git(repo, "rev-parse", "HEAD")
    for name in ("HEAD", "v1", head[:10], _git(repo, "branch", "--show-current")):
        src = resolve_source(name)
        assert (src.name, src.kind, src.commit, src.ref, src.root) == (name, "git", head, None,
                                                                        None)


def test_an_existing_directory_wins_over_a_revision_and_workspace_is_here(repo, rows):
    write_arm(repo / "HEAD", rows)
    assert resolve_source("HEAD") == RunSource("HEAD", "directory", root=Path("HEAD"))
    assert resolve_source("workspace") == RunSource("workspace", "directory", root=Path("."))


def test_a_directory_is_named_by_its_normalised_relative_path(repo, rows):
    write_arm(repo / "runs" / "a", rows)
    (repo / "runs" / "b").mkdir()
    for given in ("runs/a", "./runs//a/", "runs/b/../a", str(repo / "runs" / "a")):
        src = resolve_source(given)
        assert (src.name, src.kind, src.root) == ("runs/a", "directory", Path(given))
        assert src.where(EVAL) == f"runs/a/{EVAL}"
    assert relative_name(str(repo.parent)) == ".." and relative_name(".") == "."
    assert relative_name(str(repo.parent / "elsewhere" / "x")) == "../elsewhere/x"
    assert read_run(resolve_source(str(repo / "runs" / "a")), "a").source.name == "runs/a"


def test_a_dvc_experiment_is_found_by_its_name_under_any_commit(repo):
    head = _git(repo, "rev-parse", "HEAD")
    _git(repo, "update-ref", "refs/exps/ab/cdef0123/my-exp", head)
    _git(repo, "update-ref", "refs/exps/exec/EXEC_BRANCH/other", head)  # DVC's own, ignored
    src = resolve_source("my-exp")
    assert (src.kind, src.commit, src.ref) == ("git", head, "refs/exps/ab/cdef0123/my-exp")
    with pytest.raises(RunSourceError, match="no DVC experiment named 'other'"):
        resolve_source("other")
    _git(repo, "update-ref", "refs/exps/12/3456789a/my-exp", head)
    with pytest.raises(RunSourceError, match="ambiguous: DVC experiments refs/exps/12/"
                                             "3456789a/my-exp, refs/exps/ab/cdef0123/my-exp"):
        resolve_source("my-exp")


def test_an_unknown_name_lists_every_try(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a git repository
    with pytest.raises(RunSourceError) as e:
        resolve_source("nowhere")
    msg = str(e.value)
    assert msg.startswith("cannot find arm 'nowhere': no directory 'nowhere'; not a git revision")
    assert "no DVC experiment named 'nowhere' under refs/exps" in msg
    assert f"Give a directory holding {PARAMS} and {EVAL}" in msg


def test_without_git_a_name_is_not_a_revision(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(RunSourceError, match="git: command not found"):
        resolve_source("HEAD")


# ---- a run's files ----------------------------------------------------------------------------
def test_a_revision_reads_the_commit_never_the_working_tree(repo):
    committed = _git(repo, "show", f"HEAD:{EVAL}").encode()
    src = resolve_source("HEAD")
    assert src.read(EVAL) == committed and (repo / EVAL).read_bytes() == b"not json"
    assert src.read("reports/absent.json") is None
    assert src.listdir("reports") == ["eval", "eval.json", "train.json"]
    assert src.listdir("reports/absent") == []
    assert src.where(EVAL) == f"HEAD:{EVAL} (commit {src.commit[:12]})"
    folder = RunSource("runs/a", "directory", root=repo)
    assert folder.read(EVAL) == b"not json" and folder.read("reports/absent.json") is None
    assert folder.listdir("reports") == ["eval", "eval.json", "train.json"]
    assert folder.listdir("reports/absent") == []
    assert folder.where(EVAL) == f"runs/a/{EVAL}"


def test_a_run_reads_the_same_from_a_folder_and_from_a_commit(repo, rows):
    from_git = read_run(resolve_source("HEAD"), "committed")
    _git(repo, "checkout", "-q", "--", EVAL)
    from_dir = read_run(resolve_source("workspace"), "here")
    assert (from_git.label, from_dir.label) == ("committed", "here")
    assert from_git.params == from_dir.params == PARAM_VALUES
    assert from_git.eval == from_dir.eval and from_git.protocol["split_hash"] == "5" * 64
    assert from_git.train == from_dir.train == {"config_hash": "c0ffee"}
    assert from_git.registration is None and from_dir.registration is None
    pd.testing.assert_frame_equal(from_git.per_piece, from_dir.per_piece)
    assert list(from_git.per_piece.columns) == ["sha256", "split", "model", "group_id",
                                                "nll_nats", "n_tokens", "n_notes",
                                                "duration_s", "seed"]
    assert sorted(from_git.per_piece["seed"].unique()) == [1, 2, 3]
    assert len(from_git.per_piece) == len(rows)


def test_results_without_training_seeds_get_a_null_seed(tmp_path, rows):
    write_arm(tmp_path, rows.drop_duplicates("sha256"))
    path = tmp_path / PER_PIECE
    pq.write_table(pq.read_table(path).drop(["seed"]), path)
    run = read_run(RunSource("old", "directory", root=tmp_path), "old")
    assert str(run.per_piece["seed"].dtype) == "Int64" and run.per_piece["seed"].isna().all()


def test_test_rows_are_read_only_through_the_gate_which_records_the_look(tmp_path, rows):
    from pipeline.decision import ledger

    write_arm(tmp_path, pd.concat([rows, rows.assign(split="test")], ignore_index=True))
    src = RunSource("x", "directory", root=tmp_path)
    sealed = read_run(src, "x")
    assert set(sealed.per_piece["split"]) == {"val"}  # no gate: no test row
    path = tmp_path / "ledger.jsonl"
    gated = with_test_rows(sealed, Gate("compare", path, None))
    assert (gated.per_piece["split"] == "test").sum() == len(rows)
    (look,) = ledger.read(path)
    assert look["command"] == "compare" and look["pieces"] == sorted(set(rows["sha256"]))
    assert read_run(src, "x", Gate("compare", path, None)).per_piece.equals(gated.per_piece)
    assert len(ledger.read(path)) == 1  # the same rows again: the same look


def test_an_eval_without_protocol_has_an_empty_one(tmp_path, rows):
    write_arm(tmp_path, rows)
    (tmp_path / EVAL).write_text("{}")
    assert read_run(RunSource("x", "directory", root=tmp_path), "x").protocol == {}


@pytest.mark.parametrize("kind", ["directory", "git"])
@pytest.mark.parametrize("broken", [PARAMS, EVAL, PER_PIECE], ids=lambda p: Path(p).name)
def test_a_missing_file_is_named(tmp_path, monkeypatch, rows, kind, broken):
    write_arm(tmp_path, rows)
    (tmp_path / broken).unlink()
    monkeypatch.chdir(tmp_path)
    if kind == "git":
        _git(tmp_path, "init", "-q")
        _git(tmp_path, "add", "-A")
        _git(tmp_path, "commit", "-q", "-m", "incomplete")
    src = resolve_source("workspace" if kind == "directory" else "HEAD")
    error = ParamsError if broken == PARAMS and kind == "directory" else ArtifactError
    with pytest.raises(error, match=Path(broken).name.replace(".", r"\.")):
        read_run(src, "x")


def test_unreadable_files_in_a_commit_are_named(repo, rows):
    def commit(rel: str, data: bytes) -> RunSource:
        (repo / rel).write_bytes(data)
        _git(repo, "commit", "-q", "-am", f"break {rel}")
        return resolve_source("HEAD")

    good = {rel: (repo / rel).read_bytes() for rel in (PARAMS, PER_PIECE)}
    good[EVAL] = _git(repo, "show", f"HEAD:{EVAL}").encode()
    for rel, data, error, words in [
            (EVAL, b"{not json", ArtifactError, "is not a readable JSON file"),
            (EVAL, b"[1, 2]", ArtifactError, "is not a JSON object"),
            (PER_PIECE, b"PAR1 truncated", ArtifactError, "is not a readable Parquet file"),
            (PARAMS, b"a: [b", ParamsError, "not valid YAML"),
            (PARAMS, b"- a list", ParamsError, "top level must be a mapping of sections"),
            (TRAIN, b"{not json", ArtifactError, "is not a readable JSON file")]:
        src = commit(rel, data)
        with pytest.raises(error, match=words) as e:
            read_run(src, "x")
        assert f"HEAD:{rel}" in str(e.value)
        commit(rel, good.get(rel, b"{}"))
    assert read_run(resolve_source("HEAD"), "x").train == {}


def test_a_per_piece_table_without_a_column_is_refused(tmp_path, rows):
    write_arm(tmp_path, rows)
    path = tmp_path / PER_PIECE
    pq.write_table(pq.read_table(path).drop(["duration_s"]), path)
    with pytest.raises(ArtifactError, match="has no column 'duration_s'"):
        read_run(RunSource("x", "directory", root=tmp_path), "x")


def test_train_json_that_is_not_an_object_is_left_out(tmp_path, rows):
    write_arm(tmp_path, rows)
    (tmp_path / TRAIN).write_text("[1]")
    (tmp_path / "reports" / "preregistration_compare.json").write_text('{"rules": []}')
    run = read_run(RunSource("x", "directory", root=tmp_path), "x")
    assert run.train is None and run.registration == {"rules": []}


@pytest.mark.parametrize("kind", ["directory", "git"])
def test_one_params_section_is_read_as_written(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    if kind == "git":
        _git(tmp_path, "init", "-q")

    def source(text: str | None) -> RunSource:
        path = tmp_path / PARAMS
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)
        if kind == "directory":
            return RunSource(".", "directory", root=tmp_path)
        _git(tmp_path, "add", "-A")
        _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "params")
        return resolve_source("HEAD")

    src = source("compare:\n  n_boot: 10\n  rules: []\nmine: {a: 1}\n")
    assert params_section(src, "compare") == {"n_boot": 10, "rules": []}
    assert params_section(src, "mine") == {"a": 1}  # not refused: only a section is read
    assert params_section(src, "ngram") is None
    assert params_section(source("- a list\n"), "compare") is None
    assert params_section(source(None), "compare") is None
    with pytest.raises(ParamsError, match=r"params\.yaml.*: not valid YAML"):
        params_section(source("compare: [x"), "compare")


# ---- training logs ----------------------------------------------------------------------------
def test_curves_come_per_seed_in_seed_order(tmp_path):
    write_logs(tmp_path, {"10": 3.8, "2": 3.85})
    (tmp_path / "reports" / "plots" / "train_log" / "seed-3.tsv").write_text("step\tloss\n1\t2\n")
    (tmp_path / "reports" / "plots" / "train_log" / "notes.txt").write_text("not a log")
    curves = read_curves(RunSource("run", "directory", root=tmp_path))
    assert list(curves.seeds) == ["seed 2", "seed 10"]
    step, val = curves.seeds["seed 2"]
    assert step.tolist() == [50, 100, 150, 200]
    assert val[-1] == pytest.approx(3.85 + 3 / 200 ** 0.5 + 0.05, abs=1e-5)
    assert curves.notes == ("run/reports/plots/train_log/seed-3.tsv left out: no step or "
                            "val_loss column",)


def test_curves_of_older_runs_come_from_the_single_log(tmp_path):
    write_logs(tmp_path, {"": 3.9})
    curves = read_curves(RunSource("old", "directory", root=tmp_path))
    assert list(curves.seeds) == ["train_log.tsv"] and curves.missing is None


@pytest.mark.parametrize("text, why", [
    ("step\ttrain_loss\tval_loss\n1\t2.0\t\n", "no val_loss value"),
    ("\x00\x01", "no step or val_loss column"),
], ids=["no value", "binary"])
def test_an_unusable_log_is_a_note(tmp_path, text, why):
    write_logs(tmp_path, {"1": 3.9})
    (tmp_path / "reports" / "plots" / "train_log" / "seed-1.tsv").write_text(text)
    curves = read_curves(RunSource("r", "directory", root=tmp_path))
    assert not curves.seeds and curves.notes[0].endswith(f"left out: {why}")


def test_a_run_without_logs_says_which_were_looked_for(tmp_path):
    curves = read_curves(RunSource("r", "directory", root=tmp_path))
    assert not curves.seeds and curves.missing == (
        "reports/plots/train_log/seed-<s>.tsv or reports/plots/train_log.tsv")


def test_curves_from_a_commit_ignore_the_working_tree(repo):
    write_logs(repo, {"1": 3.8})
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "logs")
    (repo / "reports" / "plots" / "train_log" / "seed-1.tsv").write_text(log_text(9.0))
    committed = read_curves(resolve_source("HEAD")).seeds["seed 1"][1][-1]
    here = read_curves(resolve_source("workspace")).seeds["seed 1"][1][-1]
    assert committed < 4.1 < 9.0 < here

