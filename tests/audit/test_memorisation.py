"""Memorisation measures (suffix array, novelty, shingle neighbours, extraction, membership) and
the audit stage end to end, with a planted copying model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.audit.memorisation import (
    Extraction,
    ShingleIndex,
    SuffixIndex,
    extraction_test,
    judge_extraction,
    judge_flag_rate,
    judge_membership,
    membership_auc,
    newcombe_interval,
    novelty,
    resampled_rate,
    suffix_array,
    tpr_at_fpr,
    union_extraction,
    wilson_interval,
    window_offsets,
)
from pipeline.core import artifacts
from pipeline.similarity.fingerprints import jaccard_containment
from pipeline.stages.audit import AuditConfig
from pipeline.stages.audit import run as run_audit
from pipeline.stages.generate import GenerateConfig
from pipeline.stages.generate import run as run_generate
from tests.stages.test_generate import CountLM, make_world, train_seqs

small_seqs = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=25), min_size=1,
                      max_size=5)


def brute_ms(train: list[list[int]], q: list[int]) -> list[int]:
    """Longest prefix of q[i:] inside some single training sequence, by brute force."""
    out = []
    for i in range(len(q)):
        best = 0
        for s in train:
            for j in range(len(s)):
                k = 0
                while i + k < len(q) and j + k < len(s) and q[i + k] == s[j + k]:
                    k += 1
                best = max(best, k)
        out.append(best)
    return out


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=60))
def test_suffix_array_sorts_suffixes(text):
    sa = suffix_array(np.asarray(text))
    assert sa.tolist() == sorted(range(len(text)), key=lambda i: text[i:])


@settings(max_examples=80, deadline=None)
@given(small_seqs, st.lists(st.integers(0, 4), min_size=0, max_size=30))
def test_matching_statistics_equal_brute_force(train, q):
    index = SuffixIndex().fit([np.asarray(s, dtype=np.int64) for s in train])
    lengths, where = index.matching_statistics(np.asarray(q, dtype=np.int64))
    assert lengths.tolist() == brute_ms(train, q)
    for i, (n, pos) in enumerate(zip(lengths, where, strict=True)):
        if n:  # the reported occurrence really matches and stays in one sequence
            k, off = index.locate(int(pos))
            assert train[k][off:off + n] == q[i:i + n]


def test_matches_never_span_two_training_pieces():
    index = SuffixIndex().fit([np.array([1, 2, 3]), np.array([4, 5, 6])])
    match, _ = index.longest_match(np.array([2, 3, 4, 5]))
    assert match.length == 2


def test_novelty_from_matching_statistics():
    lengths = np.array([3, 2, 1, 0, 2, 1])  # 2-grams at 0, 1, 4 exist; at 2, 3 do not
    assert novelty(lengths, 2) == pytest.approx(2 / 5)
    assert novelty(lengths, 1) == pytest.approx(1 / 6)
    assert np.isnan(novelty(lengths, 7))


def test_shingle_index_matches_exact_jaccard():
    rng = np.random.default_rng(0)
    sets = [np.unique(rng.integers(0, 60, size=rng.integers(0, 30)).astype(np.uint64))
            for _ in range(20)]
    index = ShingleIndex().fit(sets)
    for _ in range(20):
        q = np.unique(rng.integers(0, 60, size=15).astype(np.uint64))
        k, jac, con = index.nearest(q)
        ref = [jaccard_containment(q, s) for s in sets]
        best = max(r[0] for r in ref)
        assert jac == pytest.approx(best)
        assert k == [r[0] for r in ref].index(best)
        assert con == pytest.approx(ref[k][1])
    assert index.nearest(np.array([999], dtype=np.uint64)) == (-1, 0.0, 0.0)


def test_membership_auc():
    assert membership_auc([1.0, 1.1], [2.0, 2.5]) == 1.0
    assert membership_auc([1.0, 2.0], [1.0, 2.0]) == 0.5
    assert np.isnan(membership_auc([], [1.0]))


def test_window_offsets():
    assert window_offsets(100, 128, 64, 4).tolist() == [0]  # a short piece is one window
    assert window_offsets(128, 128, 64, 4).tolist() == [0]
    assert window_offsets(300, 128, 64, 4).tolist() == [0, 64, 128]
    # 2000 ids: 30 candidate starts, 4 kept from first to last, evenly
    assert window_offsets(2000, 128, 64, 4).tolist() == [0, 640, 1216, 1856]
    for off in window_offsets(2000, 128, 64, 4):
        assert off + 128 <= 2000


def test_wilson_interval_known_values():
    # Wilson (1927); e.g. 0 of 10 at 95%: [0, 0.2775]; 5 of 10: [0.2366, 0.7634]
    assert wilson_interval(0, 10, 0.95) == pytest.approx((0.0, 0.27753), abs=1e-4)
    assert wilson_interval(5, 10, 0.95) == pytest.approx((0.23659, 0.76341), abs=1e-4)
    assert wilson_interval(10, 10, 0.95)[1] == 1.0
    assert all(np.isnan(wilson_interval(0, 0, 0.95)))


def test_resampled_rate_keeps_clusters_and_strata_together():
    rng = np.random.default_rng(0)
    # two pieces with 3 windows each: one all flagged, one none; a replicate is 0, 0.5 or 1
    reps = resampled_rate(np.array([1, 1, 1, 0, 0, 0]), np.array([0, 0, 0, 1, 1, 1]), 400, rng)
    assert set(np.round(reps, 6)) <= {0.0, 0.5, 1.0} and reps.std() > 0.3
    # stratified: each stratum keeps its size, so a stratum of constant values never varies
    reps = resampled_rate(np.array([1.0, 1.0, 0.0, 1.0]), np.arange(4), 400, rng,
                          strata=np.array(["a", "a", "b", "b"]))
    assert set(np.round(reps * 4).astype(int)) <= {2, 3, 4} and reps.min() >= 0.5


def test_judge_flag_rate_interval_and_excess():
    rng = np.random.default_rng(1)
    kinds = np.array(["unconditional"] * 60 + ["continuation"] * 20)
    pieces = np.repeat(np.arange(50), 3)
    human = (np.arange(150) % 20 == 0).astype(float)  # 5 % of windows
    copier = judge_flag_rate(np.ones(80), kinds, human, pieces, n_boot=500, level=0.95, rng=rng)
    assert copier["value"] == 1.0 and copier["n_flagged"] == 80
    assert copier["ci_low"] > 0.9 and copier["excess"]["ci_low"] > 0.8
    assert copier["human"]["n_pieces"] == 50 and copier["human"]["n_windows"] == 150
    like = (np.arange(80) % 20 == 3).astype(float)  # a human-like 5 %
    fair = judge_flag_rate(like, kinds, human, pieces, n_boot=500, level=0.95, rng=rng)
    assert fair["excess"]["ci_low"] < 0 < fair["excess"]["ci_high"]
    assert fair["ci_low"] < fair["value"] < fair["ci_high"]


def test_judge_membership_and_extraction_against_chance():
    rng = np.random.default_rng(2)
    low, high = rng.normal(1.0, 0.1, 40), rng.normal(2.0, 0.1, 40)
    assert judge_membership(low, high, n_boot=300, level=0.95, rng=rng)["ci_low"] == 1.0
    a, b = rng.normal(size=40), rng.normal(size=40)
    same = judge_membership(a, b, n_boot=300, level=0.95, rng=rng)
    assert same["ci_low"] < 0.5 < same["ci_high"] and same["chance"] == 0.5
    assert same["value"] == pytest.approx(membership_auc(a, b))  # the sklearn value
    ties = judge_membership([1.0, 2.0], [1.0, 2.0], n_boot=100, level=0.95, rng=rng)
    assert ties["value"] == membership_auc([1.0, 2.0], [1.0, 2.0]) == 0.5
    train = Extraction(20, 0.5, 0.5, (True, False) * 10)
    test = Extraction(20, 0.0, 0.0, (False,) * 20)
    e = judge_extraction(train, test, level=0.95)
    assert e["train"]["value"] == 0.5 and e["test"]["value"] == 0.0
    assert e["test"]["ci_high"] > 0  # Wilson: 0 of 20 is not "surely 0"
    assert e["excess"]["value"] == 0.5 and e["excess"]["ci_low"] > 0.2
    # 0 of 64 against 0 of 45, the default experiment's counts: no zero-width interval, and
    # its upper end is the Wilson bound of 0/64 (5.7%), above a 5-point margin
    none = judge_extraction(Extraction(64, 0.0, 0.0, (False,) * 64),
                            Extraction(45, 0.0, 0.0, (False,) * 45), level=0.95)["excess"]
    assert none["value"] == 0 and none["ci_low"] < 0 < 0.05 < none["ci_high"]
    assert none["ci_high"] == pytest.approx(wilson_interval(0, 64, 0.95)[1])


def test_newcombe_interval_matches_the_published_example():
    # Newcombe (1998), Table II, example (a): 56/70 - 48/80, 95% method 10: 0.0524 to 0.3339
    lo, hi = newcombe_interval(56, 70, 48, 80, 0.95)
    assert (round(lo, 4), round(hi, 4)) == (0.0524, 0.3339)
    # example (e): 0/10 - 0/20: -0.1611 to 0.2775
    lo, hi = newcombe_interval(0, 10, 0, 20, 0.95)
    assert (round(lo, 4), round(hi, 4)) == (-0.1611, 0.2775)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("mem_world"))


def make_copier(world, kind: str = "count"):
    """A high-order model of the training set: greedy decoding replays training pieces."""
    info = artifacts.read_json(world["info"])
    if kind == "ngram":
        from models.ngram import NGramLM

        return NGramLM(order=12, vocab_size=info["vocab_size"], bos_id=info["bos_id"],
                       eos_id=info["eos_id"], pad_id=info["pad_id"]).fit(train_seqs(world))
    return CountLM(12, info["vocab_size"], alpha=1e-6).fit(train_seqs(world))


@pytest.fixture(scope="module")
def copier(world):
    return make_copier(world)


def test_extraction_separates_train_from_test(world, copier):
    t = artifacts.read_parquet(world["tokens"])
    train = [np.asarray(x) for x in t[t["split"] == "train"]["ids"]][:6]
    test = [np.asarray(x) for x in t[t["split"] == "test"]["ids"]][:6]
    a = extraction_test(copier, train, 24, 24, forbid=[0, 1, 3])
    b = extraction_test(copier, test, 24, 24, forbid=[0, 1, 3])
    assert a.n == b.n == 6
    assert a.exact_rate == 1.0 and b.exact_rate == 0.0


def _audit(world, out, models, cfg=None):
    cfg = cfg or AuditConfig(models=["ngram"], extraction_pieces=4, membership_pieces=6)
    return run_audit(cfg, models, samples=out / "samples.parquet", tokens=world["tokens"],
                     info=world["info"], tokenizer=world["tokenizer"],
                     per_sample=out / "audit" / "per_sample.parquet",
                     spans=out / "audit" / "spans.parquet", report=out / "audit.json")


@pytest.mark.parametrize("kind", ["count", "ngram"])
def test_copying_model_is_flagged_far_above_human_pieces(world, kind, tmp_path):
    copier = make_copier(world, kind)
    gcfg = GenerateConfig(models=["ngram"], n_samples=4, n_continuations=4, max_new_tokens=120,
                          prompt_tokens=24, temperature=0.0)
    run_generate(gcfg, {"ngram": copier}, tokens=world["tokens"], info=world["info"],
                 tokenizer=world["tokenizer"], samples_out=tmp_path / "samples.parquet",
                 samples_dir=tmp_path / "samples")
    summary = _audit(world, tmp_path, {"ngram": copier})
    report = artifacts.read_json(tmp_path / "audit.json")
    table = artifacts.read_parquet(tmp_path / "audit" / "per_sample.parquet")

    # a continuation may end early (EOS) and copy nothing; every unconditional sample copies
    assert summary.sample_flag_rate >= 0.75
    assert summary.human_flag_rate <= 0.2
    assert report["flag_rate"]["excess"] >= 0.6
    samples = table[table["source"] == "sample"]
    assert samples[samples["kind"] == "unconditional"]["flagged"].all()
    human = table[(table["source"] == "human") & (table["kind"] == "test")]
    assert samples["lcs_tokens"].median() > 3 * human["lcs_tokens"].median()
    assert samples["novelty_tok_16"].mean() < 0.2 < human["novelty_tok_16"].mean()
    assert samples["nn_jaccard"].mean() > human["nn_jaccard"].mean()
    long = samples[samples["lcs_tokens"] >= 40]
    assert len(long) >= 4 and (long["lcs_bars"] >= 1).all()  # from the tokenizer's Bar tokens
    assert report["extraction"]["ngram"]["exact_gap"] > 0.5
    assert report["membership"]["ngram"]["auc"] > 0.9
    assert set(report["music"]["test"]) == set(report["music"]["ngram"])
    tokens = artifacts.read_parquet(world["tokens"])
    windows = sum(len(window_offsets(int(n), 128, 64, 4))
                  for n in tokens[tokens["split"] != "train"]["n_tokens"])
    assert windows > 20  # several windows per held-out piece
    assert len(table) == 8 + windows and table["decode_ok"].all()
    assert report["human"]["test"]["n_pieces"] == 10 < report["human"]["test"]["n"]

    first = {p: (tmp_path / p).read_bytes() for p in ("audit.json", "audit/per_sample.parquet")}
    _audit(world, tmp_path, {"ngram": copier})
    for p, data in first.items():
        assert (tmp_path / p).read_bytes() == data, p


def test_tpr_at_fpr_reads_the_attack_at_its_false_alarm_rate():
    held = np.arange(1.0, 11.0)  # 10 held-out losses 1..10
    # at most 10% of held-out called members: only losses below 2 (held-out 1.0 is the one
    # false alarm), so train losses 0.5 and 1.5 are caught and 2.5 is not
    assert tpr_at_fpr(np.array([0.5, 1.5, 2.5, 9.0]), held, 0.1)[0] == 0.5
    assert tpr_at_fpr(np.array([0.5, 1.5, 2.5, 9.0]), held, 0.3)[0] == 0.75  # below 4
    # weights: a held-out piece drawn twice moves the threshold
    w = np.ones((1, 10))
    w[0, 0] = 2.0  # held-out loss 1.0 drawn twice is 2 of 11 > 10%: only below 1 is allowed
    assert tpr_at_fpr(np.array([0.5, 1.5, 2.5]), held, 0.1, None, w)[0] == pytest.approx(1 / 3)


def test_membership_resamples_whole_groups_and_reports_the_tpr():
    rng = np.random.default_rng(5)
    # 10 groups of 6 pieces sharing their difficulty: a group bootstrap must see 10 units, not 60
    shared = np.repeat(rng.normal(size=10), 6)
    a = shared + 0.01 * rng.normal(size=60)
    b = np.repeat(rng.normal(size=10), 6) + 0.01 * rng.normal(size=60)
    ga, gb = np.repeat(np.arange(10), 6), np.repeat(np.arange(10, 20), 6)
    pieces = judge_membership(a, b, n_boot=400, level=0.95, rng=np.random.default_rng(1))
    groups = judge_membership(a, b, n_boot=400, level=0.95, rng=np.random.default_rng(1),
                              train_groups=ga, heldout_groups=gb)
    width = lambda j: j["ci_high"] - j["ci_low"]  # noqa: E731
    assert groups["value"] == pieces["value"]
    assert width(groups) > 1.8 * width(pieces)  # about sqrt(6) wider
    assert groups["n_train_groups"] == 10 and pieces["n_train_groups"] == 60
    t = groups["tpr"]
    assert t["fpr"] == t["chance"] == 0.1 and t["ci_low"] <= t["value"] <= t["ci_high"]
    with pytest.raises(ValueError, match="group labels"):
        judge_membership(a, b, n_boot=10, level=0.95, rng=rng, train_groups=ga[:5])


def test_membership_over_seeds_is_their_mean_with_a_t_term():
    """2-d losses (seeds, pieces): one row is exactly the 1-d judgement; identical seeds add
    nothing; seeds that disagree give their mean AUC with a wider interval than the groups'."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(-0.5, 1, 60), rng.normal(0, 1, 40)
    groups = (np.arange(60) % 20, np.arange(40) % 15)

    def judged(x, y, **kw):
        return judge_membership(x, y, n_boot=400, level=0.95, rng=np.random.default_rng(1),
                                train_groups=groups[0], heldout_groups=groups[1], **kw)

    plain = judged(a, b)
    assert judged(a[None], b[None]) == plain
    same = judged(np.stack([a, a]), np.stack([b, b]))
    assert same["value"] == plain["value"] and same["seed_half_width"] == 0.0
    assert (same["ci_low"], same["ci_high"]) == pytest.approx((plain["ci_low"], plain["ci_high"]))
    chance = rng.normal(0, 1, 60)
    mixed = judged(np.stack([a, chance]), np.stack([b, b]), seeds=[11, 12])
    assert mixed["value"] == pytest.approx((plain["value"] + membership_auc(chance, b)) / 2)
    assert sorted(mixed["per_seed"]) == ["11", "12"]
    assert mixed["per_seed"]["11"]["value"] == plain["value"]
    assert mixed["seed_half_width"] > 0
    assert mixed["ci_low"] < mixed["groups_ci_low"] and mixed["ci_high"] > mixed["groups_ci_high"]
    wide = judged(np.stack([a - 3, chance]), np.stack([b, b]))  # one seed near AUC 1
    assert wide["ci_low"] >= 0.0 and wide["ci_high"] == 1.0  # a proportion stays in [0, 1]
    assert mixed["tpr"]["seed_half_width"] >= 0
    with pytest.raises(ValueError, match="seeds"):
        judged(np.stack([a, a]), b[None])


