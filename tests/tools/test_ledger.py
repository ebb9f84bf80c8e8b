"""``symkit ledger`` (pipeline.tools.ledger): the looks at the current test pieces, ``--rebuild``
(appending the looks found and never changing a line) and ``--spent`` (every piece any look
scored). The ledger's format and its scans are tested in tests/decision/test_ledger.py."""

from __future__ import annotations

import contextlib

import pandas as pd

from pipeline.cli import main as cli
from pipeline.core import artifacts
from pipeline.decision import ledger
from pipeline.stages.split import read_exclude_test
from pipeline.tools.ledger import current_test_pieces, rebuild, spent_pieces, spent_text


def _scores(pieces: list[str], shift: float = 0.0) -> pd.DataFrame:
    return pd.DataFrame({"sha256": pieces, "split": "test", "model": "ngram",
                         "nll_nats": [50.0 + i + shift for i in range(len(pieces))]})


def test_the_current_test_pieces_come_from_the_split_else_the_scores(tmp_path):
    splits, per_piece = tmp_path / "splits.parquet", tmp_path / "per_piece.parquet"
    assert current_test_pieces(splits, per_piece) == ([], "none")
    artifacts.write_parquet(per_piece, _scores(["q", "p"]))
    assert current_test_pieces(splits, per_piece) == (["p", "q"], str(per_piece))
    artifacts.write_parquet(splits, pd.DataFrame({"sha256": ["z", "a", "m"],
                                                  "split": ["test", "test", "train"]}))
    assert current_test_pieces(splits, per_piece) == (["a", "z"], str(splits))


def test_spent_is_the_sorted_union_under_a_header_that_counts_the_looks():
    records = [{"pieces": ["c", "a"]}, {"pieces": ["a", "b"]}, {"source": "git"}]
    assert spent_pieces(records) == ["a", "b", "c"] and spent_pieces([]) == []
    text = spent_text(records)
    assert text.startswith("# Test pieces scored at least once: the union of the pieces of "
                           "the 3 looks\n")
    assert text.endswith("\na\nb\nc\n") and text.count("\n# ") == 3
    assert "of the 1 look\n" in spent_text(records[:1])


def test_rebuild_appends_the_workspace_look_once_and_keeps_every_line(tmp_path):
    book, per_piece = tmp_path / "ledger.jsonl", tmp_path / "per_piece.parquet"
    with contextlib.chdir(tmp_path):  # no git repository, no DVC cache here
        ledger.record_look(_scores(["a", "b"]), None, book)
        before = book.read_bytes()
        assert rebuild(book, per_piece) == []  # no scores in the workspace
        artifacts.write_parquet(per_piece, _scores(["a", "b"], shift=1.0))
        (added,) = rebuild(book, per_piece)
        assert added["source"] == "workspace" and added["pieces"] == ["a", "b"]
        assert rebuild(book, per_piece) == []  # already there
    assert book.read_bytes().startswith(before) and len(ledger.read(book)) == 2


def test_the_command_lists_the_looks_at_the_current_pieces_and_what_to_do(tmp_path,
                                                                         monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli(["ledger"]) == 0
    assert capsys.readouterr().out == (
        "ledger: 0 looks at the 0 test pieces of none\n")
    artifacts.write_parquet(tmp_path / "data" / "splits.parquet", pd.DataFrame(
        {"sha256": ["a", "b", "c"], "split": ["test", "test", "val"]}))
    ledger.append([ledger.look_record(_scores(pieces), reg, source=source, commit=None,
                                      time=None)
                   for pieces, reg, source in (
                       (["y"], None, "evaluate"),  # other pieces: no look at these
                       (["a", "x"], {"identity_hash": "r" * 64}, "git"))], ledger.LEDGER)
    assert cli(["ledger"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "ledger: 1 look at the 2 test pieces of data/splits.parquet"
    assert out[1] == ("  look 2 (time unknown, no commit): git, 1 of 2 test pieces, "
                      "registration rrrrrrrrrrrr")
    assert out[2].startswith("ledger: these test pieces have been scored;")


def test_spent_writes_the_sorted_union_of_every_look_the_same_bytes_each_time(tmp_path, capsys):
    a, b, c = ("a" * 64, "b" * 64, "c" * 64)
    book = tmp_path / "ledger.jsonl"
    book.write_text("".join(ledger.line(r) for r in (
        {"pieces": [c, a]}, {"pieces": [b, a]}, {"source": "git"})))
    out = tmp_path / "data" / "spent.txt"
    args = ["ledger", "--ledger", str(book), "--splits", str(tmp_path / "none.parquet"),
            "--per-piece", str(tmp_path / "none.parquet"), "--spent", str(out)]
    assert cli(args) == 0
    first = out.read_bytes()
    assert "3 pieces scored in 3 looks written to" in capsys.readouterr().out
    assert cli(args) == 0 and out.read_bytes() == first
    lines = first.decode().splitlines()
    assert lines[0].startswith("# ") and "symkit ledger --spent" in first.decode()
    assert [x for x in lines if not x.startswith("#")] == [a, b, c]
    assert str(tmp_path) not in first.decode() and read_exclude_test(out) == [a, b, c]
    assert list(tmp_path.glob("data/.*")) == []  # no temp file left beside it
