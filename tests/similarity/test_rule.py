"""The near-copy rule (:mod:`pipeline.similarity.rule`): built one way from the ``dedupe``
settings, serialised as ``data/dedupe/fingerprint.json`` and read back by one reader, whose
errors name the file, the key and the stage that writes it."""

from __future__ import annotations

import json

import pytest

from pipeline.audit.overlap import Shingling
from pipeline.core import artifacts
from pipeline.core.config import parse_section
from pipeline.similarity.duplicates import DedupeConfig
from pipeline.similarity.rule import NearCopyRule, NearCopySettings, alignment_threshold

DEFAULT_FILE = {"ioi_resolution": 4, "min_align_onsets": 10, "min_melody_notes": 12,
                "min_shingles": 16, "near_alignment": alignment_threshold(0.5, 4),
                "near_containment": 0.8, "near_jaccard": 0.5, "shingle_k": 4}
"""What the dedupe stage writes with the default settings."""


def test_the_rule_of_the_default_settings():
    rule = DedupeConfig().rule
    assert rule == NearCopyRule.of(NearCopySettings())  # DedupeConfig is the settings, extended
    assert (rule.jaccard, rule.containment, rule.min_shingles) == (0.5, 0.8, 16)
    assert rule.alignment == alignment_threshold(0.5, 4) == pytest.approx(13 / 15)
    assert rule.to_json() == DEFAULT_FILE


def test_a_null_near_alignment_is_derived_and_a_set_one_is_kept():
    derived = parse_section("dedupe", {"near_jaccard": 0.6, "lsh_threshold": 0.4,
                                       "shingle_k": 5}, DedupeConfig).rule
    assert derived.alignment == alignment_threshold(0.6, 5)
    assert parse_section("dedupe", {"near_alignment": 0.9}, DedupeConfig).rule.alignment == 0.9


def test_the_serialised_rule_reads_back_equal(tmp_path):
    cfg = parse_section("dedupe", {"near_alignment": 0.95, "min_align_onsets": 12,
                                   "min_melody_notes": 8, "short_melody_notes": 0},
                        DedupeConfig)
    path = tmp_path / "fingerprint.json"
    artifacts.write_json(path, cfg.rule.to_json())
    assert NearCopyRule.read(path) == cfg.rule
    assert set(cfg.rule.to_json()) == set(NearCopySettings.model_fields)
    # read twice and written again: the same bytes
    before = path.read_bytes()
    artifacts.write_json(path, NearCopyRule.read(path).to_json())
    assert path.read_bytes() == before


def test_the_audit_shingles_as_the_rule_says(tmp_path):
    path = tmp_path / "fingerprint.json"
    artifacts.write_json(path, DEFAULT_FILE | {"shingle_k": 6, "ioi_resolution": 3})
    assert Shingling.read(path) == Shingling(k=6, ioi_resolution=3)
    defaults = DedupeConfig()
    assert Shingling() == Shingling(k=defaults.shingle_k, ioi_resolution=defaults.ioi_resolution)


@pytest.mark.parametrize("content, message", [
    ({k: v for k, v in DEFAULT_FILE.items() if k != "near_containment"},
     "lacks near_containment"),
    ({k: v for k, v in DEFAULT_FILE.items() if k not in ("near_alignment", "min_align_onsets")},
     "lacks near_alignment, min_align_onsets"),
    (DEFAULT_FILE | {"shingle_k": "4"}, "shingle_k = '4'"),
    (DEFAULT_FILE | {"near_jaccard": 1.5}, "near_jaccard = 1.5"),
    (DEFAULT_FILE | {"extra": 1}, "extra"),
    ([1, 2], "not a JSON object"),
])
def test_a_bad_file_names_the_file_the_key_and_the_stage(tmp_path, content, message):
    path = tmp_path / "data" / "dedupe" / "fingerprint.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(content))
    (tmp_path / "dvc.yaml").write_text("stages:\n  dedupe:\n    cmd: symkit dedupe\n"
                                       "    outs:\n      - data/dedupe\n")
    with pytest.raises(artifacts.ArtifactError, match=message) as err:
        NearCopyRule.read(path)
    assert "fingerprint.json" in str(err.value) and "dedupe" in str(err.value)


def test_a_missing_file_names_the_stage(tmp_path):
    with pytest.raises(artifacts.ArtifactError, match="does not exist"):
        NearCopyRule.read(tmp_path / "fingerprint.json")
