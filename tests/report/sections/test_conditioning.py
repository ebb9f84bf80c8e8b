"""The report's conditioning section (pipeline.report.sections.conditioning): shown only for a
conditioned model, with the shuffled-condition diagnostic and the adherence of its samples."""

from __future__ import annotations

from pipeline.core import artifacts
from pipeline.report.sections import conditioning
from tests.report.test_context import make_context, rendered
from tests.stages.test_report import make_inputs, report, write_params

IV = {"value": 2.0, "ci_low": 1.9, "ci_high": 2.1}


def test_nothing_is_added_without_a_conditioned_model(tmp_path):
    for reports in ({}, {"eval": {"models": {}}, "audit": {"adherence": {}}},
                    {"eval": ["not", "a", "report"], "audit": "nor this"}):
        assert rendered(conditioning.render, make_context(tmp_path, reports=reports)) == "# t\n"


def test_the_diagnostic_and_adherence_tables_with_missing_intervals_as_na(tmp_path):
    ev = {"conditioning": {"transformer": {
        "conditions": ["key"], "groups": 4,
        "nll_per_note": {"correct": IV, "shuffled": {"value": None}},
        "shuffled_minus_correct": {"value": 0.3, "ci_low": 0.2, "ci_high": 0.4,
                                   "verdict": "follows"}}}}
    audit = {"adherence": {"transformer": {
        "conditions": ["key", "density"], "n_conditioned": 12, "window": 64,
        "density": {"measurable": True, "rate": IV}, "key": {"measurable": False}}}}
    md = rendered(conditioning.render, make_context(tmp_path, reports={"eval": ev,
                                                                        "audit": audit},
                                                    digits=2))
    assert "## Conditioning" in md
    assert "It is conditioned on key. Its val pieces (4 groups)" in md
    assert "| correct | 2 [1.9, 2.1] |" in md
    assert "| shuffled | n/a |" in md and "| removed | n/a |" in md  # absent or no value
    assert "| shuffled − correct | 0.3 [0.2, 0.4] | follows |" in md
    assert "| removed − correct | n/a | n/a |" in md
    assert "12 samples were drawn" in md and "first 64 generated tokens" in md
    assert "| key | not measurable from a sample |" in md
    assert "| density | 2 [1.9, 2.1] | n/a | n/a | n/a |" in md  # floor, shuffled, ceiling


def test_conditioning_section_only_for_a_conditioned_model(tmp_path):
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    report(tmp_path, params, p)
    assert "## Conditioning" not in p.md_out.read_text()
    iv = {"value": 2.0, "ci_low": 1.9, "ci_high": 2.1}
    ev = artifacts.read_json(p.eval)
    ev["conditioning"] = {"transformer": {
        "conditions": ["key", "density"], "groups": 5, "split": "val",
        "nll_per_note": {"correct": iv, "shuffled": {**iv, "value": 2.3},
                         "removed": {**iv, "value": 2.2}},
        "shuffled_minus_correct": {"value": 0.3, "ci_low": 0.2, "ci_high": 0.4,
                                   "verdict": "follows"},
        "removed_minus_correct": {"value": 0.2, "ci_low": -0.1, "ci_high": 0.4,
                                  "verdict": "no gap shown"}}}
    artifacts.write_json(p.eval, ev)
    audit = artifacts.read_json(p.audit)
    audit["adherence"] = {"transformer": {
        "conditions": ["density", "key"], "n_conditioned": 240, "window": 128,
        "density": {"measurable": True, "rate": {"value": 0.61, "ci_low": 0.55, "ci_high": 0.67},
                    "floor": iv, "shuffled": iv, "ceiling": iv},
        "key": {"measurable": False}}}
    artifacts.write_json(p.audit, audit)
    report(tmp_path, params, p)
    md = p.md_out.read_text()
    assert "## Conditioning" in md
    assert "| shuffled − correct | 0.3 [0.2, 0.4] | follows |" in md
    assert "| density | 0.61 [0.55, 0.67] |" in md
    assert "| key | not measurable from a sample |" in md
