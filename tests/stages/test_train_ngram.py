"""Stage train_ngram on a small synthetic token table (written through pipeline.core.artifacts)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from models.ngram import NGramLM
from pipeline.cli import main as cli_main
from pipeline.core.artifacts import read_json, sha256_bytes, write_json, write_parquet
from pipeline.core.config import ParamsError, RuntimeConfig, parse_section
from pipeline.stages.train_ngram import NOT_APPLICABLE, NGramConfig, run
from pipeline.tokens.contract import tokens_table

PAD, BOS, EOS, VOCAB = 0, 1, 2, 12


def _piece_ids(rng: np.random.Generator, length: int) -> list[int]:
    """A cycle over ids 3..9 with occasional substitutions: long contexts pay, up to a point."""
    cycle = np.array([3, 4, 5, 3, 6, 5, 7, 8, 4, 9])
    start = int(rng.integers(len(cycle)))
    ids = np.resize(np.roll(cycle, -start), length)
    noise = rng.random(length) < 0.15
    ids[noise] = rng.integers(3, VOCAB, int(noise.sum()))
    return ids.tolist()


def write_corpus(root: Path, n_groups: int = 16, seed: int = 0, n_eval: int = 2
                 ) -> dict[str, Path]:
    """tokens.parquet, augmented.parquet, info.json, manifest.parquet and splits.parquet.

    Two pieces per group; the last ``2 * n_eval`` groups are val then test, ``n_eval`` each.
    Piece 0 has two tracks. ``n_notes`` in the token table deliberately differs from the manifest's.
    """
    rng = np.random.default_rng(seed)
    tokens, manifest, splits, aug = [], [], [], []
    for i in range(2 * n_groups):
        g = i // 2
        split = ("train" if g < n_groups - 2 * n_eval
                 else "val" if g < n_groups - n_eval else "test")
        sha = sha256_bytes(f"piece-{seed}-{i}".encode())
        n_tracks = 2 if i == 0 else 1
        for t in range(n_tracks):
            ids = _piece_ids(rng, int(rng.integers(30, 60)))
            tokens.append({"sha256": sha, "split": split, "track": t, "ids": ids,
                           "n_tokens": len(ids), "n_notes": 999})
        manifest.append({"path": f"p{i}.mid", "sha256": sha, "status": "ok",
                         "n_notes": 20 + i, "duration_s": 10.0 + i / 4})
        splits.append({"sha256": sha, "group_id": f"group-{g:02d}", "split": split, "fold": 0})
        if split == "train":
            aug.append({"sha256": sha, "transpose": 1, "track": 0,
                        "ids": _piece_ids(rng, 40), "n_tokens": 40})
    tokens.sort(key=lambda r: (r["sha256"], r["track"]))
    paths = {"tokens": root / "tokens" / "tokens.parquet",
             "augmented": root / "tokens" / "augmented.parquet",
             "info": root / "tokens" / "info.json", "manifest": root / "manifest.parquet",
             "splits": root / "splits.parquet"}
    write_parquet(paths["tokens"], tokens_table(tokens))
    write_parquet(paths["augmented"], pa.Table.from_pylist(aug))
    write_json(paths["info"], {"vocab_size": VOCAB, "pad_id": PAD, "bos_id": BOS, "eos_id": EOS,
                               "tokenizer_hash": "tok-hash", "split_hash": "split-hash"})
    write_parquet(paths["manifest"], pa.Table.from_pylist(manifest))
    write_parquet(paths["splits"], pa.Table.from_pylist(splits))
    return paths


def rows_of(paths: dict[str, Path], split: str) -> list[np.ndarray]:
    table = pq.read_table(paths["tokens"]).to_pylist()
    return [np.array(r["ids"], dtype=np.int64) for r in table if r["split"] == split]


def run_stage(paths, out: Path, **cfg) -> tuple:
    summary = run(NGramConfig(**cfg), RuntimeConfig(), tokens=paths["tokens"],
                  info=paths["info"], augmented=paths["augmented"], model_dir=out / "ngram",
                  report=out / "ngram.json", plot=out / "plots" / "ngram_orders.tsv")
    return summary, read_json(out / "ngram.json")


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "data")


def test_best_order_is_chosen_on_val(corpus, tmp_path):
    summary, report = run_stage(corpus, tmp_path / "out", orders=[1, 2, 3, 4, 6],
                                use_augmented=False)
    train, val = rows_of(corpus, "train"), rows_of(corpus, "val")
    # Independent check: fit each order directly and score val the same way.
    expected = {o: NGramLM(order=o, vocab_size=VOCAB, bos_id=BOS, eos_id=EOS, pad_id=PAD)
                .fit(train).nll(val)
                for o in (1, 2, 3, 4, 6)}
    for o, nats in expected.items():
        assert report["orders"][str(o)]["val_nats_per_token"] == pytest.approx(nats, abs=1e-12)
    assert report["best_order"] == min(expected, key=expected.get)
    assert summary.best_order == report["best_order"] > 1
    assert report["data"]["val_targets"] == sum(len(s) + 1 for s in val)
    model = NGramLM.load(tmp_path / "out" / "ngram")
    assert model.order_ == report["best_order"]
    assert model.nll(val) == pytest.approx(report["val_nats_per_token"], abs=1e-12)
    assert model.metadata_["tokenizer_hash"] == "tok-hash"
    assert model.metadata_["split_hash"] == "split-hash"
    tsv = (tmp_path / "out" / "plots" / "ngram_orders.tsv").read_text().splitlines()
    assert tsv[0].split("\t") == ["order", "val_nats_per_token", "val_bits_per_token",
                                  "val_perplexity"]
    assert [int(line.split("\t")[0]) for line in tsv[1:]] == [1, 2, 3, 4, 6]
    bits = float(tsv[1].split("\t")[2])
    assert bits == pytest.approx(expected[1] / math.log(2))


def test_two_runs_give_identical_bytes(corpus, tmp_path):
    for name in ("a", "b"):
        run_stage(corpus, tmp_path / name, orders=[2, 3])
    for rel in ("ngram/model.npz", "ngram/model.json", "ngram.json", "plots/ngram_orders.tsv"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def test_test_split_is_never_scored(corpus, tmp_path):
    """A test row with an impossible id would be excluded (or crash) if test were read."""
    table = pq.read_table(corpus["tokens"]).to_pylist()
    for r in table:
        if r["split"] == "test":
            r["ids"] = [999]
    write_parquet(corpus["tokens"], tokens_table(table))
    _, report = run_stage(corpus, tmp_path / "out", orders=[2])
    assert report["excluded"]["pieces"] == []


def test_bad_rows_are_excluded_and_counted(corpus, tmp_path):
    table = pq.read_table(corpus["tokens"]).to_pylist()
    train = [r for r in table if r["split"] == "train"]
    train[1]["ids"] = [3, 4, 99]          # out of the vocabulary: the piece is excluded
    train[2]["ids"] = [3, PAD, 4, EOS]    # specials are removed, the rest is kept
    train[3].update(track=-1, ids=[])     # not encoded
    write_parquet(corpus["tokens"], tokens_table(table))
    _, report = run_stage(corpus, tmp_path / "out", orders=[2])
    reasons = {p["sha256"]: p["reason"] for p in report["excluded"]["pieces"]}
    assert reasons == {train[1]["sha256"]: "id_out_of_range", train[3]["sha256"]: "not_encoded"}
    assert report["excluded"]["special_ids_removed"] == 2


def test_augmented_rows_only_from_train_pieces(corpus, tmp_path):
    aug = pq.read_table(corpus["augmented"]).to_pylist()
    val_sha = pq.read_table(corpus["splits"]).to_pandas().query("split == 'val'")
    aug.append({**aug[0], "sha256": val_sha["sha256"].iloc[0]})  # would leak val into train
    write_parquet(corpus["augmented"], pa.Table.from_pylist(aug))
    _, plain = run_stage(corpus, tmp_path / "plain", orders=[3], use_augmented=False)
    _, with_aug = run_stage(corpus, tmp_path / "aug", orders=[3], use_augmented=True)
    assert "augmented_sequences" not in plain["data"]
    assert with_aug["data"]["augmented_sequences"] == len(aug) - 1
    assert with_aug["data"]["augmented_excluded"]["not_a_train_piece"] == 1
    assert with_aug["data"]["train_targets"] > plain["data"]["train_targets"]


@pytest.mark.parametrize("raw, match", [
    ({"orders": [2, 2]}, "repeat"), ({"orders": [0, 3]}, "1..12"), ({"orders": []}, "orders"),
    ({"smoothing": "good_turing"}, "smoothing"), ({"k": 0.0}, "k"), ({"order": 3}, "unknown"),
])
def test_bad_params_fail_fast(raw, match):
    with pytest.raises(ParamsError, match=match):
        parse_section("ngram", raw, NGramConfig)


def test_orders_are_sorted():
    assert NGramConfig(orders=[5, 1, 3]).orders == [1, 3, 5]


def test_cli_runs_the_stage(corpus, tmp_path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text("ngram:\n  orders: [1, 3]\n")
    out = tmp_path / "cli"
    rc = cli_main(["train-ngram", "--params", str(params), "--tokens", str(corpus["tokens"]),
                   "--info", str(corpus["info"]), "--augmented", str(corpus["augmented"]),
                   "--model-dir", str(out / "ngram"),
                   "--report", str(out / "ngram.json"), "--plot", str(out / "o.tsv")])
    assert rc == 0
    assert "best order 3" in capsys.readouterr().out
    assert (out / "ngram" / "model.npz").exists()


def test_no_val_is_a_clear_error(corpus, tmp_path):
    table = [r for r in pq.read_table(corpus["tokens"]).to_pylist() if r["split"] != "val"]
    write_parquet(corpus["tokens"], tokens_table(table))
    with pytest.raises(ValueError, match="0 val sequences"):
        run_stage(corpus, tmp_path / "out", orders=[2])


def test_compound_tokens_make_the_baseline_not_applicable(compound_tokens, tmp_path):
    """Compound tokens: no model, and outputs that say why (the stage's docstring)."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.npz").write_bytes(b"stale")  # another tokenizer's model goes
    s = run(NGramConfig(), RuntimeConfig(), tokens=compound_tokens["tokens"],
            info=compound_tokens["info"], augmented=compound_tokens["augmented"],
            model_dir=tmp_path / "m", report=tmp_path / "r.json", plot=tmp_path / "p.tsv")
    assert s.best_order is None and s.val_nats_per_token is None
    report = read_json(tmp_path / "r.json")
    assert report["applicable"] is False and report["reason"] == NOT_APPLICABLE
    assert report["tokenizer"] == "CPWord"
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["not_applicable.json"]
