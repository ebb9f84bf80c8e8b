"""Sampling every model: prompts and requests chosen by seed, each sample's own generator, the
seeds of a replicated model sharing the samples out, conditioned samples, and the prompt's notes
of a continuation."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest

from pipeline.core.config import ParamsError, parse_section
from pipeline.inference.generation import (
    GenerateConfig,
    generate_for_model,
    select_prompts,
    select_requests,
)
from pipeline.inference.sampling import SamplingParams
from tests.inference.test_sampling import TableModel, ToyConditioned


def _tokens(n_tokens: list[int], splits: list[str]) -> pd.DataFrame:
    """A token table: piece ``i`` holds ids ``3..`` of length ``n_tokens[i]``."""
    return pd.DataFrame({
        "sha256": [hashlib.sha256(str(i).encode()).hexdigest() for i in range(len(n_tokens))],
        "split": splits, "track": 0, "n_tokens": n_tokens,
        "ids": [list(range(3, 3 + n)) for n in n_tokens]})


def test_prompts_are_seeded_prefixes_of_long_enough_pieces_of_the_split():
    table = _tokens([30, 5, 40, 12, 50, 20, 31, 60], ["test"] * 6 + ["val", "train"])
    prompts = select_prompts(table, 3, 12, seed=4)
    long_test = set(table.loc[(table["split"] == "test") & (table["n_tokens"] > 12), "sha256"])
    assert len(prompts) == 3 and {sha for sha, _ in prompts} <= long_test
    assert [sha for sha, _ in prompts] == sorted(sha for sha, _ in prompts)  # sorted draw
    assert all(p.dtype == np.int32 and p.tolist() == list(range(3, 15)) for _, p in prompts)
    assert [s for s, _ in select_prompts(table.iloc[::-1], 3, 12, seed=4)] == [
        s for s, _ in prompts]  # the table's row order does not matter
    assert {s for s, _ in select_prompts(table, 10, 12, seed=4)} == long_test  # fewer: all
    assert select_prompts(table, 0, 12, seed=4) == []
    assert select_prompts(table, 2, 100, seed=4) == []
    val = select_prompts(table, 2, 12, seed=4, split="val")
    assert [s for s, _ in val] == list(table.loc[table["split"] == "val", "sha256"])


def test_requests_come_from_held_out_pieces_only():
    table = pd.DataFrame({"sha256": ["a", "b", "c"], "split": ["train", "val", "test"],
                          "key": ["C major", "D major", "E major"]})
    requests = select_requests(table, 20, seed=0)
    assert len(requests) == 20 and {sha for sha, _ in requests} == {"b", "c"}
    assert all(row["key"] == {"b": "D major", "c": "E major"}[sha] for sha, row in requests)
    assert select_requests(table, 0, seed=0) == []
    assert select_requests(table[table["split"] == "train"], 5, seed=0) == []


def _cfg(**kw) -> GenerateConfig:
    return GenerateConfig(**{"n_samples": 3, "max_new_tokens": 12, "top_p": 1.0, **kw})


def test_each_sample_has_its_own_generator():
    """Adding samples, or another model, leaves a model's samples unchanged; another name or
    seed gives other draws."""
    model = TableModel()
    prompts = [("p1", np.array([5, 6], dtype=np.int32)), ("p2", np.array([7], dtype=np.int32))]
    rows = generate_for_model(model, "m", _cfg(), prompts, forbid=[0])
    assert [(r["kind"], r["index"]) for r in rows] == [
        ("unconditional", 0), ("unconditional", 1), ("unconditional", 2),
        ("continuation", 0), ("continuation", 1)]
    for r in rows:
        assert r["n_tokens"] == len(r["ids"]) and r["seed"] is None and 0 not in r["ids"]
        if r["kind"] == "continuation":
            sha, prompt = prompts[r["index"]]
            assert r["prompt_sha256"] == sha and r["prompt_len"] == len(prompt)
            assert r["ids"][: len(prompt)] == prompt.tolist()
        else:
            assert r["prompt_sha256"] is None and r["prompt_len"] == 0
    more = generate_for_model(model, "m", _cfg(n_samples=5), prompts[:1], forbid=[0])
    assert [r["ids"] for r in more[:3]] == [r["ids"] for r in rows[:3]]
    assert more[5]["ids"] == rows[3]["ids"]
    other = generate_for_model(model, "other", _cfg(), prompts, forbid=[0])
    assert [r["ids"] for r in other] != [r["ids"] for r in rows]
    reseeded = generate_for_model(model, "m", _cfg(seed=1), prompts, forbid=[0])
    assert [r["ids"] for r in reseeded] != [r["ids"] for r in rows]


def test_the_seeds_of_a_replicated_model_share_the_samples_out():
    a, b = TableModel(seed=1), TableModel(seed=2)
    rows = generate_for_model(a, "m", _cfg(n_samples=5), [], forbid=[], by_seed={8: b, 7: a})
    assert [r["seed"] for r in rows] == [7, 8, 7, 8, 7]
    alone = generate_for_model(b, "m", _cfg(n_samples=5), [], forbid=[])
    assert [r["ids"] for r in rows if r["seed"] == 8] == [alone[1]["ids"], alone[3]["ids"]]
    one = generate_for_model(a, "m", _cfg(), [], forbid=[], by_seed={7: b})
    assert all(r["seed"] is None for r in one)  # one seed is a model trained once: b unused
    assert [r["ids"] for r in one] == [
        r["ids"] for r in generate_for_model(a, "m", _cfg(), [], forbid=[])]


def test_sampling_params_come_from_the_config():
    cfg = GenerateConfig(temperature=0.5, top_k=7, top_p=0.8)
    assert cfg.sampling() == SamplingParams(0.5, 7, 0.8)


def test_default_draws_enough_samples_for_an_interval():
    assert GenerateConfig().n_samples >= 64


@pytest.mark.parametrize(("raw", "key"), [
    ({"models": ["ngram", "ngram"]}, "generate"),
    ({"top_p": 0.0}, "generate.top_p"),
    ({"temperature": -1.0}, "generate.temperature"),
    ({"models": ["lstm"]}, "generate.models.0"),
    ({"seeds": 1}, "generate.seeds"),
    ({"n_continuations": -1}, "generate.n_continuations"),
])
def test_bad_params_name_the_key(raw, key):
    with pytest.raises(ParamsError, match=rf"params.yaml: {key.replace('.', '[.]')}\b"):
        parse_section("generate", raw, GenerateConfig)


def test_a_continuations_prompt_notes_are_marked_as_a_multiset(monkeypatch):
    """The prompt's notes decoded alone are matched to the whole sample's notes by (onset,
    pitch, duration), each used once; a note the prompt's end cut (other duration) is the
    model's."""
    import numpy as np

    from pipeline.inference import generation
    from pipeline.tokens import spans

    whole = {"onset": np.array([0.0, 0.0, 1.0, 1.0, 2.0]), "pitch": np.array([60, 60, 62, 64, 65]),
             "duration": np.array([1.0, 1.0, 1.0, 2.0, 1.0])}
    prompt = {"onset": np.array([0.0, 1.0, 1.0]), "pitch": np.array([60, 62, 64]),
              "duration": np.array([1.0, 1.0, 1.0])}
    monkeypatch.setattr(spans, "decode_ids", lambda tok, ids: ("score", None))
    monkeypatch.setattr(spans, "score_notes", lambda score: prompt)
    row = {"prompt_len": 3, "ids": [1, 2, 3, 4, 5]}
    assert generation.prompt_notes(None, row, whole).tolist() == [True, False, True, False, False]
    assert generation.prompt_notes(None, {**row, "prompt_len": 0}, whole) is None
    monkeypatch.setattr(spans, "decode_ids", lambda tok, ids: (None, "bad"))
    assert generation.prompt_notes(None, row, whole) is None


