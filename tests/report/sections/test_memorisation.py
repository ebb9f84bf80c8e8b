"""The report's memorisation audit section (pipeline.report.sections.memorisation): thresholds,
the audited groups, flag rate, extraction and membership per model and per training seed, and the
histogram of the longest shared runs."""

from __future__ import annotations

import pandas as pd

from pipeline.core import artifacts
from pipeline.render.document import NA, Document, Figure
from pipeline.report.sections import memorisation
from tests.report.test_context import make_context, rendered

AUDIT = {"thresholds": {"lcs_tokens": 20.0, "nn_jaccard": 0.5},
         "human": {"test": {"n": 5, "flag_rate": 0.1}},
         "samples": {"ngram": {"all": {"n": 4, "flag_rate": 0.25}}, "all": {"n": 99}},
         "flag_rate": {"samples": 0.25, "human_test": 0.1, "excess": 0.15},
         "extraction": {"ngram": {"train_exact": 0.5, "test_exact": 0.0}},
         "membership": {"ngram": {"auc": 0.6, "n_train": 8, "n_test": 7}}}


def _seeds() -> dict:
    per_seed = {str(s): {"membership_auc": {"value": auc, "ci_low": 0.5, "ci_high": 0.7,
                                            "tpr": {"value": 0.2}},
                         "extraction_rate": {"train": {"value": 0.1},
                                             "excess": {"ci_low": -0.1, "ci_high": 0.2}},
                         "flag_rate": {"excess": {"ci_low": -0.05, "ci_high": 0.08}}}
                for s, auc in ((12, 0.62), (3, 0.58))}
    return {"transformer": {"per_seed": per_seed, "seeds": [3, 12]}}


def test_without_the_audit_it_is_not_available(tmp_path):
    md = rendered(memorisation.render, make_context(tmp_path))
    assert md.endswith(f"## Memorisation audit\n\n_reports/audit.json: {NA}._\n")


def test_thresholds_groups_flag_rate_extraction_and_membership(tmp_path):
    md = rendered(memorisation.render, make_context(tmp_path, reports={"audit": AUDIT}))
    assert "| lcs_tokens | 20 |" in md and "| nn_jaccard | 0.5 |" in md
    groups = [line.split("|")[1].strip() for line in md.splitlines()
              if line.startswith(("| human", "| samples"))]
    assert groups == ["human val", "human test", "samples ngram"]  # "all" is no model
    assert f"| human val | {' | '.join([NA] * 10)} |" in md  # the val group, not audited
    assert f"| human test | 5 | 0.1 | {NA} |" in md and f"| samples ngram | 4 | 0.25 | {NA} |" in md
    assert "Flag rate: samples 0.25 vs human test pieces 0.1 (excess 0.15)." in md
    assert f"| ngram | 0.5 | 0 | {NA} |" in md  # extraction: train, test exact, no gap given
    assert f"| ngram | 0.6 | {NA} | {NA} | 8 | 7 |" in md  # held-out: n_test without n_heldout
    assert "training seed" not in md  # no per-seed block


def test_per_seed_rows_in_seed_order_judged_one_by_one(tmp_path):
    md = rendered(memorisation.render, make_context(
        tmp_path, reports={"audit": {**AUDIT, "judged": _seeds()}}))
    rows = [line for line in md.splitlines() if line.startswith("| transformer |")]
    assert [r.split("|")[2].strip() for r in rows] == ["3", "12"]  # numerically, not as text
    assert rows[0] == ("| transformer | 3 | 0.58 | 0.5 to 0.7 | 0.2 | 0.1 | -0.1 to 0.2 | "
                       "-0.05 to 0.08 |")
    assert "the criteria judge each guard on every seed alone" in md


def test_the_histogram_of_shared_runs_from_the_per_sample_table(tmp_path):
    ctx = make_context(tmp_path, reports={"audit": AUDIT})
    artifacts.write_parquet(ctx.inputs["per_sample"], pd.DataFrame({
        "model": ["human", "human", "ngram"], "kind": ["test", "val", "unconditional"],
        "lcs_tokens": [5.0, 6.0, 30.0]}))
    doc = Document("t")
    memorisation.render(doc, ctx)
    (fig,) = [b for b in doc.blocks if isinstance(b, Figure)]
    assert fig.png[:4] == b"\x89PNG" and "Longest run of tokens" in fig.caption
    artifacts.write_parquet(ctx.inputs["per_sample"], pd.DataFrame({"model": ["human"]}))
    doc = Document("t")
    memorisation.render(doc, ctx)
    assert not any(isinstance(b, Figure) for b in doc.blocks)  # columns missing: no figure
