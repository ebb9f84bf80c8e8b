"""symkit tokenize: determinism, cache equivalence, train-only vocabulary, fidelity, refusals."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import miditok
import numpy as np
import pandas as pd
import pytest
from symusic import Note, Score, Tempo, TimeSignature, Track

from pipeline.core.artifacts import read_json, sha256_bytes, write_parquet
from pipeline.core.config import ParamsError, RuntimeConfig, parse_section
from pipeline.stages.tokenize import TokenizeConfig, run
from pipeline.tokens.store import TokenCache

OUTPUTS = ("data/tokenizer.json", "data/tokens/tokens.parquet", "data/tokens/augmented.parquet",
           "data/tokens/info.json", "reports/tokenize.json")


def synthetic_score(seed: int, n_tracks: int = 2, n_notes: int = 40, gap: bool = False,
                    high: bool = False) -> Score:
    """Random small piece; ``gap`` adds empty bars, ``high`` puts a note near the top pitch."""
    rng = np.random.default_rng(seed)
    score = Score(480)
    score.tempos.append(Tempo(0, 120.0))
    score.time_signatures.append(TimeSignature(0, 4, 4))
    for t in range(n_tracks):
        track = Track(name=f"t{t}", program=(0, 40, 0)[t % 3], is_drum=t == 2)
        tick = 0
        for i in range(n_notes):
            if gap and i == n_notes // 2:
                tick += 480 * 9
            pitch = 108 if (high and i == 0) else int(rng.integers(40, 80))
            track.notes.append(Note(tick, int(rng.integers(1, 4)) * 240, pitch,
                                    int(rng.integers(30, 120))))
            tick += int(rng.integers(0, 3)) * 240
        score.tracks.append(track)
    return score


@pytest.fixture(scope="session")
def chorales(tmp_path_factory) -> list[bytes]:
    """Three real Bach chorales (five tracks each, one empty) as MIDI bytes."""
    from music21 import corpus

    out = []
    folder = tmp_path_factory.mktemp("chorales")
    for bwv in ("bwv269", "bwv347", "bwv153.1"):
        path = folder / f"{bwv}.mid"
        corpus.parse(bwv).write("midi", fp=str(path))
        out.append(path.read_bytes())
    return out


@pytest.fixture(scope="session")
def corpus_files(chorales) -> dict[str, bytes]:
    files = {f"synth/{i:02d}.mid": synthetic_score(i, 1 + i % 3, gap=i % 4 == 0,
                                                   high=i == 5).dumps_midi()
             for i in range(21)}
    files.update({f"bach/{i}.mid": b for i, b in enumerate(chorales)})
    return files


def write_corpus(root: Path, files: dict[str, bytes], extra_manifest: list[dict] | None = None,
                 order_seed: int | None = None) -> pd.DataFrame:
    """data/raw, manifest and splits for ``files``: split by sha256 value (stable when files are
    added), about 1 in 4 val and 1 in 5 test; ``synth/05.mid`` (high-pitched) is always train."""
    raw = root / "data" / "raw"
    rows = []
    for rel, data in files.items():
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        (raw / rel).write_bytes(data)
        rows.append({"path": rel, "sha256": sha256_bytes(data), "status": "ok"})
    rows += extra_manifest or []
    manifest = pd.DataFrame(rows)
    shas = sorted(r["sha256"] for r in rows if r["status"] == "ok")
    split = ["val" if int(s[:8], 16) % 20 < 5 else "test" if int(s[:8], 16) % 20 < 9 else "train"
             for s in shas]
    if "synth/05.mid" in files:
        split[shas.index(sha256_bytes(files["synth/05.mid"]))] = "train"
    splits = pd.DataFrame({"sha256": shas, "group_id": [f"g{i}" for i in range(len(shas))],
                           "split": split, "fold": 0})
    if order_seed is not None:  # row order of the inputs must not matter
        perm = np.random.default_rng(order_seed).permutation(len(splits))
        splits, manifest = splits.iloc[perm], manifest.sample(frac=1.0, random_state=order_seed)
    write_parquet(root / "data" / "manifest.parquet", manifest)
    write_parquet(root / "data" / "splits.parquet", splits)
    return splits


def run_stage(root: Path, cfg: TokenizeConfig | None = None, workers: int = 1, cache: bool = True,
              prune: bool = False):
    cfg = cfg or TokenizeConfig(vocab_size=600, transpose=[-2, 2])
    return run(cfg, RuntimeConfig(workers=workers, progress=False), raw_dir=root / "data/raw",
               manifest=root / "data/manifest.parquet", splits=root / "data/splits.parquet",
               split_report=root / "reports/split.json", tokenizer_out=root / OUTPUTS[0],
               tokens_dir=root / "data/tokens",
               cache_dir=root / "data/token_cache" if cache else None,
               report=root / OUTPUTS[4], prune_cache=prune)


def output_bytes(root: Path) -> dict[str, bytes]:
    return {p: (root / p).read_bytes() for p in OUTPUTS}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus_files) -> Path:
    """One cached run with 2 workers; other tests compare their outputs with it."""
    root = tmp_path_factory.mktemp("ref")
    write_corpus(root, corpus_files)
    run_stage(root, workers=2)
    return root


def test_byte_identical_across_runs_workers_order_and_cache(reference, corpus_files, tmp_path):
    ref = output_bytes(reference)
    other = tmp_path / "other"
    write_corpus(other, corpus_files, order_seed=3)  # shuffled input rows
    summary = run_stage(other, workers=1, cache=False)
    assert summary.encoded == len(corpus_files)
    assert output_bytes(other) == ref
    again = run_stage(reference, workers=1)  # second run: everything from the cache
    assert (again.encoded, again.reused) == (0, len(corpus_files))
    assert output_bytes(reference) == ref


def test_incremental_and_interrupted_runs_encode_only_missing(reference, corpus_files, tmp_path):
    root = tmp_path / "inc"
    shutil.copytree(reference, root)
    files = {**corpus_files, "synth/new.mid": synthetic_score(99).dumps_midi()}
    write_corpus(root, files)
    assert run_stage(root).encoded == 1
    [key] = [p.name for p in (root / "data/token_cache").iterdir()]
    cache = TokenCache(root / "data/token_cache", key)
    segments = cache.segments
    assert segments
    lost = {sha for sha, _ in cache.present()}
    segments[0].unlink()  # as if the run had been killed before this chunk was written
    lost -= {sha for sha, _ in cache.present()}
    assert lost and run_stage(root).encoded == len(lost)
    fresh = tmp_path / "fresh"
    write_corpus(fresh, files)
    run_stage(fresh, cache=False)
    assert output_bytes(root) == output_bytes(fresh)


def test_batches_and_row_groups_leave_the_tables_unchanged(reference, tmp_path, monkeypatch):
    """Trained and assembled three pieces at a time, the outputs are the reference's bytes;
    written in row groups of four rows, the tables hold the same rows."""
    import pyarrow.parquet as pq

    from pipeline.tokens import tables

    root = tmp_path / "batches"
    shutil.copytree(reference, root)
    monkeypatch.setattr(tables, "BATCH", 3)
    assert run_stage(root).encoded == 0
    assert output_bytes(root) == output_bytes(reference)
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", 4)
    run_stage(root)
    for name in ("tokens", "augmented"):
        meta = pq.read_metadata(root / f"data/tokens/{name}.parquet")
        sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        assert len(sizes) > 1 and set(sizes[:-1]) == {4} and 0 < sizes[-1] <= 4
        assert pq.read_table(root / f"data/tokens/{name}.parquet").equals(
            pq.read_table(reference / f"data/tokens/{name}.parquet"))


def test_a_corrupt_cache_entry_is_encoded_again(reference, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "corrupt"
    shutil.copytree(reference, root)
    [key] = [p.name for p in (root / "data/token_cache").iterdir()]
    seg = TokenCache(root / "data/token_cache", key).segments[0]
    table = pq.read_table(seg)
    entries = table.column("entry").to_pylist()
    entries[0] = entries[0][:-4]  # one int32 short: not an entry
    pq.write_table(table.set_column(1, "entry", pa.array(entries, pa.binary())), seg)
    assert run_stage(root).encoded == 1
    assert output_bytes(root) == output_bytes(reference)


def test_a_cache_deleted_during_the_run_costs_one_more_pass(reference, corpus_files, tmp_path,
                                                          monkeypatch):
    """The store is deleted after the stage has found every entry in it: reading one fails, the
    stage runs once more and encodes every file; the outputs are the reference's."""
    root = tmp_path / "deleted"
    shutil.copytree(reference, root)
    real_locate = TokenCache.locate
    found = []

    def deleted_after(self, *args, **kwargs):
        where = real_locate(self, *args, **kwargs)
        if not found:
            shutil.rmtree(self.dir)
        found.append(len(where))
        return where

    monkeypatch.setattr(TokenCache, "locate", deleted_after)
    summary = run_stage(root)
    assert found[0] > 0 and found[1] == 0
    assert (summary.encoded, summary.reused) == (len(corpus_files), 0)
    assert output_bytes(root) == output_bytes(reference)


