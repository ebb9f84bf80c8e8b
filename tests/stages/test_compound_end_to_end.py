"""Compound tokens through the stage functions (not dvc): tokenize a few tiny synthetic pieces
with Octuple (``model: none``), train the compound transformer, mark the n-gram not applicable,
evaluate val; each codebook's loss logged, resume after a kill equal to an uninterrupted run, and
each codebook's NLL adding up to the joint NLL."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import pipeline.training.loop as loop
from pipeline.core.artifacts import read_json, sha256_bytes, write_parquet
from pipeline.core.config import ParamsError, RuntimeConfig
from pipeline.stages import evaluate, train_ngram, train_transformer
from pipeline.stages.tokenize import TokenizeConfig
from pipeline.stages.tokenize import run as tokenize
from pipeline.tokens.contract import TokenInfo
from pipeline.training.data import load_corpus
from pipeline.training.resume import checkpoint_dir
from tests._transformer_data import tiny_config
from tests.stages.test_tokenize import synthetic_score

RUNTIME = RuntimeConfig(torch_threads=1, workers=1, progress=False)
N_PIECES = 8


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """data/ of a tiny Octuple run: raw files, manifest, splits (6 train, 2 val) and tokens."""
    root = tmp_path_factory.mktemp("octuple")
    raw = root / "data" / "raw"
    raw.mkdir(parents=True)
    rows, split = [], []
    for i in range(N_PIECES):
        data = synthetic_score(i, n_tracks=1, n_notes=24).dumps_midi()
        (raw / f"{i}.mid").write_bytes(data)
        rows.append({"path": f"{i}.mid", "sha256": sha256_bytes(data), "status": "ok",
                     "n_notes": 24, "duration_s": 10.0})
    manifest = pd.DataFrame(rows).sort_values("sha256").reset_index(drop=True)
    split = ["val" if i < 2 else "train" for i in range(N_PIECES)]
    splits = pd.DataFrame({"sha256": manifest["sha256"], "group_id": [f"g{i}" for i in
                                                                     range(N_PIECES)],
                           "split": split, "fold": 0})
    write_parquet(root / "data" / "manifest.parquet", manifest)
    write_parquet(root / "data" / "splits.parquet", splits)
    cfg = TokenizeConfig(tokenizer="Octuple", config={"use_programs": True}, model="none",
                         vocab_size=5, program=None, transpose=[-2, 2])
    tokenize(cfg, RUNTIME, raw_dir=raw, manifest=root / "data/manifest.parquet",
             splits=root / "data/splits.parquet", split_report=root / "reports/split.json",
             tokenizer_out=root / "data/tokenizer.json", tokens_dir=root / "data/tokens",
             cache_dir=None, report=root / "reports/tokenize.json")
    return root


def _train(root: Path, out: Path, cfg=None, augmented: bool = False) -> dict:
    return train_transformer.run(
        cfg or tiny_config(train={"max_steps": 4, "eval_every": 2}), RUNTIME,
        tokens=root / "data/tokens/tokens.parquet", info=root / "data/tokens/info.json",
        augmented=root / "data/tokens/augmented.parquet" if augmented else None,
        out_dir=out / "model", summary=out / "train.json", log_dir=out / "log",
        env=out / "env.json")


def test_training_logs_each_codebook(root, tmp_path):
    info = TokenInfo.read(root / "data/tokens/info.json")
    summary = _train(root, tmp_path)
    keys = info.codebook_keys()
    assert info.compound and len(keys) == len(info.codebooks) > 1
    log = pd.read_csv(tmp_path / "log" / "seed-7.tsv", sep="\t")
    assert [f"train_loss_{k}" for k in keys] == [c for c in log if c.startswith("train_loss_")]
    per_book = log[[f"train_loss_{k}" for k in keys]].to_numpy()
    assert np.isfinite(per_book).all()
    # train_loss is the plain mean over codebooks of each codebook's mean NLL
    np.testing.assert_allclose(log["train_loss"], per_book.mean(axis=1), rtol=1e-5)
    evals = log.dropna(subset=["val_loss"])
    assert list(evals["step"]) == [2, 4]
    np.testing.assert_allclose(evals["val_loss"],
                               evals[[f"val_loss_{k}" for k in keys]].mean(axis=1), rtol=1e-5)
    books = read_json(tmp_path / "train.json")["codebooks"]
    assert sorted(books) == sorted(keys)
    best = evals.set_index("step").loc[summary["best_step"]]
    assert all(books[k]["best_val_loss"] == pytest.approx(best[f"val_loss_{k}"], rel=1e-5)
               for k in keys)
    meta = read_json(tmp_path / "model" / "model.json")
    assert meta["config"]["codebook_sizes"] == list(info.codebook_sizes())
    assert meta["codebooks"] == info.codebooks


def test_augmented_codes_are_trained_on(root, tmp_path):
    summary = _train(root, tmp_path, augmented=True)
    assert summary["n_augmented_examples"] > 0
    assert summary["n_train_examples"] == 6 + summary["n_augmented_examples"]


def test_resume_after_kill_equals_an_uninterrupted_run(root, tmp_path):
    cfg = tiny_config(train={"max_steps": 6, "eval_every": 2})
    _train(root, tmp_path / "straight", cfg)
    info = TokenInfo.read(root / "data/tokens/info.json")

    def kill(state):
        if state.step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        loop.train(cfg, info, load_corpus(root / "data/tokens/tokens.parquet", info),
                   checkpoint_dir(tmp_path / "resumed" / "model", cfg, info, 1, 1), threads=1,
                   on_step=kill, echo=lambda _: None)
    _train(root, tmp_path / "resumed", cfg)  # resumes from step 3, replays 4 and 5
    for name in ("model/model.safetensors", "train.json", "log/seed-7.tsv"):
        assert (tmp_path / "straight" / name).read_bytes() == (
            tmp_path / "resumed" / name).read_bytes(), name


def test_packing_and_conditions_are_refused_naming_the_key(root, tmp_path):
    with pytest.raises(ParamsError, match=r"transformer\.data\.pack"):
        _train(root, tmp_path, tiny_config(data={"pack": True}))
    from pipeline.conditions.config import ConditionConfig

    with pytest.raises(ParamsError, match=r"condition\.use"):
        train_transformer.run(
            tiny_config(), RUNTIME, tokens=root / "data/tokens/tokens.parquet",
            info=root / "data/tokens/info.json", augmented=None, out_dir=tmp_path / "m",
            summary=tmp_path / "t.json", log_dir=tmp_path / "l", env=tmp_path / "e.json",
            condition=ConditionConfig(use=["key"]))
    assert not (tmp_path / "model").exists()


@pytest.fixture(scope="module")
def trained(root, tmp_path_factory) -> Path:
    """The tiny compound transformer (2 steps) and the n-gram stage's outputs, under ``out``."""
    out = tmp_path_factory.mktemp("trained")
    _train(root, out, tiny_config(train={"max_steps": 2, "eval_every": 2},
                                  optim={"warmup_steps": 1}))
    train_ngram.run(train_ngram.NGramConfig(), RUNTIME, tokens=root / "data/tokens/tokens.parquet",
                    info=root / "data/tokens/info.json",
                    augmented=root / "data/tokens/augmented.parquet", model_dir=out / "ngram",
                    report=out / "ngram.json", plot=out / "ngram_orders.tsv")
    return out


