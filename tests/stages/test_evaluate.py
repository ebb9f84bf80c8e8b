"""Evaluation core: protocol, per-piece table, group bootstrap, paired differences, discovery."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from models.ngram import NGramLM
from pipeline.core.artifacts import read_json, read_parquet, write_json, write_parquet
from pipeline.core.config import ParamsError, RuntimeConfig, parse_section
from pipeline.inference.loading import (
    ModelSpec,
    default_specs,
    load_models,
    load_named,
    load_ngram,
)
from pipeline.stages.evaluate import EvaluateConfig, protocol_block, run
from pipeline.stats.aggregate import TRAIN_SUBSET_STREAM, draw_train_subset
from pipeline.stats.bootstrap import (
    bootstrap_weights,
    group_sums,
    independent_diff_ci,
    paired_diff_ci,
    paired_rel_ci,
    ratio_ci,
    seed_half_width,
)
from pipeline.stats.power import detectable_effect, power_summary
from pipeline.tokens.contract import TokenInfo, tokens_table
from tests.inference.test_loading import _fit_and_save
from tests.stages.test_train_ngram import BOS, EOS, PAD, VOCAB, write_corpus


@pytest.fixture
def setup(tmp_path):
    paths = write_corpus(tmp_path / "data")
    _fit_and_save(paths, tmp_path / "data" / "ngram", order=3)
    _fit_and_save(paths, tmp_path / "data" / "unigram", order=1, smoothing="unigram")
    return paths, tmp_path


def evaluate(paths, root: Path, specs, out: str = "reports", **cfg):
    cfg = EvaluateConfig(**{"n_boot": 500, **cfg})
    summary = run(cfg, RuntimeConfig(), tokens=paths["tokens"], info=paths["info"],
                  manifest=paths["manifest"], splits=paths["splits"], specs=specs,
                  per_piece=root / out / "eval" / "per_piece.parquet",
                  report=root / out / "eval.json")
    return (summary, read_json(root / out / "eval.json"),
            read_parquet(root / out / "eval" / "per_piece.parquet"))


def two_models(root: Path) -> list[ModelSpec]:
    return [ModelSpec("ngram", root / "data" / "ngram", load_ngram),
            ModelSpec("unigram", root / "data" / "unigram", load_ngram)]


def test_missing_transformer_is_reported_not_fatal(setup):
    paths, root = setup
    specs = default_specs(root / "data" / "ngram", root / "data" / "transformer")
    summary, report, table = evaluate(paths, root, specs)
    assert set(report["models"]) == {"ngram"}
    assert report["unavailable"]["transformer"].startswith("missing")
    assert summary.unavailable == report["unavailable"]
    assert report["paired"] == {}
    assert set(table["model"]) == {"ngram"}


def test_per_piece_table_follows_the_protocol(setup):
    paths, root = setup
    _, report, table = evaluate(paths, root, two_models(root))
    assert list(table.columns) == ["sha256", "split", "model", "seed", "group_id", "nll_nats",
                                   "n_tokens", "n_notes", "duration_s"]
    assert set(table["split"]) == {"val", "test", "train"}  # train: the gap's subset
    assert table["seed"].isna().all()  # n-grams have no training seed
    assert table.equals(table.sort_values(["model", "seed", "split", "sha256"])
                        .reset_index(drop=True))
    tokens = pq.read_table(paths["tokens"]).to_pandas()
    manifest = read_parquet(paths["manifest"]).set_index("sha256")
    model = NGramLM.load(root / "data" / "ngram")
    ng = table[table["model"] == "ngram"].set_index("sha256")
    scored = tokens[tokens["split"].isin(["val", "test"]) | tokens["sha256"].isin(ng.index)]
    assert (scored["split"] == "train").any()
    for sha, rows in scored.groupby("sha256"):
        seqs = [np.asarray(s, dtype=np.int64) for s in rows["ids"]]
        assert ng.loc[sha, "nll_nats"] == pytest.approx(model.nll_per_piece(seqs).sum(), abs=1e-9)
        assert ng.loc[sha, "n_tokens"] == sum(len(s) + 1 for s in seqs)  # EOS per sequence
        assert ng.loc[sha, "n_notes"] == manifest.loc[sha, "n_notes"]  # manifest, not tokens
    val = ng[ng["split"] == "val"]
    m = report["models"]["ngram"]["val"]
    assert m["nats_per_token"]["value"] == pytest.approx(val["nll_nats"].sum()
                                                         / val["n_tokens"].sum())
    assert m["nats_per_note"]["value"] == pytest.approx(val["nll_nats"].sum()
                                                        / val["n_notes"].sum())
    assert m["nats_per_second"]["value"] == pytest.approx(val["nll_nats"].sum()
                                                          / val["duration_s"].sum())
    assert m["bits_per_token"]["value"] == pytest.approx(m["nats_per_token"]["value"]
                                                         / math.log(2))
    assert m["perplexity"]["ci_high"] == pytest.approx(math.exp(m["nats_per_token"]["ci_high"]))
    assert (m["n_pieces"], m["n_groups"]) == (4, 2)
    proto = report["protocol"]
    assert proto["split_hash"] == "split-hash" and proto["tokenizer_hash"] == "tok-hash"
    assert proto["bootstrap"]["n_boot"] == 500 and proto["splits"] == ["val", "test"]


def test_cis_bracket_estimates_and_paired_differences(setup):
    paths, root = setup
    _, report, _table = evaluate(paths, root, two_models(root))
    for name in ("ngram", "unigram"):
        for split in ("val", "test"):
            for key in ("nats_per_token", "nats_per_note", "nats_per_second", "perplexity"):
                m = report["models"][name][split][key]
                assert m["ci_low"] <= m["value"] <= m["ci_high"], (name, split, key)
    pair = report["paired"]["ngram_minus_unigram"]["val"]["nats_per_token"]
    a = report["models"]["ngram"]["val"]["nats_per_token"]["value"]
    b = report["models"]["unigram"]["val"]["nats_per_token"]["value"]
    assert pair["value"] == pytest.approx(a - b)
    assert pair["ci_low"] <= pair["value"] <= pair["ci_high"] < 0  # the trigram is better
    assert pair["share_a_lower"] == 1.0


def test_two_runs_give_identical_bytes(setup):
    paths, root = setup
    for out in ("r1", "r2"):
        evaluate(paths, root, two_models(root), out=out)
    for rel in ("eval.json", "eval/per_piece.parquet"):
        assert (root / "r1" / rel).read_bytes() == (root / "r2" / rel).read_bytes(), rel


def test_seed_changes_intervals_not_estimates(tmp_path):
    root = tmp_path
    paths = write_corpus(root / "data", n_groups=24, n_eval=6)
    _fit_and_save(paths, root / "data" / "ngram", order=3)
    _fit_and_save(paths, root / "data" / "unigram", order=1, smoothing="unigram")
    _, r1, _ = evaluate(paths, root, two_models(root), out="s1", seed=1)
    _, r2, _ = evaluate(paths, root, two_models(root), out="s2", seed=2)
    m1, m2 = r1["models"]["ngram"]["test"], r2["models"]["ngram"]["test"]
    assert m1["nats_per_note"]["value"] == m2["nats_per_note"]["value"]
    assert m1["nats_per_note"] != m2["nats_per_note"]


def test_bad_pieces_are_excluded_for_every_model(setup):
    paths, root = setup
    tokens = pq.read_table(paths["tokens"]).to_pylist()
    val = [r for r in tokens if r["split"] == "val"]
    val[0]["ids"] = [3, 500]
    val[1]["ids"] = [3, BOS, 4]  # BOS is removed, never a target
    write_parquet(paths["tokens"], tokens_table(tokens))
    man = read_parquet(paths["manifest"])
    write_parquet(paths["manifest"], man[man["sha256"] != val[2]["sha256"]])
    summary, report, table = evaluate(paths, root, two_models(root))
    reasons = {p["sha256"]: p["reason"] for p in report["excluded"]["pieces"]}
    assert reasons == {val[0]["sha256"]: "id_out_of_range", val[2]["sha256"]: "not_in_manifest"}
    assert report["excluded"]["counts"] == {"id_out_of_range": 1, "not_in_manifest": 1}
    assert report["excluded"]["special_ids_removed"] == 1
    assert summary.n_excluded == 2
    assert not table["sha256"].isin(reasons).any()
    assert table.loc[(table["sha256"] == val[1]["sha256"]), "n_tokens"].tolist() == [3, 3]


def test_lossy_pieces_are_scored_and_stated(setup):
    """Pieces whose tokens lose notes are scored per source note like the others, and eval.json
    names them (``fidelity``), for the scored splits only."""
    paths, root = setup
    table = pq.read_table(paths["tokens"])
    rows = table.to_pylist()
    val = sorted({r["sha256"] for r in rows if r["split"] == "val"})[0]
    train = sorted({r["sha256"] for r in rows if r["split"] == "train"})[0]
    for r in rows:
        if r["sha256"] == val:
            r["flags"] = ["notes_dropped", "roundtrip_lossy"]
        if r["sha256"] == train:
            r["flags"] = ["roundtrip_lossy"]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), paths["tokens"])
    _, report, per_piece = evaluate(paths, root, two_models(root))
    assert report["fidelity"]["pieces"] == [
        {"sha256": val, "split": "val", "flags": ["notes_dropped", "roundtrip_lossy"]}]
    assert report["fidelity"]["counts"] == {"val": 1}
    assert val in set(per_piece["sha256"])  # still scored


def test_evaluate_params_fail_fast():
    with pytest.raises(ParamsError, match=r"evaluate\.splits"):
        parse_section("evaluate", {"splits": ["train"]}, EvaluateConfig)
    with pytest.raises(ParamsError, match="repeat"):
        parse_section("evaluate", {"splits": ["val", "val"]}, EvaluateConfig)
    with pytest.raises(ParamsError, match="ci_level"):
        parse_section("evaluate", {"ci_level": 1.5}, EvaluateConfig)
    with pytest.raises(ParamsError, match="device"):
        parse_section("evaluate", {"device": "tpu"}, EvaluateConfig)


# -- the bootstrap itself ------------------------------------------------------------------------
def test_bootstrap_resamples_groups():
    rng = np.random.default_rng(0)
    w = bootstrap_weights(5, 1000, rng)
    assert w.shape == (1000, 5)
    assert np.all(w.sum(axis=1) == 5)
    # Two groups with ratios 1 and 3 (equal sizes): replicates can only be 1, 2 or 3, however
    # many pieces each group holds; a piece-level bootstrap would concentrate near 2.
    codes = np.repeat([0, 1], 50)
    num = group_sums(codes, np.where(codes == 0, 1.0, 3.0), 2)
    den = group_sums(codes, np.ones(100), 2)
    ci = ratio_ci(num, den, bootstrap_weights(2, 2000, np.random.default_rng(1)), 0.95)
    assert ci == {"value": 2.0, "ci_low": 1.0, "ci_high": 3.0}


def test_paired_difference_cancels_shared_group_effects():
    """Paired replicates cancel what both models share; unpaired intervals would not."""
    rng = np.random.default_rng(3)
    G = 30
    difficulty = rng.gamma(2.0, 2.0, G)          # big between-group variation, shared
    den = rng.integers(50, 150, G).astype(float)
    a, b = difficulty * den, (difficulty + 0.1) * den
    w = bootstrap_weights(G, 2000, rng)
    pair = paired_diff_ci(a, den, b, den, w, 0.95)
    assert pair["value"] == pytest.approx(-0.1)
    assert pair["ci_low"] == pytest.approx(-0.1) and pair["ci_high"] == pytest.approx(-0.1)
    single = ratio_ci(a, den, w, 0.95)
    assert single["ci_high"] - single["ci_low"] > 0.5
    assert pair["share_a_lower"] == 1.0


def test_empty_split_gives_null_metrics():
    w = bootstrap_weights(0, 10, np.random.default_rng(0))
    ci = ratio_ci(np.zeros(0), np.zeros(0), w, 0.9)
    assert all(math.isnan(v) for v in ci.values())


def test_per_piece_schema_when_no_model_loads(setup):
    paths, root = setup
    specs = [ModelSpec("ngram", root / "nowhere", load_ngram)]
    _, report, table = evaluate(paths, root, specs)
    assert report["models"] == {} and "ngram" in report["unavailable"]
    assert len(table) == 0 and "nll_nats" in table.columns
    assert isinstance(table, pd.DataFrame)


def _save_tiny_transformer(root: Path) -> None:
    """An untrained GPT with a 16-token context in ``root/data/transformer``."""
    transformer = pytest.importorskip("models.transformer")
    import torch

    cfg = transformer.TransformerConfig(vocab_size=VOCAB, max_seq_len=16, n_layer=1, n_head=2,
                                        n_embd=16)
    model = transformer.GPT(cfg, generator=torch.Generator().manual_seed(0))
    transformer.save_model(root / "data" / "transformer", model, {
        "bos_id": BOS, "eos_id": EOS, "pad_id": PAD, "tokenizer_hash": "tok-hash",
        "split_hash": "split-hash"})


def test_transformer_is_scored_and_paired_when_present(setup):
    """Integration with models.transformer (a tiny untrained GPT): discovered, scored, paired."""
    paths, root = setup
    _save_tiny_transformer(root)
    specs = default_specs(root / "data" / "ngram", root / "data" / "transformer")
    _, report, table = evaluate(paths, root, specs)
    assert report["unavailable"] == {}
    assert set(report["models"]) == {"ngram", "transformer"}
    pair = report["paired"]["ngram_minus_transformer"]["test"]["nats_per_note"]
    assert pair["ci_low"] <= pair["value"] <= pair["ci_high"] < 0  # untrained: the n-gram wins
    counts = table.groupby("model")["n_tokens"].sum()
    assert counts["ngram"] == counts["transformer"]  # the same targets for both


def test_registration_check_compares_protocol_and_split(tmp_path):
    from pipeline.core.artifacts import write_json
    from pipeline.stages.evaluate import EvaluateConfig, registration_check

    cfg = EvaluateConfig()
    info = TokenInfo(vocab_size=8, pad_id=0, bos_id=1, eos_id=2, tokenizer_hash="t",
                     split_hash="abc")
    assert registration_check(tmp_path / "none.json", cfg, info)["registered"] is False
    reg = tmp_path / "preregistration.json"
    write_json(reg, {"schema": 2, "identity": {"split_hash": "abc",
                                                "params": {"evaluate": {"n_boot": cfg.n_boot}}}})
    assert registration_check(reg, cfg, info) == {
        "registered": True, "split_hash_matches": True, "protocol_matches": True}
    changed = registration_check(reg, EvaluateConfig(n_boot=cfg.n_boot + 1),
                                 replace(info, split_hash="x"))
    assert changed["split_hash_matches"] is False and changed["protocol_matches"] is False
    write_json(reg, {"schema": 1, "split_hash": "abc"})  # an old record says nothing checkable
    assert registration_check(reg, cfg, info) == {
        "registered": True, "split_hash_matches": None, "protocol_matches": None}


def test_stride_reaches_the_scorer_and_a_too_large_one_names_the_key(setup):
    paths, root = setup
    _save_tiny_transformer(root)  # max_seq_len 16; pieces are 30-60 tokens, so windows slide
    info = TokenInfo.read(paths["info"])
    dirs = (root / "data" / "ngram", root / "data" / "transformer")

    def scored(**kw) -> pd.Series:
        _, report, table = evaluate(paths, root, default_specs(*dirs, **kw),
                                    out=f"stride-{kw}")
        assert report["unavailable"] == {}
        return table[table["model"] == "transformer"]["nll_nats"].reset_index(drop=True)

    models, _ = load_models(default_specs(*dirs, stride=3), info=info)
    assert models["transformer"].stride == 3
    default = scored()  # the scorer's own default, max_seq_len // 4 = 4
    pd.testing.assert_series_equal(scored(stride=4), default)
    assert not scored(stride=16).equals(default)
    with pytest.raises(ParamsError, match=r"evaluate\.stride: 17 .*max_seq_len 16"):
        evaluate(paths, root, default_specs(*dirs, stride=17))  # lenient, yet it stops
    with pytest.raises(ParamsError, match=r"evaluate\.stride"):  # not ModelUnavailable
        load_models(default_specs(*dirs, ["transformer"], stride=17), info=info, strict=True)
    named, _ = load_named(["transformer"], ngram_dir=dirs[0], transformer_dir=dirs[1],
                          device="cpu", info=info, torch_threads=1)  # generate, audit: unchanged
    assert named["transformer"].stride == 4


def test_default_stride_is_the_default_models_own():
    """``evaluate.stride`` 64 is what the scorer chose by itself for the default 256-token
    context, so the default experiment's scores do not change; it is part of the protocol."""
    from pipeline.training.config import ModelSection

    cfg = EvaluateConfig()
    assert cfg.stride == max(1, ModelSection().max_seq_len // 4) == 64
    info = TokenInfo(vocab_size=8, pad_id=0, bos_id=1, eos_id=2, tokenizer_hash="t",
                     split_hash="s")
    assert protocol_block(cfg, info)["transformer_stride"] == 64
    with pytest.raises(ParamsError, match=r"evaluate\.stride"):
        parse_section("evaluate", {"stride": 0}, EvaluateConfig)


def test_relative_improvement_block(tmp_path):
    """Each pair and split gains ``rel_improvement``: (A − B) / A per unit with the interval
    formed inside the same replicates as the difference (whose values do not change), the
    median piece effect and the effect without the 3 groups contributing most."""
    root = tmp_path
    paths = write_corpus(root / "data", n_groups=24, n_eval=6)
    _fit_and_save(paths, root / "data" / "ngram", order=3)
    _fit_and_save(paths, root / "data" / "unigram", order=1, smoothing="unigram")
    _, report, table = evaluate(paths, root, two_models(root), seed=5)
    for i, split in enumerate(("val", "test")):
        block = report["paired"]["ngram_minus_unigram"][split]
        part = table[table["split"] == split].sort_values("sha256")
        a, b = (part[part["model"] == m].reset_index(drop=True) for m in ("ngram", "unigram"))
        names, codes = np.unique(a["group_id"].to_numpy(dtype=str), return_inverse=True)
        w = bootstrap_weights(len(names), 500, np.random.default_rng([5, i]))
        g = {k: group_sums(codes, df[col], len(names))
             for k, df, col in (("a", a, "nll_nats"), ("b", b, "nll_nats"),
                                ("notes", a, "n_notes"))}
        args = (g["a"], g["notes"], g["b"], g["notes"], w, 0.95)
        assert block["nats_per_note"] == pytest.approx(paired_diff_ci(*args), rel=1e-12)
        rel = block["rel_improvement"]
        ci = {k: rel[k] for k in ("value", "ci_low", "ci_high")}
        assert ci == pytest.approx(paired_rel_ci(*args), rel=1e-12)
        assert rel["value"] == pytest.approx(1 - b["nll_nats"].sum() / a["nll_nats"].sum())
        seconds = (g["a"], group_sums(codes, a["duration_s"], len(names)), g["b"],
                   group_sums(codes, a["duration_s"], len(names)), w, 0.95)
        assert paired_rel_ci(*seconds) == pytest.approx(ci, rel=1e-9)  # shared units cancel
        assert rel["median_piece_effect"] == pytest.approx(
            np.median(1 - b["nll_nats"] / a["nll_nats"]))
        top = rel["without_top3_groups"]
        assert len(top["dropped_groups"]) == 3 and set(top["dropped_groups"]) <= set(names)
        kept = ~a["group_id"].isin(top["dropped_groups"])
        assert top["value"] == pytest.approx(1 - b["nll_nats"][kept].sum()
                                             / a["nll_nats"][kept].sum())
        assert rel["value"] < top["value"] < 0  # the unigram is worse


# -- generalisation gap and power ----------------------------------------------------------------
def test_train_rows_leave_val_and_test_unchanged(tmp_path):
    """The train subset adds rows and blocks, and changes nothing else: the same corpus without
    train rows (what evaluate scored before) gives the same val/test rows and blocks."""
    root = tmp_path
    paths = write_corpus(root / "data", n_groups=24, n_eval=6)
    _fit_and_save(paths, root / "data" / "ngram", order=3)
    _fit_and_save(paths, root / "data" / "unigram", order=1, smoothing="unigram")
    # train_pieces=0: as many as the held-out (val and test) scored pieces
    _, report, table = evaluate(paths, root, two_models(root), out="with", seed=3,
                                train_pieces=0)
    rows = pq.read_table(paths["tokens"]).to_pylist()
    no_train = {**paths, "tokens": root / "no_train" / "tokens.parquet"}
    write_parquet(no_train["tokens"], tokens_table([r for r in rows if r["split"] != "train"]))
    _, before, before_table = evaluate(no_train, root, two_models(root), out="without", seed=3)

    assert table[table["split"] != "train"].reset_index(drop=True).equals(before_table)
    assert table.equals(table.sort_values(["model", "split", "sha256"]).reset_index(drop=True))
    for key in ("paired", "excluded", "unavailable"):
        assert report[key] == before[key], key
    for name in ("ngram", "unigram"):
        assert {k: v for k, v in report["models"][name].items() if k != "train_subset"} \
            == before["models"][name]
        assert "train_subset" not in before["models"][name]
    assert before["gap"] == {} and report["gap"] != {}
    train = sorted({r["sha256"] for r in rows if r["split"] == "train"})
    n_held = sum(report["models"]["ngram"][s]["n_pieces"] for s in ("val", "test"))
    for name in ("ngram", "unigram"):
        part = table[(table["model"] == name) & (table["split"] == "train")]
        assert list(part["sha256"]) == draw_train_subset(train, n_held, seed=3)
        assert report["models"][name]["train_subset"]["n_pieces"] == n_held == 24
        assert report["gap"][name]["n_pieces_heldout"] == 24
    assert report["train_subset"] == {"n_pieces": 24, "n_wanted": 24, "n_usable": 24,
                                      "n_excluded": 0}
    # evaluate.train_pieces asks for more (all of train when it has fewer), nested in the draw
    _, more, more_table = evaluate(paths, root, two_models(root), out="more", seed=3,
                                   train_pieces=20)
    assert more["train_subset"]["n_pieces"] == 20 and more["gap"]["ngram"]["n_pieces_train"] == 20
    part = more_table[(more_table["model"] == "ngram") & (more_table["split"] == "train")]
    assert set(draw_train_subset(train, 12, seed=3)) <= set(part["sha256"])
    assert more_table[more_table["split"] != "train"].reset_index(drop=True).equals(before_table)
    _, every, _ = evaluate(paths, root, two_models(root), out="every", seed=3, train_pieces=500)
    assert every["train_subset"]["n_pieces"] == 24 and every["train_subset"]["n_wanted"] == 500


def _fit_on(paths: dict[str, Path], out: Path, splits: set[str]) -> None:
    """An order-12 add-k n-gram (k = 0.01) on the pieces of ``splits``: in-sample pieces are
    nearly certain, unseen long contexts fall to the uniform distribution."""
    seqs = [np.array(r["ids"], dtype=np.int64)
            for r in pq.read_table(paths["tokens"]).to_pylist() if r["split"] in splits]
    NGramLM(order=12, smoothing="add_k", k=0.01, vocab_size=VOCAB, bos_id=BOS, eos_id=EOS,
            pad_id=PAD).fit(seqs).save(out, metadata={"tokenizer_hash": "tok-hash",
                                                      "split_hash": "split-hash"})


def test_gap_flags_overfitting_and_leakage(tmp_path):
    """A memorising model fitted on train has a held-out − train gap far above a 0.5-nat bound;
    the same model fitted on train *and* the held-out pieces (leakage) has none, and one that saw
    val only sits between them (the pooled gap dilutes a val leak by test's share). Each
    assertion fails for the other model."""
    root = tmp_path
    paths = write_corpus(root / "data", n_groups=40, n_eval=10)
    _fit_on(paths, root / "data" / "overfit", {"train"})
    _fit_on(paths, root / "data" / "leak", {"train", "val", "test"})
    _fit_on(paths, root / "data" / "valleak", {"train", "val"})
    specs = [ModelSpec(n, root / "data" / n, load_ngram) for n in ("leak", "overfit", "valleak")]
    _, report, table = evaluate(paths, root, specs, seed=0, train_pieces=0)
    over, leak = report["gap"]["overfit"]["nats_per_token"], report["gap"]["leak"]["nats_per_token"]
    assert over["ci_low"] > 0.5 and leak["ci_high"] < 0.05
    assert leak["ci_low"] < 0 and over["ci_low"] > leak["ci_high"] + 1.0
    assert report["gap"]["overfit"]["nats_per_note"]["ci_low"] > 0.5
    half = report["gap"]["valleak"]["nats_per_token"]["value"]
    assert leak["value"] + 0.5 < half < over["value"] - 0.5

    # The value is the pooled held-out pieces minus the train subset; the interval resamples
    # each set's groups with its own documented generator.
    m = report["models"]["overfit"]
    assert set(m["train_subset"]) == set(m["val"])
    gap = report["gap"]["overfit"]
    assert gap["heldout"] == ["val", "test"]
    assert gap["n_pieces_heldout"] == gap["n_pieces_train"] == 40

    def sums(split: str | tuple[str, ...], rng: np.random.Generator):
        splits = (split,) if isinstance(split, str) else split
        part = table[(table["model"] == "overfit") & table["split"].isin(splits)]
        part = part.sort_values("sha256")
        names, codes = np.unique(part["group_id"].to_numpy(dtype=str), return_inverse=True)
        w = bootstrap_weights(len(names), 500, rng)
        return (group_sums(codes, part["nll_nats"], len(names)),
                group_sums(codes, part["n_tokens"], len(names)), w)

    va = sums(("val", "test"), np.random.default_rng([0, TRAIN_SUBSET_STREAM, 2]))
    tr = sums("train", np.random.default_rng([0, TRAIN_SUBSET_STREAM, 1]))
    assert over == pytest.approx(independent_diff_ci(*va, *tr, 0.95), rel=1e-12)
    assert ratio_ci(tr[0], tr[1], tr[2], 0.95) == pytest.approx(
        m["train_subset"]["nats_per_token"], rel=1e-12)


def test_power_block_is_estimated_from_val(tmp_path):
    root = tmp_path
    paths = write_corpus(root / "data", n_groups=24, n_eval=6)
    _fit_and_save(paths, root / "data" / "ngram", order=3)
    _fit_and_save(paths, root / "data" / "unigram", order=1, smoothing="unigram")
    _, report, table = evaluate(paths, root, two_models(root), ci_level=0.9)
    block = report["power"]["ngram_minus_unigram"]
    val = table[table["split"] == "val"].sort_values("sha256")
    names, codes = np.unique(val[val["model"] == "ngram"]["group_id"].to_numpy(dtype=str),
                             return_inverse=True)
    a, b = (group_sums(codes, val[val["model"] == m]["nll_nats"], len(names))
            for m in ("ngram", "unigram"))
    expected = detectable_effect(a, b, 6, power=0.8, level=0.9)
    assert {k: block[k] for k in expected} == pytest.approx(expected, rel=1e-12)
    assert block["n_groups_of"] == "test (scored)" and block["estimated_from"] == "val"
    assert block["mde"] > 0 and block["alpha"] == pytest.approx(0.05)
    summary = power_summary(report, "ngram_minus_unigram", block["mde"] * 0.9, 0.9)
    assert summary is not None and summary.mde == pytest.approx(block["mde"])
    assert summary.warning is not None

    _, val_only, _ = evaluate(paths, root, two_models(root), out="val_only", splits=["val"])
    block = val_only["power"]["ngram_minus_unigram"]
    assert (block["n_groups"], block["n_groups_of"]) == (6, "test (data/splits.parquet)")
    _, test_only, t = evaluate(paths, root, two_models(root), out="test_only", splits=["test"])
    assert test_only["power"] == {} and test_only["gap"]["ngram"]["heldout"] == ["test"]
    assert set(t["split"]) == {"test", "train"}  # test alone is a held-out side


# -- training-seed replicates --------------------------------------------------------------------
def _replicated(root: Path, paths: dict[str, Path], orders: dict[int, int]) -> ModelSpec:
    """A model folder laid out like train_transformer's, ``replicates/index.json`` listing one
    n-gram per "seed" (the order stands in for what a seed changes)."""
    folder = root / "data" / "replicated"
    for seed, order in orders.items():
        _fit_and_save(paths, folder / "replicates" / f"seed-{seed}", order=order)
    write_json(folder / "replicates" / "index.json",
               {"seeds": sorted(orders), "folders": {str(s): f"seed-{s}" for s in orders}})
    return ModelSpec("replicated", folder, load_ngram)


def test_every_replicate_is_scored_and_averaged(setup):
    paths, root = setup
    spec = _replicated(root, paths, {7: 2, 8: 3})
    specs = [ModelSpec("unigram", root / "data" / "unigram", load_ngram), spec]
    _, report, table = evaluate(paths, root, specs)
    rep = table[table["model"] == "replicated"]
    assert sorted(rep["seed"].unique()) == [7, 8] and report["seeds"] == {
        "replicated": [7, 8], "unigram": []}
    by_seed = {s: rep[(rep["seed"] == s) & (rep["split"] == "test")].set_index("sha256")
               for s in (7, 8)}
    test = report["models"]["replicated"]["test"]
    mean_nll = (by_seed[7]["nll_nats"] + by_seed[8]["nll_nats"]) / 2
    assert test["n_seeds"] == 2 and test["n_pieces"] == len(by_seed[7])
    assert test["nats_per_token"]["value"] == pytest.approx(
        mean_nll.sum() / by_seed[7]["n_tokens"].sum())
    for s in (7, 8):
        assert test["per_seed"][str(s)]["nats_per_token"] == pytest.approx(
            by_seed[s]["nll_nats"].sum() / by_seed[s]["n_tokens"].sum())
    rel = report["paired"]["replicated_minus_unigram"]["test"]["rel_improvement"]
    uni = table[(table["model"] == "unigram") & (table["split"] == "test")]
    assert rel["per_seed_of"] == "a" and set(rel["per_seed"]) == {"7", "8"}
    assert rel["per_seed"]["8"] == pytest.approx(1 - uni["nll_nats"].sum()
                                                 / by_seed[8]["nll_nats"].sum())
    assert rel["value"] == pytest.approx(1 - uni["nll_nats"].sum() / mean_nll.sum())
    # the seeds enter as a Student-t term over the per-seed effects, added in quadrature to the
    # group bootstrap of the seed-averaged model on each side
    half = seed_half_width([list(rel["per_seed"].values())], 0.95)
    assert rel["seed_half_width"] == pytest.approx(half) and half > 0
    assert rel["ci_low"] == pytest.approx(rel["value"] - math.hypot(
        rel["value"] - rel["groups_ci_low"], half))
    assert rel["ci_high"] == pytest.approx(rel["value"] + math.hypot(
        rel["groups_ci_high"] - rel["value"], half))
    assert rel["groups_ci_low"] < rel["value"] < rel["groups_ci_high"]
    gap = report["gap"]["replicated"]["nats_per_token"]
    assert set(gap["per_seed"]) == {"7", "8"}
    assert min(gap["per_seed"].values()) <= gap["value"] <= max(gap["per_seed"].values())
    assert gap["seed_half_width"] == pytest.approx(
        seed_half_width([list(gap["per_seed"].values())], 0.95))
    # each seed's own gap with its groups' interval, what the gap guards are judged on
    own = report["gap"]["replicated"]["per_seed"]
    assert set(own) == {"7", "8"} and "per_seed" not in report["gap"]["unigram"]
    for s in ("7", "8"):
        block = own[s]["nats_per_token"]
        assert block["value"] == pytest.approx(gap["per_seed"][s])
        assert block["ci_low"] < block["value"] < block["ci_high"]
        assert "seed_half_width" not in block and set(own[s]) == {"nats_per_token",
                                                                 "nats_per_note"}
    assert "seed_half_width" not in report["models"]["unigram"]["test"]["nats_per_note"]
    assert report["power"]["replicated_minus_unigram"]["n_seeds"] == 2
    assert report["power"]["replicated_minus_unigram"]["seed_sd"] > 0


def test_agreeing_replicates_add_no_width_and_differing_ones_do(setup):
    """Two replicates with the same scores give the single model's intervals; replicates that
    differ widen the comparison's interval (training variance is part of it)."""
    paths, root = setup
    uni = ModelSpec("unigram", root / "data" / "unigram", load_ngram)
    single = ModelSpec("replicated", root / "data" / "ngram", load_ngram)
    _, one, _ = evaluate(paths, root, [uni, single], out="one")
    _, same, _ = evaluate(paths, root, [uni, _replicated(root, paths, {1: 3, 2: 3})],
                          out="same")
    pair = "replicated_minus_unigram"
    for key in ("nats_per_note", "rel_improvement"):
        a, b = one["paired"][pair]["test"][key], same["paired"][pair]["test"][key]
        assert (b["ci_low"], b["ci_high"]) == pytest.approx((a["ci_low"], a["ci_high"]))
    differ = root / "differ"
    _fit_and_save(paths, differ / "replicates" / "seed-1", order=3)
    _fit_and_save(paths, differ / "replicates" / "seed-2", order=1, smoothing="add_k")
    write_json(differ / "replicates" / "index.json", {"seeds": [1, 2], "folders": {}})
    _, wide, _ = evaluate(paths, root, [uni, ModelSpec("replicated", differ, load_ngram)],
                          out="differ")
    a, b = one["paired"][pair]["test"]["nats_per_note"], wide["paired"][pair]["test"][
        "nats_per_note"]
    assert b["ci_high"] - b["ci_low"] > a["ci_high"] - a["ci_low"]


def test_an_unloadable_replicate_is_named_and_the_others_scored(setup):
    paths, root = setup
    spec = _replicated(root, paths, {1: 2, 2: 3})
    (spec.model_dir / "replicates" / "seed-2" / "model.json").write_text("{not json")
    _, report, _ = evaluate(paths, root, [spec])
    assert set(report["unavailable"]) == {"replicated@seed-2"}
    assert report["seeds"] == {"replicated": [1]}
    assert report["models"]["replicated"]["test"]["n_seeds"] == 1