def test_no_pieces_give_empty_tables(corpus_files, tmp_path):
    splits = write_corpus(tmp_path, dict(list(corpus_files.items())[:1]))
    write_parquet(tmp_path / "data/splits.parquet", splits.iloc[:0])
    summary = run_stage(tmp_path, TokenizeConfig(model="none"))
    assert (summary.pieces, summary.rows) == (0, 0)
    for name in ("tokens", "augmented"):
        assert pd.read_parquet(tmp_path / f"data/tokens/{name}.parquet").empty
    assert read_json(tmp_path / "reports/tokenize.json")["sequences"] == 0


def as_program(data: bytes, program: int | None) -> Score:
    """The file's score with every pitched track set to ``program`` (None: as written), done
    here by hand rather than by the code under test."""
    score = Score.from_midi(data)
    for track in score.tracks:
        if program is not None and not track.is_drum:
            track.program = program
    return score


def test_ids_equal_plain_miditok_encode(reference, corpus_files):
    """The stage's cached base ids + model equal miditok's own ``encode`` with the saved file, of
    each file with its pitched tracks set to tokenize.program (0 by default; the synthetic
    corpus holds programs 0 and 40 and drums, so the setting changes ids)."""
    tok = miditok.REMI(params=reference / "data/tokenizer.json")
    assert tok.is_trained
    assert tok.config.additional_params["symkit_program"] == 0
    table = pd.read_parquet(reference / "data/tokens/tokens.parquet")
    by_sha = {sha256_bytes(b): b for b in corpus_files.values()}
    changed = 0
    for sha, ids in zip(table["sha256"], table["ids"], strict=True):
        assert list(ids) == tok.encode(as_program(by_sha[sha], 0)).ids, sha
        changed += list(ids) != tok.encode(Score.from_midi(by_sha[sha])).ids
    assert changed > 0


