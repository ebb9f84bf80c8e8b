"""Split: groups never span splits, additions that merge nothing move nothing, k folds, too few
groups in val or test stop the stage, and groups holding a piece of ``split.exclude_test`` never
go to test (``split.exclude_train``: never to train)."""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import main as cli_main
from pipeline.core import artifacts
from pipeline.core.config import ParamsError, RuntimeConfig, parse_section
from pipeline.core.splits import split_hash
from pipeline.stages import split as split_stage
from pipeline.stages.dedupe import DedupeConfig
from pipeline.stages.dedupe import run as run_dedupe
from pipeline.stages.split import (
    SplitConfig,
    SplitInvariantError,
    SplitTooSmallError,
    check_invariants,
    check_min_groups,
    moved_pieces,
    read_exclude_test,
    read_exclude_train,
    split_table,
)
from pipeline.stages.split import run as run_split
from tests.stages.test_dedupe import planted_corpus, write_corpus

# the hash split as pinned below (seed 1234, nothing excluded); params.yaml's experiment has moved
# on to a fresh test set (seed 1235, data/spent_test.txt)
CFG = SplitConfig(seed=1234, exclude_test=None)
NO_MINIMUM = SplitConfig(seed=1234, exclude_test=None, min_groups=0)


def _sha(i: int, salt: str = "") -> str:
    return hashlib.sha256(f"{salt}{i}".encode()).hexdigest()


@st.composite
def structures(draw, salt: str = ""):
    """Files with metadata labels (from a small alphabet, "" = none) and dedupe clusters."""
    n = draw(st.integers(1, 40))
    labels = draw(st.lists(st.sampled_from(["", "a", "b", "c", "d", "e", "f"]), min_size=n,
                           max_size=n))
    cluster_of = draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n))
    keep = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return _tables([_sha(i, salt) for i in range(n)], labels, cluster_of, keep)


def _tables(shas, labels, cluster_of, keep):
    files = pd.DataFrame({"sha256": shas, "group": labels})
    cid = pd.Series(shas).groupby(pd.Series(cluster_of)).transform("min")
    clusters = pd.DataFrame({"sha256": shas, "cluster_id": cid.to_numpy(), "keep": keep})
    return files, clusters


def _spans(table: pd.DataFrame, key: pd.Series) -> int:
    merged = table.assign(key=key.reindex(table["sha256"]).to_numpy())
    merged = merged[merged["key"] != ""]
    return int((merged.groupby("key")["split"].nunique() > 1).sum())


@settings(max_examples=100, deadline=None)
@given(structures())
def test_no_group_label_or_cluster_spans_two_splits(data):
    files, clusters = data
    table = split_table(files, clusters, CFG)
    assert sorted(table["sha256"]) == sorted(clusters.loc[clusters["keep"], "sha256"])
    assert (table.groupby("group_id")["split"].nunique() <= 1).all()
    assert _spans(table, files.set_index("sha256")["group"]) == 0
    assert _spans(table, clusters.set_index("sha256")["cluster_id"]) == 0


@settings(max_examples=60, deadline=None)
@given(structures(), st.integers(1, 30), st.booleans())
def test_additions_that_merge_no_groups_move_nothing(data, n_new, reuse_labels):
    files, clusters = data
    before = split_table(files, clusters, CFG).set_index("sha256")
    new = [_sha(i, "new") for i in range(n_new)]
    # new files either carry fresh labels or join one existing label (that merges no groups)
    existing = sorted(set(files["group"]) - {""})
    labels = [existing[0] if reuse_labels and existing else f"new-{i}" for i in range(n_new)]
    files2 = pd.concat([files, pd.DataFrame({"sha256": new, "group": labels})])
    clusters2 = pd.concat([clusters, pd.DataFrame({"sha256": new, "cluster_id": new,
                                                   "keep": True})])
    after = split_table(files2, clusters2, CFG).set_index("sha256")
    common = before.index
    assert after.loc[common, "split"].tolist() == before["split"].tolist()
    assert after.loc[common, "group_id"].tolist() == before["group_id"].tolist()
    assert moved_pieces(before.reset_index(), after.reset_index()) == []


