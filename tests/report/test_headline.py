"""The report's first screen (pipeline.report.headline): the experiment's identity rows, the
decision sentence, the evidence of each criterion in words, and the rows of the headline
figure; and the first screen as the report stage lays it out."""

from __future__ import annotations

import re

import pytest

from pipeline.core import artifacts
from pipeline.decision.criteria import Verdict
from pipeline.render.document import NA
from pipeline.report.headline import decision_sentence, experiment_rows, gain_rows
from tests.stages.test_report import make_inputs, register, report, write_params

GAIN = "eval.paired.ngram_minus_transformer.{}.rel_improvement"


def _verdict(status: str) -> Verdict:
    return Verdict("r", status, "m", 1.0, ">=", 0.0, "m", None, None, "generic.")


def test_the_experiment_rows_name_corpus_split_tokenizer_models_and_registration():
    metrics = {"data.pieces_ok": 30, "data.pieces_quarantined": 2, "data.pieces_duplicate": 1,
               "split.hash": "abcdef0123456789", "tokenize.tokenizer": "REMI",
               "tokenize.model": "BPE", "tokenize.vocab_size": 1000,
               "tokenize.base_vocab_size": 486, "ngram.best_order": 5,
               "train.params.total": 2_500_000, "eval.seeds.transformer.0": 11,
               "eval.seeds.transformer.1": 12}
    rows = dict(map(tuple, experiment_rows(
        {"corpus": {"source": "maestro"}, "ngram": {"smoothing": "kneser_ney"}}, metrics,
        {"test": (10, 5), "train": (40, 20), "val": (5, 3)}, "FOLLOWED")))
    assert list(rows) == ["corpus", "split", "tokenizer", "models", "registration"]
    assert rows["corpus"] == "maestro: 30 pieces (2 quarantined, 1 byte duplicates set aside)"
    assert rows["split"] == ("train 40 / val 5 / test 10 pieces in 20 / 3 / 5 groups; split "
                             "hash abcdef012345")
    assert rows["tokenizer"] == "REMI + BPE, 1000 tokens (base 486)"
    assert rows["models"] == ("5-gram (kneser_ney); transformer of 2.50 M parameters, 2 "
                              "training seeds (11, 12)")
    assert rows["registration"] == "FOLLOWED"


def test_the_experiment_rows_of_nothing_say_not_available():
    rows = dict(map(tuple, experiment_rows({}, {}, {}, "NOT REGISTERED")))
    assert rows["corpus"] == f"{NA}: {NA} pieces"
    assert rows["split"].startswith(f"{NA}; split hash ")
    assert rows["tokenizer"] == NA
    assert rows["models"] == f"n-gram: {NA}; transformer: {NA}"


@pytest.mark.parametrize(("statuses", "counted"), [
    ([], "Of 0 criteria, none is judged."),
    (["PASS"], "Of 1 criteria, 1 pass."),
    (["INCONCLUSIVE"], "Of 1 criteria, 1 is inconclusive."),
    (["PASS", "INCONCLUSIVE", "INCONCLUSIVE"], "Of 3 criteria, 1 pass and 2 are inconclusive."),
    (["FAIL", "PASS", "FAIL"], "Of 3 criteria, 1 pass and 2 fail."),
])
def test_the_decision_sentence_counts_the_verdicts(statuses, counted):
    assert decision_sentence("PASS", [_verdict(s) for s in statuses]).endswith(counted)


def test_the_decision_sentence_explains_each_status_and_what_the_rules_give():
    verdicts = [_verdict("PASS")]
    assert decision_sentence("PASS", verdicts, "PASS") == (
        "Decision: PASS. Every registered criterion passes. Of 1 criteria, 1 pass.")
    looked = decision_sentence("FOLLOWED AFTER 2 LOOKS", verdicts, "PASS")
    assert looked.startswith("Decision: FOLLOWED AFTER 2 LOOKS. The registration is followed, "
                             "but the test pieces were scored before it was made")
    assert "The registered rules give PASS." in looked
    assert "differs from its registration" in decision_sentence("DEVIATED", verdicts, "FAIL")
    assert "not frozen before scoring" in decision_sentence("NOT REGISTERED", verdicts)


