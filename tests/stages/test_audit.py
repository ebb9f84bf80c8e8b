"""The audit's judgements (``judged.<model>`` in audit.json) end to end, on planted models in the
synthetic world of tests/stages/test_generate.py.

- ``copier``: an order-12 count model of the training pieces, sampled: it replays training music;
- ``fresh``: the same model of *other* human-like pieces (never in any split): new music from the
  corpus's distribution, the "reasonable model that does not copy";
- ``noise``: uniform over the vocabulary; ``silent``: EOS at once; ``undecodable``: the fresh
  model's samples marked as failing to decode.

Memorisation must fail the copier and only it; the quality guard must fail noise, silence and
undecodable output and pass both models that make human music.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from pipeline.core import artifacts
from pipeline.stages.audit import AuditConfig
from pipeline.stages.audit import run as run_audit
from pipeline.stages.generate import (
    SAMPLES_SCHEMA,
    GenerateConfig,
    generate_for_model,
    select_prompts,
)
from pipeline.tokens.tokenizer import decode_ids, load_tokenizer
from tests.stages.test_generate import EOS, CountLM, make_world, random_score, train_seqs

QUALITY_PASS = 0.7  # at least 5 of the 7 statistics inside their band


class Uniform:
    """Noise: every id equally likely (the sampler still never draws PAD or BOS)."""

    def __init__(self, vocab_size: int):
        self.vocab_size, self.eos_id = vocab_size, EOS

    def next_logprobs(self, contexts) -> np.ndarray:
        return np.full((len(contexts), self.vocab_size), -np.log(self.vocab_size))

    def token_nll(self, seqs) -> list[np.ndarray]:
        return [np.full(len(s) + 1, np.log(self.vocab_size)) for s in seqs]


class Silent(Uniform):
    """EOS at once: every sample is empty."""

    def next_logprobs(self, contexts) -> np.ndarray:
        row = np.full(self.vocab_size, -np.inf)
        row[EOS] = 0.0
        return np.tile(row, (len(contexts), 1))


def planted_models(world: dict[str, Path], seed: int) -> dict[str, Any]:
    vocab = artifacts.read_json(world["info"])["vocab_size"]
    tok = load_tokenizer(world["tokenizer"])
    rng = np.random.default_rng([seed, 99])
    fresh = [np.asarray(tok.encode(random_score(rng))[0].ids) for _ in range(24)]
    return {"copier": CountLM(12, vocab, alpha=1e-6).fit(train_seqs(world)),
            "fresh": CountLM(12, vocab, alpha=1e-6).fit(fresh),
            "noise": Uniform(vocab), "silent": Silent(vocab)}


def audit(root: Path, world: dict[str, Path], models: dict[str, Any], seed: int,
          seeds: dict[str, dict[int, Any]] | None = None, **gate: Path) -> None:
    """Audit root/samples.parquet; extraction and membership for the models that score.
    ``gate``: ``ledger_path`` and ``preregistration`` (default: the look is recorded nowhere)."""
    cfg = AuditConfig(human_window=64, human_stride=32, human_windows=4, extraction_pieces=8,
                      membership_pieces=10, n_boot=500, seed=seed)
    run_audit(cfg, {k: models[k] for k in ("copier", "fresh", "noise")},
              samples=root / "samples.parquet", tokens=world["tokens"], info=world["info"],
              tokenizer=world["tokenizer"], per_sample=root / "audit" / "per_sample.parquet",
              report=root / "audit.json", spans=root / "audit" / "spans.parquet", seeds=seeds,
              **gate)


def planted_audit(root: Path, seed: int = 0, n_samples: int = 24) -> dict[str, Any]:
    """Build the world, sample every planted model, audit them all at once; return audit.json."""
    world = make_world(root, seed=seed)
    models = planted_models(world, seed)
    tok = load_tokenizer(world["tokenizer"])
    gcfg = GenerateConfig(n_samples=n_samples, n_continuations=8, max_new_tokens=64,
                          prompt_tokens=24, seed=seed)
    prompts = select_prompts(artifacts.read_parquet(world["tokens"]), gcfg.n_continuations,
                             gcfg.prompt_tokens, gcfg.seed)
    rows = []
    for name, model in models.items():
        rows += generate_for_model(model, name, gcfg, prompts, forbid=[0, 1])
    for r in rows:
        r["decode_error"] = decode_ids(tok, r["ids"])[1]
        r["decode_ok"] = r["decode_error"] is None
    rows += [{**r, "model": "undecodable", "decode_ok": False, "decode_error": "planted"}
             for r in rows if r["model"] == "fresh"]
    rows.sort(key=lambda r: (r["model"], r["kind"], r["index"]))
    artifacts.write_parquet(root / "samples.parquet",
                            pa.Table.from_pylist(rows, schema=SAMPLES_SCHEMA))
    audit(root, world, models, seed)
    return artifacts.read_json(root / "audit.json")


@pytest.fixture(scope="module")
def audit_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("planted")
    planted_audit(root)
    return root


@pytest.fixture(scope="module")
def judged(audit_dir) -> dict[str, Any]:
    return artifacts.read_json(audit_dir / "audit.json")["judged"]


def check_planted(judged: dict[str, Any]) -> None:
    """Every planted outcome (shared by the fast test and the slow one over seeds)."""
    copier, fresh = judged["copier"], judged["fresh"]
    # the copier fails memorisation: the whole interval of each excess is above its margin
    assert copier["flag_rate"]["excess"]["ci_low"] > 0.05
    assert copier["membership_auc"]["ci_low"] > 0.5
    assert copier["extraction_rate"]["excess"]["ci_low"] > 0
    # new human-like music: flag rate, membership and extraction at chance
    e = fresh["flag_rate"]["excess"]
    assert e["ci_low"] <= 0 <= e["ci_high"]
    auc = fresh["membership_auc"]
    assert auc["ci_low"] <= 0.5 <= auc["ci_high"]
    assert fresh["extraction_rate"]["excess"]["value"] == 0
    # the quality guard judges the music, not its originality
    for name in ("copier", "fresh"):
        assert judged[name]["quality"]["score"] >= QUALITY_PASS, name
    for name in ("noise", "silent", "undecodable"):
        assert judged[name]["quality"]["score"] < 0.5, name


def test_planted_models_pass_and_fail_as_they_should(judged):
    check_planted(judged)


def test_judged_blocks_have_the_documented_keys(judged):
    fr = judged["copier"]["flag_rate"]
    assert {"value", "ci_low", "ci_high", "n", "n_flagged", "human", "excess"} <= set(fr)
    assert {"value", "ci_low", "ci_high", "n_windows", "n_pieces"} <= set(fr["human"])
    assert fr["n"] == 24 + 8 and fr["human"]["n_pieces"] == 10 < fr["human"]["n_windows"]
    assert fr["ci_low"] <= fr["value"] <= fr["ci_high"]
    mem = judged["copier"]["membership_auc"]
    assert {"value", "ci_low", "ci_high", "chance", "n_train", "n_heldout", "n_train_groups",
            "n_heldout_groups", "tpr"} <= set(mem)
    assert {"fpr", "value", "ci_low", "ci_high", "chance"} <= set(mem["tpr"])
    # membership_pieces=10 caps each side: 10 of 24 train pieces, 10 of the 20 val and test ones
    assert mem["n_train"] == 10 and mem["n_heldout"] == 10
    assert mem["n_heldout_groups"] == mem["n_heldout"]  # no splits table: a piece per group
    assert set(judged["copier"]["extraction_rate"]) == {"train", "test", "excess"}
    q = judged["fresh"]["quality"]
    assert {"score", "n_stats", "n_outside", "decode_rate", "n", "score_band_low",
            "stats"} <= set(q)
    assert q["n_stats"] == len(q["stats"]) == 7 and q["decode_rate"] == 1.0
    assert {"overlap", "band_low", "inside", "sample_mean", "human_mean", "undefined"} <= set(
        q["stats"]["pitch_range"])
    assert "membership_auc" not in judged["silent"]  # not among the audited models


def test_failures_are_failures_for_the_right_reason(judged):
    silent, undecodable = judged["silent"]["quality"], judged["undecodable"]["quality"]
    assert silent["score"] == 0 and all(s["undefined"] == 1 for s in silent["stats"].values())
    assert undecodable["decode_rate"] == 0 and undecodable["score"] == 0
    noise = judged["noise"]["quality"]["stats"]  # random ids rarely spell Pitch, Velocity, Duration
    assert noise["note_density"]["undefined"] > 0.5
    assert noise["note_density"]["sample_mean"] < 0.5 * noise["note_density"]["human_mean"]
    # noise and silence copy nothing: memorisation alone would pass them
    for name in ("noise", "silent"):
        assert judged[name]["flag_rate"]["excess"]["value"] <= 0


def test_report_keeps_its_keys_and_is_deterministic(audit_dir):
    report = artifacts.read_json(audit_dir / "audit.json")
    assert {"thresholds", "human", "samples", "music", "extraction", "membership",
            "flag_rate", "judged"} <= set(report)
    assert {"samples", "human_test", "excess", "by_model"} <= set(report["flag_rate"])
    first = {p: (audit_dir / p).read_bytes()
             for p in ("audit.json", "audit/per_sample.parquet", "audit/spans.parquet")}
    world = {k: audit_dir / f for k, f in (("tokens", "tokens.parquet"), ("info", "info.json"),
                                           ("tokenizer", "tokenizer.json"))}
    audit(audit_dir, world, planted_models(world, 0), 0)
    for p, data in first.items():
        assert (audit_dir / p).read_bytes() == data, p


def test_the_longest_shared_span_is_located_in_both_sequences(audit_dir):
    """``lcs_start`` / ``lcs_train_start`` point at the same ids in the sample and the training
    piece, and spans.parquet marks the same notes on both sides (pitches, durations and onsets
    up to one shift) for the copier, whose spans are whole replayed phrases."""
    table = artifacts.read_parquet(audit_dir / "audit" / "per_sample.parquet")
    samples = artifacts.read_parquet(audit_dir / "samples.parquet")
    tokens = artifacts.read_parquet(audit_dir / "tokens.parquet")
    ids = {(r["model"], r["kind"], r["index"]): np.asarray(r["ids"]) for _, r in samples.iterrows()}
    train = {(r["sha256"], r["track"]): np.asarray(r["ids"]) for _, r in tokens.iterrows()}
    hits = table[(table["source"] == "sample") & (table["lcs_tokens"] > 0)]
    assert len(hits) > 50
    for _, r in hits.iterrows():
        n, a, b = int(r["lcs_tokens"]), int(r["lcs_start"]), int(r["lcs_train_start"])
        assert a >= r["offset"]  # inside the generated part
        mine = ids[(r["model"], r["kind"], r["index"])][a: a + n]
        theirs = train[(r["lcs_train_sha256"], r["lcs_train_track"])][b: b + n]
        assert len(mine) == n and mine.tolist() == theirs.tolist()
    spans = artifacts.read_parquet(audit_dir / "audit" / "spans.parquet")
    copier = spans[spans["model"] == "copier"]
    assert len(copier) == 2 * len(hits[hits["model"] == "copier"])

    def marked(row) -> list[tuple[float, int, float]]:
        m = np.asarray(row["in_span"], dtype=bool)
        onset = np.asarray(row["onset"])[m]
        return list(zip((onset - onset.min()).tolist(), np.asarray(row["pitch"])[m].tolist(),
                        np.asarray(row["duration"])[m].tolist(), strict=True))

    total = 0
    for _, g in copier.groupby(["kind", "index"]):
        mine, theirs = (g[g["side"] == s].iloc[0] for s in ("sample", "train"))
        assert marked(mine) == marked(theirs)
        total += len(marked(mine))
    assert total >= 8 * len(copier) // 2  # replayed phrases: several notes per span


def test_an_audit_is_a_look_at_the_test_pieces_recorded_once(audit_dir, tmp_path):
    """The audit reads test rows (human test windows, extraction, membership): the run appends
    a look (command audit, the test pieces, the registration in force, the judging code's
    digest) before reading them, then the digest of audit.json's judged block; an identical
    re-run adds nothing."""
    from pipeline.decision import ledger, looks

    shutil.copy(audit_dir / "samples.parquet", tmp_path / "samples.parquet")
    world = {k: audit_dir / f for k, f in (("tokens", "tokens.parquet"), ("info", "info.json"),
                                           ("tokenizer", "tokenizer.json"))}
    path, reg = tmp_path / "ledger.jsonl", tmp_path / "preregistration.json"
    artifacts.write_json(reg, {"identity_hash": "r1", "identity": {"params": {}}})
    models = planted_models(world, 0)
    audit(tmp_path, world, models, 0, ledger_path=path, preregistration=reg)
    look, judged = ledger.read(path)
    tokens = artifacts.read_parquet(world["tokens"])
    assert look["kind"] == "look" and look["command"] == judged["command"] == "audit"
    assert look["pieces"] == sorted(tokens.loc[tokens["split"] == "test", "sha256"])
    assert look["registration"] == ledger.registration_summary(artifacts.read_json(reg))
    assert look["code"] == judged["code"] and len(look["code"]) == 64
    assert judged["kind"] == "audit" and judged["look"] == look["look"]
    report = artifacts.read_json(tmp_path / "audit.json")
    assert judged["results_sha256"] == looks.digest_of(report["judged"])
    assert (tmp_path / "audit.json").read_bytes() == (audit_dir / "audit.json").read_bytes()
    before = path.read_bytes()
    audit(tmp_path, world, models, 0, ledger_path=path, preregistration=reg)
    assert path.read_bytes() == before


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_planted_outcomes_hold_for_other_worlds_and_seeds(tmp_path, seed):
    """The fast test's outcomes are not one lucky draw: other worlds, samples and bootstraps."""
    check_planted(planted_audit(tmp_path, seed=seed, n_samples=32)["judged"])


