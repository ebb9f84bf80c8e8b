"""Dedupe: planted variants must land in one cluster; unrelated pieces must not merge.

The synthetic corpus helpers here (``base_piece``, ``variant``, ``write_corpus``) are also used by
tests/stages/test_split.py and tests/similarity/test_leakage.py.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pipeline.core import artifacts
from pipeline.core.config import ParamsError, RuntimeConfig, parse_section
from pipeline.music.manifest import MANIFEST_SCHEMA, NOTES_SCHEMA
from pipeline.music.parsing import note_hash
from pipeline.stages.dedupe import DedupeConfig, run

Notes = dict[str, np.ndarray]
VARIANTS = ("resaved", "tempo", "scaled", "transposed", "edited", "prefix")


# ---------------------------------------------------------------------------------- synthetic data
def _sorted(n: Notes) -> Notes:
    order = np.lexsort((n["track"], n["duration"], n["pitch"], n["onset"]))
    return {k: v[order] for k, v in n.items()}


def base_piece(rng: np.random.Generator, n_events: int = 60, voices: int = 3) -> Notes:
    """A random chordal piece: a melody (track 0) over ``voices - 1`` lower voices."""
    ioi = rng.choice([0.5, 1.0, 1.0, 2.0], size=n_events)
    onset = np.concatenate([[0.0], np.cumsum(ioi)[:-1]])
    top = 72 + np.cumsum(rng.integers(-4, 5, size=n_events)).clip(-12, 12)
    cols: dict[str, list] = {k: [] for k in ("onset", "duration", "pitch", "track")}
    for v in range(voices):
        pitch = top if v == 0 else top - rng.integers(3, 10, size=n_events) - 7 * v
        cols["onset"].append(onset)
        cols["duration"].append(ioi)
        cols["pitch"].append(pitch)
        cols["track"].append(np.full(n_events, v))
    n = {k: np.concatenate(v) for k, v in cols.items()}
    size = n["onset"].size
    return _sorted({"onset": n["onset"].astype(np.float64), "duration": n["duration"].astype(float),
                    "pitch": n["pitch"].astype(np.int16), "velocity": np.full(size, 80, np.int16),
                    "track": n["track"].astype(np.int16), "program": np.zeros(size, np.int16),
                    "is_drum": np.zeros(size, bool)})


def variant(rng: np.random.Generator, n: Notes, kind: str) -> Notes:
    """A planted near/exact copy of ``n`` (see VARIANTS)."""
    n = {k: v.copy() for k, v in n.items()}
    size = n["onset"].size
    if kind == "resaved":  # new velocities and track layout, same music
        n["velocity"] = rng.integers(30, 120, size=size).astype(np.int16)
        n["track"] = (n["track"].max() - n["track"]).astype(np.int16)
    elif kind == "tempo":  # another tempo map changes seconds, not beats
        n["velocity"] = np.full(size, 100, np.int16)
    elif kind == "scaled":  # another resolution / note values doubled
        n["onset"] *= 2.0
        n["duration"] *= 2.0
    elif kind == "transposed":
        n["pitch"] = (n["pitch"] + rng.choice([-5, -3, 2, 7])).astype(np.int16)
    elif kind == "edited":  # ~5% of notes edited or dropped
        hit = rng.random(size) < 0.05
        drop = hit & (rng.random(size) < 0.5)
        n["pitch"] = np.where(hit & ~drop, n["pitch"] + rng.choice([-2, -1, 1, 2], size),
                              n["pitch"]).astype(np.int16)
        n = {k: v[~drop] for k, v in n.items()}
    elif kind == "prefix":  # the first 75% only
        cut = np.quantile(n["onset"], 0.75)
        n = {k: v[n["onset"] < cut] for k, v in n.items()}
    else:
        raise ValueError(kind)
    return _sorted(n)


def sha_of(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def write_corpus(root: Path, pieces: dict[str, Notes], groups: dict[str, str] | None = None,
                 extra_rows: list[dict] | None = None, shuffle_seed: int | None = None
                 ) -> tuple[Path, Path, dict[str, str]]:
    """Write manifest + notes for ``{name: notes}``; returns paths and ``{name: sha256}``."""
    groups = groups or {}
    shas = {name: sha_of(name) for name in pieces}
    rows = []
    for name, n in pieces.items():
        rows.append({"path": f"{name}.mid", "sha256": shas[name], "status": "ok", "reason": "",
                     "detail": "", "duplicate_of": "", "group": groups.get(name, f"{name}.mid"),
                     "n_notes": int(n["pitch"].size), "n_tracks": 1, "tpq": 480,
                     "duration_s": 1.0, "duration_beats": 1.0, "note_hash": note_hash(n),
                     "size_bytes": 100})
    rows += extra_rows or []
    man = pd.DataFrame(rows)
    notes = pd.DataFrame([{"sha256": shas[k], **v} for k, v in pieces.items()])
    if shuffle_seed is not None:  # file order must not matter
        man = man.sample(frac=1.0, random_state=shuffle_seed)
        notes = notes.sample(frac=1.0, random_state=shuffle_seed)
    root.mkdir(parents=True, exist_ok=True)
    artifacts.write_parquet(root / "manifest.parquet",
                            pa.Table.from_pandas(man, schema=MANIFEST_SCHEMA, preserve_index=False))
    artifacts.write_parquet(root / "notes.parquet",
                            pa.Table.from_pandas(notes, schema=NOTES_SCHEMA, preserve_index=False))
    return root / "manifest.parquet", root / "notes.parquet", shas


def planted_corpus(seed: int = 0, families: int = 12, singles: int = 30
                   ) -> tuple[dict[str, Notes], dict[str, str]]:
    """``families`` bases with every variant, plus unrelated singles. Returns pieces and family."""
    rng = np.random.default_rng(seed)
    pieces, family = {}, {}
    for f in range(families):
        base = base_piece(rng, n_events=int(rng.integers(40, 90)))
        pieces[f"f{f}_base"] = base
        family[f"f{f}_base"] = f"f{f}"
        for kind in VARIANTS:
            pieces[f"f{f}_{kind}"] = variant(rng, base, kind)
            family[f"f{f}_{kind}"] = f"f{f}"
    for s in range(singles):
        pieces[f"s{s}"] = base_piece(rng, n_events=int(rng.integers(20, 90)))
        family[f"s{s}"] = f"s{s}"
    return pieces, family


def run_dedupe(root: Path, pieces, cfg: DedupeConfig | None = None, workers: int = 1, **kw):
    manifest, notes, shas = write_corpus(root, pieces, **kw)
    out = root / "dedupe"
    run(cfg or DedupeConfig(), RuntimeConfig(workers=workers, progress=False), manifest=manifest,
        notes=notes, out_dir=out, report=root / "dedupe.json")
    clusters = artifacts.read_parquet(out / "clusters.parquet").set_index("sha256")
    pairs = artifacts.read_parquet(out / "pairs.parquet")
    return shas, clusters, pairs, artifacts.read_json(root / "dedupe.json")


# ---------------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    pieces, family = planted_corpus()
    root = tmp_path_factory.mktemp("planted")
    return pieces, family, *run_dedupe(root, pieces)


def test_planted_variants_cluster_with_their_base_and_nothing_else(planted):
    pieces, family, shas, clusters, _, _ = planted
    cid = {name: clusters.loc[shas[name], "cluster_id"] for name in pieces}
    planted_pairs = [(f"{f}_base", f"{f}_{k}") for f in {v for v in family.values()
                                                          if v.startswith("f")} for k in VARIANTS]
    recall = np.mean([cid[a] == cid[b] for a, b in planted_pairs])
    assert recall >= 0.95
    # no merge of unrelated pieces: every cluster holds one family only
    fam_of_cluster: dict[str, set[str]] = {}
    for name, c in cid.items():
        fam_of_cluster.setdefault(c, set()).add(family[name])
    assert all(len(f) == 1 for f in fam_of_cluster.values())


def _linked(pairs: pd.DataFrame, tiers: set[str], x: str, y: str) -> bool:
    """Are sha256 ``x`` and ``y`` connected by pairs of ``tiers``?"""
    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from([x, y])
    sub = pairs[pairs["tier"].isin(tiers)]
    g.add_edges_from(zip(sub["a"], sub["b"], strict=True))
    return nx.has_path(g, x, y)


def test_each_variant_is_caught_by_the_intended_tier(planted):
    _, _, shas, _, pairs, report = planted
    exact = {"note"}
    moved = {"note", "transposed"}
    fuzzy = {"note", "transposed", "melody", "near"}
    for f in range(12):
        base = shas[f"f{f}_base"]
        for kind in ("resaved", "tempo"):
            assert _linked(pairs, exact, base, shas[f"f{f}_{kind}"]), (f, kind)
        for kind in ("scaled", "transposed"):
            v = shas[f"f{f}_{kind}"]
            assert _linked(pairs, moved, base, v) and not _linked(pairs, exact, base, v)
    found = [_linked(pairs, fuzzy, shas[f"f{f}_base"], shas[f"f{f}_{kind}"])
             and not _linked(pairs, moved, shas[f"f{f}_base"], shas[f"f{f}_{kind}"])
             for f in range(12) for kind in ("edited", "prefix")]
    assert np.mean(found) >= 0.95
    assert set(pairs.loc[pairs["tier"] == "near", "similarity"].round(6)) != {1.0}
    assert report["note_removed"] > 0 and report["transposed_removed"] > 0
    assert report["near_bound"] > 0


def test_drop_keeps_one_representative_and_binds_the_rest(planted):
    pieces, _, shas, clusters, _, _ = planted
    for f in range(12):
        names = [f"f{f}_base", *(f"f{f}_{k}" for k in VARIANTS)]
        rows = clusters.loc[[shas[n] for n in names]]
        assert rows["cluster_id"].nunique() == 1
        assert rows["is_representative"].sum() == 1
        exact = rows.loc[[shas[f"f{f}_{k}"] for k in ("base", "resaved", "tempo", "scaled",
                                                       "transposed")]]
        assert exact["keep"].sum() == 1  # one survivor of the exact copies
        # the representative has the most notes, then the smallest sha256
        rep = rows[rows["is_representative"]].index[0]
        n_notes = {shas[n]: pieces[n]["pitch"].size for n in names}
        best = sorted(n_notes, key=lambda s: (-n_notes[s], s))[0]
        assert rep == best
        assert rows.loc[[shas[f"f{f}_edited"], shas[f"f{f}_prefix"]], "keep"].all()
    assert clusters.loc[[shas[f"s{s}"] for s in range(30)], "keep"].all()
    assert (clusters["cluster_id"] <= clusters.index).all()  # id = smallest sha256


def test_output_independent_of_file_order_and_workers(tmp_path):
    pieces, _ = planted_corpus(seed=3, families=4, singles=8)
    outs = []
    for k, (workers, shuffle) in enumerate([(1, None), (2, 7), (1, 11)]):
        run_dedupe(tmp_path / str(k), pieces, workers=workers, shuffle_seed=shuffle)
        outs.append([(tmp_path / str(k) / "dedupe" / f).read_bytes()
                     for f in ("pairs.parquet", "clusters.parquet", "fingerprint.json")]
                    + [(tmp_path / str(k) / "dedupe.json").read_bytes()])
    assert outs[0] == outs[1] == outs[2]


def test_verdict_cache_reuses_measures_and_changes_nothing(tmp_path):
    """Dedupe with a cold, a warm and no verdict cache writes the same bytes; the warm run
    measures no candidate, and after adding pieces only pairs with a new piece are measured."""
    pieces, _ = planted_corpus(seed=5, families=5, singles=12)
    cache = tmp_path / "cache"

    def once(name: str, corpus: dict, cache_dir: Path | None) -> tuple[list[bytes], dict]:
        root = tmp_path / name
        manifest, notes, _ = write_corpus(root, corpus)
        run(DedupeConfig(), RuntimeConfig(workers=1, progress=False), manifest=manifest,
            notes=notes, out_dir=root / "dedupe", report=root / "dedupe.json",
            cache_dir=cache_dir)
        outs = [(root / "dedupe" / f).read_bytes() for f in ("pairs.parquet", "clusters.parquet")]
        return [*outs, (root / "dedupe.json").read_bytes()], artifacts.read_json(
            root / "dedupe.env.json")

    plain, _ = once("plain", pieces, None)
    cold, env_cold = once("cold", pieces, cache)
    warm, env_warm = once("warm", pieces, cache)
    assert plain == cold == warm
    assert env_cold["verdicts_measured"] > 0 and env_cold["verdicts_reused"] == 0
    assert env_warm["verdicts_measured"] == 0
    assert env_warm["verdicts_reused"] == env_cold["verdicts_measured"]
    assert env_cold["features_reused"] == env_warm["features_measured"] == 0
    assert env_warm["features_reused"] == len(pieces)

    from tests.similarity.test_neighbours import _chorale_corpus

    rng = np.random.default_rng(9)
    more = dict(pieces)
    more["new_base"] = base_piece(rng, n_events=70)
    more["new_variant"] = variant(rng, more["new_base"], "edited")
    more["new_copy_of_f0"] = variant(rng, pieces["f0_base"], "edited")
    # a pair only an alignment confirms: a chorale with inner notes added (whole note tokens)
    chorales = _chorale_corpus()
    more["chorale"], more["chorale_inner"] = chorales["original"], chorales["copy"]
    grown, env_grown = once("grown", more, cache)
    fresh, _ = once("fresh", more, None)
    assert grown == fresh
    rules = set(artifacts.read_parquet(tmp_path / "fresh" / "dedupe" / "pairs.parquet")["rule"])
    assert "alignment" in rules, rules
    assert 0 < env_grown["verdicts_measured"] < env_cold["verdicts_measured"]
    assert (env_grown["features_reused"], env_grown["features_measured"]) == (len(pieces), 5)


def _notes(onset, duration, pitch, track=None):
    size = len(onset)
    return {"onset": np.asarray(onset, float), "duration": np.asarray(duration, float),
            "pitch": np.asarray(pitch, np.int16), "velocity": np.full(size, 64, np.int16),
            "track": np.asarray(track if track is not None else np.zeros(size), np.int16),
            "program": np.zeros(size, np.int16), "is_drum": np.zeros(size, bool)}


def test_same_melody_other_harmony_is_bound_not_dropped(tmp_path):
    rng = np.random.default_rng(5)
    a = base_piece(rng, n_events=40)
    top = a["track"] == 0
    b = {k: v.copy() for k, v in a.items()}
    b["pitch"] = np.where(top, b["pitch"], b["pitch"] - rng.integers(1, 5, b["pitch"].size))
    b["pitch"] = (b["pitch"] + 3).astype(np.int16)  # and transposed
    pieces = {"a": a, "b": _sorted(b), "c": base_piece(rng, n_events=40)}
    shas, clusters, pairs, report = run_dedupe(tmp_path, pieces)
    assert clusters.loc[shas["a"], "cluster_id"] == clusters.loc[shas["b"], "cluster_id"]
    assert clusters.loc[shas["c"], "cluster_id"] != clusters.loc[shas["a"], "cluster_id"]
    assert clusters["keep"].all()
    assert pairs["tier"].tolist() == ["melody"] and report["melody_bound"] == 1


def test_policy_off_and_drop(tmp_path):
    rng = np.random.default_rng(6)
    base = base_piece(rng)
    pieces = {"a": base, "b": variant(rng, base, "transposed")}
    off = parse_section("dedupe", {"policy": {"transposed": "off", "melody": "off",
                                              "near": "off"}}, DedupeConfig)
    _, clusters, pairs, _ = run_dedupe(tmp_path / "off", pieces, off)
    assert len(pairs) == 0 and clusters["cluster_id"].nunique() == 2
    near_drop = parse_section("dedupe", {"policy": {"transposed": "off", "melody": "off",
                                                    "near": "drop"}}, DedupeConfig)
    _, clusters, pairs, _ = run_dedupe(tmp_path / "drop", pieces, near_drop)
    assert pairs["tier"].tolist() == ["near"] and clusters["keep"].sum() == 1


def test_bad_input_is_counted_not_fatal(tmp_path):
    rng = np.random.default_rng(7)
    pieces = {"a": base_piece(rng), "empty": _notes([], [], [])}
    orphan = {"path": "orphan.mid", "sha256": sha_of("orphan"), "status": "ok", "reason": "",
              "detail": "", "duplicate_of": "", "group": "g", "n_notes": 3, "n_tracks": 1,
              "tpq": 96, "duration_s": 1.0, "duration_beats": 1.0, "note_hash": "",
              "size_bytes": 1}
    dup = {**orphan, "path": "copy.mid", "sha256": sha_of("a"), "status": "duplicate",
           "duplicate_of": "a.mid"}
    _, clusters, _, report = run_dedupe(tmp_path, pieces, extra_rows=[orphan, dup])
    assert report["ok_without_notes"] == 1 and report["byte_duplicates"] == 1
    assert len(clusters) == 3 and clusters["keep"].all()


@pytest.mark.parametrize("raw, key", [
    ({"lsh_threshold": 0.9, "near_jaccard": 0.5}, "dedupe"),
    ({"policy": {"note": "keep"}}, "dedupe.policy.note"),
    ({"num_perm": "128"}, "dedupe.num_perm"),
    ({"shingle": 4}, "dedupe.shingle"),
])
def test_bad_params_fail_fast(raw, key):
    with pytest.raises(ParamsError, match=key.replace(".", r"\.")):
        parse_section("dedupe", raw, DedupeConfig)


# --------------------------------------------------------------------------- committed fixtures
def _ingest_and_dedupe(root: Path, raw: Path, limits: dict, workers: int) -> dict[str, bytes]:
    """The real ingest stage, then dedupe, over ``raw``; their output files' bytes by name."""
    from pipeline.music.ingestion import IngestConfig
    from pipeline.music.ingestion import run as ingest

    runtime = RuntimeConfig(workers=workers, progress=False)
    ingest(IngestConfig(**limits), runtime, raw_dir=raw, metadata=None,
           manifest=root / "manifest.parquet", notes=root / "notes.parquet",
           report=root / "ingest.json")
    run(DedupeConfig(), runtime, manifest=root / "manifest.parquet", notes=root / "notes.parquet",
        out_dir=root / "dedupe", report=root / "dedupe.json")
    names = ("manifest.parquet", "dedupe/pairs.parquet", "dedupe/clusters.parquet",
             "dedupe/fingerprint.json", "dedupe.json")
    return {n: (root / n).read_bytes() for n in names}