def test_gain_rows_are_the_scored_splits_with_a_whole_interval_and_each_seed():
    m = {"eval.seeds.transformer.0": 1, "eval.seeds.transformer.1": 2,
         **{f"{GAIN.format('test')}.{k}": v
            for k, v in (("value", 0.05), ("ci_low", 0.01), ("ci_high", 0.09))},
         f"{GAIN.format('test')}.per_seed.1": 0.06, f"{GAIN.format('test')}.per_seed.2": 0.04,
         "eval.paired.ngram_minus_transformer.test.n_pieces": 10,
         "eval.models.transformer.test.n_groups": 5,
         f"{GAIN.format('val')}.value": 0.02, f"{GAIN.format('val')}.ci_low": 0.0}  # no ci_high
    (row,) = gain_rows(m)
    assert (row.arm, row.design, row.value, row.ci_low, row.ci_high, row.seeds) == (
        "test", "10 pieces, 5 groups", 0.05, 0.01, 0.09, (0.06, 0.04))
    assert gain_rows({}) == []


def test_plain_evidence_for_each_kind_of_criterion():
    from pipeline.decision.criteria import Verdict
    from pipeline.report.headline import decision_sentence, plain_evidence

    m = {"ngram.best_order": 5, "eval.seeds.transformer.0": 1, "eval.seeds.transformer.1": 2,
         "eval.paired.ngram_minus_transformer.test.n_pieces": 52,
         "eval.models.transformer.test.n_groups": 36,
         "eval.paired.ngram_minus_transformer.test.rel_improvement.per_seed.1": 0.1,
         "eval.paired.ngram_minus_transformer.test.rel_improvement.per_seed.2": 0.08,
         "leakage.independent.test_pieces": 52,
         "audit.judged.transformer.membership_auc.n_train": 64,
         "audit.judged.transformer.membership_auc.n_test": 52,
         "audit.judged.transformer.quality.n_stats": 7,
         "audit.judged.transformer.quality.stats.polyphony.inside": False}

    def v(metric, value, status, op=">=", threshold=0.02, lo=None, hi=None):
        return Verdict("r", status, metric, value, op, threshold, metric, lo, hi, "generic.")

    gain = plain_evidence(v("test.nll_per_note.rel_improvement", 0.09, "INCONCLUSIVE",
                            lo=0.01, hi=0.12), m, {}, 0.95)
    assert gain == ("The transformer's NLL per note is 9.0% lower than the 5-gram's (95% CI "
                    "1.0% to 12.0%) on 52 test pieces in 36 groups, 2 training seeds (each "
                    "seed: 10.0%, 8.0%); the rule asks for a gain of at least 2%: the interval "
                    "straddles the threshold, so the data cannot tell.")
    assert "6 of 52 test pieces" in plain_evidence(
        v("leakage.test_near_train", 6, "FAIL", "==", 0), m, {}, 0.95)
    assert "The rule allows none: it fails the rule." in plain_evidence(
        v("leakage.test_near_train", 6, "FAIL", "==", 0), m, {}, 0.95)
    auc = plain_evidence(v("memorisation.transformer.membership_auc", 0.94, "FAIL", "<=", 0.6,
                           0.89, 0.98), m, {}, 0.95)
    assert "64 training pieces from 52 unseen test pieces with AUC 0.94" in auc
    assert "at most 0.6: no value in the interval meets the rule" in auc
    held = {**m, "audit.judged.transformer.membership_auc.n_heldout": 72,
            "audit.judged.transformer.membership_auc.tpr.value": 0.71,
            "audit.judged.transformer.membership_auc.tpr.fpr": 0.1}
    auc = plain_evidence(v("memorisation.transformer.membership_auc", 0.86, "FAIL", "<=", 0.65,
                           0.81, 0.9), held, {}, 0.95)
    assert "from 72 unseen val and test pieces with AUC 0.86" in auc
    assert "calling at most 10% of the unseen pieces members, it picks out 71%" in auc
    tpr = plain_evidence(v("memorisation.transformer.membership_tpr", 0.71, "FAIL", "<=", 0.3,
                           0.55, 0.79), held, {}, 0.95)
    assert tpr.startswith("Calling at most 10% of 72 unseen val and test pieces members")
    gap = plain_evidence(v("generalisation.gap_per_note.transformer", 0.66, "INCONCLUSIVE",
                           "<=", 0.5, 0.35, 1.0),
                         {**m, "eval.gap.transformer.n_pieces_heldout": 72,
                          "eval.gap.transformer.n_pieces_train": 256}, {}, 0.95)
    assert gap.startswith("Held-out music costs 0.66 nats per note more than training music (72 "
                          "held-out (val and test) against 256 training pieces; 95% CI 0.35 to "
                          "1.00)")
    quality = plain_evidence(v("quality.transformer.score", 4 / 7, "FAIL", ">=", 0.7), m, {},
                             0.95)
    assert quality.startswith("4 of 7 music statistics") and "(outside: polyphony)" in quality
    assert "needs at least 5" in quality
    assert plain_evidence(v("some.other.metric", 1.0, "PASS"), m, {}, 0.95) == "generic."
    assert plain_evidence(v("test.nll_per_note.rel_improvement", None, "INCONCLUSIVE"), m, {},
                          0.95) == "generic."
    verdicts = [v("a", 1, "PASS"), v("b", 1, "FAIL"), v("c", 1, "INCONCLUSIVE")]
    assert decision_sentence("FAIL", verdicts).endswith(
        "Of 3 criteria, 1 pass, 1 fail and 1 is inconclusive.")