def test_a_merging_addition_lists_exactly_the_moved_pieces():
    shas = [_sha(i) for i in range(400)]
    files, clusters = _tables(shas, [f"g{i}" for i in range(400)], list(range(400)), [True] * 400)
    before = split_table(files, clusters, CFG)
    # a new file that is a near-duplicate of pieces 0..199 merges them into one group
    new = _sha(0, "bridge")
    files2 = pd.concat([files, pd.DataFrame({"sha256": [new], "group": ["zz"]})])
    cid = min([new, *shas[:200]])
    clusters2 = pd.concat([clusters.assign(cluster_id=[cid if i < 200 else s
                                                       for i, s in enumerate(shas)]),
                           pd.DataFrame({"sha256": [new], "cluster_id": [cid], "keep": [True]})])
    after = split_table(files2, clusters2, CFG)
    moved = moved_pieces(before, after)
    both = before.merge(after, on="sha256", suffixes=("_b", "_a"))
    changed = both[both["split_b"] != both["split_a"]]
    assert 0 < len(moved) == len(changed) <= 200
    assert {m.split(":")[0] for m in moved} == set(changed["sha256"])
    assert after.loc[after["sha256"].isin(shas[:200]), "split"].nunique() == 1


def test_ratios_hold_on_average():
    n = 6000
    shas = [_sha(i) for i in range(n)]
    files, clusters = _tables(shas, [f"g{i}" for i in range(n)], list(range(n)), [True] * n)
    shares = split_table(files, clusters, CFG)["split"].value_counts(normalize=True)
    assert abs(shares["train"] - 0.8) < 0.02
    assert abs(shares["val"] - 0.1) < 0.015 and abs(shares["test"] - 0.1) < 0.015
    other = split_table(files, clusters, parse_section("split", {"seed": 99}, SplitConfig))
    assert (other["split"] != split_table(files, clusters, CFG)["split"]).any()


def test_group_k_fold():
    n = 900
    shas = [_sha(i) for i in range(n)]
    files, clusters = _tables(shas, [f"g{i // 3}" for i in range(n)], list(range(n)), [True] * n)
    cfg = parse_section("split", {"folds": 5, "test_fold": 2}, SplitConfig)
    table = split_table(files, clusters, cfg)
    assert set(table["fold"]) == set(range(5))
    assert (table.groupby("group_id")["fold"].nunique() == 1).all()
    assert (table.loc[table["split"] == "test", "fold"] == 2).all()
    assert (table.loc[table["fold"] == 2, "split"] == "test").all()
    assert {"train", "val"} <= set(table.loc[table["fold"] != 2, "split"])
    assert (split_table(files, clusters, CFG)["fold"] == -1).all()


@pytest.mark.parametrize("raw, key", [
    ({"train": 0.8, "val": 0.1, "test": 0.2}, "split"),
    ({"folds": 1}, "split"),
    ({"folds": 3, "test_fold": 3}, "split"),
    ({"seed": "042"}, "split.seed"),
    ({"min_groups": -1}, "split.min_groups"),
    ({"min_groups": "2"}, "split.min_groups"),
    ({"min_groups": 2.5}, "split.min_groups"),
])
def test_bad_params_fail_fast(raw, key):
    with pytest.raises(ParamsError, match=key.replace(".", r"\.")):
        parse_section("split", raw, SplitConfig)


def _stage(root, pieces, groups=None, previous=None, cfg=CFG):
    manifest, notes, shas = write_corpus(root, pieces, groups=groups)
    runtime = RuntimeConfig(workers=1, progress=False)
    run_dedupe(DedupeConfig(), runtime, manifest=manifest, notes=notes, out_dir=root / "dedupe",
               report=root / "dedupe.json")
    paths = dict(splits=root / "splits.parquet", report=root / "split.json",
                 leakage_report=root / "leakage.json", figure=root / "fig" / "leakage.png")
    run_split(cfg, runtime, manifest=manifest, notes=notes, dedupe_dir=root / "dedupe",
              previous=previous, **paths)
    return shas, paths


