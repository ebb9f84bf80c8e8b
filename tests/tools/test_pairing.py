"""Evaluated runs lined up for ``symkit compare`` (pipeline.tools.pairing): one split, the same
pieces (every piece an arm encodes lossily or did not score left out of all), each arm's scores,
and the registered comparisons scored on the same footing.

Runs are built in memory from tests/tools/test_compare.py's synthetic per-piece scores; nothing here
reads a file.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from pipeline.decision.registered_comparisons import record
from pipeline.stats.paired import Refusal, arm_scores, compare_pair, pair
from pipeline.tools.pairing import (
    check_split_hashes,
    compared_scores,
    dropped,
    exclusions,
    judge_registered,
    model_rows,
)
from pipeline.tools.runs import EvaluatedRun, RunSource
from tests.tools.test_compare import PARAMS, simulate

SPLIT_HASH = "5" * 64


def run(label: str, rows: pd.DataFrame, *, params: dict | None = None,
        split_hash: str | None = SPLIT_HASH, fidelity: list[dict] | None = None,
        excluded: list[dict] | None = None, registration: Any = None) -> EvaluatedRun:
    """An evaluated run held in memory, as :func:`pipeline.tools.runs.read_run` returns one."""
    protocol = {"tokenizer_hash": "7" * 64}
    if split_hash is not None:
        protocol["split_hash"] = split_hash
    evaluation: dict[str, Any] = {"protocol": protocol}
    if fidelity is not None:
        evaluation["fidelity"] = {"pieces": fidelity}
    if excluded is not None:
        evaluation["excluded"] = {"pieces": excluded}
    return EvaluatedRun(label, RunSource(label, "directory", root=Path(label)),
                        copy.deepcopy(params or PARAMS), evaluation, rows, None, registration)


@pytest.fixture
def rows() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Baseline and arm rows of the transformer on val and the n-gram on test (2 seeds)."""
    a, b = simulate(np.random.default_rng(31), 0.03, n_groups=10, per_group=2, seeds=(1, 2),
                    seed_sd=0.01)
    test = [x.assign(split="test", model="ngram", seed=None, sha256="e" + x["sha256"].str[1:]
                     ).drop_duplicates("sha256") for x in (a, b)]
    return (pd.concat([a, test[0]], ignore_index=True),
            pd.concat([b, test[1]], ignore_index=True))


def shas(rows: pd.DataFrame, k: int) -> list[str]:
    return sorted(rows["sha256"].unique())[:k]


# ---- one split, one model ---------------------------------------------------------------------
def test_split_hashes_must_be_present_and_equal(rows):
    a, b = rows
    check_split_hashes([run("a", a), run("b", b)])
    with pytest.raises(Refusal, match=r"no protocol\.split_hash in reports/eval\.json of some"):
        check_split_hashes([run("a", a), run("b", b, split_hash=None)])
    with pytest.raises(Refusal, match=f"'a': {SPLIT_HASH}; 'b': {'9' * 64}"):
        check_split_hashes([run("a", a), run("b", b, split_hash="9" * 64)])


def test_model_rows_are_one_model_on_one_split_or_a_refusal(rows):
    a = run("a", rows[0])
    got = model_rows(a, "transformer", "val")
    assert set(got["model"]) == {"transformer"} and set(got["split"]) == {"val"}
    assert len(got) == 2 * 20
    with pytest.raises(Refusal, match=r"arm 'a' has no 'ngram' scores on val \(models scored "
                                      r"there: transformer\)"):
        model_rows(a, "ngram", "val")
    with pytest.raises(Refusal, match="models scored there: none"):
        model_rows(a, "transformer", "train")


# ---- pieces left out of every arm ---------------------------------------------------------------
def test_exclusions_list_lossy_and_unscored_pieces_of_the_compared_rows(rows):
    a_rows, b_rows = rows
    val, other = shas(a_rows, 3), "f" * 64  # other: a piece no arm scored
    a = run("a", a_rows, fidelity=[
        {"sha256": val[1], "split": "val", "flags": ["notes_dropped", "roundtrip_lossy"]},
        {"sha256": val[2], "split": "test", "flags": ["notes_dropped"]},  # another split
        {"sha256": other, "split": "val", "flags": ["notes_dropped"]}])
    b = run("b", b_rows, excluded=[{"sha256": val[0], "reason": "not_encoded"},
                                   {"sha256": val[1], "reason": "not_encoded"},
                                   {"sha256": other, "reason": "not_encoded"}])
    out = exclusions([a, b], "val", "transformer")
    assert out == {"a": [{"sha256": val[1], "reason": "lossy: notes_dropped, roundtrip_lossy"}],
                   "b": [{"sha256": val[0], "reason": "not scored: not_encoded"},
                         {"sha256": val[1], "reason": "not scored: not_encoded"}]}
    assert dropped([a, b], "val", "transformer") == {val[0], val[1]}
    assert exclusions([run("a", a_rows), run("b", b_rows)], "val", "transformer") == \
        {"a": [], "b": []}


