"""The report's data card (pipeline.report.sections.data_card): files by status, reason and
licence; duplicates by tier; split sizes; contamination; tokenisation."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.core import artifacts
from pipeline.render.document import NA, Figure
from pipeline.report.sections import data_card
from pipeline.report.sections.data_card import (
    dedupe_tiers,
    read_notes,
    split_counts,
    split_notes,
    tokenisation_table,
)
from tests.report.test_context import make_context, rendered

SPLITS = pd.DataFrame({"sha256": ["a", "b", "c", "d", "e"],
                       "group_id": ["g1", "g1", "g2", "g3", "g3"],
                       "split": ["train", "train", "val", "test", "test"]})


def test_every_missing_input_is_named_not_available(tmp_path):
    md = rendered(data_card.render, make_context(tmp_path))
    for what in ("data/manifest.parquet", "data/dedupe/pairs.parquet", "data/splits.parquet",
                 "reports/dedupe.json", "reports/split.json", "reports/leakage.json",
                 "reports/contamination.json", "reports/tokenize.json"):
        assert f"{what}: {NA}." in md, what
    assert "## Data card" in md and "### Tokenisation" in md


def test_files_by_status_reason_and_licence(tmp_path):
    ctx = make_context(tmp_path)
    manifest = pd.DataFrame({"sha256": ["a", "b", "c", "d"],
                             "status": ["ok", "quarantined", "quarantined", "ok"],
                             "reason": ["", "no_notes", "corrupt", ""],
                             "license": ["CC0", "CC0", None, "PD"]})
    artifacts.write_parquet(ctx.inputs["manifest"], manifest)
    md = rendered(data_card.render, ctx)
    assert "4 files found." in md and "| ok | 2 |" in md and "| quarantined | 2 |" in md
    assert "| corrupt | 1 |" in md and "| no_notes | 1 |" in md  # reasons of quarantined files
    assert "| (none) | 1 |" in md and "| CC0 | 2 |" in md  # the licence column, spelt license
    artifacts.write_parquet(ctx.inputs["manifest"], manifest[["sha256", "status"]].assign(
        status="ok"))
    md = rendered(data_card.render, ctx)
    assert "No file was quarantined." in md and "Licences: not given in the metadata." in md


def test_split_counts_and_notes_are_per_split():
    assert split_counts(SPLITS) == {"test": (2, 1), "train": (2, 1), "val": (1, 1)}
    assert split_counts(SPLITS.drop(columns="group_id")) == {} and split_counts(None) == {}
    manifest = pd.DataFrame({"sha256": ["a", "b", "c", "d", "a"], "n_notes": [10, 20, 5, 7, 99]})
    # e is not in the manifest (0 notes); a repeated manifest row counts once
    assert split_notes(SPLITS, manifest) == {"test": 7, "train": 30, "val": 5}
    assert split_notes(SPLITS, manifest.drop(columns="n_notes")) == {}
    assert split_notes(None, manifest) == {}


def test_the_split_table_lists_train_val_test_first(tmp_path):
    ctx = make_context(tmp_path)
    artifacts.write_parquet(ctx.inputs["splits"], pd.concat([SPLITS, pd.DataFrame(
        {"sha256": ["f"], "group_id": ["g9"], "split": ["extra"]})]))
    md = rendered(data_card.render, ctx)
    rows = [line.split("|")[1].strip() for line in md.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() in
            ("train", "val", "test", "extra")]
    assert rows == ["train", "val", "test", "extra"]
    assert f"| train | 2 | 1 | {NA} |" in md  # no manifest: notes not available


def test_dedupe_tiers_count_every_tier_in_order_zeros_included(monkeypatch):
    drawn = {}

    def count_bars_png(labels, values, unit):
        drawn.update(zip(labels, values, strict=True))
        return b"png"

    monkeypatch.setattr(data_card, "count_bars_png", count_bars_png)
    (fig,) = dedupe_tiers({"byte_duplicates": 3, "note_pairs": 2, "transposed_pairs": 0,
                           "melody_pairs": 1, "near_pairs": 4, "near_by_jaccard": 3,
                           "near_by_alignment": 1, "near_rejected": 5, "other": "x"})
    assert isinstance(fig, Figure) and fig.png == b"png"
    assert list(drawn.items()) == [
        ("byte-identical files", 3), ("note: same notes", 2),
        ("transposed: transposed or time-scaled", 0), ("melody: same melody", 1),
        ("near: near duplicates", 4), ("near, confirmed by jaccard", 3),
        ("near, confirmed by alignment", 1), ("near: candidates rejected", 5)]
    assert dedupe_tiers(None) == [] and dedupe_tiers({"other": 1}) == []


def test_read_notes_reads_the_wanted_pieces_only(tmp_path):
    path = tmp_path / "notes.parquet"
    artifacts.write_parquet(path, pd.DataFrame({
        "sha256": ["a", "b", "c"], "onset": [[0.0], [1.0], [2.0]], "duration": [[1.0]] * 3,
        "pitch": [[60], [61], [62]]}))
    got = read_notes(path, ["c", "a", "zz"])
    assert sorted(got) == ["a", "c"] and list(got["c"]["pitch"]) == [62]
    np.testing.assert_array_equal(got["a"]["onset"], [0.0])
    assert read_notes(tmp_path / "missing.parquet", ["a"]) is None


def test_tokenisation_has_a_readable_table():
    (tok,) = tokenisation_table({"tokenizer": "REMI", "model": "BPE", "vocab_size": 1000,
                                 "base_vocab_size": 486, "model_trained_on_pieces": 268,
                                 "tokens_by_split": {"train": 10, "test": 3},
                                 "pieces_by_split": {"train": 2, "test": 1}}, 4)
    rows = dict(map(tuple, tok.rows))
    assert rows["trained vocabulary"] == "BPE, 1000 tokens (base 486), learned on 268 train pieces"
    assert rows["tokens per split"] == "train 10 (2 pieces), test 3 (1 piece)"
    assert tokenisation_table(None, 4) == []


def test_contamination_section_says_what_was_checked_and_found(tmp_path):
    from pipeline.report.sections.data_card import contamination

    (note,) = contamination({"references": [], "by_split": {"test": {"pieces": 4}}}, tmp_path, 4)
    assert "No reference corpus declared" in note.text
    assert "not available" in contamination(None, tmp_path, 4)[0].text
    summary = {"references": [{"reference": "../lakh", "files": 9, "by_status": {
        "ok": 7, "quarantined": 1, "duplicate": 1}, "by_reason": {"corrupt": 1},
        "pieces_matched": 1}], "tiers": ["note", "transposed", "melody", "near"],
        "by_split": {"test": {"pieces": 4, "in_reference": 2, "by_tier": {
            "note": 1, "transposed": 0, "melody": 0, "near": 1}}}}
    artifacts.write_parquet(tmp_path / "matches.parquet", pd.DataFrame({
        "split": ["test", "test", "test"], "sha256": ["q1", "q1", "q2"],
        "path": ["a.mid", "a.mid", "b.mid"], "reference": ["../lakh"] * 3,
        "ref_sha256": ["r1", "r2", "r3"], "ref_path": ["x.mid", "y.mid", "z.mid"],
        "tier": ["note", "near", "near"], "rule": [None, "jaccard", "excerpt"],
        "similarity": [1.0, 0.7, 0.2], "alignment": [np.nan, np.nan, 0.91]}))
    what, refs, per_split, matches, more = contamination(summary, tmp_path, 4)
    assert "compared with every piece" in what.text
    assert refs.rows[0][:4] == ["../lakh", "9", "7", "1 (corrupt 1)"]
    assert per_split.rows == [["test", "4", "2", "1", "0", "0", "1"]]
    # one row per held-out piece, its strongest match first
    assert [r[1:4] for r in matches.rows] == [["a.mid", "note", "1"],
                                              ["b.mid", "near (excerpt)", "0.91"]]
    assert "matches.parquet" in more.text
