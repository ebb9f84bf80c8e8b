"""``symkit sample`` and ``symkit score``: a trained model used outside the stages.

A tiny corpus is tokenised by the tokenize stage (BPE included) and tiny GPTs are saved recording
that tokenizer's hash; one of them is conditioned, with a ``condition`` entry shaped as training
writes it."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from models.transformer import GPT, TransformerConfig, save_model
from pipeline.cli import main
from pipeline.conditions.vocab import ConditionVocab
from pipeline.core.artifacts import read_json, read_parquet, sha256_bytes
from pipeline.inference.pieces import score_rows
from pipeline.inference.protocol import clean_sequences
from pipeline.inference.scorer import TransformerScorer, load_scorer
from pipeline.inference.standalone import encode_midi, open_model
from pipeline.music.parsing import parse_midi
from pipeline.stages.tokenize import TokenizeConfig
from pipeline.tokens.contract import TokenInfo
from pipeline.tokens.tokenizer import load_tokenizer
from tests.midi_utils import make_midi, random_piece
from tests.stages.test_tokenize import run_stage, write_corpus

VOCAB = ConditionVocab(names=("mode", "density"), labels=(("major", "minor"), ("high",)))
"""The conditioned model's vocabulary: the random test pieces are never dense enough for
"high", so every measured density is a label it lacks."""


@dataclass(frozen=True)
class Setup:
    root: Path
    raw: Path
    files: dict[str, bytes]
    tokenizer: Path
    info: TokenInfo
    plain: Path
    conditioned: Path


def _save_gpt(folder: Path, info: TokenInfo, vocab: ConditionVocab | None = None) -> Path:
    cfg = TransformerConfig(vocab_size=info.vocab_size, max_seq_len=32, n_layer=1, n_head=2,
                            n_embd=16, cond_slot_sizes=vocab.slot_sizes if vocab else ())
    model = GPT(cfg, torch.Generator().manual_seed(0))
    meta = {"vocab_size": info.vocab_size, "pad_id": info.pad_id, "bos_id": info.bos_id,
            "eos_id": info.eos_id, "tokenizer_hash": info.tokenizer_hash,
            "split_hash": info.split_hash, "seed": 1234}
    if vocab is not None:  # as pipeline/training/outputs.py records it
        meta["condition"] = {"names": list(vocab.names), "vocab_hash": vocab.hash,
                             "ids_sha256": "0" * 64, "dropout": 0.1, "vocab": vocab.to_dict()}
    save_model(folder, model, meta)
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Setup:
    root = tmp_path_factory.mktemp("inference")
    rng = np.random.default_rng(3)
    files = {f"p{i:02d}.mid": make_midi(random_piece(rng, n=int(rng.integers(20, 50)),
                                                     voices=1 + i % 2))
             for i in range(10)}
    write_corpus(root, files)
    run_stage(root, TokenizeConfig(vocab_size=520), cache=False)
    info = TokenInfo.read(root / "data/tokens/info.json")
    return Setup(root, root / "data/raw", files, root / "data/tokenizer.json", info,
                 _save_gpt(root / "plain", info), _save_gpt(root / "conditioned", info, VOCAB))


def all_rows(tokens: Path) -> pd.DataFrame:
    """Every row of a token table, test included (the oracle reads what the stage wrote),
    sorted by (sha256, track)."""
    return read_parquet(tokens).sort_values(["sha256", "track"], kind="stable").reset_index(
        drop=True)


def _run(capsys, *argv: str) -> tuple[int, str]:
    rc = main([*argv])
    return rc, capsys.readouterr().err


# ----------------------------------------------------------------------------------- encoding
def test_files_get_the_tokenize_stages_ids(setup):
    tok = load_tokenizer(setup.tokenizer)
    assert tok.is_trained
    table = all_rows(setup.root / "data/tokens/tokens.parquet")
    for data in setup.files.values():
        rows = table[table["sha256"] == sha256_bytes(data)]
        got = encode_midi(tok, data)
        assert [t for t, _ in got] == rows["track"].tolist()
        assert [ids.tolist() for _, ids in got] == [list(x) for x in rows["ids"]]


def test_per_track_tokenizers_give_the_stages_rows(tmp_path):
    rng = np.random.default_rng(5)
    files = {"multi.mid": make_midi([*random_piece(rng, n=20), [], *random_piece(rng, n=12)],
                                    programs=[0, 40, 73]),
             "one.mid": make_midi(random_piece(rng, n=30))}
    write_corpus(tmp_path, files)
    run_stage(tmp_path, TokenizeConfig(config={"use_programs": False}, model="none"),
              cache=False)
    tok = load_tokenizer(tmp_path / "data/tokenizer.json")
    table = all_rows(tmp_path / "data/tokens/tokens.parquet")
    for data in files.values():
        rows = table[table["sha256"] == sha256_bytes(data)]
        got = encode_midi(tok, data)
        assert [t for t, _ in got] == rows["track"].tolist()
        assert [ids.tolist() for _, ids in got] == [list(x) for x in rows["ids"]]
    assert len(encode_midi(tok, files["multi.mid"])) > 1


def test_a_file_is_scored_under_the_tokenizers_program(setup):
    """The default tokenizer encodes every pitched track as program 0 (tokenize.program), and a
    new file is encoded the same way: its tracks written as program 52 (as one chorale's are)
    give the ids of the same notes written as program 0, drums left as drums."""
    tok = load_tokenizer(setup.tokenizer)
    assert tok.config.additional_params["symkit_program"] == 0
    rng = np.random.default_rng(7)
    voices = random_piece(rng, n=16, voices=3)
    sung = encode_midi(tok, make_midi(voices, programs=[52, 52, 0], drums=[False, False, True]))
    plain = encode_midi(tok, make_midi(voices, programs=[0, 0, 0], drums=[False, False, True]))
    assert [ids.tolist() for _, ids in sung] == [ids.tolist() for _, ids in plain]
    other = encode_midi(tok, make_midi(voices, programs=[0, 0, 0], drums=[False, False, False]))
    assert [ids.tolist() for _, ids in other] != [ids.tolist() for _, ids in plain]


# ------------------------------------------------------------------------------------ refusals
def test_a_tokenizer_the_model_was_not_trained_with_is_refused(setup, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(setup.plain, other)
    meta = read_json(other / "model.json")
    meta["tokenizer_hash"] = "f" * 64
    (other / "model.json").write_text(json.dumps(meta))
    midi = (setup.raw / "p00.mid").as_posix()
    for argv in (["sample", "--out", str(tmp_path / "s")],
                 ["score", midi, "--out", str(tmp_path / "s.csv")]):
        rc, err = _run(capsys, *argv, "--model", str(other), "--tokenizer", str(setup.tokenizer))
        assert rc == 2, argv
        assert "f" * 64 in err and setup.info.tokenizer_hash in err
        assert (other / "model.json").as_posix() in err and setup.tokenizer.as_posix() in err
    assert not (tmp_path / "s").exists() and not (tmp_path / "s.csv").exists()


@pytest.mark.parametrize("pair", ["tempo=fast", "mode=dorian", "mode"])
def test_conditions_outside_the_models_vocabulary_are_refused(setup, tmp_path, capsys, pair):
    midi = (setup.raw / "p00.mid").as_posix()
    for argv in (["sample", "--out", str(tmp_path / "s")],
                 ["score", midi, "--out", str(tmp_path / "s.csv")]):
        rc, err = _run(capsys, *argv, "--model", str(setup.conditioned), "--tokenizer",
                       str(setup.tokenizer), "--condition", pair)
        assert rc == 2, argv
        assert VOCAB.hash in err and "mode: major, minor; density: high" in err, err


def test_conditions_for_an_unconditioned_model_are_refused(setup, tmp_path, capsys):
    rc, err = _run(capsys, "sample", "--model", str(setup.plain), "--tokenizer",
                   str(setup.tokenizer), "--condition", "mode=major", "--out", str(tmp_path))
    assert rc == 2 and "without conditions" in err
    rc, err = _run(capsys, "sample", "--model", str(setup.conditioned), "--tokenizer",
                   str(setup.tokenizer), "--guidance", "2", "--out", str(tmp_path))
    assert rc == 2 and "--guidance 2 needs --condition" in err


# --------------------------------------------------------------------------------------- score
def test_score_equals_the_evaluate_protocol(setup, tmp_path, capsys):
    out = tmp_path / "scores.csv"
    rc, err = _run(capsys, "score", setup.raw.as_posix(), "--model", str(setup.plain),
                   "--tokenizer", str(setup.tokenizer), "--out", str(out))
    assert rc == 0, err
    got = pd.read_csv(out)
    assert got["path"].tolist() == [(setup.raw / n).as_posix() for n in sorted(setup.files)]
    assert (got["status"] == "ok").all()
    # evaluate: the token table's rows, the protocol's rules, score_rows, summed per piece
    rows, _ = clean_sequences(all_rows(setup.root / "data/tokens/tokens.parquet"), setup.info)
    nll = score_rows(load_scorer(setup.plain), list(rows["ids"]))
    want = pd.DataFrame({"sha256": rows["sha256"], "nll": nll,
                         "n": [len(s) + 1 for s in rows["ids"]]}).groupby("sha256").sum()
    for _, row in got.iterrows():
        data = setup.files[Path(row["path"]).name]
        assert row["sha256"] == sha256_bytes(data)
        assert row["nll_nats"] == pytest.approx(want.at[row["sha256"], "nll"], rel=1e-6)
        assert row["n_tokens"] == want.at[row["sha256"], "n"]
        assert row["n_notes"] == len(parse_midi(data).notes["pitch"])  # as ingest counts
        assert row["nll_per_note"] == pytest.approx(row["nll_nats"] / row["n_notes"])
        assert row["nll_per_token"] == pytest.approx(row["nll_nats"] / row["n_tokens"])


def test_bad_files_get_a_status_row(setup, tmp_path, capsys):
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    (folder / "a_broken.mid").write_bytes(b"MThd\x00\x00\x00\x06garbage")
    (folder / "b_empty.mid").write_bytes(b"")
    (folder / "c_text.mid").write_bytes(b"hello, not a MIDI file")
    (folder / "d_silent.mid").write_bytes(make_midi([]))
    (folder / "sub" / "e_good.mid").write_bytes(setup.files["p01.mid"])
    (folder / "notes.txt").write_text("not listed: not a MIDI file name")
    out = tmp_path / "scores.parquet"
    rc, err = _run(capsys, "score", str(folder), str(tmp_path / "gone.mid"), "--model",
                   str(setup.plain), "--tokenizer", str(setup.tokenizer), "--out", str(out))
    assert rc == 0, err
    got = pd.read_parquet(out)
    assert dict(zip(got["path"].map(lambda p: Path(p).name), got["status"], strict=True)) == {
        "a_broken.mid": "corrupt", "b_empty.mid": "empty_file", "c_text.mid": "not_midi",
        "d_silent.mid": "no_notes", "e_good.mid": "ok", "gone.mid": "missing"}
    assert got["nll_nats"].notna().tolist() == [False, False, False, False, True, False]


def test_score_uses_each_files_measured_conditions(setup, tmp_path, capsys, monkeypatch):
    seen = []
    original = TransformerScorer.token_nll

    def spy(self, seqs, conds=None):
        seen.append(conds.copy())
        return original(self, seqs, conds)

    monkeypatch.setattr(TransformerScorer, "token_nll", spy)
    base = ["score", setup.raw.as_posix(), "--model", str(setup.conditioned), "--tokenizer",
            str(setup.tokenizer)]
    assert main([*base, "--out", str(tmp_path / "auto.csv")]) == 0
    auto = pd.read_csv(tmp_path / "auto.csv", keep_default_na=False)
    # density is measured for every piece, but the vocabulary lacks its label: "none", reported
    assert (auto["condition_density"] == "<none>").all()
    assert auto["conditions_unknown"].str.match(r"density=(low|mid)").all()
    labels = [{"mode": m if m != "<none>" else None} for m in auto["condition_mode"]]
    assert np.array_equal(seen[0], VOCAB.encode_many(labels))  # one sequence per piece
    seen.clear()
    assert main([*base, "--conditions", "none", "--condition", "mode=minor",
                 "--out", str(tmp_path / "fixed.csv")]) == 0
    fixed = pd.read_csv(tmp_path / "fixed.csv", keep_default_na=False)
    assert (fixed["condition_mode"] == "minor").all() and (fixed["conditions_unknown"] == "").all()
    assert (seen[0] == VOCAB.encode({"mode": "minor"})).all()


# -------------------------------------------------------------------------------------- sample
def _sample(setup, out: Path, *extra: str, model: Path | None = None) -> int:
    return main(["sample", "--model", str(model or setup.plain), "--tokenizer",
                 str(setup.tokenizer), "--n", "3", "--max-new-tokens", "24", "--out", str(out),
                 *extra])


def test_the_same_seed_writes_the_same_files(setup, tmp_path):
    prompt = setup.raw / "p02.mid"
    for name in ("a", "b"):
        assert _sample(setup, tmp_path / name, "--seed", "7", "--prompt", str(prompt),
                       "--prompt-tokens", "5") == 0
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "sample-000.mid" in files and "samples.json" in files
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    record = read_json(tmp_path / "a" / "samples.json")
    assert record["model"]["tokenizer_hash"] == setup.info.tokenizer_hash
    assert record["settings"]["seed"] == 7 and record["prompts"][0]["name"] == "p02.mid"
    want = encode_midi(load_tokenizer(setup.tokenizer), setup.files["p02.mid"])[0][1][:5]
    for s in record["samples"]:
        assert s["prompt_len"] == 5 and s["ids"][:5] == want.tolist()
    assert _sample(setup, tmp_path / "c", "--seed", "8", "--prompt", str(prompt),
                   "--prompt-tokens", "5") == 0
    other = read_json(tmp_path / "c" / "samples.json")
    assert [s["ids"] for s in other["samples"]] != [s["ids"] for s in record["samples"]]


def test_sample_passes_the_requested_condition_ids(setup, tmp_path, monkeypatch):
    seen = []
    original = TransformerScorer.next_logprobs

    def spy(self, contexts, conds=None):
        seen.append(None if conds is None else np.asarray(conds).copy())
        return original(self, contexts, conds)

    monkeypatch.setattr(TransformerScorer, "next_logprobs", spy)
    assert _sample(setup, tmp_path / "s", "--condition", "mode=minor", "--guidance", "2",
                   model=setup.conditioned) == 0
    minor, none = VOCAB.encode({"mode": "minor"}), VOCAB.none_ids()
    rows = {tuple(r) for c in seen for r in c}
    assert rows == {tuple(minor), tuple(none)}  # conditioned and, for guidance, unconditioned
    record = read_json(tmp_path / "s" / "samples.json")
    assert record["model"]["condition_vocab_hash"] == VOCAB.hash
    assert record["settings"]["guidance"] == 2.0
    for s in record["samples"]:
        assert s["conditions"] == {"mode": "minor", "density": "<none>"}
        assert s["condition_ids"] == minor.tolist()


def test_open_model_needs_both_files(setup, tmp_path):
    from pipeline.inference.standalone import InferenceError

    (tmp_path / "m").mkdir()
    shutil.copy(setup.plain / "model.json", tmp_path / "m" / "model.json")
    with pytest.raises(InferenceError, match=r"model\.safetensors: no such file"):
        open_model(tmp_path / "m", setup.tokenizer)
    assert open_model(setup.plain, setup.tokenizer).vocab is None


def test_a_compound_model_json_is_checked_against_its_tokenizer(tmp_path):
    """A compound tokenizer (Octuple) opens with a compound transformer's model.json, whose
    codebooks its info then carries; a model.json without codebooks, or with conditions (which
    training never writes for compound tokens), is refused naming the file."""
    from pipeline.core.artifacts import write_json, write_text
    from pipeline.inference.standalone import InferenceError
    from pipeline.tokens.tokenizer import codebooks, make_tokenizer, tokenizer_hash, tokenizer_text

    tok = make_tokenizer("Octuple", {"use_programs": True})
    write_text(tmp_path / "tokenizer.json", tokenizer_text(tok))
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"")
    meta = {"tokenizer_hash": tokenizer_hash(tok), "vocab_size": len(tok), "bos_id": 1,
            "eos_id": 2}
    write_json(model / "model.json", meta)
    with pytest.raises(InferenceError, match=r"model\.json: not a compound transformer's"):
        open_model(model, tmp_path / "tokenizer.json")
    write_json(model / "model.json", {**meta, "codebooks": codebooks(tok)})
    inf = open_model(model, tmp_path / "tokenizer.json")
    assert inf.info.compound and inf.info.codebooks == codebooks(tok) and inf.vocab is None
    write_json(model / "model.json", {**meta, "codebooks": codebooks(tok),
                                      "condition": {"names": ["mode"],
                                                    "vocab": VOCAB.to_dict()}})
    with pytest.raises(InferenceError, match=r"a compound model \(Octuple\) with a `condition`"):
        open_model(model, tmp_path / "tokenizer.json")