def test_stage_end_to_end_is_deterministic_and_leak_free(tmp_path):
    pieces, family = planted_corpus(seed=2, families=8, singles=40)
    outs = []
    for k in range(2):
        shas, paths = _stage(tmp_path / str(k), pieces)
        outs.append({name: p.read_bytes() for name, p in paths.items()})
    assert outs[0] == outs[1]
    table = artifacts.read_parquet(paths["splits"])
    clusters = artifacts.read_parquet(tmp_path / "1" / "dedupe" / "clusters.parquet")
    assert sorted(table["sha256"]) == sorted(clusters.loc[clusters["keep"], "sha256"])
    split_of = dict(zip(table["sha256"], table["split"], strict=True))
    for f in range(8):  # every kept member of a planted family shares one split
        kept = {split_of[shas[n]] for n in pieces if family[n] == f"f{f}" and shas[n] in split_of}
        assert len(kept) == 1
    leak = artifacts.read_json(paths["leakage_report"])
    assert leak["grouped_crossing_groups"] == leak["grouped_crossing_pairs"] == 0
    assert leak["grouped_crossing_metadata_groups"] == 0
    report = artifacts.read_json(paths["report"])
    assert report["split_hash"] == split_hash(table["sha256"], table["split"])
    assert report["compared_with_previous"] is False
    assert report["ok_missing_from_dedupe"] == 0


def test_stage_lists_moves_against_previous(tmp_path):
    pieces, _ = planted_corpus(seed=9, families=0, singles=60)
    _stage(tmp_path / "a", pieces)
    previous = tmp_path / "a" / "splits.parquet"
    # relabel every piece into one metadata group: all pieces now share a split (one group
    # leaves val and test empty, so the minimum is off here)
    groups = dict.fromkeys(pieces, "one hymn")
    _, paths = _stage(tmp_path / "b", pieces, groups=groups, previous=previous, cfg=NO_MINIMUM)
    report = artifacts.read_json(paths["report"])
    old = artifacts.read_parquet(previous)
    new = artifacts.read_parquet(paths["splits"])
    assert new["split"].nunique() == 1
    assert report["moved_pieces"] == int((old["split"] != new["split"][0]).sum()) > 0
    assert report["pieces_added"] == report["pieces_removed"] == 0


def test_empty_corpus_gives_empty_artifacts(tmp_path):
    from pipeline.music.manifest import MANIFEST_SCHEMA, NOTES_SCHEMA

    manifest, notes = tmp_path / "manifest.parquet", tmp_path / "notes.parquet"
    artifacts.write_parquet(manifest, MANIFEST_SCHEMA.empty_table())
    artifacts.write_parquet(notes, NOTES_SCHEMA.empty_table())
    runtime = RuntimeConfig(workers=1, progress=False)
    run_dedupe(DedupeConfig(), runtime, manifest=manifest, notes=notes, out_dir=tmp_path / "d",
               report=tmp_path / "dedupe.json")
    s = run_split(NO_MINIMUM, runtime, manifest=manifest, notes=notes, dedupe_dir=tmp_path / "d",
                  splits=tmp_path / "s.parquet", report=tmp_path / "s.json",
                  leakage_report=tmp_path / "l.json", figure=tmp_path / "f.png")
    assert s.pieces == 0 and len(artifacts.read_parquet(tmp_path / "s.parquet")) == 0
    assert artifacts.read_json(tmp_path / "l.json")["grouped_crossing_pairs"] == 0