def test_ngram_is_not_applicable_with_its_reason(trained):
    report = read_json(trained / "ngram.json")
    assert report["applicable"] is False and "tuple of one id per codebook" in report["reason"]
    assert "best_order" not in report
    assert sorted(p.name for p in (trained / "ngram").iterdir()) == ["not_applicable.json"]
    assert (trained / "ngram_orders.tsv").read_text().splitlines() == [
        "order\tval_nats_per_token\tval_bits_per_token\tval_perplexity"]


def _evaluate(root: Path, trained: Path, out: Path) -> evaluate.EvaluateSummary:
    from pipeline.inference.loading import default_specs

    cfg = evaluate.EvaluateConfig(splits=["val"], n_boot=100, train_pieces=2, stride=8)
    return evaluate.run(cfg, RUNTIME, tokens=root / "data/tokens/tokens.parquet",
                        info=root / "data/tokens/info.json",
                        manifest=root / "data/manifest.parquet",
                        splits=root / "data/splits.parquet",
                        specs=default_specs(trained / "ngram", trained / "model", stride=8),
                        per_piece=out / "per_piece.parquet", report=out / "eval.json")


def test_evaluate_scores_the_joint_nll_and_each_codebook(root, trained, tmp_path):
    summary = _evaluate(root, trained, tmp_path)
    info = TokenInfo.read(root / "data/tokens/info.json")
    keys = info.codebook_keys()
    assert summary.unavailable["ngram"].startswith("not applicable: the n-gram baseline")
    table = pd.read_parquet(tmp_path / "per_piece.parquet")
    assert list(table.columns)[-len(keys):] == [f"nll_nats_{k}" for k in keys]
    assert set(table["model"]) == {"transformer"} and set(table["split"]) == {"val", "train"}
    shares = table[[f"nll_nats_{k}" for k in keys]].sum(axis=1)
    np.testing.assert_allclose(shares, table["nll_nats"], rtol=1e-12)
    assert (table[[f"nll_nats_{k}" for k in keys]] > 0).all().all()
    tokens = pd.read_parquet(root / "data/tokens/tokens.parquet")
    steps = dict(zip(tokens["sha256"], tokens["n_tokens"], strict=True))
    assert all(n == steps[s] + 1 for s, n in zip(table["sha256"], table["n_tokens"], strict=True))
    report = read_json(tmp_path / "eval.json")
    assert report["paired"] == {} or not any("ngram" in k for k in report["paired"])
    assert sorted(report["codebooks"]["transformer"]["val"]) == sorted(keys)
    val = table[table["split"] == "val"]
    per_note = report["models"]["transformer"]["val"]["nats_per_note"]["value"]
    assert per_note == pytest.approx(val["nll_nats"].sum() / val["n_notes"].sum())
    assert math.fsum(v["share"] for v in report["codebooks"]["transformer"]["val"].values()) \
        == pytest.approx(1.0)
    assert report["protocol"]["compound"]["n_tokens"] == "steps"