def test_program_null_keeps_each_tracks_program(corpus_files, tmp_path):
    """tokenize.program: null encodes each track with its own program: the ids of plain miditok
    ``encode``, Program tokens of 40 included; 0 writes none of them and the tokenizer file
    says which it did, so ``symkit score`` and ``tokenize.from`` encode new files alike."""
    files = dict(list(corpus_files.items())[:4])
    seen = {}
    for program in (None, 0):
        root = tmp_path / str(program)
        write_corpus(root, files)
        run_stage(root, TokenizeConfig(program=program, model="none"))
        tok = miditok.REMI(params=root / "data/tokenizer.json")
        assert tok.config.additional_params.get("symkit_program") == program
        table = pd.read_parquet(root / "data/tokens/tokens.parquet")
        for sha, ids in zip(table["sha256"], table["ids"], strict=True):
            data = next(b for b in files.values() if sha256_bytes(b) == sha)
            assert list(ids) == tok.encode(as_program(data, program)).ids
        seen[program] = {tok[int(i)] for ids in table["ids"] for i in ids}
    assert "Program_40" in seen[None] and "Program_40" not in seen[0]


def test_bpe_is_trained_on_train_split_only(corpus_files, tmp_path, monkeypatch):
    received: list[str] = []
    original = miditok.MusicTokenizer.train

    def spy(self, *args, iterator=None, **kwargs):
        inner = iter(iterator)
        corpus = iterator

        class Recorder:  # what the trainer actually pulls from the iterator
            def __len__(self):
                return len(corpus)

            def __iter__(self):
                for item in inner:
                    received.append(corpus.seen[-1])
                    yield item

        return original(self, *args, iterator=Recorder(), **kwargs)

    monkeypatch.setattr(miditok.MusicTokenizer, "train", spy)
    splits = write_corpus(tmp_path, corpus_files)
    run_stage(tmp_path)
    train = sorted(splits.loc[splits["split"] == "train", "sha256"])
    assert received == train
    report = read_json(tmp_path / "reports/tokenize.json")
    assert report["model_trained_on_pieces"] == len(train) < len(splits)
    from pipeline.core.artifacts import sha256_json

    assert report["model_trained_on_hash"] == sha256_json(train)


def test_roundtrip_on_real_multitrack_files(reference, chorales):
    table = pd.read_parquet(reference / "data/tokens/tokens.parquet")
    shas = {sha256_bytes(b) for b in chorales}
    assert all(len(Score.from_midi(b).tracks) > 1 for b in chorales)
    rows = table[table["sha256"].isin(shas)]
    assert len(rows) == len(chorales)
    assert (rows["roundtrip_f1"] == 1.0).all()
    assert not any("roundtrip_lossy" in f for f in rows["flags"])
    assert (rows["n_notes"] > 100).all() and (rows["n_notes"] <= rows["n_notes_input"]).all()
    report = read_json(reference / "reports/tokenize.json")
    assert report["roundtrip_below_1"] == 0 and report["roundtrip_f1_min"] == 1.0


def test_info_and_augmentation(reference):
    info = read_json(reference / "data/tokens/info.json")
    tok = miditok.REMI(params=reference / "data/tokenizer.json")
    assert info["vocab_size"] == len(tok) == 600
    assert (info["pad_id"], info["bos_id"], info["eos_id"]) == (
        tok.pad_token_id, tok.vocab["BOS_None"], tok.vocab["EOS_None"])
    saved = read_json(reference / "data/tokenizer.json")
    assert saved["tokenization"] == "REMI" and not [k for k in saved if k.endswith("_version")]
    table = pd.read_parquet(reference / "data/tokens/tokens.parquet")
    aug = pd.read_parquet(reference / "data/tokens/augmented.parquet")
    train = set(table.loc[table["split"] == "train", "sha256"])
    assert set(aug["sha256"]) <= train and set(aug["transpose"]) == {-2, 2}
    ids = np.concatenate(list(table["ids"]))
    assert not np.isin(ids, [info["bos_id"], info["eos_id"], info["pad_id"]]).any()
    report = read_json(reference / "reports/tokenize.json")
    assert report["augment_out_of_range"] == 1  # the piece holding pitch 108 cannot go up 2


