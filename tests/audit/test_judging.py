"""The audit's judging: flag thresholds from human windows, flags and summaries, membership and
extraction on the same seeded pieces for every model, and each model's judged blocks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.audit.judging import (
    AuditConfig,
    ModelCheck,
    audit_json,
    checks_json,
    flag,
    judge,
    model_checks,
    summarise,
    thresholds,
)
from pipeline.audit.memorisation import Extraction
from pipeline.core.config import ParamsError, parse_section
from pipeline.music.descriptors import STATS

CFG = AuditConfig(n_boot=200, extraction_prefix=4, extraction_tokens=4, extraction_pieces=3,
                  membership_pieces=4)


def test_audit_params_errors_name_the_key():
    with pytest.raises(ParamsError, match=r"audit\.flag_metrics\.0"):
        parse_section("audit", {"flag_metrics": ["lcs"]}, AuditConfig)
    with pytest.raises(ParamsError, match=r"audit\.flag_quantile"):
        parse_section("audit", {"flag_quantile": 1.5}, AuditConfig)


def test_membership_scores_per_note_so_dense_tokenising_is_not_a_signal():
    """Train pieces tokenised with more ids per note cost more nats per piece's ids but not per
    note: per_note_nll divides the summed NLL by the notes."""
    import pandas as pd

    from pipeline.audit.judging import per_note_nll

    class PerId:
        def token_nll(self, seqs):
            return [np.full(len(s) + 1, 0.5) for s in seqs]  # 0.5 nats per target, EOS too

    rows = pd.DataFrame({"ids": [[1] * 9, [1] * 19, [1] * 5], "n_notes": [5, 10, 0]})
    got = per_note_nll(PerId(), rows)
    assert got[0] == got[1] == 1.0 and np.isnan(got[2])



def test_thresholds_are_observed_quantiles_of_the_val_windows():
    val = pd.DataFrame({"lcs_tokens": [1.0, 2.0, 3.0, 4.0, np.nan, 10.0],
                        "nn_jaccard": [np.nan] * 6})
    assert thresholds(val, ["lcs_tokens", "nn_jaccard"], 0.5) == {"lcs_tokens": 3.0,
                                                                  "nn_jaccard": None}
    assert thresholds(val, ["lcs_tokens"], 0.7)["lcs_tokens"] == 4.0  # "higher": observed
    assert thresholds(val, ["lcs_tokens"], 1.0)["lcs_tokens"] == 10.0


def test_a_row_is_flagged_when_any_metric_is_above_its_threshold():
    df = pd.DataFrame({"a": [1.0, 5.0, 2.0, np.nan], "b": [0.1, 0.1, 0.9, 0.9]})
    assert flag(df, {"a": 2.0, "b": 0.5}).tolist() == [False, True, True, True]
    assert flag(df, {"a": 2.0, "b": None}).tolist() == [False, True, False, False]  # NaN: no
    assert not flag(df, {"a": None}).any()


def test_summarise_counts_rates_and_finite_values():
    assert summarise(pd.DataFrame({"flagged": [], "decode_ok": []}), ["x"]) == {"n": 0}
    df = pd.DataFrame({"flagged": [True, False, False, False], "decode_ok": [True, False, True,
                                                                             True],
                       "x": [1.0, 3.0, np.nan, 8.0], "y": [np.nan] * 4})
    assert summarise(df, ["x", "y"]) == {"n": 4, "flag_rate": 0.25, "decode_failures": 1,
                                         "x_mean": 4.0, "x_median": 3.0, "x_max": 8.0}


class Scripted:
    """Greedy continuation replays ``train``'s pieces; every target costs ``nll`` nats."""

    vocab_size, eos_id = 20, 2

    def __init__(self, nll: float):
        self.nll = nll

    def next_logprobs(self, contexts):
        out = np.full((len(contexts), 20), -10.0)
        for r, c in enumerate(contexts):
            out[r, (int(c[-1]) + 1 - 3) % 17 + 3 if len(c) else 3] = 0.0  # counts up
        return out

    def token_nll(self, seqs):
        return [np.full(len(s) + 1, self.nll) for s in seqs]


