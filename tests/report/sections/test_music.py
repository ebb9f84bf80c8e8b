"""The report's music statistics (pipeline.report.sections.music): each model's samples against
held-out human test music, as a table and as ratios, and each judged model against the human
band."""

from __future__ import annotations

import numpy as np

from pipeline.music.descriptors import STATS
from pipeline.render.document import NA, Document, Figure
from pipeline.report.sections import music
from tests.report.test_context import make_context, rendered

MUSIC = {"test": {"pitch_range": 12.0, "polyphony": 2.0, "note_density": 0.0},
         "ngram": {"pitch_range": 6.0, "polyphony": 3.0, "note_density": 1.0},
         "ngram_abs_diff": {"pitch_range": 6.0}, "note": "not a model"}


def test_without_music_statistics_they_are_not_available(tmp_path):
    for audit in (None, {}, {"music": {"ngram": {}}}):
        md = rendered(music.render, make_context(tmp_path, reports={"audit": audit}))
        assert f"music statistics in reports/audit.json: {NA}." in md


def test_every_statistic_per_model_and_the_ratio_to_human_music(tmp_path, monkeypatch):
    drawn = {}

    def grouped_bars_png(stats, ratios, reference):
        drawn.update(stats=stats, ratios=ratios, reference=reference)
        return b"png"

    monkeypatch.setattr(music, "grouped_bars_png", grouped_bars_png)
    md = rendered(music.render, make_context(tmp_path, reports={"audit": {"music": MUSIC}}))
    header = next(line for line in md.splitlines() if line.startswith("| statistic"))
    assert header == "| statistic | human test | ngram |"  # no _abs_diff block, no non-dict
    assert "| pitch_range | 12 | 6 |" in md and f"| scale_consistency | {NA} | {NA} |" in md
    assert drawn["stats"] == list(STATS) and drawn["reference"] == 1.0
    ratio = dict(zip(STATS, drawn["ratios"]["ngram"], strict=True))
    assert ratio["pitch_range"] == 0.5 and ratio["polyphony"] == 1.5
    assert np.isnan(ratio["note_density"])  # human value 0: no ratio
    assert np.isnan(ratio["scale_consistency"])  # not measured


def test_each_judged_model_against_the_human_band(tmp_path):
    judged = {"transformer": {"quality": {"stats": {
        "pitch_range": {"sample_mean": 6.0, "human_mean": 12.0, "overlap": 0.4,
                        "band_low": 0.6, "inside": False},
        "note_density": {"sample_mean": 1.0, "human_mean": 1.1, "overlap": 0.9,
                         "band_low": 0.6, "inside": True}}}},
              "ngram": {"quality": {}}}
    ctx = make_context(tmp_path, reports={"audit": {"music": MUSIC, "judged": judged}})
    doc = Document("t")
    music.render(doc, ctx)
    md = rendered(music.render, ctx)
    assert "### transformer against the human band" in md and "ngram against" not in md
    assert "| note density | 1 | 1.1 | 0.9 | 0.6 | inside |" in md
    assert md.index("| note density |") < md.index("| pitch range | 6 | 12 | 0.4 | 0.6 | outside |")
    assert sum(isinstance(b, Figure) for b in doc.blocks) == 2  # the ratios and the band
