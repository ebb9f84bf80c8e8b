"""The words and the document of ``symkit compare`` (pipeline.report.compare_document): the
design and verdict sentences, the per-piece and per-seed figures' numbers, the registered
comparisons' blocks and the document, built from planted compare.json content; and the forest
and scatter figures of the command's own outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from pipeline.render.document import Heading, render_markdown
from pipeline.report.compare_document import (
    Drawn,
    build_document,
    context,
    design_words,
    finding,
    forest_rows,
    piece_nll,
    registered_blocks,
    render,
    scatter_panels,
    seed_effects,
    verdict,
)
from pipeline.stats.paired import ArmScores, arm_scores, compare_pair, pair
from pipeline.tools.compare import Settings
from tests.stats.test_paired import PER_NOTE, pieces, scored
from tests.tools.test_compare import png_size, result, run_cli, write_arm

CFG = Settings(split="val", ci_level=0.95, equivalence_margin=0.005)


def _iv(value: float, lo: float, hi: float) -> dict[str, float]:
    return {"value": value, "ci_low": lo, "ci_high": hi}


def _metric(rel: tuple[float, float, float], *, p: float = 0.01, significant: bool = True,
            equivalent: bool = False) -> dict[str, Any]:
    return {"rel_improvement": _iv(*rel), "diff": _iv(rel[0] * 4, rel[1] * 4, rel[2] * 4),
            "baseline": _iv(4.0, 3.9, 4.1), "arm": _iv(4 - rel[0] * 4, 3.8, 4.0),
            "p_value": p, "p_holm": min(1.0, 2 * p), "significant": significant,
            "equivalent": equivalent}


def _comparison(**over: Any) -> dict[str, Any]:
    """One comparison of compare.json: arm "b" 3% better than baseline "a" per note."""
    return {"baseline": "a", "arm": "b", "n_pieces": 40, "n_groups": 20, "n_seeds_baseline": 3,
            "n_seeds_arm": 3, "seed_pairing": "paired", "design": "controlled",
            "params_diff": [{"key": "transformer.train.max_steps", "baseline": 400, "arm": 800,
                             "absent": None}],
            "protocol_diff": [], "registered_rules": [], "omitted_metrics": {},
            "metrics": {"nats_per_note": _metric((0.03, 0.01, 0.05))},
            "median_piece_effect": 0.028, **over}


def _result(comparisons: list[dict[str, Any]]) -> dict[str, Any]:
    arm = {"source": "a", "commit": None, "split_hash": "5" * 64, "tokenizer_hash": "7" * 64,
           "seeds": [1, 2, 3], "n_pieces": 40}
    return {"split": "val", "model": "transformer", "baseline": "a", "warnings": [],
            "settings": {"ci_level": 0.95, "n_boot": 300, "p_value": "two-sided",
                         "equivalence_margin": 0.005},
            "arms": [{**arm, "label": "a"}, *({**arm, "label": c["arm"]} for c in comparisons)],
            "comparisons": comparisons, "registered": {}}


# ---- words -------------------------------------------------------------------------------------
def test_the_design_is_named_with_what_differs():
    assert design_words(_comparison(params_diff=[])) == "identical: no param differs"
    assert design_words(_comparison()) == (
        "controlled: one param differs (transformer.train.max_steps 400 → 800)")
    two = [{"key": "a.x", "baseline": 1, "arm": None, "absent": "arm"},
           {"key": "b.y", "baseline": "s", "arm": "t", "absent": None}]
    assert design_words(_comparison(params_diff=two)) == "confounded: 2 params differ (a.x, b.y)"
    long = {"key": "k", "baseline": "x" * 60, "arm": None, "absent": "arm"}
    protocol = {"key": "transformer_stride", "baseline": 64, "arm": 32, "absent": None}
    text = design_words(_comparison(params_diff=[long], protocol_diff=[protocol]))
    assert text == (f"controlled: one param differs (k {'x' * 39}… → (absent)); scoring protocol "
                    "differs (transformer_stride 64 → 32)")


def test_a_finding_states_effect_interval_p_and_conclusion():
    c = _comparison()
    assert finding(c, "nats_per_note", CFG, n_comparisons=1) == (
        "b's NLL per note is 3.0% lower than a's (95% CI 1.0%–5.0% lower, p = 0.01): a real "
        "difference at alpha = 0.05, not shown equivalent within ±0.5%")
    worse = _comparison(metrics={"nats_per_note": _metric((-0.001, -0.004, 0.002), p=0.0004,
                                                          significant=False, equivalent=True)})
    assert finding(worse, "nats_per_note", CFG, n_comparisons=3) == (
        "b's NLL per note is 0.1% higher than a's (95% CI 0.4% higher to 0.2% lower, Holm p "
        "< 0.001, raw p < 0.001): no difference shown at alpha = 0.05 after Holm, equivalent "
        "within ±0.5%")
    same = _comparison(metrics={"nats_per_note": _metric((0.0, 0.0, 0.0), p=1.0,
                                                         significant=False)})
    assert finding(same, "nats_per_note", CFG, n_comparisons=1).startswith(
        "b's NLL per note equals a's on every piece (difference 0, p = 1)")


def test_the_context_names_pieces_groups_seeds_and_design():
    assert context(_comparison(), "val") == (
        "on 40 val pieces in 20 groups, 3 training seeds each (paired by seed); controlled: one "
        "param differs (transformer.train.max_steps 400 → 800)")
    one = _comparison(n_seeds_baseline=1, n_seeds_arm=1, params_diff=[])
    assert context(one, "test") == "on 40 test pieces in 20 groups; identical: no param differs"
    assert context(_comparison(n_seeds_baseline=1, seed_pairing="unpaired"), "val").startswith(
        "on 40 val pieces in 20 groups, a 1 training seed and b 3; ")
    assert verdict(_comparison(), "nats_per_note", CFG, n_comparisons=1) == (
        finding(_comparison(), "nats_per_note", CFG, n_comparisons=1) + "; "
        + context(_comparison(), "val") + ".")


# ---- the figures' numbers ----------------------------------------------------------------------
def test_piece_nll_averages_the_seeds_per_unit_and_leaves_unitless_pieces_out():
    s = ArmScores(np.array(["a", "b", "c"]), np.array(["g", "g", "h"]),
                  np.array([[10.0, 20.0, 5.0], [14.0, 30.0, 7.0]]),
                  {"n_notes": np.array([4.0, 5.0, 0.0]), "n_tokens": np.array([2.0, 5.0, 3.0])},
                  [1, 2])
    np.testing.assert_allclose(piece_nll(s), [3.0, 5.0, np.nan])
    np.testing.assert_allclose(piece_nll(s, "n_tokens"), [6.0, 5.0, 2.0])


def test_forest_rows_and_scatter_panels_follow_planted_comparisons():
    comps = [_comparison(arm=f"arm{k}", design="identical") for k in range(1, 6)]
    rows = forest_rows(_result(comps), {"arm2": [0.01, 0.02]})
    assert [(r.arm, r.value, r.ci_low, r.ci_high) for r in rows] == [
        (f"arm{k}", 0.03, 0.01, 0.05) for k in range(1, 6)]
    assert rows[1].seeds == (0.01, 0.02) and rows[0].seeds == ()
    assert scatter_panels(_result(comps[:3])) == ["arm1", "arm2", "arm3"]  # 4 arms: all drawn
    assert scatter_panels(_result(comps)) == ["arm1"]  # 6 arms: the first only


# ---- the document ------------------------------------------------------------------------------
def test_registered_blocks_say_unregistered_or_list_every_rule():
    blocks = registered_blocks({}, 0.95)
    assert isinstance(blocks[0], Heading) and "exploratory (NOT REGISTERED)" in blocks[1].text
    reg = {"registered": True, "source": "HEAD", "hash": "f" * 64, "counts": {"PASS": 1},
           "rules": [{"rule": "longer", "baseline": "a", "arm": "b", "status": "PASS",
                      "evidence": "3% better.", "deviations": ["n_boot 300, registered 2000"]}],
           "not_run": [{"rule": "wider", "reason": "no arm with model.n_embd 256"}]}
    _, intro, table = registered_blocks(reg, 0.95)
    assert "HEAD's reports/preregistration_compare.json (ffffffffffff)" in intro.text
    assert intro.text.count(": PASS 1.") == 1
    assert table.rows == [["longer", "a → b", "PASS",
                           "3% better. Deviations: n_boot 300, registered 2000."],
                          ["wider", "", "NOT RUN", "no arm with model.n_embd 256"]]


def test_the_document_is_the_same_bytes_each_time_and_figures_only_when_drawn():
    res = _result([_comparison()])
    md, html = render(build_document(res, CFG))
    assert (md, html) == render(build_document(res, CFG))
    assert md.startswith("# symkit compare: transformer on val")
    assert "## b against a" in md and "NOT REGISTERED: no registered rule covers" in md
    assert "## Figures" not in md  # --no-figures
    drawn = [Drawn("forest", "Relative improvement", "caption", b"\x89PNG fake"),
             Drawn("scatter", "Per-piece NLL", "", None, ("Not drawn: no scores.",))]
    with_figures = render_markdown(build_document(res, CFG, drawn))
    assert "## Figures" in with_figures and "](figures/forest.png)" in with_figures
    assert "Not drawn: no scores." in with_figures and "figures/scatter.png" not in with_figures
    assert "| b | controlled | transformer.train.max_steps | 400 | 800 |" in md


# ---- the figures of the command's outputs ------------------------------------------------------
def _arms_with_gains(tmp_path: Path, n_arms: int) -> None:
    """base/ and arm1/ .. arm<n-1>/, arm k 1·k% better, 3 training seeds each."""
    rng = np.random.default_rng(13)
    p = pieces(rng, 12, 2)
    write_arm(tmp_path / "base", scored(p, np.ones(len(p)), [1, 2, 3], rng, 0.01))
    for k in range(1, n_arms):
        write_arm(tmp_path / f"arm{k}", scored(p, np.full(len(p), 1 - 0.01 * k), [1, 2, 3], rng,
                                               0.01))


def test_forest_rows_and_scatter_panels_follow_the_comparisons(tmp_path, monkeypatch):
    _arms_with_gains(tmp_path, 5)
    heights = {}
    for n in (2, 4, 5):
        arms = ["base", *(f"arm{k}" for k in range(1, n))]
        assert run_cli(tmp_path, monkeypatch, *arms, "--out", f"out{n}") == 0
        out = result(tmp_path, f"out{n}")
        rows = forest_rows(out, {})
        assert len(rows) == len(out["comparisons"]) == n - 1
        assert (rows[0].arm, rows[0].design) == ("arm1", "identical")
        assert scatter_panels(out) == (arms[1:] if n <= 4 else ["arm1"])
        figures = tmp_path / f"out{n}" / "figures"
        heights[n] = png_size((figures / "forest.png").read_bytes())[1]
        width = png_size((figures / "scatter.png").read_bytes())[0]
        assert width > 600 if 2 < n <= 4 else width < 600
    assert heights[2] < heights[4] < heights[5]  # one row more per comparison
    assert "only the first, arm1, is drawn" in (tmp_path / "out5" / "compare.md").read_text()


def test_seed_effects_paired_and_against_the_baseline_mean():
    rng = np.random.default_rng(14)
    p0 = pieces(rng)
    a = scored(p0, np.ones(len(p0)), [1, 2, 3], rng, 0.02)
    gains = {1: 0.01, 2: 0.02, 3: 0.04}
    b = pd.concat([a[a["seed"] == s].assign(nll_nats=lambda d, g=g: d["nll_nats"] * (1 - g))
                   for s, g in gains.items()])
    sa, sb = arm_scores(a, "A"), arm_scores(b, "B")
    # paired: seed s against seed s recovers each seed's planted gain
    assert seed_effects(sa, sb, paired=True) == pytest.approx(list(gains.values()))
    # unpaired: against A's mean over seeds; their mean is the comparison's point estimate
    unpaired = seed_effects(sa, sb, paired=False)
    st = compare_pair(pair(sa, sb, "A", "B", "val"), PER_NOTE, n_boot=50, level=0.95,
                      rng=np.random.default_rng(0), margin=0.005)["nats_per_note"]
    assert np.mean(unpaired) == pytest.approx(st["rel_improvement"]["value"], rel=1e-12)
    assert seed_effects(sb, arm_scores(a[a["seed"] == 1], "A1"), paired=False) == []