@pytest.mark.parametrize(("name", "extra", "model"), [
    ("TSD", {}, "BPE"), ("MIDILike", {}, "BPE"), ("Structured", {}, "BPE"),
    ("TSD", {"encode_ids_split": "beat"}, "BPE"), ("REMI", {"encode_ids_split": "no"}, "BPE"),
    ("REMI", {}, "WordPiece"),
], ids=["TSD", "MIDILike", "Structured", "TSD-beat", "REMI-nosplit", "REMI-WordPiece"])
def test_other_tokenizers_end_to_end(name, extra, model, corpus_files, tmp_path):
    """Cached base ids + trained model equal plain miditok ``encode`` for each scheme."""
    files = dict(list(corpus_files.items())[:8])  # includes pieces with empty bars
    write_corpus(tmp_path, files)
    cfg = TokenizeConfig(tokenizer=name, config={"use_programs": True, **extra}, model=model,
                         vocab_size=600, program=None)
    run_stage(tmp_path, cfg)
    tok = getattr(miditok, name)(params=tmp_path / "data/tokenizer.json")
    assert tok.is_trained
    table = pd.read_parquet(tmp_path / "data/tokens/tokens.parquet")
    for sha, ids in zip(table["sha256"], table["ids"], strict=True):
        data = next(b for b in files.values() if sha256_bytes(b) == sha)
        assert list(ids) == tok.encode(Score.from_midi(data)).ids
    assert (table["roundtrip_f1"] == 1.0).all()


def test_per_track_sequences(corpus_files, tmp_path):
    files = dict(list(corpus_files.items())[:6])
    files["synth/empty.mid"] = synthetic_score(0, n_notes=0).dumps_midi()
    write_corpus(tmp_path, files)
    run_stage(tmp_path, TokenizeConfig(config={"use_programs": False}, model="none"))
    table = pd.read_parquet(tmp_path / "data/tokens/tokens.parquet")
    tok = miditok.REMI(params=tmp_path / "data/tokenizer.json")
    for sha, group in table.groupby("sha256"):
        data = next(b for b in files.values() if sha256_bytes(b) == sha)
        seqs = tok.encode(Score.from_midi(data))
        assert list(group["track"]) == list(range(len(seqs)))
        assert [list(x) for x in group["ids"]] == [s.ids for s in seqs]


def compound_config(name: str, **extra) -> TokenizeConfig:
    """A compound tokenizer as the stage takes it: no trained vocabulary (``vocab_size`` is then
    unused, as it is for every tokenizer with ``model: none``)."""
    return TokenizeConfig(tokenizer=name, config={"use_programs": True, **extra}, model="none",
                          vocab_size=5, program=None, transpose=[-2, 2])


@pytest.mark.parametrize("name", ["CPWord", "Octuple"])
def test_compound_tokens_are_codes_per_codebook_and_deterministic(name, corpus_files, tmp_path):
    """Compound tokens: per row one list of codes per codebook, each ``n_tokens`` long, equal to
    plain miditok ``encode``, and empty ids; info.json lists the codebooks; transposed copies
    shift the pitch codebook alone; the same bytes with 1 and 2 workers, shuffled inputs and
    no cache."""
    from pipeline.tokens.tokenizer import steps_from_codes

    files = dict([*list(corpus_files.items())[:7], ("bach/0.mid", corpus_files["bach/0.mid"])])
    write_corpus(tmp_path / "a", files)
    run_stage(tmp_path / "a", compound_config(name), workers=2)
    write_corpus(tmp_path / "b", files, order_seed=5)
    run_stage(tmp_path / "b", compound_config(name), workers=1, cache=False)
    assert output_bytes(tmp_path / "a") == output_bytes(tmp_path / "b")

    root = tmp_path / "a"
    tok = getattr(miditok, name)(params=root / "data/tokenizer.json")
    info = read_json(root / "data/tokens/info.json")
    assert info["compound"] is True and info["tokenizer"] == name and info["model"] == "none"
    assert [c["size"] for c in info["codebooks"]] == [len(v) for v in tok.vocab]
    assert info["vocab_size"] == len(tok) == sum(len(v) for v in tok.vocab)
    table = pd.read_parquet(root / "data/tokens/tokens.parquet")
    assert len(table) == len(files) and (table["ids"].map(len) == 0).all()
    for sha, codes, n in zip(table["sha256"], table["codes"], table["n_tokens"], strict=True):
        assert [len(c) for c in codes] == [n] * len(tok.vocab)
        data = next(b for b in files.values() if sha256_bytes(b) == sha)
        assert steps_from_codes(codes) == tok.encode(Score.from_midi(data)).ids
    assert (table["roundtrip_f1"] == 1.0).all()
    assert not [f for fl in table["flags"] for f in fl if f != "notes_dropped"]  # preprocessing

    aug = pd.read_parquet(root / "data/tokens/augmented.parquet")
    assert set(aug["transpose"]) == {-2, 2} and (aug["ids"].map(len) == 0).all()
    k = next(k for k, v in enumerate(tok.vocab) if "Pitch_60" in v)
    is_pitch = np.array([t.startswith("Pitch_")
                         for t in sorted(tok.vocab[k], key=tok.vocab[k].get)])
    base = dict(zip(table["sha256"], table["codes"], strict=True))
    for sha, t, codes in zip(aug["sha256"], aug["transpose"], aug["codes"], strict=True):
        mine, theirs = np.stack(codes), np.stack(base[sha])
        notes = is_pitch[theirs[k]]
        assert notes.any() and (mine[k][notes] == theirs[k][notes] + t).all()
        assert (np.delete(mine, k, axis=0) == np.delete(theirs, k, axis=0)).all()
        assert (mine[k][~notes] == theirs[k][~notes]).all()


