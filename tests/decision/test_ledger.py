"""The test-access ledger (pipeline.decision.ledger) and what the registration's status makes of
earlier looks: refused registrations, FOLLOWED AFTER n LOOKS, DEVIATED when the rules changed
after a look; looks found in git history and the DVC cache. The pieces bound to the registration
and the commit order in its status are tested with the registration
(tests/decision/test_preregistration.py), the ``symkit ledger`` command in
tests/tools/test_ledger.py."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pipeline.cli import main as cli
from pipeline.core import artifacts
from pipeline.decision import ledger
from pipeline.decision.history import registration_order
from pipeline.decision.ledger import AlreadyScored
from tests.stages.test_report import (
    TEST_PIECES,
    make_inputs,
    register,
    report,
    write_params,
)


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          cwd=root, check=True, capture_output=True, text=True).stdout


def per_piece(shift: float = 0.0, pieces: list[str] = TEST_PIECES) -> pd.DataFrame:
    return pd.DataFrame({"sha256": pieces * 2, "split": "test", "model": ["ngram"] * len(pieces)
                         + ["transformer"] * len(pieces), "seed": pd.array([None] * 2 * len(
                             pieces), dtype="Int64"),
                         "nll_nats": [50.0 + i + shift for i in range(2 * len(pieces))]})


# ---- the file --------------------------------------------------------------------------------
def test_a_look_is_appended_once_and_old_lines_are_kept_byte_for_byte(tmp_path):
    path = tmp_path / "ledger.jsonl"
    reg = {"identity_hash": "r1", "identity": {"params": {"criteria": {"rules": []}}}}
    with contextlib.chdir(tmp_path):
        first = ledger.record_look(per_piece(), reg, path)
        before = path.read_bytes()
        assert ledger.record_look(per_piece(), reg, path) is None  # the same scores again
        assert path.read_bytes() == before
        ledger.record_look(per_piece(shift=0.5), reg, path)  # other scores: another look
        ledger.record_look(per_piece(), None, path)  # the same scores, no registration
    assert path.read_bytes().startswith(before)
    records = ledger.read(path)
    assert len(records) == 3 and records[0] == first
    assert first["pieces"] == TEST_PIECES and first["source"] == "evaluate"
    assert first["registration"]["identity_hash"] == "r1" and first["time"].endswith("Z")
    assert ledger.look_record(per_piece().assign(split="val"), reg, source="evaluate",
                              commit=None, time=None) is None  # val is no look at test


def test_a_damaged_ledger_line_stops_with_the_file_and_line(tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"pieces": []}\nnot json\n')
    with pytest.raises(artifacts.ArtifactError, match=r"ledger\.jsonl line 2"):
        ledger.read(path)


def test_earlier_looks_are_other_scores_or_other_registrations_of_these_pieces(tmp_path):
    recs = [ledger.look_record(per_piece(s), {"identity_hash": r}, source="evaluate",
                               commit=None, time=None)
            for s, r in ((0.0, "old"), (0.0, "new"), (1.0, "new"))]
    recs.append(ledger.look_record(per_piece(pieces=["zz"]), None, source="git", commit=None,
                                   time=None))  # other pieces: no look at these
    current = ledger.look_key(recs[1])
    earlier, this = ledger.earlier_looks([*recs, recs[1]], TEST_PIECES, current)
    assert this is not None and this.index == 2
    assert [lk.index for lk in earlier] == [1, 3]


# ---- registration and looks -------------------------------------------------------------------
def _registered(root: Path):
    p = make_inputs(root)
    params = write_params(root)
    register(root, params, p, before_scores=True)
    return p, params


def test_loosening_a_rule_with_the_scores_moved_away_is_refused_then_deviated(tmp_path):
    """Register, score, move eval.json aside, loosen, register again, put it back. The ledger
    refuses the second registration; the loosened params are then a deviation from the one in
    force; forced, the registration declares the look, and the status says it came after it."""
    p, params = _registered(tmp_path)
    assert report(tmp_path, params, p).decision == "PASS"  # evaluate's look is in the ledger
    aside = tmp_path / "aside"
    aside.mkdir()
    for f in (p.eval, p.per_piece):
        shutil.move(f, aside / f.name)
    data = yaml.safe_load(params.read_text())
    data["criteria"]["rules"][2]["threshold"] = 0.5
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(AlreadyScored, match="1 look: evaluate"):
        register(tmp_path, params, p)
    shutil.move(aside / "eval.json", p.eval)
    shutil.move(aside / "per_piece.parquet", p.per_piece)
    s = report(tmp_path, params, p)
    assert s.decision == "DEVIATED"
    assert "criterion 'memorisation_at_human_level'.threshold: registered 0.05, now 0.5" in \
        p.md_out.read_text()

    # forced, the registration declares the look it was made after: no longer hidden, it
    # reads FOLLOWED AFTER 1 LOOK, and the looks table says what changed since
    rec = register(tmp_path, params, p, force=True)
    assert rec["forced"] and len(rec["looks_before"]) == 1
    s = report(tmp_path, params, p)
    md = p.md_out.read_text()
    assert s.decision == "FOLLOWED AFTER 1 LOOK"
    assert "criteria: 'memorisation_at_human_level' changed" in md


def test_a_registration_after_a_look_with_the_same_rules_reads_followed_after_looks(tmp_path):
    p, params = _registered(tmp_path)
    report(tmp_path, params, p)
    data = yaml.safe_load(params.read_text())
    data["transformer"] = {"seed": 7}  # retrained after seeing the test scores, rules unchanged
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    register(tmp_path, params, p, force=True)
    table = pd.read_parquet(p.per_piece)
    artifacts.write_parquet(p.per_piece, table.assign(nll_nats=table["nll_nats"] + 1.0))
    s = report(tmp_path, params, p)
    assert s.decision == "FOLLOWED AFTER 1 LOOK" and s.n_deviations == 0
    md = p.md_out.read_text()
    assert "scored 1 time before these results" in md
    row = next(line for line in md.splitlines() if line.startswith("| 1 |"))
    assert "params transformer" in row and "10 of 10" in row
    metrics = artifacts.read_json(p.metrics_out)
    assert metrics["decision.overall"] == "FOLLOWED AFTER 1 LOOK"
    assert metrics["decision.rules"] == "PASS"


# ---- git history and the DVC cache ------------------------------------------------------------
@pytest.fixture()
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    return tmp_path


def test_preregister_finds_test_scores_in_git_history_and_rebuild_records_them(repo, capsys):
    p, params = _registered(repo)
    report(repo, params, p)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "registered experiment and its results")
    commit = git(repo, "rev-parse", "HEAD").strip()
    for f in (p.eval, p.per_piece, p.ledger):  # every trace in the workspace gone
        f.unlink()
    data = yaml.safe_load(params.read_text())
    data["criteria"]["rules"][0]["threshold"] = 0.0
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(AlreadyScored, match=f"git {commit[:12]}"):
        register(repo, params, p)
    assert [r["commit"] for r in ledger.read(p.ledger)] == [commit]  # kept in the ledger
    p.ledger.unlink()
    with contextlib.chdir(repo):  # --spent writes what --rebuild found
        assert cli(["ledger", "--rebuild", "--spent", "spent.txt"]) == 0
    out = capsys.readouterr().out
    assert "1 look added" in out and "1 look at the 10 test pieces of data/splits.parquet" in out
    assert "10 pieces scored in 1 look written to spent.txt" in out
    assert "(`symkit ledger --spent data/spent_test.txt`, split.exclude_test set to it" in out
    assert "AFTER n EARLIER TEST SETS" in out
    lines = (repo / "spent.txt").read_text().splitlines()
    assert [x for x in lines if not x.startswith("#")] == sorted(TEST_PIECES)
    assert ledger.read(p.ledger)[0]["source"] == "git"


def test_a_ledger_that_lost_committed_lines_is_rewritten(repo):
    p, params = _registered(repo)
    report(repo, params, p)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "results")
    with contextlib.chdir(repo):
        assert ledger.rewritten(p.ledger.relative_to(repo)) is None
        p.ledger.write_text("")
        why = ledger.rewritten(p.ledger.relative_to(repo))
    assert why is not None and "were removed or changed" in why


def test_preregister_finds_test_scores_in_the_dvc_cache(tmp_path):
    p, params = _registered(tmp_path)
    data = p.per_piece.read_bytes()
    md5 = "0123456789abcdef0123456789abcdef"
    blob = tmp_path / ".dvc/cache/files/md5" / md5[:2] / md5[2:]
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"stages": {"evaluate": {"outs": [
        {"path": "reports/eval/per_piece.parquet", "md5": md5}]}}}))
    p.preregistration.unlink()
    with contextlib.chdir(tmp_path):
        found = ledger.scan_dvc_cache()
    assert [r["source"] for r in found] == ["dvc-cache"] and found[0]["pieces"] == TEST_PIECES
    p.per_piece.unlink()
    p.eval.unlink()
    with pytest.raises(AlreadyScored, match="dvc-cache"):
        register(tmp_path, params, p)


def test_history_lists_commits_on_every_ref(repo):
    with contextlib.chdir(repo):
        Path("f").write_text("1")
        git(repo, "add", "f")
        git(repo, "commit", "-qm", "one")
        git(repo, "checkout", "-qb", "side")
        Path("f").write_text("2")
        git(repo, "commit", "-qam", "two")
        git(repo, "checkout", "-q", "-")
        from pipeline.decision.history import commits_touching
        assert len(commits_touching("f")) == 2  # the other branch's version counts too
        assert registration_order(Path("r.json"), Path("f"))["git"] is True


@pytest.mark.parametrize("rel", ["reports/ledger.jsonl",
                                 "experiments/adaptation/reports/ledger.jsonl"])
def test_ledgers_merged_from_two_branches_keep_every_line_of_both(repo, rel):
    """The repository's .gitattributes merges a ledger as a union: two branches that each
    appended a look merge without a conflict, and neither look is lost."""
    shutil.copy(Path(__file__).resolve().parents[2] / ".gitattributes", repo / ".gitattributes")
    path = repo / rel
    path.parent.mkdir(parents=True)
    reg = {"identity_hash": "r1", "identity": {"params": {"criteria": {"rules": []}}}}

    def look(shift: float) -> dict:
        return ledger.look_record(per_piece(shift), reg, source="evaluate", commit=None,
                                  time=None)

    ledger.append([look(0.0)], path)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "first look")
    git(repo, "checkout", "-qb", "side")
    ledger.append([look(0.5)], path)
    git(repo, "commit", "-qam", "a look on the side")
    git(repo, "checkout", "-q", "-")
    ledger.append([look(1.0)], path)
    git(repo, "commit", "-qam", "a look here")
    git(repo, "merge", "-q", "--no-edit", "side")  # check=True: a conflict fails here
    lines = path.read_text().splitlines()
    assert sorted(lines) == sorted(ledger.line(look(s)).rstrip("\n") for s in (0.0, 0.5, 1.0))
    assert ledger.read(path)[0]["results_sha256"] == look(0.0)["results_sha256"]  # kept first


def test_each_different_set_of_scores_of_the_same_rows_is_a_look_of_its_own(tmp_path):
    """The same token rows read under one registration and code are one access, but scores that
    differ (the models changed) are looks of their own: four earlier ones here, and the access
    record is not counted beside its scores."""
    from pipeline.decision import looks

    tokens = tmp_path / "tokens.parquet"
    artifacts.write_parquet(tokens, pd.DataFrame({"sha256": TEST_PIECES, "split": "test",
                                                  "track": 0, "ids": [[1]] * len(TEST_PIECES)}))
    book = tmp_path / "ledger.jsonl"
    for shift in range(5):
        _, look = looks.test_tokens("evaluate", tokens, ["sha256", "split"], ledger_path=book,
                                    registration=None)
        look.scored(ledger.results_digest(per_piece(float(shift))))
    records = ledger.read(book)
    assert len(records) == 6  # one access, five scores
    current = ledger.Run((ledger.results_digest(per_piece(4.0)), None), None, 0,
                         records[0]["code"], {"scores": ledger.results_digest(per_piece(4.0))})
    earlier, this = ledger.earlier_looks(records, TEST_PIECES, current)
    assert len(earlier) == 4 and this is not None
    assert len(ledger.one_per_look(records)) == 5