def test_joint_nll_is_the_sum_of_the_renormalised_codebooks(root, trained):
    """Each step's joint NLL, recomputed from the model's raw logits with every codebook's PAD
    and BOS removed from its support, equals the scorer's; the windows change nothing for a
    piece that fits one context."""
    import torch

    from pipeline.inference.scorer import load_scorer

    scorer = load_scorer(trained / "model")
    info = TokenInfo.read(root / "data/tokens/info.json")
    tokens = pd.read_parquet(root / "data/tokens/tokens.parquet")
    seq = np.stack([np.asarray(c, dtype=np.int64) for c in tokens["codes"].iloc[0]], axis=1)[:20]
    per = scorer.codebook_nll([seq])[0]
    full = np.concatenate([[info.codebook_ids("bos_id")], seq, [info.codebook_ids("eos_id")]])
    with torch.no_grad():
        logits, _ = scorer.model(torch.as_tensor(full[None, :-1]))
    for k, lg in enumerate(logits):
        lg = lg[0].double().clone()
        lg[:, [info.codebooks[k]["pad_id"], info.codebooks[k]["bos_id"]]] = -math.inf
        want = -torch.log_softmax(lg, -1).gather(1, torch.as_tensor(full[1:, k])[:, None])[:, 0]
        np.testing.assert_allclose(per[:, k], want.numpy(), rtol=1e-5)
    np.testing.assert_allclose(scorer.token_nll([seq])[0], per.sum(axis=1), rtol=1e-12)
    long = np.concatenate([seq] * 3)  # 60 steps > max_seq_len 32: sliding windows
    assert len(scorer.token_nll([long])[0]) == len(long) + 1


def test_the_gain_rule_reads_the_missing_ngram_as_not_available(root, trained, tmp_path):
    from pipeline.core.config import load_section
    from pipeline.decision.criteria import CriteriaConfig, evaluate_all
    from pipeline.decision.metrics import build_metrics
    from pipeline.decision.preregistration import COMPARISON_METRIC
    from pipeline.report.sections.models import ngram_table

    _evaluate(root, trained, tmp_path)
    ngram = read_json(trained / "ngram.json")
    metrics = build_metrics({"eval": read_json(tmp_path / "eval.json"), "ngram": ngram})
    cfg = load_section("criteria", Path(__file__).parents[2] / "params.yaml", CriteriaConfig)
    gain = [v for v in evaluate_all(cfg, metrics) if v.metric == COMPARISON_METRIC]
    assert gain and all(v.status == "INCONCLUSIVE" and "not available" in v.evidence
                        for v in gain)
    shown = ngram_table(ngram, 3)
    assert len(shown) == 1 and "not applicable" in shown[0].text and ngram["reason"] in \
        shown[0].text


# --- sampling ---------------------------------------------------------------------------------