@pytest.mark.parametrize("key", ["crossing_groups", "crossing_metadata_groups", "crossing_pairs"])
def test_invariant_check_names_the_count(key):
    counts = {"crossing_groups": 0, "crossing_metadata_groups": 0, "crossing_pairs": 0,
              "pairs_with_a_dropped_piece": 3}
    check_invariants(counts)  # dropped pieces are not a crossing
    with pytest.raises(SplitInvariantError, match=f"{key}=2"):
        check_invariants({**counts, key: 2})


def test_stage_refuses_a_split_that_puts_one_group_in_two_splits(tmp_path, monkeypatch):
    pieces, _ = planted_corpus(seed=2, families=4, singles=10)
    real = split_stage.split_table

    def buggy(files, clusters, cfg, exclude=(), exclude_train=()):
        # one piece of a multi-piece group moves to another split
        table = real(files, clusters, cfg, exclude, exclude_train)
        sizes = table["group_id"].map(table["group_id"].value_counts())
        i = int((sizes > 1).to_numpy().argmax())
        table.loc[i, "split"] = "val" if table.loc[i, "split"] != "val" else "test"
        return table

    monkeypatch.setattr(split_stage, "split_table", buggy)
    with pytest.raises(SplitInvariantError, match=r"crossing_groups=1\b"):
        _stage(tmp_path, pieces)
    assert not (tmp_path / "splits.parquet").exists()  # nothing written for a broken split


# ------------------------------------------------------------------ too few groups to evaluate
def _labelled(n: int, per_group: int = 1):
    """``n`` groups labelled g0..g{n-1}, ``per_group`` singleton-cluster pieces each."""
    shas = [_sha(i) for i in range(n * per_group)]
    labels = [f"g{i // per_group}" for i in range(n * per_group)]
    return _tables(shas, labels, list(range(len(shas))), [True] * len(shas))


def _groups_per_split(table: pd.DataFrame) -> dict[str, int]:
    return table.groupby("split")["group_id"].nunique().to_dict()


def test_the_hash_assignment_is_unchanged():
    """Pinned before the minimum existed: a split that passes is exactly the hash split."""
    files, clusters = _labelled(100, per_group=2)
    expected = {"{}": "8e42b0dde1173d9235cf9abaf55145716a11eb807d130d8ae5b66558ebbd4162",
                "folds": "16ffd4fdcdb467efe56f47ab2b72470df910ecd282b2cd5f33414bcbfb4628a7"}
    for name, raw in (("{}", {}), ("folds", {"folds": 5, "test_fold": 2})):
        cfg = parse_section("split", {"seed": 1234, **raw}, SplitConfig)
        table = split_table(files, clusters, cfg)
        assert split_hash(table["sha256"], table["split"]) == expected[name], name
        check_min_groups(_groups_per_split(table), cfg)  # plenty of groups: it passes
    folded = split_table(files, clusters, parse_section(
        "split", {"seed": 1234, "folds": 5, "test_fold": 2}, SplitConfig))
    first = folded.drop_duplicates("group_id").set_index("group_id")
    assert first.loc[[f"group:g{i}" for i in range(4)], "split"].tolist() == [
        "val", "train", "test", "train"]
    assert first.loc[[f"group:g{i}" for i in range(4)], "fold"].tolist() == [4, 3, 2, 1]


def test_the_measured_small_corpus_is_refused_naming_counts_and_remedies():
    """28 groups hashed into train 23 / val 5 / test 0, as a user measured on a tiny corpus."""
    with pytest.raises(SplitTooSmallError) as err:
        check_min_groups({"train": 23, "val": 5}, CFG)
    msg = str(err.value)
    assert "28 groups split into train 23, val 5, test 0" in msg
    assert "test needs >= 2" in msg and "val needs" not in msg
    assert "split.min_groups = 2" in msg
    for remedy in ("more data", "split.folds", "other ratios", "lower split.min_groups"):
        assert remedy in msg, remedy


