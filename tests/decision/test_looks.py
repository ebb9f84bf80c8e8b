"""pipeline.decision.looks: reading test rows records the look first, once per distinct look."""

from __future__ import annotations

import pandas as pd
import pytest

from pipeline.core import artifacts
from pipeline.decision import bound_code, ledger, looks
from pipeline.tokens.dataset import _check_split


def tokens(path, shift: int = 0):
    artifacts.write_parquet(path, pd.DataFrame({
        "sha256": ["t2", "t1", "v1"], "split": ["test", "test", "val"], "track": [0, 0, 0],
        "ids": [[1 + shift], [2], [3]]}))
    return path


def test_reading_test_tokens_records_the_look_before_returning_rows(tmp_path):
    path, book = tokens(tmp_path / "tokens.parquet"), tmp_path / "ledger.jsonl"
    reg = tmp_path / "preregistration.json"
    artifacts.write_json(reg, {"identity_hash": "r1", "identity": {}})
    rows, look = looks.test_tokens("evaluate", path, ["sha256", "split", "ids"],
                                   ledger_path=book, registration=reg)
    assert rows["sha256"].tolist() == ["t1", "t2"] and set(rows["split"]) == {"test"}
    (rec,) = ledger.read(book)
    assert rec == look.record
    assert rec["command"] == "evaluate" and rec["pieces"] == ["t1", "t2"]
    assert rec["registration"]["identity_hash"] == "r1"
    assert rec["code"] == bound_code.judging_digest()
    assert rec["inputs"] == artifacts.sha256_file(path)
    # the same read again is the same look; other rows are another
    looks.test_tokens("evaluate", path, ["sha256", "split"], ledger_path=book, registration=reg)
    assert len(ledger.read(book)) == 1
    looks.test_tokens("evaluate", tokens(path, shift=1), ["sha256", "split"], ledger_path=book,
                      registration=reg)
    assert len(ledger.read(book)) == 2
    # its scores join it: one look, two records
    look.scored("d" * 64)
    recs = ledger.read(book)
    assert recs[-1]["look"] == look.id and recs[-1]["results_sha256"] == "d" * 64
    assert len(ledger.one_per_look(recs)) == 2  # the two reads; the first stands with its scores


def test_score_tables_and_files_record_looks_only_at_test_pieces(tmp_path):
    book = tmp_path / "ledger.jsonl"
    table = pd.DataFrame({"sha256": ["t1", "v1"], "split": ["test", "val"], "model": "m",
                          "nll_nats": [1.0, 2.0]})
    rows, look = looks.test_scores("compare", table, ledger_path=book, registration=None)
    assert rows["sha256"].tolist() == ["t1"] and look.record["command"] == "compare"
    assert looks.test_scores("compare", table[table["split"] == "val"], ledger_path=book)[1] \
        is None
    assert looks.test_pieces_scored("score", ["x", "t1"], ["t1", "t2"], "in",
                                    ledger_path=book).record["pieces"] == ["t1"]
    assert looks.test_pieces_scored("score", ["x"], ["t1"], "in", ledger_path=book) is None
    assert [r["command"] for r in ledger.read(book)] == ["compare", "score"]


def test_no_other_reader_hands_out_test_rows(tmp_path):
    from pipeline.tokens.contract import read_tokens

    path = tokens(tmp_path / "tokens.parquet")
    assert read_tokens(path)["sha256"].tolist() == ["v1"]
    with pytest.raises(ValueError, match=r"pipeline\.decision\.looks"):
        read_tokens(path, splits=["test"])
    with pytest.raises(ValueError, match="spends the test set"):
        _check_split("test")