def test_octuple_flags_the_pieces_it_clips(corpus_files, tmp_path):
    """Octuple encodes at most ``max_bar_embedding`` bars and miditok clips longer pieces with a
    warning: such a piece is flagged truncated_bars (and its round trip is lossy)."""
    from miditok.utils import get_bars_ticks

    files = dict(list(corpus_files.items())[:8])
    write_corpus(tmp_path, files)
    run_stage(tmp_path, compound_config("Octuple", max_bar_embedding=6))
    tok = miditok.Octuple(params=tmp_path / "data/tokenizer.json")
    table = pd.read_parquet(tmp_path / "data/tokens/tokens.parquet")
    clipped = []
    for sha, flags, f1 in zip(table["sha256"], table["flags"], table["roundtrip_f1"],
                              strict=True):
        data = next(b for b in files.values() if sha256_bytes(b) == sha)
        bars = len(get_bars_ticks(tok.preprocess_score(Score.from_midi(data)),
                                  only_notes_onsets=True))
        assert ("truncated_bars" in flags) == (bars > 6)
        if bars > 6:
            clipped.append(sha)
            assert f1 < 1.0 and "roundtrip_lossy" in flags
    assert 0 < len(clipped) < len(files)
    report = read_json(tmp_path / "reports/tokenize.json")
    assert report["flags"]["truncated_bars"] == len(clipped)


def test_a_shared_compound_tokenizer_is_used_as_it_is(corpus_files, tmp_path):
    files = dict(list(corpus_files.items())[:4])
    write_corpus(tmp_path / "a", files)
    run_stage(tmp_path / "a", compound_config("CPWord"))
    write_corpus(tmp_path / "b", files)
    cfg = compound_config("CPWord").model_copy(
        update={"from_": str(tmp_path / "a/data/tokenizer.json")})
    run_stage(tmp_path / "b", cfg)
    assert output_bytes(tmp_path / "b")["data/tokens/tokens.parquet"] == \
        output_bytes(tmp_path / "a")["data/tokens/tokens.parquet"]
    with pytest.raises(ParamsError, match=r"a CPWord tokenizer, but tokenize\.tokenizer = Oct"):
        run_stage(tmp_path / "b", compound_config("Octuple").model_copy(
            update={"from_": str(tmp_path / "a/data/tokenizer.json")}))


def test_bad_sources_are_flagged_not_fatal(corpus_files, tmp_path):
    files = dict(list(corpus_files.items())[:4])
    garbage = b"MThd this is not midi"
    files["bad/garbage.mid"] = garbage
    files["synth/empty.mid"] = synthetic_score(0, n_notes=0).dumps_midi()
    write_corpus(tmp_path, files, extra_manifest=[
        {"path": "bad/missing.mid", "sha256": "f" * 64, "status": "ok"}])
    (tmp_path / "data/raw/synth/00.mid").write_bytes(b"changed since ingest")
    splits = pd.read_parquet(tmp_path / "data/splits.parquet")
    extra = pd.DataFrame({"sha256": ["e" * 64], "group_id": ["x"], "split": ["test"], "fold": 0})
    write_parquet(tmp_path / "data/splits.parquet", pd.concat([splits, extra]))
    summary = run_stage(tmp_path)
    table = pd.read_parquet(tmp_path / "data/tokens/tokens.parquet")
    flags = dict(zip(table["sha256"], table["flags"].map(list), strict=True))
    assert flags[sha256_bytes(garbage)] == ["read_error"]
    assert flags["f" * 64] == ["read_error"]
    assert flags["e" * 64] == ["missing_source"]
    assert flags[sha256_bytes(corpus_files["synth/00.mid"])] == ["sha_mismatch"]
    assert flags[sha256_bytes(files["synth/empty.mid"])] == ["no_notes"]
    assert len(table) == len(splits) + 1 and summary.flagged == 5
    import pyarrow.parquet as pq

    f1 = pq.read_table(tmp_path / "data/tokens/tokens.parquet").column("roundtrip_f1")
    assert f1.null_count == 4 and not has_nan(f1)
    assert read_json(tmp_path / "reports/tokenize.json")["flags"]["read_error"] == 2
    [key] = [p.name for p in (tmp_path / "data/token_cache").iterdir()]
    cached = {sha for sha, _ in TokenCache(tmp_path / "data/token_cache", key).present()}
    assert cached and sha256_bytes(garbage) not in cached