def test_extraction_over_seeds_counts_a_piece_any_seed_reproduces():
    one = Extraction(4, 0.25, 0.5, (True, False, False, False))
    two = Extraction(4, 0.5, 0.7, (False, True, True, False))
    both = union_extraction([one, two])
    assert both.exact_each == (True, True, True, False) and both.exact_rate == 0.75
    assert both.token_match == pytest.approx(0.6)
    assert union_extraction([one]) == one
    with pytest.raises(ValueError, match="numbers of sequences"):
        union_extraction([one, Extraction(3, 0.0, 0.0, (False,) * 3)])


def test_flag_rate_with_one_seed_label_is_the_plain_judgement():
    rng = np.random.default_rng(3)
    flags, kinds = rng.random(90) < 0.1, np.array(["u"] * 80 + ["c"] * 10)
    human, pieces = rng.random(60) < 0.07, np.arange(60) % 20

    def judged(seeds):
        return judge_flag_rate(flags, kinds, human, pieces, n_boot=300, level=0.95,
                               rng=np.random.default_rng(4), sample_seeds=seeds)

    assert judged(np.full(90, 5)) == judged(None)
    split = judged(np.arange(90) % 3)
    assert sorted(split["per_seed"]) == ["0", "1", "2"]
    assert sum(v["n_flagged"] for v in split["per_seed"].values()) == split["n_flagged"]
    assert split["value"] == judged(None)["value"]