def _pieces(prefix: str, n: int, counting: bool) -> pd.DataFrame:
    rng = np.random.default_rng(len(prefix))
    ids = [[(k + i) % 17 + 3 for i in range(12)] if counting else rng.integers(3, 20, 12).tolist()
           for k in range(n)]
    return pd.DataFrame({"sha256": [f"{prefix}{k}" for k in range(n)], "ids": ids,
                         "n_tokens": 12, "n_notes": 4})


def test_every_model_is_checked_on_the_same_seeded_pieces():
    train, test = _pieces("t", 6, counting=True), _pieces("x", 5, counting=False)
    heldout = pd.concat([_pieces("v", 5, counting=False), test], ignore_index=True)
    groups = {f"t{k}": f"group{k // 2}" for k in range(6)}
    checks = model_checks({"b": Scripted(0.5), "a": Scripted(1.0)}, train, heldout, test, CFG,
                          forbid=[0, 1], groups=groups)
    assert list(checks) == ["a", "b"]
    a, b = checks["a"], checks["b"]
    assert a.extraction_train.n == b.extraction_train.n == 3  # extraction_pieces
    assert a.extraction_train.exact_rate == 1.0 and a.extraction_test.exact_rate == 0.0
    assert a.nll_train.tolist() == [13 * 1.0 / 4] * 4 and b.nll_train.tolist() == [13 * 0.5 / 4] * 4
    assert a.groups_train.tolist() == b.groups_train.tolist()  # the same pieces
    assert set(a.groups_train) <= {"group0", "group1", "group2"}
    assert set(a.groups_heldout) <= set(heldout["sha256"])  # no groups: a piece each
    extraction, membership = checks_json(checks, 0.1)
    assert extraction["a"]["exact_gap"] == 1.0 and extraction["a"]["n_test"] == 3
    assert membership["a"]["n_train"] == membership["a"]["n_heldout"] == 4
    assert membership["a"]["auc"] == 0.5  # equal losses everywhere: chance


def _audit_rows(seed_labels: bool) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for kind in ("val", "test"):
        for k in range(12):
            rows.append({"source": "human", "model": "human", "kind": kind, "index": k,
                         "sha256": f"{kind}{k // 2}", "flagged": k % 6 == 0, "decode_ok": True,
                         "seed": None})
    for k in range(10):
        rows.append({"source": "sample", "model": "m", "kind": "unconditional", "index": k,
                     "sha256": None, "flagged": k < 6, "decode_ok": k != 9,
                     "seed": (7 + k % 2) if seed_labels else None})
    df = pd.DataFrame(rows)
    for s in STATS:
        df[s] = rng.normal(size=len(df))
    return df


def _check(nll_train: float) -> ModelCheck:
    ext = Extraction(n=4, exact_rate=0.25, token_match=0.5, exact_each=(True, False, False, False))
    none = Extraction(n=4, exact_rate=0.0, token_match=0.1, exact_each=(False,) * 4)
    return ModelCheck(ext, none, np.full(8, nll_train) + np.arange(8) / 100, np.arange(8.0) / 4,
                      np.arange(8).astype(str).astype(object),
                      np.arange(8, 16).astype(str).astype(object))


def test_judge_gives_each_model_the_blocks_its_evidence_allows():
    df = _audit_rows(seed_labels=False)
    judged = judge(df, {"m": _check(0.0), "quiet": _check(0.0)}, CFG)
    assert sorted(judged) == ["m", "quiet"]
    assert set(judged["m"]) == {"flag_rate", "quality", "membership_auc", "extraction_rate"}
    assert set(judged["quiet"]) == {"membership_auc", "extraction_rate"}  # drew no samples
    fr = judged["m"]["flag_rate"]
    assert (fr["n"], fr["n_flagged"], fr["value"]) == (10, 6, 0.6) and "per_seed" not in fr
    assert judged["m"]["quality"]["decode_rate"] == 0.9
    # train losses 0.00..0.07 against held-out 0, 0.25, ..., 1.75: lower than all but the first
    # held-out piece (one tie, counted half)
    assert judged["m"]["membership_auc"]["value"] == pytest.approx((7 * 8 + 0.5) / 64)
    assert judged["m"]["extraction_rate"]["train"]["value"] == 0.25
    assert judge(df, {"m": _check(0.0)}, CFG)["m"] == judged["m"]  # seeded per model


