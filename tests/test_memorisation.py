"""Memorisation measures (suffix array, novelty, shingle neighbours, extraction, membership) and
the audit stage end to end, with a planted copying model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core import artifacts
from pipeline.core.config import ParamsError, parse_section
from pipeline.music.fingerprints import jaccard_containment
from pipeline.scoring.memorisation import (
    ShingleIndex,
    SuffixIndex,
    extraction_test,
    membership_auc,
    novelty,
    suffix_array,
)
from pipeline.stages.audit import AuditConfig
from pipeline.stages.audit import run as run_audit
from pipeline.stages.generate import GenerateConfig
from pipeline.stages.generate import run as run_generate
from tests.test_generate import CountLM, make_world, train_seqs

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
                     report=out / "audit.json")


@pytest.mark.parametrize("kind", ["count", "ngram"])
def test_copying_model_is_flagged_far_above_human_pieces(world, kind, tmp_path):
    copier = make_copier(world, kind)
    gcfg = GenerateConfig(models=["ngram"], n_samples=4, max_new_tokens=120, prompt_tokens=24,
                          temperature=0.0)
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
    assert len(table) == 8 + 10 + 10 and table["decode_ok"].all()

    first = {p: (tmp_path / p).read_bytes() for p in ("audit.json", "audit/per_sample.parquet")}
    _audit(world, tmp_path, {"ngram": copier})
    for p, data in first.items():
        assert (tmp_path / p).read_bytes() == data, p


def test_audit_params_errors_name_the_key():
    with pytest.raises(ParamsError, match=r"audit\.flag_metrics\.0"):
        parse_section("audit", {"flag_metrics": ["lcs"]}, AuditConfig)
    with pytest.raises(ParamsError, match=r"audit\.flag_quantile"):
        parse_section("audit", {"flag_quantile": 1.5}, AuditConfig)