def _generate(root: Path, trained: Path, out: Path, **params) -> pd.DataFrame:
    """Samples of the tiny model: unconditional ones, and continuations of val pieces' first
    steps (the fixture has no test split: val rows stand in for the prompts' test rows)."""
    from pipeline.inference import generation
    from pipeline.inference.loading import load_transformer

    cfg = generation.GenerateConfig(**{
        "models": ["transformer"], "n_samples": 3, "n_continuations": 2, "max_new_tokens": 12,
        "prompt_tokens": 4, "batch_size": 2, "files_per_kind": 1, **params})
    rows = pd.read_parquet(root / "data/tokens/tokens.parquet")
    rows = rows[rows["split"] == "val"].assign(split="test")
    summary = generation.run(cfg, {"transformer": load_transformer(trained / "model")},
                             prompt_rows=rows, info=root / "data/tokens/info.json",
                             tokenizer=root / "data/tokenizer.json",
                             samples_out=out / "samples.parquet", samples_dir=out / "samples")
    assert summary.n_prompts == 2
    return pd.read_parquet(out / "samples.parquet")


def test_samples_are_drawn_step_by_step_and_decode(root, trained, tmp_path):
    import symusic

    from pipeline.tokens.tokenizer import load_tokenizer, steps_from_codes

    samples = _generate(root, trained, tmp_path)
    info = TokenInfo.read(root / "data/tokens/info.json")
    K = len(info.codebooks)
    assert list(samples.columns[:8]) == ["model", "kind", "index", "seed", "prompt_sha256",
                                         "prompt_len", "ids", "codes"]
    assert sorted(samples["kind"].value_counts().items()) == [("continuation", 2),
                                                               ("unconditional", 3)]
    assert all(len(i) == 0 for i in samples["ids"])
    tokens = pd.read_parquet(root / "data/tokens/tokens.parquet").set_index("sha256")
    never = [{c["pad_id"], c["bos_id"]} | ({c["eos_id"]}) for c in info.codebooks]
    for _, row in samples.iterrows():
        steps = np.asarray(steps_from_codes(row["codes"]))
        assert steps.shape == (row["n_tokens"], K) and row["n_tokens"] > row["prompt_len"]
        for k in range(K):
            assert not set(steps[row["prompt_len"]:, k].tolist()) & never[k], (k, row["index"])
        if row["kind"] == "continuation":
            want = np.asarray(steps_from_codes(tokens.loc[row["prompt_sha256"], "codes"]))[:4]
            np.testing.assert_array_equal(steps[:4], want)
    # a barely trained Octuple model may draw bars that run backwards across time-signature
    # changes: such steps decode to notes before time 0 and are kept as failures
    assert samples["decode_ok"].sum() >= 3
    assert all("before time 0" in e for e in samples.loc[~samples["decode_ok"], "decode_error"])
    tok = load_tokenizer(root / "data/tokenizer.json")
    from pipeline.tokens.tokenizer import decode_ids

    ok = samples[samples["decode_ok"]]
    score, err = decode_ids(tok, steps_from_codes(ok["codes"].iloc[-1]))
    assert err is None and isinstance(score, symusic.Score) and score.note_num() > 0
    midi = symusic.Score.from_file(str(tmp_path / "samples" / "transformer_unconditional_0.mid"))
    assert midi.note_num() > 0


def test_sampling_is_reproducible_and_independent_of_the_batch(root, trained, tmp_path):
    a = _generate(root, trained, tmp_path / "a")
    b = _generate(root, trained, tmp_path / "b", batch_size=5)
    c = _generate(root, trained, tmp_path / "c", seed=99)
    assert (tmp_path / "a/samples.parquet").read_bytes() == \
        (tmp_path / "b/samples.parquet").read_bytes()
    def codes(df):
        return [[c.tolist() for c in x] for x in df["codes"]]

    assert codes(a) == codes(b) and codes(a) != codes(c)


def test_the_first_codebooks_eos_ends_a_step_never_half_drawn():
    """Stub heads: the first codebook draws EOS at the third step, the others put all their mass
    on EOS, PAD and BOS, which they may never draw: they fall back on their best allowed id."""
    from pipeline.inference.sampling import SamplingParams, StepRules, sample_steps

    class Heads:
        def next_step_logprobs(self, contexts):
            n = len(contexts)
            first = np.full((n, 5), -50.0)
            for r, c in enumerate(contexts):
                first[r, 2 if len(c) >= 2 else 3] = 0.0  # EOS (2) once two steps are drawn
            other = np.full((n, 6), -50.0)
            other[:, :3] = 0.0  # PAD, BOS, EOS
            other[:, 5] = -1.0
            return [first, other]

    rules = StepRules(forbid=((0, 1), (0, 1, 2)), eos=2, ignore=(-1, -1), used={})
    rngs = [np.random.default_rng(i) for i in range(2)]
    out = sample_steps(Heads(), [np.zeros((0, 2)), np.asarray([[3, 5]])], max_new_steps=10,
                       params=SamplingParams(), rngs=rngs, rules=rules)
    assert [o.tolist() for o in out] == [[[3, 5], [3, 5]], [[3, 5]]]