def test_fixture_folder_dedupes_deterministically_and_finds_copies(tmp_path, midi_fixtures,
                                                                   midi_expected, copy_tree):
    """The committed fixtures, plus a byte copy of one under another name and the same music
    saved again at another resolution: the same bytes with 1 or 2 workers, the byte copy marked
    a duplicate by ingest and counted by dedupe, the re-saved copy linked by the note tier and
    dropped. No two distinct fixtures are linked."""
    from symusic import Score

    raw = copy_tree(midi_fixtures, tmp_path / "raw")
    band = (midi_fixtures / "band.mid").read_bytes()
    (raw / "zz_copy_of_band.mid").write_bytes(band)
    resaved = Score.from_midi(band).resample(960).dumps_midi()
    assert resaved != band
    (raw / "band_960.mid").write_bytes(resaved)
    limits = midi_expected["ingest"]
    outs = [_ingest_and_dedupe(tmp_path / f"w{w}", raw, limits, w) for w in (1, 2)]
    assert outs[0] == outs[1]

    root = tmp_path / "w1"
    manifest = artifacts.read_parquet(root / "manifest.parquet").set_index("path")
    assert manifest.loc["zz_copy_of_band.mid", ["status", "duplicate_of"]].tolist() == \
        ["duplicate", "band.mid"]
    report = artifacts.read_json(root / "dedupe.json")
    assert report["byte_duplicates"] == 1
    sha = manifest["sha256"].to_dict()
    pairs = artifacts.read_parquet(root / "dedupe/pairs.parquet")
    assert [(r.tier, {r.a, r.b}) for r in pairs.itertuples()] == \
        [("note", {sha["band.mid"], sha["band_960.mid"]})]
    clusters = artifacts.read_parquet(root / "dedupe/clusters.parquet").set_index("sha256")
    kept = manifest[manifest["status"] == "ok"]
    assert sorted(clusters.index) == sorted(kept["sha256"])
    assert clusters.loc[[sha["band.mid"], sha["band_960.mid"]], "keep"].sum() == 1
    assert clusters["keep"].sum() == len(clusters) - 1