def has_nan(col) -> bool:
    return bool(np.isnan(col.drop_null().to_numpy()).any())


def test_prune_cache_removes_unreferenced_entries(corpus_files, tmp_path):
    files = dict(list(corpus_files.items())[:4])
    write_corpus(tmp_path, files)
    run_stage(tmp_path, TokenizeConfig(model="none", transpose=[]))  # one entry a piece
    root = tmp_path / "data/token_cache"
    [old] = list(root.iterdir())
    cfg = TokenizeConfig(model="none", config={"use_programs": True, "num_velocities": 8},
                         transpose=[])
    assert run_stage(tmp_path, cfg).encoded == 4  # new base config: new key
    [new] = [p.name for p in root.iterdir() if p != old]
    assert len(TokenCache(root, old.name).present()) == 4
    assert run_stage(tmp_path, cfg, prune=True).pruned == 4
    assert not old.exists() and len(TokenCache(root, new).present()) == 4
    files = dict(list(corpus_files.items())[:2])  # two pieces leave the splits
    write_corpus(tmp_path, files)
    assert run_stage(tmp_path, cfg, prune=True).pruned == 2
    assert len(TokenCache(root, new).present()) == 2


@pytest.mark.parametrize(("raw", "key"), [
    ({"model": "Unigram"}, "tokenize.model"),
    ({"tokenizer": "CPWord", "model": "BPE"},
     "tokenize.model: BPE — CPWord has several vocabularies"),
    ({"tokenizer": "Octuple"}, "tokenize.model: BPE — Octuple"),  # BPE is the default
    ({"tokenizer": "Octuple", "model": "WordPiece"},
     "tokenize.model: WordPiece — Octuple has several vocabularies"),
    ({"tokenizer": "MuMIDI", "model": "none"}, "tokenize.tokenizer = 'MuMIDI': Value error, "
                                               "MuMIDI is refused: multi-vocabulary with steps"),
    ({"tokenizer": "CPWord", "model": "none", "config": {"max_bar_embedding": 90}},
     "config.max_bar_embedding: read by Octuple only"),
    ({"tokenizer": "Octuple", "model": "none", "config": {"max_bar_embedding": -1}},
     "config.max_bar_embedding"),
    ({"tokenizer": "Remi"}, "tokenize.tokenizer"),
    ({"config": {"use_programz": True}}, "config.use_programz"),
    ({"tokenizer": "Structured", "config": {"use_rests": True}}, "config.use_rests"),
    ({"config": {"ac_polyphony_bar": True}}, "config.ac_polyphony_bar"),
    ({"config": {"pitch_range": [21, 200]}}, "pitch_range"),
    ({"transpose": [0]}, "tokenize.transpose"),
    ({"vocab_size": "1000"}, "tokenize.vocab_size"),
    ({"program": 128}, "tokenize.program"),
    ({"program": "piano"}, "tokenize.program"),
], ids=lambda v: str(v) if isinstance(v, str) else "-".join(map(str, v)))
def test_refused_params_name_the_key(raw, key):
    with pytest.raises(ParamsError, match=key.replace(".", r"\.")):
        parse_section("tokenize", raw, TokenizeConfig)


@pytest.mark.parametrize("name", ["REMI", "CPWord", "Octuple"])
def test_vocab_size_is_unused_without_a_trained_vocabulary(name):
    """With ``model: none`` no vocabulary is trained and ``vocab_size`` is not read, for a
    compound tokenizer as for a single-stream one (the default 1000 stays valid there)."""
    for size in (5, 1000):
        cfg = parse_section("tokenize", {"tokenizer": name, "model": "none",
                                         "vocab_size": size}, TokenizeConfig)
        assert cfg.vocab_size == size


def test_vocab_size_must_exceed_base_vocabulary(corpus_files, tmp_path):
    write_corpus(tmp_path, dict(list(corpus_files.items())[:2]))
    with pytest.raises(ParamsError, match=r"tokenize\.vocab_size = 100"):
        run_stage(tmp_path, TokenizeConfig(vocab_size=100))


def test_cli_uses_params_section(corpus_files, tmp_path, monkeypatch):
    from pipeline.cli import main

    write_corpus(tmp_path, dict(list(corpus_files.items())[:3]))
    (tmp_path / "params.yaml").write_text(
        "runtime:\n  workers: 1\n  progress: false\n"
        "tokenize:\n  tokenizer: TSD\n  config:\n    use_programs: true\n  model: none\n")
    monkeypatch.chdir(tmp_path)
    assert main(["tokenize"]) == 0
    assert read_json(tmp_path / "data/tokens/info.json")["tokenizer"] == "TSD"
    (tmp_path / "params.yaml").write_text("tokenize:\n  model: Unigram\n")
    assert main(["tokenize"]) == 2