def test_cpword_steps_fill_only_their_familys_codebooks(tmp_path):
    """CPWord: a Note step draws Pitch, Velocity, Duration (and Program), a Metric step its
    Position/Bar, then a Position its Tempo and a Bar its TimeSig; every other codebook holds
    Ignore_None, as miditok writes it, so the samples decode (an untrained model)."""
    import torch

    from models.compound import CompoundGPT
    from models.transformer import TransformerConfig
    from pipeline.inference.generation import compound_rules
    from pipeline.inference.sampling import SamplingParams, sample_steps
    from pipeline.inference.scorer import CompoundScorer
    from pipeline.tokens.tokenizer import codebooks, decode_ids, make_tokenizer

    tok = make_tokenizer("CPWord", {"use_programs": True, "use_tempos": True,
                                    "use_time_signatures": True})
    books = codebooks(tok)
    info = TokenInfo(vocab_size=sum(b["size"] for b in books), pad_id=0, bos_id=1, eos_id=2,
                     tokenizer_hash="t", split_hash="s", tokenizer="CPWord", model="none",
                     compound=True, codebooks=books)
    rules = compound_rules(info, tok)
    types = [b["name"] for b in books]
    note, metric = int(tok.vocab[0]["Family_Note"]), int(tok.vocab[0]["Family_Metric"])
    assert [types[k] for k in rules.used[note]] == ["Pitch", "Velocity", "Duration", "Program"]
    assert [types[k] for k in rules.used[metric]] == ["Position/Bar"]
    assert all({0, 1, 2, 3, 4} <= set(f) for f in rules.forbid[1:])  # specials, Ignore
    assert 2 not in rules.forbid[0] and {0, 1, 3} <= set(rules.forbid[0])  # EOS ends
    cfg = TransformerConfig(vocab_size=info.vocab_size, max_seq_len=32, n_layer=1, n_head=2,
                            n_embd=16, codebook_sizes=[b["size"] for b in books])
    scorer = CompoundScorer(CompoundGPT(cfg, torch.Generator().manual_seed(0)).eval(),
                            codebooks=books)
    out = sample_steps(scorer, [np.zeros((0, len(books)))] * 2, max_new_steps=40,
                       params=SamplingParams(), rngs=[np.random.default_rng(i) for i in (1, 2)],
                       rules=rules)
    for steps in out:
        for step in steps.tolist():
            assert step[0] in (note, metric)
            drawn = set(rules.used[step[0]])
            for k in sorted(drawn):
                drawn |= set(rules.then.get(k, {}).get(step[k], ()))
            if step[0] == metric:
                kind = tok[1, step[1]].split("_")[0]  # Bar or Position
                assert {types[k] for k in drawn} == {"Position/Bar",
                                                     "TimeSig" if kind == "Bar" else "Tempo"}
            assert all((step[k] == books[k]["ignore_id"]) == (k not in drawn)
                       for k in range(1, len(books))), step
    assert all(decode_ids(tok, s.tolist())[1] is None for s in out)
    assert any(decode_ids(tok, s.tolist())[0].note_num() > 0 for s in out)


# --- audit ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def audited(root, trained, tmp_path_factory) -> Path:
    """The tiny model's samples audited: the token table copied with one train piece relabelled
    test (the fixture's split has none), whose first steps also prompt a continuation."""
    from pipeline.inference import generation
    from pipeline.inference.loading import load_transformer
    from pipeline.stages import audit

    out = tmp_path_factory.mktemp("audited")
    tokens = pd.read_parquet(root / "data/tokens/tokens.parquet")
    first_train = tokens.index[tokens["split"] == "train"][0]
    tokens.loc[first_train, "split"] = "test"
    write_parquet(out / "tokens.parquet", tokens)
    model = load_transformer(trained / "model")
    cfg = generation.GenerateConfig(models=["transformer"], n_samples=4, n_continuations=1,
                                    max_new_tokens=16, prompt_tokens=4, files_per_kind=0)
    generation.run(cfg, {"transformer": model}, prompt_rows=tokens,
                   info=root / "data/tokens/info.json", tokenizer=root / "data/tokenizer.json",
                   samples_out=out / "samples.parquet", samples_dir=out / "samples")
    acfg = audit.AuditConfig(models=["transformer"], ngram_sizes=[2, 4],
                             interval_ngram_sizes=[2], human_window=8, human_stride=4,
                             human_windows=2, extraction_pieces=4, extraction_prefix=4,
                             extraction_tokens=4, membership_pieces=4, n_boot=100)
    audit.run(acfg, {"transformer": model}, samples=out / "samples.parquet",
              tokens=out / "tokens.parquet", info=root / "data/tokens/info.json",
              tokenizer=root / "data/tokenizer.json", per_sample=out / "per_sample.parquet",
              report=out / "audit.json", spans=out / "spans.parquet",
              splits=root / "data/splits.parquet", ledger_path=out / "ledger.jsonl")
    return out


