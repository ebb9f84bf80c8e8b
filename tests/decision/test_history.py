"""pipeline.decision.history: does git show the registration committed before the results?"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipeline.decision.history import registration_order

REG, RES = Path("reports/preregistration.json"), Path("reports/eval.json")


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                   cwd=root, check=True, capture_output=True)


@pytest.fixture()
def repo(tmp_path: Path, monkeypatch) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "reports").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_commit(root: Path, path: Path, text: str) -> None:
    (root / path).write_text(text)
    git(root, "add", str(path))
    git(root, "commit", "-q", "-m", f"write {path}")


def test_no_git_history(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert registration_order(REG, RES) == {"git": False}


def test_registration_then_results(repo: Path) -> None:
    write_commit(repo, REG, "{}")
    (repo / RES).write_text("{}")  # results not committed yet: newer than the registration
    facts = registration_order(REG, RES)
    assert facts["registration_precedes_results"] is True and facts["results_uncommitted"]
    write_commit(repo, RES, '{"a": 1}')
    facts = registration_order(REG, RES)
    assert facts["registration_precedes_results"] is True and not facts["results_uncommitted"]
    assert facts["registration_commit"] != facts["results_commit"]


def test_results_first_or_together_is_not_preceded(repo: Path) -> None:
    write_commit(repo, RES, "{}")
    write_commit(repo, REG, "{}")
    assert registration_order(REG, RES)["registration_precedes_results"] is False
    (repo / REG).write_text('{"changed": 1}')
    (repo / RES).write_text('{"changed": 1}')
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "both")
    assert registration_order(REG, RES)["registration_precedes_results"] is False


def test_uncommitted_registration_cannot_be_dated(repo: Path) -> None:
    write_commit(repo, RES, "{}")
    (repo / REG).write_text("{}")
    facts = registration_order(REG, RES)
    assert facts["registration_uncommitted"] and facts["registration_precedes_results"] is None