def test_lossy_vocabulary_is_flagged_and_scored(corpus_files, tmp_path, monkeypatch):
    """A model that does not decode back to the base ids (as WordPiece's unknown token does) is
    flagged per row and its round trip re-scored, never hidden."""
    from pipeline.tokens import tables as tokenization

    real_expand = tokenization.expand
    monkeypatch.setattr(tokenization, "expand", lambda ids, table: real_expand(ids, table)[:-3])
    write_corpus(tmp_path, dict(list(corpus_files.items())[:4]))
    run_stage(tmp_path, TokenizeConfig(vocab_size=600))
    table = pd.read_parquet(tmp_path / "data/tokens/tokens.parquet")
    assert all({"model_lossy", "roundtrip_lossy"} <= set(f) for f in table["flags"])
    assert ((table["roundtrip_f1"] > 0.5) & (table["roundtrip_f1"] < 1.0)).all()
    report = read_json(tmp_path / "reports/tokenize.json")
    assert report["flags"]["model_lossy"] == report["roundtrip_below_1"] == 4


def test_a_shared_tokenizer_is_used_as_it_is(reference, corpus_files, tmp_path):
    """tokenize.from: another corpus tokenised with the reference run's tokenizer. Nothing is
    trained on its split, the tokenizer file and its hash are the reference's byte for byte,
    and every id is what that tokenizer gives, so both corpora's tokens mean the same."""
    other = {k: v for k, v in corpus_files.items() if k.startswith("synth/")
             and int(k[6:8]) % 2 == 0}
    write_corpus(tmp_path, other)
    shared = reference / OUTPUTS[0]
    cfg = TokenizeConfig.model_validate({"vocab_size": 600, "from": str(shared)})
    run_stage(tmp_path, cfg)
    assert (tmp_path / OUTPUTS[0]).read_bytes() == shared.read_bytes()
    ours, theirs = read_json(tmp_path / OUTPUTS[3]), read_json(reference / OUTPUTS[3])
    assert ours["tokenizer_hash"] == theirs["tokenizer_hash"]
    report = read_json(tmp_path / OUTPUTS[4])
    assert report["model_trained_on_pieces"] == 0
    assert report["tokenizer_from_sha256"] == sha256_bytes(shared.read_bytes())
    assert read_json(reference / OUTPUTS[4])["tokenizer_from_sha256"] is None
    tok = miditok.REMI(params=shared)
    tokens = pd.read_parquet(tmp_path / "data/tokens/tokens.parquet")
    manifest = pd.read_parquet(tmp_path / "data/manifest.parquet")
    path_of = dict(zip(manifest["sha256"], manifest["path"], strict=True))
    for sha, ids in zip(tokens["sha256"][:4], tokens["ids"][:4], strict=True):
        want = tok.encode(as_program((tmp_path / "data/raw" / path_of[sha]).read_bytes(), 0))
        assert list(ids) == list(want.ids)
    # the same corpus with its own BPE gets other merges, so other ids
    write_corpus(tmp_path / "own", other)
    run_stage(tmp_path / "own")
    assert read_json(tmp_path / "own" / OUTPUTS[3])["tokenizer_hash"] != ours["tokenizer_hash"]


def test_cli_from_overrides_the_param(reference, corpus_files, tmp_path, monkeypatch):
    """``symkit tokenize --from F`` tokenises with F although params.yaml trains its own BPE:
    how a second pipeline (experiments/adaptation) reuses the first one's tokenizer."""
    from pipeline.cli import main

    write_corpus(tmp_path, dict(list(corpus_files.items())[:3]))
    (tmp_path / "params.yaml").write_text(
        "runtime:\n  workers: 1\n  progress: false\ntokenize:\n  vocab_size: 600\n")
    monkeypatch.chdir(tmp_path)
    shared = reference / OUTPUTS[0]
    assert main(["tokenize", "--from", str(shared), "--tokenizer-out", "t.json"]) == 0
    assert (tmp_path / "t.json").read_bytes() == shared.read_bytes()
    assert read_json(tmp_path / OUTPUTS[4])["model_trained_on_pieces"] == 0


@pytest.mark.parametrize(("change", "match"), [
    ({"vocab_size": 700}, "600 tokens, but tokenize.vocab_size = 700; set it to 600"),
    ({"tokenizer": "TSD"}, "a REMI tokenizer, but tokenize.tokenizer = TSD; set it to REMI"),
    ({"model": "none"}, "its trained vocabulary is BPE, but tokenize.model = none"),
    ({"config": {"use_programs": False}}, "use_programs: True there, False here"),
    ({"program": None}, "encodes tracks as program 0, but tokenize.program = None; set it to 0"),
])
def test_a_shared_tokenizer_params_do_not_describe_is_refused(reference, corpus_files, tmp_path,
                                                              change, match):
    write_corpus(tmp_path, dict(list(corpus_files.items())[:3]))
    cfg = TokenizeConfig.model_validate({"vocab_size": 600, **change,
                                         "from": str(reference / OUTPUTS[0])})
    with pytest.raises(ParamsError, match=re.escape(match)):
        run_stage(tmp_path, cfg)