def test_the_audit_treats_each_step_as_one_symbol(audited):
    report = read_json(audited / "audit.json")
    assert report["compound"]["step_symbol"].startswith("each step (one id per codebook)")
    assert list(report["compound"]["not_applicable"]) == ["lcs_bars"]
    assert "Bar tokens" in report["compound"]["not_applicable"]["lcs_bars"]
    rows = pd.read_parquet(audited / "per_sample.parquet")
    samples = pd.read_parquet(audited / "samples.parquet")
    mine = rows[rows["source"] == "sample"]
    assert len(mine) == len(samples) == 5 and set(rows["source"]) == {"sample", "human"}
    # windows and spans count steps
    want = (samples["n_tokens"] - samples["prompt_len"]).clip(upper=8).tolist()
    assert sorted(mine["n_tokens"].tolist()) == sorted(want)
    assert rows["lcs_bars"].isna().all() and (rows["lcs_tokens"] >= 0).all()
    assert rows.loc[rows["decode_ok"], "n_notes"].gt(0).all()  # decoded notes: the real steps
    assert "transformer" in report["judged"]
    assert (audited / "ledger.jsonl").exists()


def test_membership_scores_the_joint_nll_per_note_and_extraction_whole_steps(root, trained):
    from pipeline.audit.compound import CompoundView
    from pipeline.audit.judging import per_note_nll
    from pipeline.audit.memorisation import extraction_test
    from pipeline.inference.loading import load_transformer
    from pipeline.tokens.tokenizer import load_tokenizer

    info = TokenInfo.read(root / "data/tokens/info.json")
    tokens = pd.read_parquet(root / "data/tokens/tokens.parquet")
    samples = tokens[["codes"]].head(0)
    scorer = load_transformer(trained / "model")
    view = CompoundView.of(info, load_tokenizer(root / "data/tokenizer.json"), tokens, samples)
    model = view.model(scorer)
    rows = view.table.head(3)
    steps = [np.stack([np.asarray(c, dtype=np.int64) for c in codes], axis=1)
             for codes in tokens["codes"].head(3)]
    want = [float(np.sum(v)) / n for v, n in
            zip(scorer.token_nll(steps), rows["n_notes"], strict=True)]
    np.testing.assert_allclose(per_note_nll(model, rows), want, rtol=1e-12)
    seqs = list(view.table["ids"].head(4))
    ext = extraction_test(model, seqs, 4, 4)
    assert ext.n == 4 and 0.0 <= ext.token_match <= 1.0
    greedy = model.greedy_continue([s[:4] for s in seqs], 4)
    again = model.greedy_continue([s[:4] for s in seqs], 4)
    assert [g.tolist() for g in greedy] == [g.tolist() for g in again]


# --- symkit score and symkit sample -----------------------------------------------------------


def test_files_get_the_tokenize_stages_steps(root):
    """A MIDI file encoded by the standalone tools gives its piece's codes in tokens.parquet,
    as steps (one id per codebook each)."""
    from pipeline.inference.standalone import encode_midi
    from pipeline.tokens.tokenizer import load_tokenizer, steps_from_codes

    tok = load_tokenizer(root / "data/tokenizer.json")
    tokens = pd.read_parquet(root / "data/tokens/tokens.parquet")
    for i in range(N_PIECES):
        data = (root / "data/raw" / f"{i}.mid").read_bytes()
        row = tokens[tokens["sha256"] == sha256_bytes(data)]
        got = encode_midi(tok, data)
        assert [t for t, _ in got] == row["track"].tolist()
        assert [ids.tolist() for _, ids in got] == [steps_from_codes(c) for c in row["codes"]]