def test_judge_over_seeds_pools_samples_and_checks():
    df = _audit_rows(seed_labels=True)
    seeds = {"m": {"7": _check(0.0), "8": _check(5.0)}}
    judged = judge(df, {"m": seeds["m"]["7"]}, CFG, seeds)
    m = judged["m"]
    assert m["seeds"] == [7, 8] and sorted(m["flag_rate"]["per_seed"]) == ["7", "8"]
    assert m["extraction_rate"]["over_seeds"] == "any"
    assert m["membership_auc"]["value"] == pytest.approx(
        np.mean([v["value"] for v in m["membership_auc"]["per_seed"].values()]))
    # every seed's own judgement, what the criteria judge the guards on
    assert sorted(m["per_seed"]) == ["7", "8"]
    assert set(m["per_seed"]["7"]) == {"flag_rate", "membership_auc", "extraction_rate"}
    assert m["per_seed"]["8"]["membership_auc"]["value"] == \
        m["membership_auc"]["per_seed"]["8"]["value"]


def test_each_seed_s_flag_rate_is_its_own_samples_against_the_same_human_windows():
    """Samples drawn by two seeds: each seed's flag rate is judge_flag_rate on its samples
    alone (no seed term), against the same human test windows; a model whose samples name no
    seed, or one seed, has none."""
    from pipeline.audit.judging import _rng, per_seed_flag_rates
    from pipeline.audit.memorisation import judge_flag_rate

    df = _audit_rows(seed_labels=True)
    m = judge(df, {}, CFG)["m"]
    flags = {s: b["flag_rate"] for s, b in m["per_seed"].items()}
    assert sorted(flags) == ["7", "8"] and set(m["per_seed"]["7"]) == {"flag_rate"}
    samples = df[df["source"] == "sample"]
    test = df[(df["source"] == "human") & (df["kind"] == "test")]
    for seed, got in flags.items():
        mine = samples[samples["seed"] == int(seed)]
        want = judge_flag_rate(mine["flagged"].to_numpy(), mine["kind"].to_numpy(),
                               test["flagged"].to_numpy(), test["sha256"].astype(str).to_numpy(),
                               n_boot=CFG.n_boot, level=CFG.ci_level,
                               rng=_rng(CFG, "flag_rate", f"m@seed-{seed}"))
        assert got == want and "seed_half_width" not in got["excess"]
        assert got["human"]["n_windows"] == len(test)
    # seeds 7 and 8 alternate over samples 0..9, of which 0..5 are flagged: 3 of 5 each
    assert flags["7"]["n"] == flags["8"]["n"] == 5
    assert flags["7"]["n_flagged"] == flags["8"]["n_flagged"] == 3
    assert "per_seed" not in judge(_audit_rows(seed_labels=False), {}, CFG)["m"]
    one = samples.assign(seed=7)
    assert per_seed_flag_rates(one, one["seed"].to_numpy(), test, CFG, "m") == {}


def test_audit_json_sets_sample_rates_against_the_human_test_rate():
    df = _audit_rows(seed_labels=False)
    df["lcs_tokens"] = np.arange(len(df), dtype=float)
    out = audit_json(df, ["lcs_tokens", *STATS], {"lcs_tokens": 3.0}, {}, {})
    assert out["thresholds"] == {"lcs_tokens": 3.0}
    assert out["human"]["test"]["n"] == 12 and out["human"]["test"]["n_pieces"] == 6
    assert out["flag_rate"]["samples"] == 0.6 and out["flag_rate"]["human_test"] == 2 / 12
    assert out["flag_rate"]["excess"] == pytest.approx(0.6 - 2 / 12)
    assert out["flag_rate"]["by_model"] == {"m": 0.6}
    assert set(out["samples"]["m"]) == {"all", "unconditional"}
    assert set(out["music"]) == {"test", "m", "m_abs_diff"}
    samples, test = df[df["source"] == "sample"], df[df["kind"] == "test"]
    assert out["music"]["m"]["pitch_range"] == pytest.approx(samples["pitch_range"].mean())
    assert out["music"]["m_abs_diff"]["pitch_range"] == pytest.approx(
        abs(samples["pitch_range"].mean() - test["pitch_range"].mean()))
    assert out["samples"]["m"]["all"]["lcs_tokens_max"] == len(df) - 1
