"""Positive and negative controls of the shipped criteria (pipeline.decision.criteria_controls):
each rule judged on simulated evidence from a model that should pass and one that should fail,
and all rules together on one good model and one bad model per failure. The code holds no
spread: these tests plant theirs (:func:`planted`), small enough that a sound rule can meet the
standard, so a rule that cannot is a property of the rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main as cli
from pipeline.core.config import load_section
from pipeline.decision.criteria import CriteriaConfig, Criterion
from pipeline.decision.criteria_controls import CONTROLS, Sizes, pass_rate, rates
from pipeline.decision.spreads import Spreads

REPO_PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
DRAWS = 300
SPREADS = Spreads(gain_se_groups=0.0051, gain_seed_sd=0.0112, gap_se_note=0.104,
                  gap_se_token=0.0497, piece_sd_note=0.5, human_flag_rate=0.053,
                  source={"gain_se_groups": "planted by the test"})
"""Planted spreads, the size an earlier split of the default experiment measured."""


def planted(**kw) -> Sizes:
    """Sizes of the committed split (234 train, 63 val, 51 test pieces) with :data:`SPREADS`."""
    spreads = kw.pop("spreads", SPREADS)
    return Sizes(spreads=spreads, **{
        "seeds": 3, "membership_train": 234, "membership_test": 114,
        "membership_train_groups": 152, "membership_test_groups": 50, "extraction_train": 234,
        "extraction_test": 51, "samples": 256, "human_windows": 151, "human_pieces": 51, **kw})


@pytest.fixture(scope="module")
def shipped() -> dict[tuple[str, str, str], float]:
    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    return {(r.rule, r.case, r.truth): r.pass_rate
            for r in rates(cfg, planted(), draws=DRAWS, seed=1)}


MISSES = [
    # about 67%: judged on every seed, each seed's own 85 samples leave its excess about
    # ±5.8 points wide (±4.4 at 256), and all 3 seeds must clear the 10-point margin
    ("transformer_copies_no_more_than_humans", "samples flagged at the human rate"),
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
    """Bands calibrated together: human-like sets fail 5%, and a model with each statistic
    outside half the time passes 0.5^7 = 0.8% (at 6 of 7 inside it passed 8/128 = 6.25%)."""
    good = _rates(shipped, "transformer_samples_human_like", "good")
    assert good and 0.90 <= good[0] <= 0.99  # 0.95 for the set
    for p in ("50%", "60%"):
        assert shipped[("transformer_samples_human_like", "bad",
                        f"each statistic outside its band with {p}")] <= 0.03


def test_the_harness_fails_the_old_gap_rule_a_model_at_zero_gap_could_not_pass():
    """The old `transformer_gap_not_negative` (whole interval >= 0) passed a model whose val is
    exactly as predictable as its training pieces about 2% of the time: the harness must see
    it, or it could not tell a redesign from none."""
    old = Criterion(name="old", metric="generalisation.gap.transformer", op=">=", threshold=0.0,
                    judge="interval", rationale="old rule")
    at_zero = next(c for c in CONTROLS[old.metric] if "gap of 0:" in c.truth)
    assert pass_rate(old, at_zero, DRAWS, seed=1, sizes=planted()) < 0.05
    new = old.model_copy(update={"judge": "refute"})
    # judged on 3 independent seeds, each passing about 97%: 0.97³ ≈ 0.92
    assert pass_rate(new, at_zero, DRAWS, seed=1, sizes=planted()) > 0.85


@pytest.mark.parametrize(("rule", "truth"), MISSES)
def test_the_documented_misses_still_miss(shipped, rule, truth):
    """docs/evaluation.md names these controls as missing the standard at the default sizes;
    when a redesign meets it, this test fails so the docs are updated with it."""
    rate = shipped[next(k for k in shipped if k[0] == rule and k[2] == truth)]
    case = next(k for k in shipped if k[0] == rule and k[2] == truth)[1]
    assert (rate < 0.80) if case == "good" else (rate > 0.05), rate


def test_the_rates_are_reproducible():
    """The same seed gives the same rates (20 draws are enough to show it); another seed
    other ones."""
    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)

    def draw(seed: int) -> dict:
        return {(r.rule, r.case, r.truth): r.pass_rate
                for r in rates(cfg, planted(), draws=20, seed=seed)}

    first = draw(1)
    assert draw(1) == first and draw(2) != first


def test_design_sizes_follow_the_registered_split_and_params():
    from pipeline.core.config import read_params
    from pipeline.decision.criteria_controls import design_sizes, resolved_effect

    params = read_params(REPO_PARAMS)
    counts = {"train": (276, 148), "val": (27, 21), "test": (45, 33)}
    default = design_sizes(params, counts, SPREADS, windows_per_piece=3.0)
    assert (default.membership_train, default.membership_test, default.extraction_train,
            default.samples, default.human_pieces, default.human_windows) == (
        256, 72, 256, 4096 + 16, 45, 135)
    assert default.spreads == SPREADS and default.seeds == 12
    # sections left out of params take the stages' own defaults
    assert design_sizes({}, counts, SPREADS, 3.0) == default
    small = design_sizes(params, {"train": (40, 30), "val": (8, 8), "test": (12, 12)},
                         SPREADS, 3.0)
    assert (small.membership_train, small.membership_test, small.extraction_train) == (40, 20, 40)
    # no spread is a constant in code: a design without measured spreads cannot be built
    with pytest.raises(TypeError, match="spreads"):
        Sizes(seeds=3, membership_train=1, membership_test=1, membership_train_groups=1,
              membership_test_groups=1, extraction_train=1, extraction_test=1, samples=1,
              human_windows=1, human_pieces=1)
    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    gain = next(r for r in cfg.rules if r.name == "transformer_beats_ngram")
    # the one power statement at 3 seeds: 5.9%, where the expected half-width plus 0.84
    # standard errors said 5.4% (the seeds' estimated spread varies, and a wide draw costs more
    # than a narrow one gains); more seeds, a smaller true gain
    three = design_sizes({**params, "transformer": {"replicates": 3}}, counts, SPREADS, 3.0)
    assert resolved_effect(gain, three) == pytest.approx(0.0588, abs=5e-4)
    five = design_sizes({**params, "transformer": {"replicates": 5}}, counts, SPREADS, 3.0)
    assert resolved_effect(gain, default) < resolved_effect(gain, five) < \
        resolved_effect(gain, three)


def test_the_one_power_statement_is_the_gain_that_passes_80_percent_of_simulations():
    """gain_at_power (the registration's, the report's and the docs' statement) against the
    gain rule's own simulation at that true gain."""
    from pipeline.decision.criteria_controls import _gain, good
    from pipeline.stats.power import gain_at_power

    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    rule = next(r for r in cfg.rules if r.name == "transformer_beats_ngram")
    sizes = planted()
    at = gain_at_power(rule.threshold, sizes.gain_se_groups, sizes.gain_seed_sd, sizes.seeds,
                       sizes.level)
    rate = pass_rate(rule, good("at the stated gain", _gain(at)), 2000, 0, sizes)
    assert abs(rate - 0.80) < 0.04, rate


def test_joint_rates_match_a_direct_simulation():
    """Two rules on normally simulated metrics, drawn independently: all rules together pass
    as often as the product of each rule's closed-form pass probability."""
    from statistics import NormalDist

    from pipeline.decision.criteria_controls import GOOD_MODEL, joint_rates

    cfg = CriteriaConfig(rules=[
        Criterion(name="gap", metric="generalisation.gap_per_note.transformer", op="<=",
                  threshold=0.5, judge="interval", rationale="r"),
        Criterion(name="near", metric="leakage.test_near_train", op="==", threshold=0,
                  rationale="r")])
    sizes = planted(seeds=1, spreads=Spreads(**{**SPREADS.to_dict(), "gap_se_note": 0.1}))
    got = joint_rates(cfg, GOOD_MODEL, sizes, 4000, seed=3)
    z = NormalDist().inv_cdf(0.975)
    direct = NormalDist(0.2, 0.1).cdf(0.5 - z * 0.1)  # estimate + z se <= 0.5
    assert abs(got["all"] - direct) < 0.02 and got["rules"]["near"] == 1.0
    assert got["all"] == got["rules"]["gap"]


def test_the_bad_models_fail_the_rules_together_and_a_larger_design_is_searched():
    from pipeline.decision.criteria_controls import joint_block, size_for_standard

    cfg = CriteriaConfig(rules=[
        Criterion(name="gain", metric="test.nll_per_note.rel_improvement", op=">=",
                  threshold=0.02, judge="interval", rationale="r"),
        Criterion(name="gap", metric="generalisation.gap_per_note.transformer", op="<=",
                  threshold=0.5, judge="interval", rationale="r"),
        Criterion(name="leak", metric="generalisation.gap_per_note.transformer", op=">=",
                  threshold=0.0, judge="refute", rationale="r")])
    wide = planted(spreads=Spreads(**{**SPREADS.to_dict(), "gain_se_groups": 0.02,
                                      "gain_seed_sd": 0.005}))
    block = joint_block(cfg, wide, 200)
    bad = {b["model"]: b["all"] for b in block["bad"]}
    assert bad["no gain"] <= 0.05 and bad["memorises"] <= 0.05 and bad["leaks"] <= 0.05
    assert block["good"]["all"] < 0.80 and not block["meets_standard"]
    size = size_for_standard(cfg, wide, 200)
    assert size is not None and size["factor"] > 1 and size["good_all"] >= 0.80


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
    from pipeline.decision.criteria_controls import bad, good, power_block

    def estimate(truth: float):
        """A normal estimate around ``truth`` with an interval of ±0.1."""
        def draw(rng, sizes):
            v = float(rng.normal(truth, 0.05))
            return {"value": v, "ci_low": v - 0.1, "ci_high": v + 0.1}
        return draw

    # the spreads a val pilot would give (planted here)
    monkeypatch.setattr("pipeline.tools.controls.sizes_of", lambda args, params: planted())
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
    (stated,) = power_block(cfg, planted(), draws=20, search=False)["rules"]
    assert [c["case"] for c in stated["controls"]] == ["good", "bad"]


def test_the_guards_controls_draw_every_seed_and_are_judged_seed_by_seed():
    """A control of a metric judged per seed draws each seed's own block, and pass_rate judges
    them as the report does: one failing seed fails the rule, whatever the seeds' mean."""
    import numpy as np

    from pipeline.decision.criteria_controls import bad, good
    from pipeline.decision.metrics import judged_per_seed

    rng = np.random.default_rng(0)
    for metric in sorted(judged_per_seed() & set(CONTROLS)):
        control = CONTROLS[metric][0]
        three = control.draw(rng, planted(seeds=3, n_boot=100))
        assert sorted(three["seeds"]) == ["0", "1", "2"], metric
        assert all({"value", "ci_low", "ci_high"} <= set(b) for b in three["seeds"].values())
        one = control.draw(rng, planted(seeds=1, n_boot=100))
        assert "seeds" not in one and {"value", "ci_low", "ci_high"} <= set(one), metric

    def seeds(*values):
        def draw(rng, sizes):
            blocks = {str(i): {"value": v, "ci_low": v - 0.01, "ci_high": v + 0.01}
                      for i, v in enumerate(values)}
            return {"value": float(np.mean(values)), "seeds": blocks}
        return draw

    rule = Criterion(name="auc", metric="memorisation.transformer.membership_auc", op="<=",
                     threshold=0.65, judge="interval", rationale="r")
    assert pass_rate(rule, good("every seed at chance", seeds(0.5, 0.52, 0.48)), 5, 0,
                     planted()) == 1.0
    assert pass_rate(rule, bad("one seed memorises", seeds(0.5, 0.5, 0.8)), 5, 0,
                     planted()) == 0.0  # mean 0.6


def test_a_guard_judged_on_every_seed_resolves_a_stricter_effect():
    """Every one of 3 independent seeds must pass: each with 0.8^(1/3) = 92.8%, so the bound
    passes only a smaller true gap than on one seed; the refute rule fails once any seed does,
    each with 1 - 0.2^(1/3) = 41.5%, so it fails a value nearer its threshold."""
    from statistics import NormalDist

    from pipeline.decision.criteria_controls import resolved_effect

    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    bound = next(r for r in cfg.rules if r.name == "transformer_gap_bounded")
    leak = next(r for r in cfg.rules if r.name == "transformer_gap_not_negative")
    se, z = planted().gap_per_note_se, NormalDist().inv_cdf(0.975)
    assert resolved_effect(bound, planted(seeds=1)) == pytest.approx(
        0.5 - z * se - NormalDist().inv_cdf(0.8) * se)
    assert resolved_effect(bound, planted(seeds=3)) == pytest.approx(
        0.5 - z * se - NormalDist().inv_cdf(0.8 ** (1 / 3)) * se)
    assert resolved_effect(leak, planted(seeds=3)) == pytest.approx(
        0.0 - z * se - NormalDist().inv_cdf(1 - 0.2 ** (1 / 3)) * se)
    assert resolved_effect(leak, planted(seeds=3)) > resolved_effect(leak, planted(seeds=1))


def test_seeds_sharing_the_pieces_noise_match_the_closed_form_and_sit_between_the_extremes():
    """With the seeds' own spread measured, every seed's gap carries one shared draw of the
    pieces' noise: the gap bound passes 8 seeds as often as P(shared + largest seed's own <=
    room) says (:func:`per_seed_quantile`), more often than 8 independent seeds and less often
    than one seed; without the seeds' spread the seeds stay independent."""
    from dataclasses import replace
    from statistics import NormalDist

    from pipeline.decision.criteria_controls import (
        GOOD_MODEL,
        joint_rates,
        per_seed_quantile,
        resolved_effect,
    )

    cfg = CriteriaConfig(rules=[
        Criterion(name="gap", metric="generalisation.gap_per_note.transformer", op="<=",
                  threshold=0.5, judge="interval", rationale="r")])
    se, sd, z = 0.1, 0.03, NormalDist().inv_cdf(0.975)
    shared = planted(seeds=8, spreads=replace(SPREADS, gap_se_note=se, gap_seed_sd_note=sd))
    independent = planted(seeds=8, spreads=replace(SPREADS, gap_se_note=se))
    room = 0.5 - z * se - 0.2  # the good model's 0.2 passes when every seed's error fits in it
    grid = np.linspace(-8, 8, 4001)
    w = NormalDist().pdf
    closed = float(sum(w(u) * NormalDist().cdf((room - se * u) / sd) ** 8 for u in grid)
                   * (grid[1] - grid[0]))
    got = joint_rates(cfg, GOOD_MODEL, shared, 4000, seed=5)["all"]
    assert abs(got - closed) < 0.025
    one = NormalDist(0, se).cdf(room)
    apart = joint_rates(cfg, GOOD_MODEL, independent, 4000, seed=5)["all"]
    assert abs(apart - one ** 8) < 0.025 and one ** 8 < got < one
    # the closed form the power statement uses is the simulation's
    assert per_seed_quantile(closed, se, sd, 8) == pytest.approx(room, abs=1e-6)
    assert per_seed_quantile(0.8, se, None, 8) == pytest.approx(
        NormalDist().inv_cdf(0.8 ** (1 / 8)) * se)
    assert per_seed_quantile(0.8, se, 0.0, 8) == pytest.approx(NormalDist().inv_cdf(0.8) * se)
    bound = cfg.rules[0]
    assert resolved_effect(bound, shared) == pytest.approx(
        0.5 - z * se - per_seed_quantile(0.8, se, sd, 8))
    assert resolved_effect(bound, planted(seeds=1)) > resolved_effect(bound, shared) > \
        resolved_effect(bound, independent)


def test_with_the_pieces_fixed_more_samples_per_seed_can_meet_the_standard():
    """Judged on every seed, 8 seeds sharing 256 samples leave each seed 32, too few to clear
    the copying margin on all of them; the recipe can draw more samples without more music,
    and :func:`within_corpus` finds how many; a rule that more samples cannot help is named."""
    from pipeline.decision.criteria_controls import within_corpus

    cfg = CriteriaConfig(rules=[
        Criterion(name="copies", metric="memorisation.transformer.flag_excess", op="<=",
                  threshold=0.1, judge="interval", rationale="r")])
    sizes = planted(seeds=8)
    found = within_corpus(cfg, sizes, 100, seed=2)
    assert found["meets_standard"] and found["samples_factor"] > 1
    assert found["samples"] == round(256 * found["samples_factor"])
    assert found["held_out_pieces"] == sizes.membership_test  # the pieces as they are
    gain = CriteriaConfig(rules=[
        Criterion(name="gain", metric="test.nll_per_note.rel_improvement", op=">=",
                  threshold=0.02, judge="interval", rationale="r")])
    wide = planted(seeds=8, spreads=Spreads(**{**SPREADS.to_dict(), "gain_se_groups": 0.04}))
    stuck = within_corpus(gain, wide, 100, seed=2)
    assert not stuck["meets_standard"] and stuck["limited_by"] == ["gain"]


def test_size_lines_ask_for_a_larger_design_only_when_the_good_model_misses():
    """A design whose good model meets 80% but whose bad model passes too often needs no larger
    design (more pieces would not fail the bad model more): no size line. A good model that
    misses, with no larger design found, says so."""
    from pipeline.decision.criteria_controls import size_lines

    bad_misses = {"joint": {"good": {"all": 0.83}, "meets_standard": False},
                  "size_for_standard": None}
    assert size_lines(bad_misses) == []
    good_misses = {"joint": {"good": {"all": 0.70}, "meets_standard": False},
                   "size_for_standard": None}
    [line] = size_lines(good_misses)
    assert "only at a larger design: none up to 32 times" in line


def test_size_lines_say_when_no_single_rule_holds_the_good_model_back():
    """Each rule passing 80% alone can still leave all together below it: the line says the
    misses add up rather than naming nothing, and gives its draws."""
    from pipeline.decision.criteria_controls import size_lines

    within = {"samples": 16384, "samples_factor": 4.0, "seeds": 24, "good_all": 0.75,
              "meets_standard": False, "limited_by": [], "rules": {"a": 0.9}, "draws": 100}
    lines = size_lines({"joint": {"good": {"all": 0.72}}, "within_corpus": within,
                        "size_for_standard": None})
    assert "(100 draws)" in lines[0] and "no rule alone" in lines[0]
    assert "held back by ," not in lines[0] and not lines[0].endswith("held back by ")
    del within["draws"]  # a power block stated before amendment 2 did not record them
    lines = size_lines({"joint": {"good": {"all": 0.72}}, "within_corpus": within,
                        "size_for_standard": None})
    assert "draws" not in lines[0] and "reaches 80%: at best" in lines[0]


def test_designs_are_simulated_on_common_random_numbers():
    """A metric whose sizes two designs share is drawn the same in both, so more samples move
    only the rules that read samples (with one generator for every metric, the samples'
    draws shifted every later metric's)."""
    from pipeline.decision.criteria_controls import GOOD_MODEL, joint_rates

    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    base = planted(seeds=3)
    one = joint_rates(cfg, GOOD_MODEL, base, 40, seed=3)
    more = joint_rates(cfg, GOOD_MODEL, base.scaled(1.0, 3, 4.0), 40, seed=3)
    for rule in ("transformer_beats_ngram", "transformer_gap_bounded",
                 "transformer_membership_near_chance", "transformer_samples_human_like"):
        assert one["rules"][rule] == more["rules"][rule], rule