def test_a_model_with_seeds_is_judged_over_every_seed_on_the_same_pieces(audit_dir):
    """A model trained over several seeds: membership is the seeds' mean AUC with their t term,
    extraction counts a piece any seed reproduces, and each seed keeps its own blocks on the
    same pieces. Planted: seed 1 is the copier itself (its blocks equal the copier's judgement
    alone), seed 2 a model that never saw training (at chance)."""
    root = audit_dir / "seeds"
    root.mkdir()
    shutil.copy(audit_dir / "samples.parquet", root / "samples.parquet")
    w = make_world(audit_dir / "seeds_world", seed=0)
    models = planted_models(w, 0)
    alone = artifacts.read_json(audit_dir / "audit.json")["judged"]["copier"]
    audit(root, w, models, 0, seeds={"copier": {1: models["copier"], 2: models["fresh"]},
                                     "silent": {1: models["silent"], 2: models["silent"]}})
    judged = artifacts.read_json(root / "audit.json")["judged"]
    copier = judged["copier"]
    assert copier["seeds"] == [1, 2]
    one, two = copier["per_seed"]["1"], copier["per_seed"]["2"]
    assert one["membership_auc"]["value"] == alone["membership_auc"]["value"]
    assert one["extraction_rate"] == alone["extraction_rate"]
    assert one["membership_auc"]["ci_low"] > 0.5  # the copier is caught on its seed ...
    auc = two["membership_auc"]
    assert auc["ci_low"] <= 0.5 <= auc["ci_high"]  # ... and the other seed is at chance
    assert auc["n_train"] == one["membership_auc"]["n_train"]
    pooled = copier["membership_auc"]
    assert pooled["value"] == pytest.approx((one["membership_auc"]["value"] + auc["value"]) / 2)
    assert pooled["per_seed"]["2"]["value"] == auc["value"]
    assert pooled["seed_half_width"] > 0  # the seeds disagree, so the interval says so ...
    assert pooled["ci_high"] - pooled["ci_low"] > \
        pooled["groups_ci_high"] - pooled["groups_ci_low"]
    assert pooled["ci_high"] - pooled["ci_low"] > \
        one["membership_auc"]["ci_high"] - one["membership_auc"]["ci_low"]  # ... wider
    ext, ext_one = copier["extraction_rate"], one["extraction_rate"]
    assert ext["over_seeds"] == "any"
    assert ext["train"]["value"] >= max(ext_one["train"]["value"],
                                        two["extraction_rate"]["train"]["value"])
    assert ext["train"]["n"] == ext_one["train"]["n"]
    assert "per_seed" not in judged["fresh"] and "seeds" not in judged["fresh"]
    assert "per_seed" not in judged["silent"]  # sampled, but not among the measured models


