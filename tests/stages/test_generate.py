"""``symkit generate`` on a synthetic world: a REMI tokenizer, random melodies tokenised into a
token table, and a count-based order-k model that meets the SequenceModel protocol.

The world builder and :class:`CountLM` are reused by the audit and report tests.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from pipeline.core import artifacts
from pipeline.stages.generate import GenerateConfig, run
from pipeline.tokens.contract import tokens_table

BOS, EOS = 1, 2


class CountLM:
    """Order-k count model with backoff to the longest seen context and add-alpha smoothing.

    With a high order and tiny alpha, greedy decoding replays training sequences: the planted
    "copying" model of the memorisation tests.
    """

    def __init__(self, order: int, vocab_size: int, alpha: float = 1e-3):
        self.order, self.vocab_size, self.alpha, self.eos_id = order, vocab_size, alpha, EOS

    def fit(self, seqs) -> CountLM:
        self.counts_: dict[tuple, Counter] = defaultdict(Counter)
        for s in seqs:
            x = [BOS, *map(int, s), EOS]
            for i in range(1, len(x)):
                for n in range(self.order):
                    if i - n >= 0:
                        self.counts_[tuple(x[i - n:i])][x[i]] += 1
        return self

    def _row(self, context) -> np.ndarray:
        x = [BOS, *map(int, context)]
        for n in range(min(self.order - 1, len(x)), -1, -1):
            c = self.counts_.get(tuple(x[len(x) - n:]))
            if c:
                row = np.full(self.vocab_size, self.alpha)
                for tok, k in c.items():
                    row[tok] += k
                return np.log(row / row.sum())
        return np.full(self.vocab_size, -np.log(self.vocab_size))

    def next_logprobs(self, contexts) -> np.ndarray:
        return np.stack([self._row(c) for c in contexts])

    def token_nll(self, seqs) -> list[np.ndarray]:
        out = []
        for s in seqs:
            s = [int(v) for v in s]
            targets = [*s, EOS]
            out.append(np.array([-self._row(s[:i])[t] for i, t in enumerate(targets)]))
        return out


def random_score(rng: np.random.Generator, n_notes: int = 48):
    """A random melody: random-walk pitches in C major, durations of 1/2, 1 or 2 beats, random
    velocities (so that a few notes identify a piece, as in real music)."""
    import symusic

    scale = np.array([0, 2, 4, 5, 7, 9, 11])
    score = symusic.Score(480)
    track = symusic.Track(program=0)
    t, degree = 0, 14
    for _ in range(n_notes):
        degree = int(np.clip(degree + rng.integers(-3, 4), 7, 24))
        dur = int(rng.choice([240, 480, 960]))
        pitch = 48 + 12 * (degree // 7) + int(scale[degree % 7])
        track.notes.append(symusic.Note(t, dur, pitch, int(rng.integers(30, 125))))
        t += dur
    score.tracks.append(track)
    return score


def make_world(root: Path, n_train: int = 24, n_val: int = 10, n_test: int = 10,
               seed: int = 0) -> dict[str, Path]:
    """Write tokenizer.json, tokens.parquet and info.json under ``root``; return their paths."""
    import miditok

    tok = miditok.REMI()
    rng = np.random.default_rng(seed)
    rows = []
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        for i in range(n):
            ids = tok.encode(random_score(rng))[0].ids
            sha = hashlib.sha256(f"{split}-{i}".encode()).hexdigest()
            rows.append({"sha256": sha, "split": split, "track": 0, "ids": ids,
                         "n_tokens": len(ids), "n_notes": 48, "roundtrip_f1": 1.0})
    rows.sort(key=lambda r: r["sha256"])
    paths = {"tokenizer": root / "tokenizer.json", "tokens": root / "tokens.parquet",
             "info": root / "info.json"}
    tok.save(paths["tokenizer"])
    artifacts.write_parquet(paths["tokens"], tokens_table(rows))
    artifacts.write_json(paths["info"], {"vocab_size": len(tok), "pad_id": 0, "bos_id": BOS,
                                         "eos_id": EOS, "tokenizer_hash": "t", "split_hash": "s"})
    return paths


def train_seqs(paths: dict[str, Path]) -> list[np.ndarray]:
    t = artifacts.read_parquet(paths["tokens"])
    return [np.asarray(x) for x in t[t["split"] == "train"]["ids"]]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    return make_world(tmp_path_factory.mktemp("world"))


def _run(world, out: Path, cfg: GenerateConfig, models, seeds=None) -> tuple:
    summary = run(cfg, models, tokens=world["tokens"], info=world["info"],
                  tokenizer=world["tokenizer"], samples_out=out / "samples.parquet",
                  samples_dir=out / "samples", seeds=seeds)
    return summary, artifacts.read_parquet(out / "samples.parquet")


def test_generate_writes_contract_and_is_deterministic(world, tmp_path):
    vocab = artifacts.read_json(world["info"])["vocab_size"]
    models = {"ngram": CountLM(3, vocab).fit(train_seqs(world))}
    cfg = GenerateConfig(models=["ngram"], n_samples=3, n_continuations=3, max_new_tokens=40,
                         prompt_tokens=16, top_p=0.9)
    s1, df = _run(world, tmp_path / "a", cfg, models)
    assert list(df.columns) == ["model", "kind", "index", "seed", "prompt_sha256", "prompt_len",
                                "ids", "n_tokens", "decode_ok", "decode_error"]
    assert df["seed"].isna().all()  # a model trained once names no seed
    assert s1.n_samples == len(df) == 6 and s1.n_prompts == 3
    cont = df[df["kind"] == "continuation"]
    tokens = artifacts.read_parquet(world["tokens"]).set_index("sha256")
    for _, r in cont.iterrows():
        assert tokens.loc[r["prompt_sha256"], "split"] == "test"
        assert list(r["ids"][:16]) == list(tokens.loc[r["prompt_sha256"], "ids"][:16])
    unc = df[df["kind"] == "unconditional"]
    assert (unc["prompt_len"] == 0).all() and unc["prompt_sha256"].isna().all()
    assert (df["n_tokens"] == df["ids"].map(len)).all()
    assert not any({0, 1, 3} & set(ids) for ids in df["ids"])  # specials never sampled
    pngs = sorted(p.name for p in (tmp_path / "a" / "samples").glob("*.png"))
    assert len(pngs) == int(df["decode_ok"].sum()) == 6
    _run(world, tmp_path / "b", cfg, models)
    for rel in ["samples.parquet", *[f"samples/{p}" for p in pngs],
                *[f"samples/{p[:-4]}.mid" for p in pngs]]:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def test_decode_failures_are_counted_not_dropped(world, tmp_path, monkeypatch):
    import pipeline.inference.generation as gen

    vocab = artifacts.read_json(world["info"])["vocab_size"]
    models = {"ngram": CountLM(2, vocab).fit(train_seqs(world))}
    real = gen.decode_ids
    calls = iter(range(100))

    def flaky(tok, ids):
        return (None, "RuntimeError: broken") if next(calls) % 2 else real(tok, ids)

    monkeypatch.setattr(gen, "decode_ids", flaky)
    monkeypatch.setattr(gen, "prompt_notes", lambda tok, row, notes: None)  # samples only
    cfg = GenerateConfig(models=["ngram"], n_samples=2, n_continuations=2, max_new_tokens=10,
                         prompt_tokens=8)
    s, df = _run(world, tmp_path, cfg, models)
    assert s.n_decode_failures == 2 and len(df) == 4
    bad = df[~df["decode_ok"]]
    assert len(bad) == 2 and (bad["decode_error"] == "RuntimeError: broken").all()
    assert len(list((tmp_path / "samples").glob("*.mid"))) == 2


def test_unconditional_and_continuation_counts_are_separate(world, tmp_path, monkeypatch):
    """``n_samples`` unconditional samples per model, ``n_continuations`` (0 = none) prompts."""
    import pipeline.render.figures as figures

    monkeypatch.setattr(figures, "piano_roll_png", lambda notes, title="", prompt=None: b"png")
    vocab = artifacts.read_json(world["info"])["vocab_size"]
    models = {"ngram": CountLM(2, vocab).fit(train_seqs(world))}
    for n_cont, expected in ((0, 0), (3, 3), (50, 10)):  # at most the 10 test pieces
        cfg = GenerateConfig(models=["ngram"], n_samples=5, n_continuations=n_cont,
                             max_new_tokens=4, prompt_tokens=8)
        s, df = _run(world, tmp_path / str(n_cont), cfg, models)
        assert (df["kind"] == "unconditional").sum() == 5
        assert (df["kind"] == "continuation").sum() == s.n_prompts == expected


def test_a_model_with_seeds_shares_its_samples_out_among_them(world, tmp_path, monkeypatch):
    """Sample i of each kind comes from seed i mod S (ascending), with the generator it would
    have had anyway: every seed's samples are those a lone run of that seed draws at the same
    indices, and the model's sample counts do not grow with the seeds."""
    import pipeline.render.figures as figures

    monkeypatch.setattr(figures, "piano_roll_png", lambda notes, title="", prompt=None: b"png")
    vocab = artifacts.read_json(world["info"])["vocab_size"]
    seqs = train_seqs(world)
    a, b = CountLM(3, vocab).fit(seqs[:12]), CountLM(1, vocab).fit(seqs[12:])
    cfg = GenerateConfig(models=["ngram"], n_samples=5, n_continuations=3, max_new_tokens=24,
                         prompt_tokens=8)
    _, both = _run(world, tmp_path / "both", cfg, {"ngram": a}, seeds={"ngram": {8: b, 7: a}})
    assert len(both) == 8 and both["seed"].notna().all()
    for kind, n in (("unconditional", 5), ("continuation", 3)):
        part = both[both["kind"] == kind]
        assert part["seed"].tolist() == [7 if i % 2 == 0 else 8 for i in range(n)]
    for seed, model in ((7, a), (8, b)):
        _, alone = _run(world, tmp_path / str(seed), cfg, {"ngram": model})
        mine = both[both["seed"] == seed]
        ref = alone.set_index(["kind", "index"]).loc[list(zip(mine["kind"], mine["index"],
                                                              strict=True))]
        assert [list(x) for x in mine["ids"]] == [list(x) for x in ref["ids"]]
    _, one = _run(world, tmp_path / "one", cfg, {"ngram": a}, seeds={"ngram": {7: a}})
    assert one["seed"].isna().all()  # a single seed is a model trained once