def test_plain_evidence_of_a_guard_judged_on_every_seed_names_each_seed():
    from pipeline.decision.criteria import Criterion, evaluate
    from pipeline.decision.metrics import seed_metrics
    from pipeline.report.headline import plain_evidence

    def verdict(metric, op, threshold, blocks):
        rule = Criterion(name="r", metric=metric, op=op, threshold=threshold, judge="interval",
                         rationale="why")
        m = {}
        for seed, (value, lo, hi) in blocks.items():
            m.update(seed_metrics(metric, seed, {"value": value, "ci_low": lo, "ci_high": hi}))
        return evaluate(rule, m)

    auc = plain_evidence(verdict("memorisation.transformer.membership_auc", "<=", 0.65,
                                 {"1234": (0.88, 0.84, 0.92), "1236": (0.72, 0.66, 0.78)}),
                         {}, {}, 0.95)
    assert auc == ("The transformer's membership AUC (0.5 is chance), judged on each of its 2 "
                   "training seeds alone, since the rule (at most 0.65) must hold for every "
                   "one: seed 1234 0.88 (95% CI 0.84 to 0.92), FAIL; seed 1236 0.72 (95% CI "
                   "0.66 to 0.78), FAIL; seed 1234 fails, so the rule fails.")
    flags = plain_evidence(verdict("memorisation.transformer.flag_excess", "<=", 0.1,
                                   {"1": (-0.02, -0.08, 0.04), "2": (0.03, -0.04, 0.11)}),
                           {}, {}, 0.95)
    assert "(at most 10 points)" in flags and "seed 2 +3.0 (95% CI -4.0 to +11.0)" in flags
    assert flags.endswith("no seed fails, but seed 2 does not pass, so the data cannot tell.")
    gap = plain_evidence(verdict("generalisation.gap_per_note.transformer", "<=", 0.5,
                                 {"1": (0.2, 0.1, 0.3), "2": (0.25, 0.1, 0.4)}), {}, {}, 0.95)
    assert gap.startswith("Held-out less training NLL of the transformer, nats per note")
    assert gap.endswith("every seed passes, so the rule passes.")


