"""Positive and negative controls of the shipped criteria (pipeline.decision.criteria_controls):
each rule
judged on simulated evidence from a model that should pass and one that should fail, at the
default experiment's sizes. The rates are in docs/evaluation.md (`symkit controls`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipeline.cli import main as cli
from pipeline.core.config import load_section
from pipeline.decision.criteria import CriteriaConfig, Criterion
from pipeline.decision.criteria_controls import CONTROLS, pass_rate, rates

REPO_PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
DRAWS = 300


@pytest.fixture(scope="module")
def shipped() -> dict[tuple[str, str, str], float]:
    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    return {(r.rule, r.case, r.truth): r.pass_rate for r in rates(cfg, draws=DRAWS, seed=1)}


MISSES = [
    # about 7%: seven statistics cannot tell 50% outside from the calibrated 5% more sharply
    ("transformer_samples_human_like", "each statistic outside its band with 50%"),
    # about 67%: judged on every seed, each seed's own 85 samples leave its excess about
    # ±5.8 points wide (±4.4 at 256), and all 3 seeds must clear the 10-point margin
    ("transformer_copies_no_more_than_humans", "samples flagged at the human rate (5.3%)"),
    # about 57%: judged on every seed, 3 seeds drawn independently must each pass (85% alone,
    # the rate seeds that share the pieces' noise would give)
    ("transformer_gap_bounded", "a true gap of 0.2 nats per note (held-out notes e^0.2 = 1.22 "
                                "times less likely)"),
]


def _rates(shipped, rule: str, case: str) -> list[float]:
    return [v for (r, c, t), v in shipped.items() if r == rule and c == case
            and (r, t) not in MISSES]


@pytest.mark.parametrize("rule", ["transformer_beats_ngram", "no_test_near_copies",
                                  "transformer_copies_no_more_than_humans",
                                  "transformer_membership_near_chance",
                                  "transformer_extraction_at_chance"])
def test_the_redesigned_and_sound_rules_pass_good_models_and_fail_bad_ones(shipped, rule):
    """Every control but the documented misses meets the standard."""
    good, bad = _rates(shipped, rule, "good"), _rates(shipped, rule, "bad")
    missed = [t for r, t in MISSES if r == rule]
    assert bad and (good or missed)
    assert all(g >= 0.80 for g in good), good
    assert max(bad) <= 0.05, bad


def test_the_gap_rules_per_note_pass_good_models_and_catch_memorisation_and_leaks(shipped):
    """Per note, 72 held-out (val and test) against 256 train pieces, judged on every seed: the
    bound passes a gap of 0 (and of 0.2 only on one seed, a documented miss) and fails a
    memorising model; the leak guard passes 0 and 0.2 and catches -0.5. At 27 val against 128
    train pieces, one seed, the 0.2 gap passed 44% and the leak 15%."""
    for rule in ("transformer_gap_bounded", "transformer_gap_not_negative"):
        assert min(_rates(shipped, rule, "good")) >= 0.80, rule
        assert max(_rates(shipped, rule, "bad")) <= 0.05, rule


def test_quality_judged_by_its_calibrated_band_rejects_human_like_music_about_5_percent(shipped):
    good = _rates(shipped, "transformer_samples_human_like", "good")
    assert good and 0.90 <= good[0] <= 0.99  # 1 - P(2+ of 7 outside at 5% each) = 95.6%
    mostly_off = shipped[("transformer_samples_human_like", "bad",
                          "each statistic outside its band with 60%")]
    assert mostly_off <= 0.05


def test_the_harness_fails_the_old_gap_rule_a_model_at_zero_gap_could_not_pass():
    """The old `transformer_gap_not_negative` (whole interval >= 0) passed a model whose val is
    exactly as predictable as its training pieces about 2% of the time: the harness must see
    it, or it could not tell a redesign from none."""
    old = Criterion(name="old", metric="generalisation.gap.transformer", op=">=", threshold=0.0,
                    judge="interval", rationale="old rule")
    at_zero = next(c for c in CONTROLS[old.metric] if "gap of 0:" in c.truth)
    assert pass_rate(old, at_zero, DRAWS, seed=1) < 0.05
    new = old.model_copy(update={"judge": "refute"})
    # judged on 3 independent seeds, each passing about 97%: 0.97³ ≈ 0.92
    assert pass_rate(new, at_zero, DRAWS, seed=1) > 0.85


@pytest.mark.parametrize(("rule", "truth"), MISSES)
def test_the_documented_misses_still_miss(shipped, rule, truth):
    """docs/evaluation.md names these controls as missing the standard at the default sizes;
    when a redesign meets it, this test fails so the docs are updated with it."""
    rate = shipped[next(k for k in shipped if k[0] == rule and k[2] == truth)]
    case = next(k for k in shipped if k[0] == rule and k[2] == truth)[1]
    assert (rate < 0.80) if case == "good" else (rate > 0.05), rate


def test_the_rates_are_reproducible(shipped):
    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    again = {(r.rule, r.case, r.truth): r.pass_rate for r in rates(cfg, draws=DRAWS, seed=1)}
    assert again == shipped


def test_design_sizes_follow_the_registered_split_and_params():
    from pipeline.core.config import read_params
    from pipeline.decision.criteria_controls import Sizes, design_sizes, gap_se_for, resolved_effect

    params = read_params(REPO_PARAMS)
    default = design_sizes(params, {"train": (276, 148), "val": (27, 21), "test": (45, 33)})
    assert (default.membership_train, default.membership_test, default.extraction_train,
            default.samples, default.human_pieces) == (256, 72, 256, 256, 45)
    assert default.gap_per_note_se == pytest.approx(Sizes().gap_per_note_se, rel=0.01)
    assert default.gap_se == pytest.approx(Sizes().gap_se, rel=0.01)
    assert default.seeds == 3
    # sections left out of params take the stages' own defaults (evaluate.train_pieces 256)
    bare = design_sizes({}, {"train": (276, 148), "val": (27, 21), "test": (45, 33)})
    assert bare == default
    small = design_sizes(params, {"train": (40, 30), "val": (8, 8), "test": (12, 12)})
    assert (small.membership_train, small.membership_test, small.extraction_train) == (40, 20, 40)
    assert small.gain_se > default.gain_se and small.gap_se > default.gap_se
    # the committed sizes give back the committed spread; fewer train pieces, a wider one
    assert gap_se_for(27, 128, "note") == pytest.approx(0.165)
    assert gap_se_for(27, 27, "note") > gap_se_for(27, 128, "note") > gap_se_for(54, 128, "note")
    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    gain = next(r for r in cfg.rules if r.name == "transformer_beats_ngram")
    # 2% + the expected half-width (z x 0.0051 and t_2 x 0.886 x 0.0112 / sqrt(3), in
    # quadrature: 2.66%) + 0.84 x 0.0082 = 5.4%: the MDE stated above the threshold
    half = math.hypot(1.96 * 0.0051, 4.303 * 0.8862 * 0.0112 / math.sqrt(3))
    assert resolved_effect(gain, default) == pytest.approx(0.02 + half + 0.8416 * 0.0082,
                                                           abs=2e-4)
    five = design_sizes({**params, "transformer": {"replicates": 5}},
                        {"train": (276, 148), "val": (27, 21), "test": (45, 33)})
    assert resolved_effect(gain, five) < resolved_effect(gain, default)


def test_every_control_is_of_a_declared_metric():
    """A control's metric is a canonical key of the metric table, so a renamed metric cannot
    leave its controls behind."""
    from pipeline.decision.metrics import METRICS

    assert set(CONTROLS) <= {m.key for m in METRICS}
    assert all(c.case in ("good", "bad") and c.side in ("both", "upper", "lower")
               for cs in CONTROLS.values() for c in cs)


def test_a_criterion_added_with_its_controls_reaches_symkit_controls(tmp_path, monkeypatch,
                                                                     capsys):
    """CONTRIBUTING.md's "How to add a criterion (with its control)", step by step, on a toy
    rule: the rule in params, one entry in CONTROLS; `symkit controls` and the registration's
    power statement then judge it."""
    from pipeline.decision.criteria_controls import Sizes, bad, good, power_block

    def estimate(truth: float):
        """A normal estimate around ``truth`` with an interval of ±0.1."""
        def draw(rng, sizes):
            v = float(rng.normal(truth, 0.05))
            return {"value": v, "ci_low": v - 0.1, "ci_high": v + 0.1}
        return draw

    # 1. the rule in params.yaml
    params = tmp_path / "params.yaml"
    params.write_text(
        "criteria:\n  rules:\n    - name: toy_pieces_per_group\n"
        "      metric: toy.pieces_per_group\n      op: \">=\"\n      threshold: 2.0\n"
        "      judge: interval\n      rationale: a group holds two pieces\n")
    assert cli(["controls", "--params", str(params), "--draws", "20"]) == 0
    assert "| toy_pieces_per_group | - | no control for toy.pieces_per_group |" in \
        capsys.readouterr().out
    # 2. one entry in CONTROLS: its good and its bad model
    monkeypatch.setitem(CONTROLS, "toy.pieces_per_group", (
        good("2.5 pieces per group", estimate(2.5)),
        bad("one piece per group", estimate(1.0))))
    assert cli(["controls", "--params", str(params), "--draws", "20"]) == 0
    out = capsys.readouterr().out
    assert "| toy_pieces_per_group | good | 2.5 pieces per group | 100.0% | >= 80%: met |" in out
    assert "| toy_pieces_per_group | bad | one piece per group | 0.0% | <= 5%: met |" in out
    cfg = load_section("criteria", params, CriteriaConfig)
    (stated,) = power_block(cfg, Sizes(), draws=20)["rules"]
    assert [c["case"] for c in stated["controls"]] == ["good", "bad"]


def test_the_guards_controls_draw_every_seed_and_are_judged_seed_by_seed():
    """A control of a metric judged per seed draws each seed's own block, and pass_rate judges
    them as the report does: one failing seed fails the rule, whatever the seeds' mean."""
    import numpy as np

    from pipeline.decision.criteria_controls import Sizes, bad, good
    from pipeline.decision.metrics import judged_per_seed

    rng = np.random.default_rng(0)
    for metric in sorted(judged_per_seed() & set(CONTROLS)):
        control = CONTROLS[metric][0]
        three = control.draw(rng, Sizes(seeds=3, n_boot=100))
        assert sorted(three["seeds"]) == ["0", "1", "2"], metric
        assert all({"value", "ci_low", "ci_high"} <= set(b) for b in three["seeds"].values())
        one = control.draw(rng, Sizes(seeds=1, n_boot=100))
        assert "seeds" not in one and {"value", "ci_low", "ci_high"} <= set(one), metric

    def seeds(*values):
        def draw(rng, sizes):
            blocks = {str(i): {"value": v, "ci_low": v - 0.01, "ci_high": v + 0.01}
                      for i, v in enumerate(values)}
            return {"value": float(np.mean(values)), "seeds": blocks}
        return draw

    rule = Criterion(name="auc", metric="memorisation.transformer.membership_auc", op="<=",
                     threshold=0.65, judge="interval", rationale="r")
    assert pass_rate(rule, good("every seed at chance", seeds(0.5, 0.52, 0.48)), 5, 0) == 1.0
    assert pass_rate(rule, bad("one seed memorises", seeds(0.5, 0.5, 0.8)), 5, 0) == 0.0  # mean 0.6