def test_continuations_are_a_look_at_the_test_pieces_and_samples_alone_are_none(
        world, tmp_path, monkeypatch):
    """A continuation's prompt is a test piece: the run appends a look (command generate, the
    test pieces, the registration in force) to the ledger before drawing; an unchanged re-run
    adds nothing, and a run without continuations reads no test row and records nothing."""
    import pipeline.render.figures as figures
    from pipeline.decision import ledger

    monkeypatch.setattr(figures, "piano_roll_png", lambda notes, title="", prompt=None: b"png")
    vocab = artifacts.read_json(world["info"])["vocab_size"]
    models = {"ngram": CountLM(2, vocab).fit(train_seqs(world))}
    path, reg = tmp_path / "ledger.jsonl", tmp_path / "preregistration.json"
    artifacts.write_json(reg, {"identity_hash": "r1", "identity": {"params": {}}})

    def generate(n_continuations: int, out: str) -> None:
        cfg = GenerateConfig(models=["ngram"], n_samples=2, n_continuations=n_continuations,
                             max_new_tokens=4, prompt_tokens=8)
        run(cfg, models, tokens=world["tokens"], info=world["info"],
            tokenizer=world["tokenizer"], samples_out=tmp_path / out / "samples.parquet",
            samples_dir=tmp_path / out / "samples", ledger_path=path, preregistration=reg)

    generate(0, "none")
    assert not path.exists()
    generate(3, "a")
    (look,) = ledger.read(path)
    tokens = artifacts.read_parquet(world["tokens"])
    assert look["kind"] == "look" and look["command"] == "generate"
    assert look["pieces"] == sorted(tokens.loc[tokens["split"] == "test", "sha256"])
    assert look["registration"]["identity_hash"] == "r1" and look["code"]
    before = path.read_bytes()
    generate(3, "b")
    assert path.read_bytes() == before