class ToyWithVocab(ToyConditioned):
    """The toy model as a conditioned transformer scorer presents itself: a ``condition`` entry
    like model.json's. Slot ``key``: id 0 none, 1 "C major", 2 "D major", 3 "E major"."""

    def __init__(self) -> None:
        self.condition = {"names": ["key"], "vocab": {
            "names": ["key"], "labels": [["C major", "D major", "E major"]]}}


def test_generate_draws_conditioned_samples_under_held_out_requests():
    from pipeline.inference.generation import (
        CONDITIONED,
        GenerateConfig,
        generate_for_model,
        select_requests,
    )

    table = pd.DataFrame({"sha256": [f"h{i}" for i in range(6)],
                          "split": ["val", "test", "val", "test", "train", "train"],
                          "key": ["C major", "D major", "E major", "B minor", "D major", None]})
    requests = select_requests(table, 12, seed=3)
    assert len(requests) == 12 and {sha for sha, _ in requests} <= {"h0", "h1", "h2", "h3"}
    assert requests == select_requests(table, 12, seed=3)
    cfg = GenerateConfig(n_samples=4, n_continuations=0, max_new_tokens=20, n_conditioned=12)
    rows = generate_for_model(ToyWithVocab(), "transformer", cfg, [], forbid=[],
                              requests=requests)
    cond = [r for r in rows if r["kind"] == CONDITIONED]
    assert len(cond) == 12 and len([r for r in rows if r["kind"] == "unconditional"]) == 4
    import json

    for r, (sha, req) in zip(cond, requests, strict=True):
        asked = json.loads(r["condition"])
        assert r["request_sha256"] == sha
        # a label the model never learned (B minor) is asked as "none"
        assert asked == {"key": req["key"] if req["key"] != "B minor" else None}
        if asked["key"] is not None:
            want = 5 + ["C major", "D major", "E major"].index(asked["key"]) + 1
            assert np.mean(np.asarray(r["ids"]) == want) > 0.7
    # an unconditioned model draws no conditioned samples, whatever the requests
    plain = generate_for_model(ToyConditioned.__new__(ToyConditioned), "m", cfg, [],
                               forbid=[], requests=requests)
    assert not [r for r in plain if r["kind"] == CONDITIONED]