def test_a_corpus_just_at_the_minimum_passes_and_one_group_fewer_is_refused():
    files, clusters = _labelled(32)  # hashes into train 27, val 2, test 3
    table = split_table(files, clusters, CFG)
    assert _groups_per_split(table) == {"train": 27, "val": 2, "test": 3}
    check_min_groups(_groups_per_split(table), CFG)
    with pytest.raises(SplitTooSmallError, match="val needs >= 3") as err:
        check_min_groups(_groups_per_split(table), SplitConfig(min_groups=3))
    assert "test needs" not in str(err.value)
    files, clusters = _labelled(28)  # the same labels, fewer: val 1
    with pytest.raises(SplitTooSmallError, match="train 25, val 1, test 2"):
        check_min_groups(_groups_per_split(split_table(files, clusters, CFG)), CFG)
    check_min_groups({"train": 5}, NO_MINIMUM)  # 0 turns the check off


def test_an_empty_train_and_a_small_held_out_fold_are_refused():
    with pytest.raises(SplitTooSmallError, match="train needs >= 1"):
        check_min_groups({"val": 4, "test": 4}, SplitConfig(train=0.0, val=0.5, test=0.5))
    cfg = parse_section("split", {"folds": 10, "test_fold": 3}, SplitConfig)
    with pytest.raises(SplitTooSmallError, match=r"10 folds, test = fold 3.*fewer folds"):
        check_min_groups({"train": 14, "val": 2, "test": 1}, cfg)


def test_the_stage_refuses_before_writing_and_the_cli_exits_non_zero(tmp_path, capsys):
    pieces, _ = planted_corpus(seed=9, families=0, singles=8)
    groups = dict.fromkeys(pieces, "one hymn")  # one group: val and test are empty
    with pytest.raises(SplitTooSmallError, match=r"1 group split into .*val 0, test 0"):
        _stage(tmp_path, pieces, groups=groups)
    assert not (tmp_path / "splits.parquet").exists()
    assert not (tmp_path / "split.json").exists()
    params = tmp_path / "params.yaml"
    params.write_text("split:\n  min_groups: 2\n")
    paths = {"manifest": "manifest.parquet", "notes": "notes.parquet", "dedupe-dir": "dedupe",
             "splits": "splits.parquet", "report": "split.json",
             "leakage-report": "leakage.json", "figure": "leakage.png"}
    rc = cli_main(["split", "--params", str(params),
                   *[a for k, v in paths.items() for a in (f"--{k}", str(tmp_path / v))]])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("symkit split: 1 group split into")
    assert "split.min_groups" in err and not (tmp_path / "splits.parquet").exists()


# ------------------------------------------------------------------ split.exclude_test
FOLDED = {"folds": 5, "test_fold": 2}