def test_plain_evidence_for_copying_extraction_and_the_quality_band():
    from pipeline.report.headline import plain_evidence

    j = "audit.judged.transformer"
    m = {f"{j}.flag_rate.value": 0.03, f"{j}.flag_rate.human.value": 0.05,
         f"{j}.flag_rate.n": 256, f"{j}.extraction_rate.train.value": 0.1,
         f"{j}.extraction_rate.test.value": 0.0, f"{j}.quality.n_stats": 7,
         f"{j}.quality.stats.polyphony.inside": False,
         f"{j}.quality.stats.pitch_range.inside": True,
         "quality.transformer.score": 5 / 7, "quality.transformer.score_band_low": 4 / 7}
    params = {"audit": {"extraction_prefix": 32, "extraction_tokens": 64}}

    def v(metric, value, status, lo=None, hi=None, op="<=", threshold=0.05):
        return Verdict("r", status, metric, value, op, threshold, metric, lo, hi, "generic.")

    flags = plain_evidence(v("memorisation.transformer.flag_excess", -0.02, "PASS", -0.05, 0.01),
                           m, params, 0.95)
    assert flags == ("3.0% of 256 transformer samples are flagged as copying training music, "
                     "against 5.0% of held-out human windows: 2.0 points less (95% CI -5.0 to "
                     "+1.0 points); the rule allows at most 5 points more: the whole interval "
                     "meets the rule.")
    extraction = plain_evidence(v("memorisation.transformer.extraction_excess", 0.1, "FAIL",
                                  0.05, 0.15), m, params, 0.95)
    assert extraction.startswith("Given the first 32 tokens of a piece, the transformer "
                                 "continued the next 64 exactly for 10.0% of training pieces "
                                 "and 0.0% of unseen test pieces, an excess of +10.0 points")
    assert extraction.endswith("no value in the interval meets the rule.")
    band = plain_evidence(v("quality.transformer.margin", 1 / 7, "PASS", op=">=", threshold=0.0),
                          m, params, 0.95)
    assert band == ("5 of 7 music statistics of the transformer's samples lie inside the band "
                    "of held-out human music (outside: polyphony); held-out human sets of the "
                    "same size have at least 4 inside in all but the calibrated share of draws, "
                    "and the rule needs as many: it meets the rule.")
    # a metric of the family without its maker keeps the generic sentence
    assert plain_evidence(v("memorisation.transformer.other", 1.0, "PASS"), m, params,
                          0.95) == "generic."


# ---- the first screen, as the report stage lays it out ---------------------------------------
def test_first_screen_names_the_experiment_the_decision_and_why(tmp_path):
    p = make_inputs(tmp_path)
    ev = artifacts.read_json(p.eval)
    ev["paired"]["ngram_minus_transformer"]["test"]["rel_improvement"] = {
        "value": 0.05, "ci_low": 0.02, "ci_high": 0.08}
    artifacts.write_json(p.eval, ev)
    params = write_params(tmp_path)
    register(tmp_path, params, p, force=True)
    report(tmp_path, params, p)
    md = p.md_out.read_text()
    first = md[:md.index("## The criteria")]
    # identity, then the decision sentence, then the table of verdicts with words
    assert first.index("| split | train 2 / val 1 / test 10 pieces in 1 / 1 / 5 groups") < \
        first.index("Decision: FOLLOWED AFTER 1 LOOK.") < \
        first.index("| criterion | verdict | evidence |")
    assert "The registered rules give PASS." in first
    row = next(line for line in first.splitlines() if line.startswith("| transformer_beats"))
    assert "The transformer's NLL per note is 5.0% lower than the n-gram's" in row
    assert "test.nll_per_note.rel_improvement is" not in row  # words, not a dotted key
    # the headline figure has its alt text and caption in HTML
    html = p.html_out.read_text()
    assert re.search(r'<img alt="The transformer&#x27;s NLL per note, relative to', html)
