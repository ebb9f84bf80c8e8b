"""The report stage (pipeline.stages.report): the decision under the registration, and the report
as a pure function of its input files.

:func:`make_inputs`, :func:`register` and :func:`report` build a small, complete set of stage
outputs and run the registration and the report on them as `dvc repro` would; the tests of the
registration (tests/decision/, tests/tools/test_preregister.py) and of the report's sections
(tests/report/) use them too."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from dataclasses import fields
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import yaml

from pipeline.cli import main as cli
from pipeline.core import artifacts
from pipeline.core.config import load_section, read_params
from pipeline.core.splits import split_hash
from pipeline.decision import ledger
from pipeline.render.audio import notes_to_midi
from pipeline.render.figures import piano_roll_png
from pipeline.stages.audit import SPANS_SCHEMA
from pipeline.stages.report import ReportConfig, ReportPaths, run
from pipeline.tools.preregister import run as preregister

RULES = [
    {"name": "transformer_beats_ngram", "metric": "test.nll_per_note.rel_improvement", "op": ">=",
     "threshold": 0.02, "ci": "lower>0", "ci_metric": "test.nll_per_note.diff",
     "rationale": "better by 2%"},
    {"name": "no_crossing_groups", "metric": "leakage.crossing_groups", "op": "==",
     "threshold": 0, "rationale": "no leak"},
    {"name": "memorisation_at_human_level", "metric": "memorisation.flag_rate_excess",
     "op": "<=", "threshold": 0.05, "rationale": "no copying"},
]
EVALUATE = {"n_boot": 200, "ci_level": 0.95, "seed": 7}


def write_params(root: Path, rules=RULES, evaluate=EVALUATE) -> Path:
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump({"evaluate": evaluate, "criteria": {"rules": rules},
                                    "report": {"title": "test report"}}, sort_keys=False))
    return path


TEST_PIECES = [f"{i:04d}" for i in range(10)]
SPLITS = pd.DataFrame({"sha256": ["a", "b", "c", *TEST_PIECES],
                       "group_id": ["g1", "g1", "g2", *[f"t{i // 2}" for i in range(10)]],
                       "split": ["train", "train", "val", *["test"] * 10]})
SPLIT = split_hash(SPLITS["sha256"], SPLITS["split"])
GIT_SHOWS_ORDER = {"git": True, "registration_commit": "c0ffee" * 6 + "0000",
                   "results_commit": None, "registration_uncommitted": False,
                   "results_uncommitted": True, "registration_precedes_results": True,
                   "ledger_rewritten": None}
"""git's facts (the report stage's sidecar) for a registration committed before the results."""
HISTORY_CHECKED = {"checked": True, "why_not": None, "ledger_versions": 0, "ledger_problems": [],
                   "registrations": []}
"""What :func:`pipeline.decision.trail.scan` says of a history with nothing in it to object to."""


def paths_in(root: Path) -> ReportPaths:
    return ReportPaths(**{f.name: root / f.default for f in fields(ReportPaths)})


def make_inputs(root: Path) -> ReportPaths:
    """A complete, small set of stage outputs in their default layout under ``root``."""
    p = paths_in(root)
    rng = np.random.default_rng(0)
    artifacts.write_json(p.ingest, {"by_status": {"ok": 30, "quarantined": 2, "duplicate": 1}})
    artifacts.write_json(p.split, {"pieces": 30, "groups": 12, "split_hash": SPLIT})
    artifacts.write_json(p.leakage, {"grouped_crossing_groups": 0, "grouped_crossing_pairs": 0})
    artifacts.write_json(p.train, {"best_val_loss": 1.4, "final_train_loss": 1.2,
                                   "tokens": 123456, "steps": 50, "params": {"total": 1000}})
    artifacts.write_json(p.eval, {
        "protocol": {"units": "nats", "bootstrap": {"n_boot": 200}},
        "models": {m: {"test": {"nats_per_note": {"value": v, "ci_low": v - 0.1,
                                                  "ci_high": v + 0.1}}}
                   for m, v in (("ngram", 2.0), ("transformer", 1.9))},
        "paired": {"ngram_minus_transformer": {"test": {"nats_per_note": {
            "value": 0.1, "ci_low": 0.04, "ci_high": 0.16}}}}})
    artifacts.write_json(p.audit, {
        "thresholds": {"lcs_tokens": 20.0}, "flag_rate": {"samples": 0.1, "human_test": 0.1,
                                                          "excess": 0.0},
        "human": {"test": {"n": 5, "flag_rate": 0.1}}, "samples": {"ngram": {"all": {"n": 4}}},
        "music": {"test": {"pitch_range": 12.0}, "ngram": {"pitch_range": 10.0}},
        "extraction": {"ngram": {"train_exact": 0.5, "test_exact": 0.0}},
        "membership": {"ngram": {"auc": 0.6, "n_train": 8, "n_test": 8}}})
    per_piece = pd.DataFrame({"sha256": [f"{i:04d}" for i in range(10)] * 2,
                              "split": "test", "model": ["ngram"] * 10 + ["transformer"] * 10,
                              "nll_nats": rng.uniform(50, 100, 20), "n_tokens": 100,
                              "n_notes": 40, "duration_s": 30.0})
    artifacts.write_parquet(p.per_piece, per_piece)
    per_sample = pd.DataFrame({"source": ["human"] * 3 + ["sample"] * 2,
                               "model": ["human"] * 3 + ["ngram"] * 2,
                               "kind": ["test"] * 3 + ["unconditional"] * 2,
                               "lcs_tokens": [5.0, 7.0, 9.0, 30.0, 12.0],
                               "decode_ok": [True] * 4 + [False],
                               "index": [0, 1, 2, 0, 1], "nn_sha256": ["a"] * 5,
                               "nn_jaccard": [0.1] * 5, "lcs_bars": [0.0, 1.0, 1.0, 4.0, 2.0],
                               "lcs_train_sha256": ["a"] * 5})
    artifacts.write_parquet(p.per_sample, per_sample)
    side = {"model": "ngram", "kind": "unconditional", "index": 0, "length": 30}
    artifacts.write_parquet(p.spans, pa.Table.from_pylist([
        {**side, "side": "sample", "sha256": None, "start": 2, "onset": [0.0, 1.0, 2.0, 3.0],
         "duration": [1.0] * 4, "pitch": [60, 62, 64, 65], "in_span": [False, True, True, False]},
        {**side, "side": "train", "sha256": "a", "start": 40,
         "onset": [0.0, 4.0, 5.0, 6.0, 7.0, 30.0], "duration": [1.0] * 6,
         "pitch": [50, 52, 62, 64, 66, 70], "in_span": [False, False, True, True, False, False]},
    ], schema=SPANS_SCHEMA))
    p.train_log.parent.mkdir(parents=True, exist_ok=True)
    p.train_log.write_text("step\ttrain_loss\tval_loss\n0\t3.0\t3.1\n10\t2.0\t\n20\t1.5\t1.6\n")
    artifacts.write_bytes(p.samples_dir / "ngram_unconditional_0.png", piano_roll_png(
        {"onset": np.arange(4.0), "duration": np.ones(4), "pitch": np.array([60, 62, 64, 65])}))
    buf = io.BytesIO()
    notes_to_midi({"onset": np.arange(4.0), "duration": np.ones(4),
                   "pitch": np.array([60, 62, 64, 65])}).write(buf)
    artifacts.write_bytes(p.samples_dir / "ngram_unconditional_0.mid", buf.getvalue())
    artifacts.write_parquet(p.manifest, pd.DataFrame({
        "sha256": ["a", "b", "c"], "status": ["ok", "quarantined", "duplicate"],
        "reason": ["", "no_notes", "exact"], "licence": ["CC0", "CC0", "PD"]}))
    artifacts.write_parquet(p.splits, SPLITS)
    artifacts.write_parquet(p.pairs, pd.DataFrame({"a": ["a"], "b": ["c"], "tier": ["note"],
                                                   "similarity": [1.0]}))
    artifacts.write_parquet(p.notes, pd.DataFrame({
        "sha256": ["a", "c"], "onset": [[0.0, 1.0], [0.0, 1.0]], "duration": [[1.0, 1.0]] * 2,
        "pitch": [[60, 62], [60, 62]]}))
    artifacts.write_json(p.env, {"git_commit": "deadbeef", "params_sha256": "0" * 64,
                                 "environment": {"packages": artifacts.package_versions()},
                                 "git": GIT_SHOWS_ORDER, "history": HISTORY_CHECKED})
    return p


def report(root: Path, params: Path, p: ReportPaths, *, look: bool = True):
    """Report as `dvc repro` would: evaluate has recorded its look at the test scores under the
    registration in force (``look``), then the report runs."""
    with contextlib.chdir(root):
        table = artifacts.read_table_or_none(p.per_piece)
        if look and table is not None:
            ledger.record_look(table, artifacts.read_json_or_none(p.preregistration), p.ledger)
        return run(load_section("report", params, ReportConfig), read_params(params), p)


def register(root: Path, params: Path, p: ReportPaths, *, before_scores: bool = False, **kw):
    """``symkit preregister`` in ``root``; ``before_scores``: as before `dvc repro evaluate`
    (no eval.json, no per-piece table)."""
    missing = root / "missing"
    with contextlib.chdir(root):
        return preregister(params, split_report=p.split, splits=p.splits,
                           eval_report=missing / "eval.json" if before_scores else p.eval,
                           per_piece=missing / "per_piece.parquet" if before_scores
                           else p.per_piece, ledger_path=p.ledger, out=p.preregistration, **kw)


def without_test_scores(p: ReportPaths) -> None:
    """As before `dvc repro evaluate`: no eval.json yet (restored by make_inputs)."""
    p.eval.unlink()


def outputs(p: ReportPaths) -> dict[str, bytes]:
    return {q.name: q.read_bytes() for q in (p.metrics_out, p.md_out, p.html_out)}


def test_registered_report_passes_and_is_a_pure_function_of_its_inputs(tmp_path):
    a = tmp_path / "a"
    p = make_inputs(a)
    params = write_params(a)
    rec = register(a, params, p, before_scores=True)
    assert rec["identity"]["split_hash"] == SPLIT and not rec["forced"]
    assert rec["identity"]["pieces"] == {"test": TEST_PIECES, "val": ["c"]}
    assert rec["identity"]["params"]["evaluate"] == EVALUATE
    assert rec["identity"]["packages"]["numpy"] == np.__version__
    s = report(a, params, p)
    assert s.decision == "PASS" and s.n_deviations == 0
    first = outputs(p)
    report(a, params, p)
    assert outputs(p) == first
    shutil.copytree(a, tmp_path / "b")  # same files elsewhere: same bytes (no absolute paths)
    report(tmp_path / "b", tmp_path / "b" / "params.yaml", paths_in(tmp_path / "b"))
    assert outputs(paths_in(tmp_path / "b")) == first

    metrics = artifacts.read_json(p.metrics_out)
    assert metrics["decision.overall"] == "PASS"
    assert metrics["decision.registration"] == "FOLLOWED"
    assert metrics["decision.criteria.no_crossing_groups"] == "PASS"
    assert metrics["test.nll_per_note.rel_improvement"] == pytest.approx(0.05)
    html = p.html_out.read_text()
    assert "data:image/png;base64," in html
    assert "http://" not in html and "https://" not in html and "<script" not in html
    md = p.md_out.read_text()
    assert "all match the registration" in md and "| transformer_beats_ngram |" in md
    assert "The registration was committed in c0ffeec0ffee; the results are not committed" in md
    assert "](samples/ngram_unconditional_0.png)" in md
    assert "CC0" in md
    # the commit being reported on and timings stay in the sidecars, never in the report
    assert "deadbeef" not in md and "compute time" not in md


def test_missing_registration_is_not_registered(tmp_path):
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    s = report(tmp_path, params, p)
    assert s.decision == "NOT REGISTERED"
    assert artifacts.read_json(p.metrics_out)["decision.registration"] == "NOT REGISTERED"
    md = p.md_out.read_text()
    assert "Decision: NOT REGISTERED." in md and "Not registered" in md
    # the verdicts are still shown, judged from params.yaml
    assert "| transformer_beats_ngram |" in md


def _deviations(tmp_path: Path, change) -> tuple[str, list[str], str]:
    """Register, apply ``change(params_dict, paths)``, report; -> (decision, deviations, md)."""
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    register(tmp_path, params, p, before_scores=True)
    data = yaml.safe_load(params.read_text())
    change(data, p)
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    s = report(tmp_path, params, p)
    md = p.md_out.read_text()
    devs = [line for line in md.splitlines() if line and line in
            md.split("## Deviations from the registration")[-1].split("\n## ")[0]]
    return s.decision, devs, md


def test_a_criterion_loosened_after_registration_is_deviated_and_not_used(tmp_path):
    def loosen(data, p):
        data["criteria"]["rules"][2]["threshold"] = 0.5
        artifacts.write_json(p.audit, {**artifacts.read_json(p.audit),
                                       "flag_rate": {"excess": 0.3}})

    decision, devs, md = _deviations(tmp_path, loosen)
    assert decision == "DEVIATED"
    assert any("criterion 'memorisation_at_human_level'.threshold: registered 0.05, now 0.5"
               in d for d in devs)
    # the registered rule judges: an excess of 0.3 fails "<= 0.05" (it would pass "<= 0.5")
    row = next(line for line in md.splitlines() if line.startswith("| memorisation_at_human"))
    assert "<= 0.05" in row and "FAIL" in row
    # prominent: named by the decision sentence, listed right after the verdicts, before the
    # figures and the criteria (the verdicts stay on the first screen)
    assert md.index("Decision: DEVIATED.") < md.index("## Decision") \
        < md.index("## Deviations from the registration") < md.index("## The criteria")


def test_cli_preregister_and_report(tmp_path, monkeypatch, capsys):
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    monkeypatch.chdir(tmp_path)  # CLI defaults are relative to the repository root
    assert cli(["preregister", "--params", str(params)]) == 1  # test scores exist
    assert "these 10 test pieces were already scored or registered (1 look" in \
        capsys.readouterr().err
    without_test_scores(p)
    p.per_piece.unlink()
    p.ledger.unlink()  # preregister recorded the look it found: start again before it
    assert cli(["preregister", "--params", str(params)]) == 0
    make_inputs(tmp_path)
    ledger.record_look(pd.read_parquet(p.per_piece), artifacts.read_json(p.preregistration),
                       p.ledger)
    assert cli(["report", "--params", str(params)]) == 0
    env = artifacts.read_json(p.env)
    assert "environment" in env and "params_sha256" in env
    assert env["git"] == {"git": False, "ledger_rewritten": None}
    assert env["history"]["checked"] is False and "no git history" in env["history"]["why_not"]
    # without git history nothing shows the looks and registrations git would hold
    metrics = artifacts.read_json(p.metrics_out)
    assert metrics["decision.overall"] == "UNVERIFIED"
    assert "The status rests on the registration hash" in p.md_out.read_text()
    assert metrics["decision.rules"] == "PASS"


def test_corrupt_inputs_degrade_to_not_available(tmp_path):
    params = write_params(tmp_path)
    p = paths_in(tmp_path)
    p.eval.parent.mkdir(parents=True, exist_ok=True)
    p.eval.write_text("{not json")
    p.per_piece.parent.mkdir(parents=True, exist_ok=True)
    p.per_piece.write_bytes(b"PAR1garbage")
    assert report(tmp_path, params, p).decision == "NOT REGISTERED"
    assert "not available" in p.md_out.read_text()


def test_repository_params_sections_parse():
    from pipeline.stages.audit import AuditConfig
    from pipeline.stages.generate import GenerateConfig

    repo = Path(__file__).resolve().parents[2] / "params.yaml"
    gen = load_section("generate", repo, GenerateConfig)
    audit = load_section("audit", repo, AuditConfig)
    load_section("report", repo, ReportConfig)
    assert audit.human_window == gen.max_new_tokens  # humans audited on a sample's span


def test_power_at_the_registration_and_at_the_run_is_stated_side_by_side(tmp_path):
    """The registration's joint rates (planted spreads, simulated by preregister's own code)
    and the one power statement reach the report; a run whose eval.json lacks the test gain's
    groups-only interval says why its own rates are not available."""
    from pipeline.decision.criteria import CriteriaConfig
    from pipeline.decision.criteria_controls import joint_block, power_block
    from tests.decision.test_criteria_controls import planted

    p = make_inputs(tmp_path)
    rules = [{"name": "beats", "metric": "test.nll_per_note.rel_improvement", "op": ">=",
              "threshold": 0.02, "judge": "interval", "rationale": "r"}]
    params = write_params(tmp_path, rules=rules)
    for f in (p.per_piece, p.eval):
        f.unlink()
    rec = register(tmp_path, params, p, before_scores=True)
    cfg = CriteriaConfig.model_validate({"rules": rules})
    rec["power"] = power_block(cfg, planted(), draws=50, search=False)
    artifacts.write_json(p.preregistration, rec)
    make_inputs(tmp_path)
    report(tmp_path, params, p)
    md = p.md_out.read_text()
    assert "### Power: the good model and the bad ones" in md
    assert "Power of beats at the registration's spreads (val pilot): it passes with 80% " \
           "probability only a true gain of" in md
    direct = joint_block(cfg, planted(), 50)
    row = next(x for x in md.splitlines() if x.startswith("| all rules together, good model"))
    assert f"| {direct['good']['all']:.0%} | not available |" in row


def test_a_guard_is_judged_on_every_training_seed_in_the_report(tmp_path):
    """audit.json's per-seed membership blocks reach metrics.json; the seeds' mean straddles
    the limit, but one seed's whole interval lies above it, so the guard fails, and the report
    says which seed decides."""
    p = make_inputs(tmp_path)
    rules = [{"name": "membership", "metric": "memorisation.transformer.membership_auc",
              "op": "<=", "threshold": 0.65, "judge": "interval", "rationale": "r"}]
    params = write_params(tmp_path, rules=rules)
    audit = artifacts.read_json(p.audit)
    audit["judged"] = {"transformer": {
        "membership_auc": {"value": 0.64, "ci_low": 0.5, "ci_high": 0.78},
        "per_seed": {s: {"membership_auc": {"value": v, "ci_low": v - 0.05,
                                            "ci_high": v + 0.05}}
                     for s, v in (("11", 0.58), ("12", 0.72))}}}
    artifacts.write_json(p.audit, audit)
    report(tmp_path, params, p)
    metrics = artifacts.read_json(p.metrics_out)
    assert metrics["memorisation.transformer.membership_auc.seed.12.ci_low"] == \
        pytest.approx(0.67)
    assert metrics["decision.criteria.membership"] == "FAIL"
    md = p.md_out.read_text()
    assert "| membership | FAIL | The transformer's membership AUC (0.5 is chance), judged on " \
           "each of its 2 training seeds alone" in md
    assert "seed 12 fails, so the rule fails." in md
    assert "| membership | memorisation.transformer.membership_auc | <= 0.65 (whole interval) " \
           "| 0.72 (seed 12) | [0.67, 0.77] | FAIL |" in md


def test_stage_reports_are_folded_not_dumped_in_the_body(tmp_path):
    p = make_inputs(tmp_path)
    report(tmp_path, write_params(tmp_path), p)
    md = p.md_out.read_text()
    body = re.sub(r"<details>.*?</details>", "", md, flags=re.S)
    dotted = [line for line in body.splitlines()
              if re.match(r"\| [a-z_]+\.[a-z0-9_.]+ \|", line)]
    assert dotted == [] and "(no rows)" not in md and "params sha256" not in md
    assert "<details><summary>Every value in reports/split.json" in md
    assert "Dedupe tier note (the same notes saved differently): the most similar pair" in md
    html = p.html_out.read_text()
    assert html.count("<details>") == md.count("<details>") >= 3


def test_report_md_links_figure_files_that_html_embeds(tmp_path):
    import base64

    p = make_inputs(tmp_path)
    stale = p.figures_dir / "99-old.png"
    artifacts.write_bytes(stale, b"old")
    report(tmp_path, write_params(tmp_path), p)
    md, html = p.md_out.read_text(), p.html_out.read_text()
    links = re.findall(r"!\[[^\]]+\]\((figures/report/[^)]+\.png)\)", md)
    assert links and not stale.exists()
    assert sorted(links) == sorted(f"figures/report/{f.name}" for f in p.figures_dir.glob("*.png"))
    embedded = {base64.b64decode(d) for d in re.findall(r"base64,([^\"]+)\"", html)}
    assert all((p.md_out.parent / rel).read_bytes() in embedded for rel in links)
    assert "(embedded in report.html)" not in md
