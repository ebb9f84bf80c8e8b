"""What git history shows (pipeline.decision.trail), and the attacks on a registration it
catches: each test plants one and checks the report reads DEVIATED, UNVERIFIED, or names what
came before. The experiments are the small stage outputs of ``tests.stages.test_report``, in a
git repository made for the test; ``symkit report`` runs as a command, so it scans history
itself."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main as cli
from pipeline.core import artifacts
from pipeline.decision import bound_code, ledger, trail
from pipeline.decision.preregistration import Evidence, check, identity
from pipeline.tools.preregister import amend_registration
from tests.decision.test_ledger import git, per_piece
from tests.stages.test_report import make_inputs, register, report, write_params

ROOT = Path(__file__).resolve().parents[2]


def test_contained_is_an_ordered_subsequence():
    assert trail.contained(["a", "c"], ["a", "b", "c"])
    assert trail.contained([], ["a"])
    assert not trail.contained(["c", "a"], ["a", "b", "c"])
    assert not trail.contained(["a", "x"], ["a", "b"])


@pytest.fixture()
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    return tmp_path


def commit(root: Path, message: str) -> str:
    git(root, "add", "-A")
    git(root, "commit", "-qm", message)
    return git(root, "rev-parse", "HEAD").strip()


def registered_and_scored(root: Path):
    """An experiment registered in one commit, its results (and their look) in the next."""
    p = make_inputs(root)
    params = write_params(root)
    for f in (p.per_piece, p.eval):  # as before `dvc repro evaluate`
        f.unlink()
    register(root, params, p, before_scores=True)
    first = commit(root, "register")
    make_inputs(root)
    report(root, params, p)  # records evaluate's look under the registration
    commit(root, "results")
    return p, params, first


def symkit_report(root: Path, params: Path) -> tuple[dict, str]:
    """``symkit report`` in ``root``: (metrics.json, report.md)."""
    with contextlib.chdir(root):
        assert cli(["report", "--params", str(params)]) == 0
    return (artifacts.read_json(root / "reports" / "metrics.json"),
            (root / "reports" / "report.md").read_text())


def loosen(params: Path) -> None:
    data = yaml.safe_load(params.read_text())
    data["criteria"]["rules"][0]["threshold"] = 0.0
    params.write_text(yaml.safe_dump(data, sort_keys=False))


def test_an_honest_history_follows(repo):
    p, params, _ = registered_and_scored(repo)
    metrics, md = symkit_report(repo, params)
    assert metrics["decision.registration"] == "FOLLOWED", md
    env = artifacts.read_json(p.env)
    assert env["history"]["checked"] and env["history"]["ledger_problems"] == []
    assert "The status rests on the registration hash" in md
    assert "committed versions" in md


def test_a_registration_and_its_ledger_line_rewritten_in_one_commit_are_caught(repo):
    p, params, first = registered_and_scored(repo)
    rec = artifacts.read_json(p.preregistration)
    old_hash = rec["identity_hash"]
    rec["identity"]["params"]["criteria"]["rules"][0]["threshold"] = 0.0  # loosened by hand
    rec["identity_hash"] = artifacts.sha256_json(rec["identity"])
    artifacts.write_json(p.preregistration, rec)
    p.ledger.write_text(p.ledger.read_text().replace(old_hash, rec["identity_hash"]))
    yaml_params = yaml.safe_load(params.read_text())
    yaml_params["criteria"]["rules"][0]["threshold"] = 0.0
    params.write_text(yaml.safe_dump(yaml_params, sort_keys=False))
    commit(repo, "tidy the registration")
    metrics, md = symkit_report(repo, params)
    assert metrics["decision.registration"] == "DEVIATED"
    assert "is not contained in the current one" in md  # the ledger line that changed
    assert f"an earlier registration of these test pieces, committed in {first[:12]}" in md


def test_a_discarded_look_then_a_loosened_registration_names_the_earlier_one(repo):
    p = make_inputs(repo)
    params = write_params(repo)
    for f in (p.per_piece, p.eval):
        f.unlink()
    register(repo, params, p, before_scores=True)
    first = commit(repo, "register")
    make_inputs(repo)
    report(repo, params, p)  # a look: recorded, never committed, then thrown away
    for f in (p.per_piece, p.eval, p.ledger):  # the ledger was not committed yet
        f.unlink()
    loosen(params)
    with pytest.raises(ledger.AlreadyScored, match=f"committed in {first[:12]}"):
        register(repo, params, p, before_scores=True)
    rec = register(repo, params, p, before_scores=True, force=True)
    assert rec["forced"] and rec["supersedes"][0]["commit"] == first
    commit(repo, "register again")
    make_inputs(repo)
    report(repo, params, p)
    commit(repo, "results")
    metrics, md = symkit_report(repo, params)
    assert metrics["decision.registration"] == "FOLLOWED, REPLACING 1 REGISTRATION"
    # the same registration without saying what it replaced is a deviation
    artifacts.write_json(p.preregistration, {**rec, "supersedes": [], "forced": False})
    metrics, md = symkit_report(repo, params)
    assert metrics["decision.registration"] == "DEVIATED"
    assert f"committed in {first[:12]}" in md and "does not declare it" in md


def test_earlier_test_sets_are_named_after_a_new_split(repo):
    p = make_inputs(repo)
    params = write_params(repo)
    spent = ledger.look_record(per_piece(pieces=["x1", "x2", "x3"]),
                               {"identity_hash": "earlier", "identity": {}}, source="evaluate",
                               commit=None, time=None)
    ledger.append([spent, {**spent, "results_sha256": "other scores"}], p.ledger)
    for f in (p.per_piece, p.eval):
        f.unlink()
    register(repo, params, p, before_scores=True)  # other pieces do not block it
    commit(repo, "register a fresh test split")
    make_inputs(repo)
    report(repo, params, p)
    commit(repo, "results")
    metrics, md = symkit_report(repo, params)
    assert metrics["decision.registration"] == "FOLLOWED, AFTER 1 EARLIER TEST SET"
    assert "## Earlier test sets" in md
    row = next(x for x in md.splitlines() if x.startswith(f"| {spent['pieces_sha256'][:12]}"))
    assert row.split("|")[2:5] == [" 3 ", " 2 ", " earlier "]


def _changed(code: dict, path: str = "pipeline/decision/metrics.py") -> dict:
    return {**code, "judging": {**code["judging"], path: "0" * 64}}


def test_a_judging_change_after_a_look_deviates_and_an_amendment_reads_as_its_own_status(
        repo, monkeypatch):
    p, params, _ = registered_and_scored(repo)
    fixed = _changed(bound_code.bound_code())
    monkeypatch.setattr("pipeline.stages.report.bound_code", lambda: fixed)
    metrics, md = symkit_report(repo, params)
    assert metrics["decision.registration"] == "DEVIATED"
    assert "judging: pipeline/decision/metrics.py changed" in md
    monkeypatch.setattr("pipeline.tools.preregister.bound_code", lambda: fixed)
    with contextlib.chdir(repo):
        rec = amend_registration(Path("reports/preregistration.json"), "read the gain right",
                                 Path("reports/ledger.jsonl"))
    amendment = rec["amendments"][0]
    assert amendment["changes"] == ["judging: pipeline/decision/metrics.py changed"]
    assert len(amendment["looks_before"]) == 1
    commit(repo, "amend the registration")
    metrics, md = symkit_report(repo, params)
    assert metrics["decision.registration"] == "FOLLOWED WITH 1 AMENDMENT", md
    assert "## Amendments to the registration" in md and "read the gain right" in md
    # an amendment edited afterwards breaks the chain
    artifacts.write_json(p.preregistration, {**rec, "amendments": [
        {**amendment, "why": "something else"}]})
    metrics, md = symkit_report(repo, params)
    assert metrics["decision.registration"] == "DEVIATED"
    assert "does not hash onto the registration before it" in md


def test_a_shallow_clone_is_unverified(repo, tmp_path_factory):
    _, params, _ = registered_and_scored(repo)
    clone = tmp_path_factory.mktemp("clone") / "c"
    git(repo.parent, "clone", "-q", "--depth", "1", f"file://{repo}", str(clone))
    metrics, md = symkit_report(clone, clone / params.name)
    assert metrics["decision.registration"] == "UNVERIFIED"
    assert "a shallow clone" in md


def test_an_old_registration_under_todays_judging_code_is_deviated_and_names_files():
    """The default experiment's registration of d684390 predates binding the code: checked as it
    was committed, against the code git holds at its commit, it reads DEVIATED and names the
    judging files changed since."""
    from pipeline.decision import history

    with contextlib.chdir(ROOT):
        if history.unreadable() is not None:
            pytest.skip(f"history cannot be read here: {history.unreadable()}")
        old = [v for v in trail.registrations(Path("reports/preregistration.json"))
               if v["commit"].startswith("d684390")]
        if not old:
            pytest.skip("this history does not hold commit d684390")
        commit = old[0]["commit"]
        registered = json.loads(history.file_at(commit, "reports/preregistration.json"))
        code_then = trail.code_at(commit)
    assert registered["schema"] == 3 and "code" not in registered["identity"]
    c = check(registered, identity({}, None, {}), evidence=Evidence(
        code=bound_code.bound_code(), history={"checked": True, "registrations": [],
                                               "code_at_registration": code_then}))
    assert c.status == "DEVIATED"
    (said,) = [d for d in c.deviations if "the code that judges" in d]
    assert "is not the code of the registration's commit" in said
    assert "judging: models/base.py changed" in said  # the first of many, by path
    now = bound_code.bound_code()["judging"]
    assert code_then["judging"]["pipeline/decision/criteria.py"] != \
        now["pipeline/decision/criteria.py"]  # judged per seed since


def test_registrations_lists_every_committed_version(repo):
    registered_and_scored(repo)
    with contextlib.chdir(repo):
        versions = trail.registrations(Path("reports/preregistration.json"))
    assert len(versions) == 1 and versions[0]["n_test"] == 10
    assert versions[0]["identity_hash"] == json.loads(
        (repo / "reports" / "preregistration.json").read_text())["identity_hash"]