def test_samples_drawn_by_several_seeds_widen_the_flag_rate(audit_dir):
    """Samples labelled with the seeds that drew them (as generate writes them): the flag rate
    pools them, lists each seed's rate, and widens its intervals by the seeds' term."""
    root = audit_dir / "flag_seeds"
    root.mkdir()
    table = artifacts.read_parquet(audit_dir / "samples.parquet")
    table = table[table["model"] == "copier"].copy()
    fresh = artifacts.read_parquet(audit_dir / "samples.parquet")
    fresh = fresh[fresh["model"] == "fresh"]
    odd = table["index"].to_numpy() % 2 == 1  # the copier's odd samples replaced by fresh ones
    table.loc[odd, "ids"] = fresh["ids"].to_numpy()[odd]
    table["seed"] = np.where(odd, 2, 1)
    artifacts.write_parquet(root / "samples.parquet",
                            pa.Table.from_pandas(table, schema=SAMPLES_SCHEMA,
                                                 preserve_index=False))
    w = make_world(audit_dir / "flag_world", seed=0)
    audit(root, w, planted_models(w, 0), 0)
    copier = artifacts.read_json(root / "audit.json")["judged"]["copier"]
    flag_rate = copier["flag_rate"]
    per = flag_rate["per_seed"]
    assert sorted(per) == ["1", "2"] and per["1"]["n"] + per["2"]["n"] == flag_rate["n"]
    assert per["1"]["value"] > per["2"]["value"]  # the copier's seed is flagged more
    # each seed judged alone as well, its excess over the same human windows
    own = {s: b["flag_rate"] for s, b in copier["per_seed"].items()}
    assert {s: (b["n"], b["value"]) for s, b in own.items()} == \
        {s: (b["n"], b["value"]) for s, b in per.items()}
    assert own["1"]["human"]["value"] == own["2"]["human"]["value"]  # the same windows
    assert own["1"]["excess"]["value"] > own["2"]["excess"]["value"]
    assert flag_rate["seed_half_width"] > 0
    ex = flag_rate["excess"]
    assert ex["ci_high"] - ex["ci_low"] > ex["groups_ci_high"] - ex["groups_ci_low"]
    rows = artifacts.read_parquet(root / "audit" / "per_sample.parquet")
    assert sorted(rows[rows["source"] == "sample"]["seed"].unique().tolist()) == [1, 2]
    assert rows[rows["source"] == "human"]["seed"].isna().all()