def test_a_missing_shared_tokenizer_names_the_key(corpus_files, tmp_path):
    write_corpus(tmp_path, dict(list(corpus_files.items())[:2]))
    cfg = TokenizeConfig.model_validate({"vocab_size": 600, "from": "nowhere/tokenizer.json"})
    with pytest.raises(ParamsError, match=r"tokenize\.from = 'nowhere/tokenizer\.json': no such"):
        run_stage(tmp_path, cfg)


def test_also_train_on_adds_another_corpus_train_pieces_only(corpus_files, tmp_path,
                                                             monkeypatch):
    """tokenize.also_train_on: the vocabulary learns from this split's train pieces and the
    other corpus's train pieces (the declared set "source train + target train"), never from the
    other corpus's val or test pieces, and only this corpus's pieces reach the tables."""
    seen: list[list[str]] = []
    original = miditok.MusicTokenizer.train

    def spy(self, *args, iterator=None, **kwargs):
        out = original(self, *args, iterator=iterator, **kwargs)
        seen.append(list(iterator.seen))
        return out

    monkeypatch.setattr(miditok.MusicTokenizer, "train", spy)
    mine = {k: v for k, v in corpus_files.items() if k.startswith("synth/") and int(k[6:8]) % 2}
    other = {k: v for k, v in corpus_files.items() if k not in mine}
    own = write_corpus(tmp_path / "own", mine)
    theirs = write_corpus(tmp_path / "other", other)
    d = tmp_path / "other" / "data"
    cfg = TokenizeConfig.model_validate({
        "vocab_size": 600, "also_train_on": {"raw_dir": str(d / "raw"),
                                             "manifest": str(d / "manifest.parquet"),
                                             "splits": str(d / "splits.parquet")}})
    run_stage(tmp_path / "own", cfg)
    train = set(own.loc[own["split"] == "train", "sha256"])
    other_train = set(theirs.loc[theirs["split"] == "train", "sha256"])
    other_held = set(theirs.loc[theirs["split"] != "train", "sha256"])
    assert other_train and other_held
    assert sorted(seen[-1]) == sorted(train | other_train)
    assert not other_held & set(seen[-1])
    tokens = pd.read_parquet(tmp_path / "own" / "data/tokens/tokens.parquet")
    assert set(tokens["sha256"]) == set(own["sha256"])
    report = read_json(tmp_path / "own" / OUTPUTS[4])
    assert report["model_trained_on_pieces"] == len(train | other_train)
    assert report["model_trained_on_other_corpus"] == {"pieces": len(other_train), "failed": []}
    # without the other corpus the vocabulary is learned from fewer pieces: other merges
    run_stage(tmp_path / "own", TokenizeConfig(vocab_size=600))
    alone = read_json(tmp_path / "own" / OUTPUTS[4])
    assert "model_trained_on_other_corpus" not in alone  # the key only when the option is set
    assert alone["tokenizer_hash"] != report["tokenizer_hash"]


@pytest.mark.parametrize(("extra", "match"), [
    ({"from": "t.json"}, "set at most one of them"),
    ({"model": "none"}, "needs a trained vocabulary"),
])
def test_also_train_on_refuses_what_trains_nothing(extra, match):
    raw = {"also_train_on": {"raw_dir": "r", "manifest": "m", "splits": "s"}, **extra}
    with pytest.raises(ParamsError, match=match):
        parse_section("tokenize", raw, TokenizeConfig)


# --------------------------------------------------------------------------- committed fixtures
@pytest.fixture(scope="module")
def fixture_tokens(tmp_path_factory, midi_fixtures, midi_expected) -> Path:
    """The tokenize stage (REMI, programs in one stream, BPE) over the committed MIDI fixtures
    that ingest keeps."""
    root = tmp_path_factory.mktemp("fixture_tokens")
    files = {p.name: p.read_bytes() for p in sorted(midi_fixtures.glob("*.mid"))
             if midi_expected["files"][p.name]["expect"] == "ok"}
    write_corpus(root, files)
    run_stage(root, TokenizeConfig(vocab_size=600, program=None))  # the fixtures' own programs
    return root


def test_every_kept_fixture_encodes_and_round_trips(good_midi, fixture_tokens):
    """Each kept fixture (drums, several programs, format 0 and 2, zero-length and overlapping
    notes included): one sequence, the ids of plain miditok ``encode``, no flag, and a lossless
    round trip."""
    root = fixture_tokens
    table = pd.read_parquet(root / "data/tokens/tokens.parquet")
    data = good_midi.read_bytes()
    [row] = table[table["sha256"] == sha256_bytes(data)].itertuples()
    tok = miditok.REMI(params=root / "data/tokenizer.json")
    assert list(row.ids) == tok.encode(Score.from_midi(data)).ids
    assert list(row.flags) == [] and row.roundtrip_f1 == 1.0
    assert 0 < row.n_notes <= row.n_notes_input