def _score(root: Path, trained: Path, out: Path, *paths: Path, splits: Path | None = None
           ) -> pd.DataFrame:
    from pipeline.cli import main

    rc = main(["score", *map(str, paths), "--model", str(trained / "model"), "--tokenizer",
               str(root / "data/tokenizer.json"), "--stride", "8", "--torch-threads", "1",
               "--splits", str(splits or root / "data/splits.parquet"),
               "--preregistration", str(out / "none.json"), "--ledger", str(out / "ledger.jsonl"),
               "--out", str(out / "scores.parquet")])
    assert rc == 0
    return pd.read_parquet(out / "scores.parquet")


def test_symkit_score_gives_evaluates_per_piece_nll(root, trained, tmp_path):
    """symkit score of the raw files gives each piece the NLL evaluate wrote in per_piece (the
    val pieces and the train subset), the same steps and codebook columns that add up to it; a
    bad file keeps its status row; a file longer than the context is scored in windows."""
    from pipeline.inference.pieces import score_codebooks
    from pipeline.inference.scorer import load_scorer
    from pipeline.inference.standalone import encode_midi
    from pipeline.tokens.tokenizer import load_tokenizer

    _evaluate(root, trained, tmp_path)
    want = pd.read_parquet(tmp_path / "per_piece.parquet").set_index("sha256")
    keys = TokenInfo.read(root / "data/tokens/info.json").codebook_keys()
    raw = sorted((root / "data/raw").glob("*.mid"))
    long = tmp_path / "long.mid"
    long.write_bytes(synthetic_score(99, n_tracks=1, n_notes=80).dumps_midi())
    (tmp_path / "bad.mid").write_bytes(b"MThd\x00\x00\x00\x06garbage")
    got = _score(root, trained, tmp_path, *raw, tmp_path / "bad.mid", long)
    books = [f"nll_nats_{k}" for k in keys]
    assert list(got.columns)[-len(keys):] == books
    assert got["status"].tolist() == ["ok"] * N_PIECES + ["corrupt", "ok"]
    assert got.loc[N_PIECES, ["nll_nats", *books]].isna().all()
    scored = got[got["sha256"].isin(want.index)]
    assert len(scored) == len(want) == 4
    for _, row in scored.iterrows():
        piece = want.loc[row["sha256"]]
        assert row["nll_per_note"] == pytest.approx(piece["nll_nats"] / piece["n_notes"],
                                                    rel=1e-6)
        assert row["n_tokens"] == piece["n_tokens"] and row["n_notes"] == piece["n_notes"]
        np.testing.assert_allclose(row[books].to_numpy(float), piece[books].to_numpy(float),
                                   rtol=1e-6)
    ok = got[got["status"] == "ok"]
    np.testing.assert_allclose(ok[books].sum(axis=1), ok["nll_nats"], rtol=1e-12)
    steps = encode_midi(load_tokenizer(root / "data/tokenizer.json"), long.read_bytes())[0][1]
    last = got.iloc[-1]
    assert last["n_tokens"] == len(steps) + 1 > 2 * 32  # three windows of the 32-step context
    nll, shares = score_codebooks(load_scorer(trained / "model", stride=8), [steps])
    assert last["nll_nats"] == pytest.approx(nll[0], rel=1e-6)
    np.testing.assert_allclose(last[books].to_numpy(float), shares[0], rtol=1e-6)


def test_symkit_score_of_a_compound_test_piece_is_a_look(root, trained, tmp_path, capsys):
    from pipeline.decision import ledger

    splits = pd.read_parquet(root / "data/splits.parquet")
    splits.loc[0, "split"] = "test"
    write_parquet(tmp_path / "splits.parquet", splits)
    raw = sorted((root / "data/raw").glob("*.mid"))
    _score(root, trained, tmp_path, *raw, splits=tmp_path / "splits.parquet")
    assert "1 of these files is a test piece" in capsys.readouterr().out
    (look,) = ledger.read(tmp_path / "ledger.jsonl")
    assert look["command"] == "score" and look["pieces"] == [splits.loc[0, "sha256"]]


def test_symkit_score_refuses_a_stride_beyond_the_context_in_steps(root, trained, tmp_path,
                                                                   capsys):
    from pipeline.cli import main

    rc = main(["score", str(root / "data/raw/0.mid"), "--model", str(trained / "model"),
               "--tokenizer", str(root / "data/tokenizer.json"), "--stride", "33",
               "--splits", str(root / "data/splits.parquet"), "--preregistration",
               str(tmp_path / "none.json"), "--out", str(tmp_path / "scores.csv")])
    assert rc == 2 and not (tmp_path / "scores.csv").exists()
    assert "--stride 33: the model's context is 32 steps; use 1..32" in capsys.readouterr().err


