"""``symkit score`` (pipeline.tools.score): which files a list of paths names, one row per file
in input order with each file's NLL summed over its sequences, and the table written as CSV or
Parquet.

The model is a tiny untrained GPT saved with an untrained REMI tokenizer's hash (made in well
under a second, no stage run); scoring MIDI files exactly as evaluate scores the token table is
tested in tests/inference/test_standalone.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.cli import main
from pipeline.core.artifacts import write_text
from pipeline.inference.pieces import score_rows
from pipeline.inference.standalone import FileResult, open_model
from pipeline.tools import score
from pipeline.tools.score import COLUMNS, collect_paths, write_scores
from tests.midi_utils import make_midi, random_piece


@dataclass(frozen=True)
class TinyModel:
    model: Path
    tokenizer: Path
    midi: dict[str, Path]
    """Three MIDI files: ``one`` (one voice), ``two`` (two voices), ``three``."""


def tiny_model(root: Path) -> TinyModel:
    """An untrained GPT of 1 block recording the hash of an untrained REMI tokenizer, and three
    small MIDI files."""
    import torch

    from models.transformer import GPT, TransformerConfig, save_model
    from pipeline.tokens.tokenizer import load_tokenizer, make_tokenizer, tokenizer_text
    from pipeline.tokens.tokenizer import tokenizer_hash as hash_of

    tokenizer = root / "tokenizer.json"
    write_text(tokenizer, tokenizer_text(make_tokenizer("REMI", {"use_programs": True})))
    tok = load_tokenizer(tokenizer)
    ids = {k: int(tok.vocab[f"{k}_None"]) for k in ("PAD", "BOS", "EOS")}
    cfg = TransformerConfig(vocab_size=len(tok), max_seq_len=32, n_layer=1, n_head=2, n_embd=16)
    save_model(root / "model", GPT(cfg, torch.Generator().manual_seed(0)), {
        "vocab_size": len(tok), "pad_id": ids["PAD"], "bos_id": ids["BOS"],
        "eos_id": ids["EOS"], "tokenizer_hash": hash_of(tok), "split_hash": "s", "seed": 1})
    rng = np.random.default_rng(4)
    midi = {}
    for name, voices in (("one", 1), ("two", 2), ("three", 1)):
        midi[name] = root / "midi" / f"{name}.mid"
        midi[name].parent.mkdir(exist_ok=True)
        midi[name].write_bytes(make_midi(random_piece(rng, n=20, voices=voices)))
    return TinyModel(root / "model", tokenizer, midi)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyModel:
    return tiny_model(tmp_path_factory.mktemp("tiny"))


def _results(n: int, vocab: int = 400) -> list[FileResult]:
    """``n`` planted files: every third unscored, the others with 1 to 3 sequences."""
    rng = np.random.default_rng(n)
    out = []
    for i in range(n):
        if i % 3 == 2:
            out.append(FileResult("corrupt", "bad header", f"{i:064x}"))
            continue
        rows = tuple((t, rng.integers(3, vocab, rng.integers(5, 50)).astype(np.int32))
                     for t in range(1 + i % 3))
        out.append(FileResult("ok", "", f"{i:064x}", 10 + i, rows))
    return out


# ---- paths -------------------------------------------------------------------------------------
def test_folders_become_their_sorted_midi_files_and_other_paths_stay_as_given(tmp_path):
    (tmp_path / "in" / "sub").mkdir(parents=True)
    for rel in ("b.mid", "a.MIDI", "sub/c.kar", "notes.txt"):
        (tmp_path / "in" / rel).write_bytes(b"x")
    folder, lone = (tmp_path / "in").as_posix(), (tmp_path / "z.txt").as_posix()
    got = collect_paths([lone, tmp_path / "in", f"{folder}/b.mid", lone])
    assert got == [lone, f"{folder}/a.MIDI", f"{folder}/b.mid", f"{folder}/sub/c.kar"]
    assert collect_paths([tmp_path / "missing.mid"]) == [(tmp_path / "missing.mid").as_posix()]
    assert collect_paths([tmp_path / "in" / "sub" / "empty"]) == [
        (tmp_path / "in" / "sub" / "empty").as_posix()]


# ---- scoring -----------------------------------------------------------------------------------
def test_each_file_is_the_sum_of_its_sequences_and_unscored_files_keep_their_status(tiny):
    inf = open_model(tiny.model, tiny.tokenizer)
    scorer = inf.scorer(torch_threads=1)
    results = _results(5, inf.info.vocab_size)
    paths = [f"f{i}.mid" for i in range(5)]
    table = score.run(inf, scorer, results, paths, show_progress=False)
    assert table.schema == COLUMNS
    rows = table.to_pylist()
    assert [r["path"] for r in rows] == paths and rows[2]["status"] == "corrupt"
    assert rows[2]["detail"] == "bad header" and rows[2]["nll_nats"] is None
    assert rows[2]["n_sequences"] is None and rows[2]["nll_per_note"] is None
    for r, res in zip(rows, results, strict=True):
        if res.status != "ok":
            continue
        per_seq = score_rows(scorer, [ids for _, ids in res.rows])
        assert r["nll_nats"] == pytest.approx(math.fsum(per_seq), rel=1e-9)
        assert r["n_sequences"] == len(res.rows)
        assert r["n_tokens"] == sum(len(ids) + 1 for _, ids in res.rows)  # and each EOS
        assert r["nll_per_note"] == pytest.approx(r["nll_nats"] / res.n_notes)
        assert r["nll_per_token"] == pytest.approx(r["nll_nats"] / r["n_tokens"])


def test_the_table_does_not_depend_on_how_many_files_a_call_scores(tiny, monkeypatch):
    inf = open_model(tiny.model, tiny.tokenizer)
    scorer = inf.scorer(torch_threads=1)
    results = _results(7, inf.info.vocab_size)
    paths = [f"f{i}.mid" for i in range(7)]
    many = score.run(inf, scorer, results, paths, show_progress=False)
    monkeypatch.setattr(score, "FILES_PER_CALL", 2)
    few = score.run(inf, scorer, results, paths, show_progress=False)
    np.testing.assert_allclose(few["nll_nats"].to_numpy(zero_copy_only=False),
                               many["nll_nats"].to_numpy(zero_copy_only=False), rtol=1e-9)
    assert few.drop(["nll_nats", "nll_per_note", "nll_per_token"]).equals(
        many.drop(["nll_nats", "nll_per_note", "nll_per_token"]))


@pytest.mark.parametrize("name", ["s.csv", "s.parquet", "s.PARQUET"])
def test_scores_are_written_as_csv_or_parquet_by_extension(tmp_path, name):
    import pyarrow as pa

    table = pa.Table.from_pylist([{"path": "a.mid", "status": "ok", "nll_nats": 1.5},
                                  {"path": "b.mid", "status": "missing", "nll_nats": None}],
                                 schema=COLUMNS)
    write_scores(table, tmp_path / name)
    data = (tmp_path / name).read_bytes()
    parquet = name.lower().endswith(".parquet")
    assert data.startswith(b"PAR1") is parquet
    back = pd.read_parquet(tmp_path / name) if parquet else pd.read_csv(tmp_path / name)
    assert back["path"].tolist() == ["a.mid", "b.mid"] and back["nll_nats"].isna().tolist() == [
        False, True]
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temp file left


# ---- the command -------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "named"), [
    (["--out", "scores.txt"], "--out scores.txt: name a .csv or .parquet file"),
    (["--workers", "0"], "--workers 0: must be >= 1"),
    (["--batch-size", "0"], "--batch-size 0: must be >= 1"),
])
def test_bad_options_are_refused_before_anything_is_read(tmp_path, capsys, args, named):
    assert main(["score", str(tmp_path / "none.mid"), "--model", str(tmp_path / "no-model"),
                 *args]) == 2
    assert capsys.readouterr().err.strip() == f"symkit score: {named}"


def test_the_command_scores_in_input_order_and_sums_up(tiny, tmp_path, capsys):
    out = tmp_path / "out" / "scores.csv"
    args = ["score", str(tiny.midi["two"]), str(tiny.midi["one"]), str(tmp_path / "gone.mid"),
            "--model", str(tiny.model), "--tokenizer", str(tiny.tokenizer), "--out", str(out),
            "--torch-threads", "1"]
    assert main(args) == 0
    table = pd.read_csv(out)
    assert [Path(p).name for p in table["path"]] == ["two.mid", "one.mid", "gone.mid"]
    assert table["status"].tolist() == ["ok", "ok", "missing"]
    per_note = table["nll_nats"].iloc[:2].sum() / table["n_notes"].iloc[:2].sum()
    assert capsys.readouterr().out.strip() == (
        f"score: 3 files, 2 scored, {per_note:.4f} nats per note over them; not scored: "
        f"missing 1 -> {out.as_posix()}")
    first = out.read_bytes()
    assert main(args) == 0 and out.read_bytes() == first  # the same bytes again
    (tmp_path / "empty").mkdir()
    assert main(["score", str(tmp_path / "empty"), "--model", str(tiny.model),
                 "--tokenizer", str(tiny.tokenizer), "--out", str(out)]) == 2
    assert "no MIDI files (.mid, .midi, .kar) under" in capsys.readouterr().err


def test_scoring_a_test_piece_is_a_look_and_scoring_other_files_is_none(tiny, tmp_path, capsys):
    """Files are hashed before scoring: a file that is a test piece of data/splits.parquet gets
    a look in the ledger (command score, that piece only) and one line saying so; scoring the
    same files again is the same look, and files that are no test piece record nothing."""
    from pipeline.core.artifacts import sha256_file, write_json, write_parquet
    from pipeline.decision import ledger

    one, two = (sha256_file(tiny.midi[k]) for k in ("one", "two"))
    splits, path = tmp_path / "splits.parquet", tmp_path / "ledger.jsonl"
    write_parquet(splits, pd.DataFrame({"sha256": [one, two, "f" * 64],
                                        "split": ["test", "train", "test"]}))
    reg = tmp_path / "preregistration.json"
    write_json(reg, {"identity_hash": "r1", "identity": {"pieces": {"test": ["e" * 64]}}})
    out = tmp_path / "scores.csv"

    def score_files(*names: str) -> str:
        assert main(["score", *(str(tiny.midi[n]) for n in names), "--model", str(tiny.model),
                     "--tokenizer", str(tiny.tokenizer), "--out", str(out),
                     "--torch-threads", "1", "--ledger", str(path), "--splits", str(splits),
                     "--preregistration", str(reg)]) == 0
        return capsys.readouterr().out

    printed = score_files("two", "three")
    assert not path.exists() and "look" not in printed
    printed = score_files("one", "two")
    assert printed.splitlines()[0] == (f"score: 1 of these files is a test piece: scoring it is "
                                       f"a look at the test set, recorded in {path.as_posix()}")
    (look,) = ledger.read(path)
    assert look["command"] == "score" and look["pieces"] == [one]
    assert look["registration"]["identity_hash"] == "r1"
    before = path.read_bytes()
    score_files("one", "two")
    assert path.read_bytes() == before