def test_a_guard_judged_on_every_seed_resolves_a_stricter_effect():
    """Every one of 3 independent seeds must pass: each with 0.8^(1/3) = 92.8%, so the bound
    passes only a smaller true gap than on one seed; the refute rule fails once any seed does,
    each with 1 - 0.2^(1/3) = 41.5%, so it fails a value nearer its threshold."""
    from statistics import NormalDist

    from pipeline.decision.criteria_controls import Sizes, resolved_effect

    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    bound = next(r for r in cfg.rules if r.name == "transformer_gap_bounded")
    leak = next(r for r in cfg.rules if r.name == "transformer_gap_not_negative")
    se, z = Sizes().gap_per_note_se, NormalDist().inv_cdf(0.975)
    assert resolved_effect(bound, Sizes(seeds=1)) == pytest.approx(
        0.5 - z * se - NormalDist().inv_cdf(0.8) * se)
    assert resolved_effect(bound, Sizes(seeds=3)) == pytest.approx(
        0.5 - z * se - NormalDist().inv_cdf(0.8 ** (1 / 3)) * se)
    assert resolved_effect(leak, Sizes(seeds=3)) == pytest.approx(
        0.0 - z * se - NormalDist().inv_cdf(1 - 0.2 ** (1 / 3)) * se)
    assert resolved_effect(leak, Sizes(seeds=3)) > resolved_effect(leak, Sizes(seeds=1))