def _sample(root: Path, trained: Path, out: Path, *extra: str) -> int:
    from pipeline.cli import main

    return main(["sample", "--model", str(trained / "model"), "--tokenizer",
                 str(root / "data/tokenizer.json"), "--n", "3", "--max-new-tokens", "10",
                 "--batch-size", "2", "--torch-threads", "1", "--out", str(out), *extra])


def test_symkit_sample_draws_compound_steps_reproducibly(root, trained, tmp_path):
    """symkit sample opens a compound model, draws unprompted samples step by step, the same
    codes for the same seed whatever the batch size."""
    import symusic

    assert _sample(root, trained, tmp_path / "a") == 0
    assert _sample(root, trained, tmp_path / "b", "--batch-size", "3") == 0
    record = read_json(tmp_path / "a" / "samples.json")
    info = TokenInfo.read(root / "data/tokens/info.json")
    assert len(record["samples"]) == 3 and record["prompts"] == []
    for s in record["samples"]:
        assert s["ids"] == [] and len(s["codes"]) == len(info.codebooks)
        assert all(len(c) == len(s["codes"][0]) <= 10 for c in s["codes"])
        assert s["prompt"] is None and s["prompt_len"] == 0
    ok = [s for s in record["samples"] if s["decode_ok"]]
    assert ok and symusic.Score.from_file(str(tmp_path / "a" / ok[0]["file"])).note_num() > 0
    again = read_json(tmp_path / "b" / "samples.json")
    assert [s["codes"] for s in again["samples"]] == [s["codes"] for s in record["samples"]]


def test_symkit_sample_continues_a_prompts_steps(root, trained, tmp_path):
    """--prompt: each sample starts with its prompt's first --prompt-tokens steps exactly, then
    the drawn ones; the same seed writes the same bytes, another seed other steps; prompted
    samples decode to MIDI holding at least the prompt's notes; a prompt shorter than
    --prompt-tokens is used whole."""
    import symusic

    from pipeline.tokens.tokenizer import steps_from_codes

    tokens = pd.read_parquet(root / "data/tokens/tokens.parquet").set_index("sha256")
    prompts = [root / "data/raw" / "0.mid", root / "data/raw" / "1.mid"]
    whole = [np.asarray(steps_from_codes(tokens.loc[sha256_bytes(p.read_bytes()), "codes"]))
             for p in prompts]
    args = ["--prompt", str(prompts[0]), "--prompt", str(prompts[1]), "--prompt-tokens", "4",
            "--seed", "5"]
    for name in ("a", "b"):
        assert _sample(root, trained, tmp_path / name, *args) == 0
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "samples.json" in files and any(f.endswith(".mid") for f in files)
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    record = read_json(tmp_path / "a" / "samples.json")
    assert record["prompts"] == [{"name": p.name, "sha256": sha256_bytes(p.read_bytes()),
                                  "n_steps": 4} for p in prompts]
    assert record["settings"]["prompt_tokens"] == 4
    for s in record["samples"]:
        steps = np.asarray(steps_from_codes(s["codes"]))
        assert s["prompt"] == s["index"] % 2 and s["prompt_len"] == 4 and s["ids"] == []
        np.testing.assert_array_equal(steps[:4], whole[s["prompt"]][:4])
        assert 4 < len(steps) <= 4 + 10
    ok = [s for s in record["samples"] if s["decode_ok"]]
    assert ok and all(symusic.Score.from_file(str(tmp_path / "a" / s["file"])).note_num() >= 4
                      for s in ok)
    assert _sample(root, trained, tmp_path / "c", *args[:-1], "6") == 0
    other = read_json(tmp_path / "c" / "samples.json")
    assert [s["codes"] for s in other["samples"]] != [s["codes"] for s in record["samples"]]
    assert _sample(root, trained, tmp_path / "d", "--prompt", str(prompts[0]),
                   "--prompt-tokens", "1000", "--n", "1") == 0
    (s,) = read_json(tmp_path / "d" / "samples.json")["samples"]
    assert s["prompt_len"] == len(whole[0]) < 1000
    np.testing.assert_array_equal(np.asarray(steps_from_codes(s["codes"]))[:len(whole[0])],
                                  whole[0])
