"""Adherence of conditioned samples to their requested labels, read against the ceiling (human
windows), the floor (unconditioned samples) and shuffled requests; what a sample can show."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pipeline.audit.adherence import (
    audit_adherence,
    difference,
    matches,
    rate,
    shuffled_requests,
)
from pipeline.conditions.config import ConditionConfig
from tests.conditions._planted import scale_notes as _scale_notes
from tests.inference.test_generation import ToyWithVocab


def test_matches_counts_only_pairs_with_a_request():
    requested = [{"key": "C major"}, {"key": "D major"}, {"key": None}, {"key": math.nan}, {}]
    measured = [{"key": "C major"}, {"key": "C major"}, {"key": "C major"}, {"key": "C major"},
                {"key": None}]
    got = matches(requested, measured, "key")
    assert got[:2].tolist() == [1.0, 0.0] and np.isnan(got[2:]).all()


def test_rate_is_the_share_of_counted_pairs_with_a_unit_bootstrap():
    hits = np.array([1.0, 1.0, 0.0, np.nan, 1.0, 0.0])
    units = ["a", "a", "b", "b", "c", "c"]
    r = rate(hits, units, seed=0, n_boot=400, level=0.9, replicates=True)
    assert r["value"] == pytest.approx(3 / 5) and (r["n"], r["units"]) == (5, 3)
    assert r["ci_low"] <= r["value"] <= r["ci_high"] and len(r["reps"]) == 400
    assert r == {**rate(hits, units, seed=0, n_boot=400, level=0.9), "reps": r["reps"]}
    empty = rate(np.array([np.nan, np.nan]), ["a", "b"], seed=0, n_boot=100, level=0.9,
                 replicates=True)
    assert empty == {"value": None, "ci_low": None, "ci_high": None, "n": 0, "units": 0,
                     "reps": None}
    same = rate(np.ones(4), ["a", "b", "c", "d"], seed=1, n_boot=100, level=0.95)
    assert (same["value"], same["ci_low"], same["ci_high"]) == (1.0, 1.0, 1.0)


def test_difference_pairs_the_replicates_of_two_rates():
    a = {"value": 0.8, "reps": np.array([0.7, 0.8, 0.9])}
    b = {"value": 0.5, "reps": np.array([0.5, 0.5, 0.5])}
    d = difference(a, b, 0.5)
    assert d["value"] == pytest.approx(0.3) and d["ci_low"] <= 0.3 <= d["ci_high"]
    assert difference(a, {"value": None, "reps": None}, 0.9) == {
        "value": None, "ci_low": None, "ci_high": None}


def test_shuffled_requests_are_a_seeded_permutation():
    requested = [{"key": k} for k in ["C", "C", "D", "E", "F", "G", "A", "B"]]
    a = shuffled_requests(requested, 3)
    assert a == shuffled_requests(requested, 3) and a != requested
    assert sorted(r["key"] for r in a) == sorted(r["key"] for r in requested)


def test_no_conditioned_samples_no_adherence_block():
    args = {"tokenizer": None, "heldout": None, "conditions": None, "width": 8, "stride": 8,
            "max_windows": 1, "cfg": ConditionConfig(), "seed": 0, "n_boot": 100, "level": 0.9}
    assert audit_adherence(pd.DataFrame({"model": ["m"]}), **args) == {}
    assert audit_adherence(pd.DataFrame({"model": ["m"], "kind": ["unconditional"]}),
                           **args) == {}


# ---------------------------------------------------------------------- planted scales, samples
def test_adherence_tells_a_following_model_from_one_that_ignores_its_request():
    from pipeline.audit.adherence import adherence
    from pipeline.conditions.config import ConditionConfig
    from pipeline.conditions.table import measured_labels

    cfg = ConditionConfig()
    tonics = [0, 2, 4, 5, 7, 9] * 10
    names = ["C", "D", "E", "F", "G", "A"]
    requested = [{"key": f"{names[[0, 2, 4, 5, 7, 9].index(t)]} major"} for t in tonics]
    follows = [measured_labels(_scale_notes(t), cfg) for t in tonics]
    ignores = [measured_labels(_scale_notes(0), cfg) for _ in tonics]  # always C major
    human = follows[:12]
    common = {"requested": requested, "unconditioned": ignores, "human_own": requested[:12],
              "human": human, "human_units": [f"p{i // 2}" for i in range(12)],
              "measurable": {"key": True, "meter": False}, "n_boot": 500}
    good = adherence(["key", "meter"], conditioned=follows, **common)
    bad = adherence(["key", "meter"], conditioned=ignores, **common)
    assert good["meter"] == {"measurable": False}
    assert good["key"]["rate"]["value"] == 1.0 and good["key"]["ceiling"]["value"] == 1.0
    assert good["key"]["floor"]["value"] == pytest.approx(1 / 6)
    assert good["key"]["shuffled"]["ci_high"] < 0.5  # unrelated requests rarely match
    assert bad["key"]["rate"]["value"] == pytest.approx(1 / 6)
    assert bad["key"]["rate"]["ci_high"] < good["key"]["rate"]["ci_low"]
    # the registrable differences: a model that follows clears the floor, one that ignores
    # its request does not
    assert good["key"]["minus_floor"]["ci_low"] > 0 and good["key"]["minus_shuffled"]["ci_low"] > 0
    assert bad["key"]["minus_floor"]["ci_low"] <= 0 <= bad["key"]["minus_floor"]["ci_high"]
    # a request for nothing does not count
    none_req = adherence(["key"], **{**common, "requested": [{"key": None}] * 60},
                         conditioned=follows)
    assert none_req["key"]["rate"]["n"] == 0 and none_req["key"]["rate"]["value"] is None


class _ScaleTokenizer:
    """Decodes ids 5..8 as notes: the most frequent id picks the scale (5 C major, 6 C, 7 D,
    8 E), so a sample that follows request "D major" decodes as D major."""

    one_token_stream = True
    config = None

    def decode(self, ids):
        import symusic

        tonic = {5: 0, 6: 0, 7: 2, 8: 4}[max(set(ids), key=list(ids).count)]
        notes = _scale_notes(tonic)
        score = symusic.Score(480)
        track = symusic.Track()
        for o, d, p in zip(notes["onset"], notes["duration"], notes["pitch"], strict=True):
            track.notes.append(symusic.Note(int(o * 480), int(d * 480), int(p), 80))
        score.tracks.append(track)
        return score


def test_audit_adherence_on_generated_and_human_windows():
    from pipeline.audit.adherence import audit_adherence
    from pipeline.conditions.config import ConditionConfig
    from pipeline.inference.generation import GenerateConfig, generate_for_model, select_requests

    table = pd.DataFrame({"sha256": [f"h{i}" for i in range(9)], "split": ["val", "test"] * 4
                          + ["val"], "key": ["C major", "D major", "E major"] * 3})
    requests = select_requests(table, 30, seed=1)
    cfg = GenerateConfig(n_samples=30, n_continuations=0, max_new_tokens=16, n_conditioned=30)
    samples = pd.DataFrame(generate_for_model(ToyWithVocab(), "transformer", cfg, [],
                                              forbid=[], requests=requests))
    samples["condition"] = samples.get("condition")
    # human pieces: ids that decode to their own key
    ids_of = {"C major": 6, "D major": 7, "E major": 8}
    heldout = pd.DataFrame({"sha256": table["sha256"], "track": 0,
                            "ids": [[ids_of[k]] * 32 for k in table["key"]]})
    out = audit_adherence(samples, _ScaleTokenizer(), heldout, table, width=16, stride=16,
                          max_windows=2, cfg=ConditionConfig(), seed=0, n_boot=300, level=0.95)
    block = out["transformer"]
    assert block["conditions"] == ["key"] and block["n_conditioned"] == 30
    key = block["key"]
    assert key["ceiling"]["value"] == 1.0 and key["ceiling"]["units"] == 9
    assert key["rate"]["value"] > 0.8
    assert key["rate"]["ci_low"] > key["floor"]["ci_high"]  # unconditioned samples do not follow
    assert key["rate"]["value"] > key["shuffled"]["value"]


def test_meter_adherence_is_measured_when_the_tokenizer_writes_time_signatures():
    from symusic import Note, Score, TimeSignature, Track

    from pipeline.audit.adherence import measurable_conditions, window_labels
    from pipeline.conditions.config import ConditionConfig
    from pipeline.tokens.tokenizer import make_tokenizer

    score = Score(480)
    score.time_signatures.append(TimeSignature(0, 3, 4))
    track = Track(program=0)
    for i, pitch in enumerate([60, 64, 67, 72, 67, 64] * 4):  # C major, a beat each
        track.notes.append(Note(i * 480, 480, pitch, 80))
    score.tracks.append(track)
    cfg = ConditionConfig()
    plain = make_tokenizer("REMI", {"use_programs": True, "use_time_signatures": False})
    writes = make_tokenizer("REMI", {"use_programs": True})  # as params.yaml: time signatures on
    names = ["key", "meter", "tempo", "composer"]
    assert measurable_conditions(names, plain) == {"key": True, "meter": False, "tempo": False,
                                                   "composer": False}
    assert measurable_conditions(names, writes) == {"key": True, "meter": True, "tempo": False,
                                                    "composer": False}
    ids = np.asarray(writes.encode(score).ids)
    labels = window_labels(writes, ids, cfg)
    assert labels["meter"] == "3/4" and labels["key"] == "C major"