def _write_list(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_no_file_or_an_empty_one_gives_the_plain_split(tmp_path):
    files, clusters = _labelled(100, per_group=2)
    empty = _write_list(tmp_path / "spent.txt", ["# nothing scored yet", "", "  "])
    assert read_exclude_test(None) == read_exclude_test(empty) == []
    for raw in ({}, FOLDED):
        cfg = parse_section("split", raw, SplitConfig)
        plain = split_table(files, clusters, cfg)
        with_file = parse_section("split", {**raw, "exclude_test": str(empty)}, SplitConfig)
        pd.testing.assert_frame_equal(split_table(files, clusters, with_file,
                                                  read_exclude_test(empty)), plain)


@pytest.mark.parametrize("raw", [{}, FOLDED], ids=["plain", "folds"])
def test_listed_groups_leave_test_for_train_and_val_and_nothing_else_moves(raw):
    n = 3000  # groups of two pieces; the second piece of each is listed
    shas = [_sha(i) for i in range(2 * n)]
    files, clusters = _tables(shas, [f"g{i // 2}" for i in range(2 * n)], list(range(2 * n)),
                              [True] * (2 * n))
    cfg = parse_section("split", raw, SplitConfig)
    plain = split_table(files, clusters, cfg).set_index("sha256")
    listed = set(shas[1::4]) | {_sha(0, "not in the corpus")}  # every other group
    table = split_table(files, clusters, cfg, listed).set_index("sha256")
    held = table.loc[sorted(listed & set(shas)), "group_id"]
    in_held = table["group_id"].isin(held)
    assert in_held.sum() == 2 * len(held) == n  # both pieces of each listed group
    assert not (table.loc[in_held, "split"] == "test").any()
    assert (table.loc[~in_held, "split"] == "test").any()
    pd.testing.assert_frame_equal(table[~in_held], plain[~in_held])  # the rest as before
    assert (table["fold"] == plain["fold"]).all()  # a moved group keeps its fold
    moved = table[in_held & (plain["split"] == "test")].drop_duplicates("group_id")
    stayed = in_held & (plain["split"] != "test")
    assert (table.loc[stayed, "split"] == plain.loc[stayed, "split"]).all()
    share = (moved["split"] == "train").mean()
    assert len(moved) > 100 and set(moved["split"]) == {"train", "val"}
    assert abs(share - cfg.train / (cfg.train + cfg.val)) < 0.06
    again = split_table(files, clusters, cfg, sorted(listed, reverse=True)).set_index("sha256")
    pd.testing.assert_frame_equal(again, table)  # a pure function of the listed set


def test_a_listed_dropped_copy_keeps_its_whole_group_out_of_test():
    shas = [_sha(i) for i in range(400)]
    # pieces 2k and 2k+1 are near-copies (one cluster); the second is dropped
    files, clusters = _tables(shas, [""] * 400, [i // 2 for i in range(400)],
                              [i % 2 == 0 for i in range(400)])
    plain = split_table(files, clusters, CFG)
    dropped = [shas[2 * k + 1] for k in range(200)]
    table = split_table(files, clusters, CFG, dropped)
    assert (plain["split"] == "test").any() and not (table["split"] == "test").any()


@pytest.mark.parametrize("lines, match", [
    (["# spent", "", "A" * 64], r"line 3 is 'AAAA"),
    (["a" * 63], "line 1"),
    (["sha256:" + "a" * 64], "line 1"),
])
def test_a_bad_line_names_the_key_the_file_and_the_line(tmp_path, lines, match):
    path = _write_list(tmp_path / "spent.txt", lines)
    with pytest.raises(ValueError, match=r"split\.exclude_test = .*spent\.txt.*" + match) as err:
        read_exclude_test(path)
    assert "64 lowercase hex" in str(err.value)


def test_a_missing_file_names_the_key_and_the_path(tmp_path):
    with pytest.raises(ValueError, match=r"split\.exclude_test = .*nowhere\.txt.*not found"):
        read_exclude_test(tmp_path / "nowhere.txt")
    with pytest.raises(ParamsError, match="exclude_test needs train"):
        parse_section("split", {"train": 0.0, "val": 0.0, "test": 1.0, "exclude_test": "x"},
                      SplitConfig)


def test_the_stage_draws_a_test_set_without_the_pieces_the_ledger_shows_scored(tmp_path):
    from pipeline.decision import ledger

    pieces, _ = planted_corpus(seed=3, families=6, singles=60)
    _, paths = _stage(tmp_path / "spent", pieces)
    first = artifacts.read_parquet(paths["splits"])
    report = artifacts.read_json(paths["report"])
    assert {report[f"exclude_test_{k}"] for k in ("listed", "pieces", "groups", "moved")} == {None}
    scored = sorted(first.loc[first["split"] == "test", "sha256"])
    book, spent = tmp_path / "ledger.jsonl", tmp_path / "spent.txt"
    book.write_text(ledger.line({"pieces": scored[1:]}) + ledger.line({"pieces": scored[:2]}))
    assert cli_main(["ledger", "--ledger", str(book), "--splits", str(paths["splits"]),
                     "--spent", str(spent)]) == 0
    empty = _write_list(tmp_path / "empty.txt", ["# none"])
    # an empty list: the same split
    _, same = _stage(tmp_path / "empty", pieces,
                     cfg=SplitConfig(seed=1234, exclude_test=str(empty)))
    assert same["splits"].read_bytes() == paths["splits"].read_bytes()
    # the same seed: the listed groups leave test, nothing comes in
    _, old_seed = _stage(tmp_path / "same-seed", pieces,
                         cfg=SplitConfig(seed=1234, min_groups=0,
                                            exclude_test=str(spent)))
    assert not (artifacts.read_parquet(old_seed["splits"])["split"] == "test").any()
    _, fresh = _stage(tmp_path / "fresh", pieces,
                      cfg=SplitConfig(seed=7, exclude_test=str(spent)))
    table = artifacts.read_parquet(fresh["splits"])
    test = table.loc[table["split"] == "test"]
    assert len(test) and not test["sha256"].isin(scored).any()
    assert not test["group_id"].isin(first.loc[first["sha256"].isin(scored), "group_id"]).any()
    report = artifacts.read_json(fresh["report"])
    assert report["exclude_test_listed"] == report["exclude_test_pieces"] == len(scored)
    assert report["exclude_test_groups"] == first.loc[first["split"] == "test",
                                                      "group_id"].nunique()
    plain = split_table_of(tmp_path / "fresh", SplitConfig(seed=7, exclude_test=None))
    moved = plain[plain["sha256"].isin(scored) & (plain["split"] == "test")]
    assert report["exclude_test_moved"] == moved["group_id"].nunique() > 0


def split_table_of(root, cfg):
    """The split of the corpus written under ``root``, without the listed set."""
    man = artifacts.read_parquet(root / "manifest.parquet", columns=["sha256", "status", "group"])
    files = man[man["status"].isin(["ok", "duplicate"])].fillna({"group": ""})
    return split_table(files, artifacts.read_parquet(root / "dedupe" / "clusters.parquet"), cfg)


# ------------------------------------------------------------------ split.exclude_train
@pytest.mark.parametrize("raw", [{}, {"train": 0.6, "val": 0.1, "test": 0.3}],
                         ids=["default", "skewed"])
def test_train_listed_groups_leave_train_for_val_and_test_and_nothing_else_moves(raw):
    n = 3000  # groups of two pieces; the second piece of every other group is listed
    shas = [_sha(i) for i in range(2 * n)]
    files, clusters = _tables(shas, [f"g{i // 2}" for i in range(2 * n)], list(range(2 * n)),
                              [True] * (2 * n))
    cfg = parse_section("split", {**raw, "exclude_test": None}, SplitConfig)
    plain = split_table(files, clusters, cfg).set_index("sha256")
    listed = set(shas[1::4]) | {_sha(0, "not in the corpus")}
    table = split_table(files, clusters, cfg, exclude_train=listed).set_index("sha256")
    held = table.loc[sorted(listed & set(shas)), "group_id"]
    in_held = table["group_id"].isin(held)
    assert in_held.sum() == 2 * len(held) == n
    assert not (table.loc[in_held, "split"] == "train").any()
    assert (table.loc[~in_held, "split"] == "train").any()
    pd.testing.assert_frame_equal(table[~in_held], plain[~in_held])
    stayed = in_held & (plain["split"] != "train")
    assert (table.loc[stayed, "split"] == plain.loc[stayed, "split"]).all()
    moved = table[in_held & (plain["split"] == "train")].drop_duplicates("group_id")
    assert len(moved) > 500 and set(moved["split"]) == {"val", "test"}
    assert abs((moved["split"] == "val").mean() - cfg.val / (cfg.val + cfg.test)) < 0.06
    again = split_table(files, clusters, cfg,
                        exclude_train=sorted(listed, reverse=True)).set_index("sha256")
    pd.testing.assert_frame_equal(again, table)


def test_a_group_listed_for_both_goes_to_val():
    shas = [_sha(i) for i in range(400)]
    files, clusters = _tables(shas, [""] * 400, list(range(400)), [True] * 400)
    table = split_table(files, clusters, CFG, shas, shas)
    assert set(table["split"]) == {"val"}


def test_the_exclude_train_file_is_a_list_or_a_contamination_match_table(tmp_path):
    import pyarrow as pa

    a, b = _sha(1), _sha(2)
    _write_list(tmp_path / "list.txt", ["# copies", b, a, a])
    assert read_exclude_train(tmp_path / "list.txt") == [a, b]
    assert read_exclude_train(None) == []
    table = pa.table({"sha256": [_sha(3), _sha(4), _sha(5)], "ref_sha256": [b, a, b]})
    artifacts.write_parquet(tmp_path / "matches.parquet", table)
    assert read_exclude_train(tmp_path / "matches.parquet") == [a, b]
    artifacts.write_parquet(tmp_path / "other.parquet", pa.table({"sha256": [a]}))
    with pytest.raises(ParamsError, match=r"split\.exclude_train = .*other\.parquet.*ref_sha256"):
        read_exclude_train(tmp_path / "other.parquet")
    artifacts.write_parquet(tmp_path / "bad.parquet", pa.table({"ref_sha256": ["abc"]}))
    with pytest.raises(ParamsError, match=r"split\.exclude_train = .*'abc' is not a sha256"):
        read_exclude_train(tmp_path / "bad.parquet")
    (tmp_path / "torn.parquet").write_bytes(b"not parquet")
    with pytest.raises(ParamsError, match=r"split\.exclude_train = .*torn\.parquet"):
        read_exclude_train(tmp_path / "torn.parquet")
    with pytest.raises(ParamsError, match=r"split\.exclude_train = .*nowhere\.txt.*not found"):
        read_exclude_train(tmp_path / "nowhere.txt")
    with pytest.raises(ParamsError, match="exclude_train needs val"):
        parse_section("split", {"train": 1.0, "val": 0.0, "test": 0.0, "exclude_test": None,
                                "exclude_train": "x"}, SplitConfig)


def test_the_stage_keeps_listed_groups_out_of_train_and_counts_them(tmp_path):
    import pyarrow as pa

    pieces, _ = planted_corpus(seed=3, families=6, singles=60)
    _, paths = _stage(tmp_path / "plain", pieces)
    first = artifacts.read_parquet(paths["splits"])
    report = artifacts.read_json(paths["report"])
    keys = ("listed", "pieces", "groups", "moved", "in_train")
    assert {report[f"exclude_train_{k}"] for k in keys} == {None}
    train = sorted(first.loc[first["split"] == "train", "sha256"])
    listed = train[:10] + sorted(first.loc[first["split"] == "val", "sha256"])[:2]
    copies = pa.table({"sha256": [_sha(i, "other") for i in range(12)], "ref_sha256": listed})
    artifacts.write_parquet(tmp_path / "matches.parquet", copies)
    _, out = _stage(tmp_path / "excluded", pieces,
                    cfg=SplitConfig(seed=1234, exclude_test=None,
                                    exclude_train=str(tmp_path / "matches.parquet")))
    table = artifacts.read_parquet(out["splits"])
    assert not table.loc[table["sha256"].isin(listed), "split"].eq("train").any()
    report = artifacts.read_json(out["report"])
    assert report["exclude_train_listed"] == report["exclude_train_pieces"] == 12
    assert report["exclude_train_in_train"] == 0
    held = first.loc[first["sha256"].isin(listed), "group_id"].unique()
    assert report["exclude_train_groups"] == len(held)
    moved = first.loc[first["group_id"].isin(held) & (first["split"] == "train"), "group_id"]
    assert report["exclude_train_moved"] == moved.nunique() > 0
    rest = ~table["group_id"].isin(held)
    pd.testing.assert_frame_equal(table[rest].reset_index(drop=True),
                                  first[~first["group_id"].isin(held)].reset_index(drop=True))