def test_a_piece_both_lossy_and_unscored_keeps_the_lossy_reason(rows):
    val = shas(rows[0], 1)
    a = run("a", rows[0], fidelity=[{"sha256": val[0], "split": "val", "flags": ["model_lossy"]}],
            excluded=[{"sha256": val[0], "reason": "not_encoded"}])
    assert exclusions([a], "val", "transformer") == {
        "a": [{"sha256": val[0], "reason": "lossy: model_lossy"}]}


def test_compared_scores_leave_the_dropped_pieces_out_of_every_arm(rows):
    a_rows, b_rows = rows
    val = shas(a_rows, 2)
    arms = [run("a", a_rows, excluded=[{"sha256": val[0], "reason": "not_encoded"}]),
            run("b", b_rows, fidelity=[{"sha256": val[1], "split": "val",
                                        "flags": ["notes_dropped"]}])]
    sa, sb = compared_scores(arms, "val", "transformer")
    assert len(sa.shas) == len(sb.shas) == 20 - 2
    assert not {val[0], val[1]} & set(sa.shas) and list(sa.shas) == list(sb.shas)
    assert sa.seeds == sb.seeds == [1, 2]
    kept = a_rows[(a_rows["split"] == "val") & ~a_rows["sha256"].isin(val)]
    assert np.array_equal(sa.nll, arm_scores(kept, "a").nll)
    everything = compared_scores(arms, "val", "transformer", drop=set())
    assert len(everything[0].shas) == 20
    ngram = compared_scores(arms, "test", "ngram")  # the drops are the test split's: none
    assert len(ngram[0].shas) == 20 and ngram[0].seeds == []


# ---- registered comparisons --------------------------------------------------------------------
RULE = {"name": "longer_is_better", "baseline": {"transformer.train.max_steps": 400},
        "arm": {"transformer.train.max_steps": 800}, "metric": "nats_per_note.rel_improvement",
        "op": ">=", "threshold": 0.01, "judge": "interval", "rationale": "r"}
SECTION = {"n_boot": 200, "ci_level": 0.9, "seed": 5, "equivalence_margin": 0.005,
           "multiplicity": "none", "rules": [RULE]}


def _params(max_steps: int) -> dict:
    p = copy.deepcopy(PARAMS)
    p["transformer"]["train"]["max_steps"] = max_steps
    p["compare"] = copy.deepcopy(SECTION)
    return p


def test_without_a_usable_registration_nothing_is_scored(rows):
    a, b = rows
    out = judge_registered([run("a", a), run("b", b)])
    assert out["registered"] is False and out["rules"] == []
    assert out["note"].startswith("a (the baseline) holds no reports/preregistration_compare")
    out = judge_registered([run("a", a, registration={"schema": 99}), run("b", b)])
    assert out["registered"] is False and "not a comparison registration" in out["note"]


def test_a_registered_pair_is_scored_with_the_registered_settings(rows):
    a, b = rows
    reg = record(SECTION)
    arms = [run("base", a, params=_params(400), registration=reg),
            run("same", a, params=_params(400), registration=reg),  # repeats the baseline
            run("long", b, params=_params(800), registration=reg)]
    out = judge_registered(arms)
    (entry,) = out["rules"]
    assert (entry["baseline"], entry["arm"], entry["level"]) == ("base", "long", 0.9)
    p = pair(*(compared_scores([arms[0], arms[2]], "val", "transformer")), "base", "long", "val")
    expected = compare_pair(p, [("nats_per_note", "n_notes")], n_boot=200, level=0.9,
                            rng=np.random.default_rng([5, 2]), margin=0.005)
    rel = expected["nats_per_note"]["rel_improvement"]
    assert (entry["value"], entry["ci_low"], entry["ci_high"]) == (rel["value"], rel["ci_low"],
                                                                   rel["ci_high"])
    assert entry["n_pieces"] == 20 and entry["n_seeds"] == [2, 2]
    assert entry["status"] == "PASS" and entry["deviations"] == []
