"""``symkit report``: flat metrics, pre-registered decision, and the experiment report.

Inputs (all optional; a missing or unreadable one is shown as "not available"): every stage's
``reports/*.json``, ``reports/eval/per_piece.parquet``, ``reports/audit/per_sample.parquet``,
``reports/plots/train_log/``, ``reports/samples/``, ``data/manifest.parquet``,
``data/splits.parquet``, ``data/dedupe/pairs.parquet``, ``reports/preregistration.json``,
``reports/report.env.json``, and the ``criteria``/``evaluate``/``report`` sections of params.yaml.
Outputs: ``reports/metrics.json`` (flat dotted keys, for ``dvc metrics show/diff``),
``reports/report.md`` and ``reports/report.html`` (self-contained).

:func:`run` is a pure function of those files: same inputs, same bytes (no timestamps; figures
are deterministic PNGs). ``main`` first writes the environment sidecar ``reports/report.env.json``
(git commit, params hash, package versions), which ``run`` then reads like any other input.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from pipeline.core import artifacts
from pipeline.core.artifacts import read_json_or_none, read_table_or_none
from pipeline.core.config import load_section, parse_section, read_params
from pipeline.core.splits import split_hash_of
from pipeline.decision import ledger, looks, trail
from pipeline.decision.bound_code import bound_code
from pipeline.decision.criteria import CriteriaConfig, evaluate_all, overall
from pipeline.decision.criteria_controls import Sizes, joint_block, run_sizes, size_lines
from pipeline.decision.history import head_commit, registration_order
from pipeline.decision.metrics import build_metrics
from pipeline.decision.preregistration import (
    COMPARISON_METRIC,
    Check,
    Evidence,
    chain_head,
    check,
    identity,
    power_sentence,
    stated_power,
)
from pipeline.decision.spreads import Spreads, SpreadsUnavailable, from_run
from pipeline.render.document import (
    Audio,
    Details,
    Document,
    Figure,
    Heading,
    Para,
    Table,
    fmt,
    render_html,
    render_markdown,
    with_captions,
)
from pipeline.render.figures import loss_curves_png
from pipeline.report.context import ReportConfig, ReportContext, Section
from pipeline.report.headline import decision_sentence, experiment_rows, gain_rows, plain_evidence
from pipeline.report.sections import (
    conditioning,
    data_card,
    environment,
    memorisation,
    metrics_table,
    models,
    music,
    nll_distributions,
    samples,
    training_seeds,
)
from pipeline.report.sections.data_card import split_counts
from pipeline.report.sections.training_seeds import train_logs

HELP = "decision report against pre-registered criteria"


@dataclass(frozen=True)
class ReportPaths:
    """Every input and output; defaults equal dvc.yaml's paths (the CLI flags mirror them)."""

    ingest: Path = Path("reports/ingest.json")
    dedupe: Path = Path("reports/dedupe.json")
    split: Path = Path("reports/split.json")
    leakage: Path = Path("reports/leakage.json")
    contamination: Path = Path("reports/contamination.json")
    contamination_dir: Path = Path("reports/contamination")
    tokenize: Path = Path("reports/tokenize.json")
    ngram: Path = Path("reports/ngram.json")
    train: Path = Path("reports/train.json")
    eval: Path = Path("reports/eval.json")
    audit: Path = Path("reports/audit.json")
    per_piece: Path = Path("reports/eval/per_piece.parquet")
    per_sample: Path = Path("reports/audit/per_sample.parquet")
    spans: Path = Path("reports/audit/spans.parquet")
    train_log: Path = Path("reports/plots/train_log")
    samples_dir: Path = Path("reports/samples")
    manifest: Path = Path("data/manifest.parquet")
    splits: Path = Path("data/splits.parquet")
    pairs: Path = Path("data/dedupe/pairs.parquet")
    notes: Path = Path("data/notes.parquet")
    leakage_png: Path = Path("reports/figures/leakage.png")
    preregistration: Path = Path("reports/preregistration.json")
    ledger: Path = ledger.LEDGER
    """The test-access ledger: every earlier look at the test pieces."""
    env: Path = Path("reports/report.env.json")
    figures_dir: Path = Path("reports/figures/report")
    """The report's figures as PNG files, which report.md links (report.html embeds them)."""
    metrics_out: Path = Path("reports/metrics.json")
    md_out: Path = Path("reports/report.md")
    html_out: Path = Path("reports/report.html")


STAGE_REPORTS = ("ingest", "dedupe", "split", "leakage", "contamination", "tokenize", "ngram",
                 "train", "eval", "audit")
"""Stage reports flattened into metrics.json, each under its own name."""


SECTIONS: tuple[Section, ...] = (
    data_card.render, models.render, metrics_table.render, training_seeds.render,
    nll_distributions.render, conditioning.render, memorisation.render, music.render,
    samples.render, environment.render)
"""The descriptive sections after the criteria, in reading order (``pipeline/report/sections/``)."""


@dataclass(frozen=True)
class ReportSummary:
    decision: str
    n_deviations: int
    n_metrics: int


def _ci_cell(v: Any, digits: int) -> str:
    """The CI a verdict used, naming its metric when that is not the criterion's own."""
    if v.ci_low is None and v.ci_high is None:
        return ""
    ci = f"[{fmt(v.ci_low, digits)}, {fmt(v.ci_high, digits)}]"
    return ci if v.ci_metric == v.metric else f"{v.ci_metric} {ci}"


def run(cfg: ReportConfig, params: Mapping[str, Any], paths: ReportPaths) -> ReportSummary:
    """Build metrics.json, judge the registered criteria, write report.md and report.html.

    ``params`` is params.yaml as read (every section). The decision is NOT REGISTERED without a
    registration, DEVIATED when the experiment differs from it, and otherwise the verdict of the
    registered rules (PASS, FAIL or INCONCLUSIVE).
    """
    reports = {stem: read_json_or_none(getattr(paths, stem)) for stem in STAGE_REPORTS}
    env = read_json_or_none(paths.env) or {}
    metrics = build_metrics(reports)
    registered = read_json_or_none(paths.preregistration)
    packages = (env.get("environment") or {}).get("packages") or {}
    current = identity(params, split_hash_of(reports["split"]), packages)
    git = env.get("git") or {}
    reg = check(registered, current, reports["eval"],
                scoring_evidence(read_table_or_none(paths.per_piece), paths.ledger, git,
                                 env.get("history"), reports["audit"]))
    criteria = reg.criteria or parse_section("criteria", params.get("criteria"), CriteriaConfig)
    verdicts = evaluate_all(criteria, metrics, ci_level(params))
    rules = overall(verdicts)
    decision = rules if reg.status == "FOLLOWED" else reg.status
    metrics["decision.overall"] = decision
    metrics["decision.rules"] = rules
    metrics["decision.registration"] = reg.status
    metrics["decision.earlier_looks"] = reg.n_looks
    for status in ("PASS", "FAIL", "INCONCLUSIVE"):
        metrics[f"decision.n_{status.lower()}"] = sum(v.status == status for v in verdicts)
    metrics["decision.n_deviations"] = len(reg.deviations)
    for v in verdicts:
        metrics[f"decision.criteria.{v.name}"] = v.status
    metrics = dict(sorted(metrics.items()))

    level = ci_level(params)
    doc = Document(cfg.title)
    # the first screen: what the experiment is, what was decided, why
    doc.add(Table(["experiment", ""], experiment_rows(
                params, metrics, split_counts(read_table_or_none(paths.splits)),
                _registration_cell(reg, git))),
            Para(decision_sentence(decision, verdicts, rules),
                 "p" if decision == "PASS" else "warn"))
    # the verdicts first (the decision sentence above already names a deviation), then why the
    # registration is not followed, before anything else
    doc.add(Heading("Decision"),
            Table(["criterion", "verdict", "evidence"],
                  [[v.name, v.status, plain_evidence(v, metrics, params, level)]
                   for v in verdicts], status_col=1),
            Para(_registration_sentence(reg, registered, git), "note"),
            Para(rests_on(reg, registered, git, env.get("history")), "note"))
    if reg.deviations:
        doc.add(Heading("Deviations from the registration"),
                Para(f"{len(reg.deviations)} deviation(s). The verdicts above use the registered "
                     "rules, but the experiment is not the one that was registered, so the "
                     "decision is DEVIATED.", "warn"),
                *[Para(d, "warn") for d in reg.deviations])
    if reg.n_looks:
        doc.add(*looks_section(reg, registered))
    if reg.amendments:
        doc.add(*amendments_section(reg))
    if reg.test_sets:
        doc.add(*test_sets_section(reg))
    doc.add(*headline_figures(criteria, metrics, paths, level))
    doc.add(Heading("The criteria"),
            Table(["criterion", "metric", "rule", "value", f"{level:.0%} CI", "verdict",
                   "rationale"],
                  [[v.name, v.metric, f"{v.op} {fmt(v.threshold, cfg.digits)}"
                    + {"interval": " (whole interval)",
                       "refute": " (fails only if the whole interval fails)"}.get(r.judge, ""),
                    fmt(v.value, cfg.digits) + (f" (seed {v.seed})" if v.seed else ""),
                    _ci_cell(v, cfg.digits), v.status, r.rationale]
                   for v, r in zip(verdicts, criteria.rules, strict=True)], status_col=5),
            *power_section(criteria, registered, reports, params,
                           read_table_or_none(paths.per_piece)))
    ctx = ReportContext(cfg, params, reports, metrics,
                        {f.name: getattr(paths, f.name) for f in fields(paths)}, registered, env)
    for section in SECTIONS:
        section(doc, ctx)

    doc = place_figures(doc, paths.figures_dir, paths.md_out.parent)
    artifacts.write_json(paths.metrics_out, metrics)
    artifacts.write_text(paths.md_out, render_markdown(Document(doc.title,
                                                                with_captions(doc.blocks))))
    artifacts.write_text(paths.html_out, render_html(doc))
    return ReportSummary(decision, len(reg.deviations), len(metrics))


RUN_DRAWS = 100
"""Simulated experiments per model when the report re-simulates at the run's spreads (the
registration states its own, with more)."""


def run_power(criteria: CriteriaConfig, reports: Mapping[str, Any], params: Mapping[str, Any],
              per_piece: Any) -> tuple[Sizes | None, dict[str, Any] | None, str | None]:
    """(sizes, joint block, why not): all rules together on the good and bad models at the
    spreads this run measured (:func:`pipeline.decision.spreads.from_run`)."""
    eval_report, audit = reports.get("eval"), reports.get("audit")
    if not isinstance(eval_report, dict) or not isinstance(audit, dict) or per_piece is None:
        return None, None, "the run has no eval.json, audit.json or per-piece table"
    try:
        sizes = run_sizes(params, audit, from_run(eval_report, per_piece, audit,
                                                  level=ci_level(params)))
    except (SpreadsUnavailable, KeyError, ValueError) as e:
        return None, None, str(e)
    return sizes, joint_block(criteria, sizes, RUN_DRAWS), None


def _registered_sizes(block: Mapping[str, Any]) -> Sizes | None:
    try:
        return Sizes(spreads=Spreads.from_dict(block["spreads"]), **block["sizes"])
    except (KeyError, TypeError):
        return None


def power_section(criteria: CriteriaConfig, registered: Any, reports: Mapping[str, Any],
                  params: Mapping[str, Any], per_piece: Any) -> list[Any]:
    """How often the rules pass a good model and the bad ones, all together and one by one: at
    the registration's spreads (a val pilot, stated before any test piece was scored) beside
    the spreads this run measured, and the one power statement at each."""
    block, amendment = stated_power(registered)
    block = block if isinstance(block, dict) and block.get("joint") else None
    reg_sizes = _registered_sizes(block) if block else None
    run_sizes_, run_joint, why = run_power(criteria, reports, params, per_piece)
    restated = f", restated by amendment {amendment}" if amendment else ""
    out: list[Any] = [Heading("Power: the good model and the bad ones", 3)]
    for sizes, at in ((reg_sizes, f"the registration's spreads (val pilot{restated})"),
                      (run_sizes_, "the spreads this run measured")):
        if sizes is not None:
            said = power_sentence(criteria, sizes.gain_se_groups, sizes.gain_seed_sd,
                                  sizes.seeds, sizes.level, at)
            if said:
                out.append(Para(said))
    if block is None and run_joint is None:
        return [*out, Para("Not stated: the registration holds no power statement with the "
                           "joint rates (`symkit preregister` states it from a val pilot, "
                           "`symkit evaluate --pilot reports/pilot`), and at this run's "
                           f"spreads: {why}.", "note")]
    cols = [(block or {}).get("joint"), run_joint]

    def cell(joint: Any, get: Any) -> str:
        if not joint:
            return "not available"
        v = get(joint)
        return "-" if v is None else f"{v:.0%}"

    rows = [[f"{r.name} (good model)", *[cell(j, lambda j, n=r.name: j["good"]["rules"].get(n))
                                         for j in cols]] for r in criteria.rules]
    rows.append(["all rules together, good model (standard >= 80%)",
                 *[cell(j, lambda j: j["good"]["all"]) for j in cols]])
    names = [b["model"] for b in ((cols[0] or cols[1]) or {}).get("bad") or []]
    for n in names:
        rows.append([f"all rules together, bad model: {n} (standard <= 5%)",
                     *[cell(j, lambda j, n=n: next((b["all"] for b in j["bad"]
                                                    if b["model"] == n), None)) for j in cols]])
    bad_rows = []
    for r in criteria.rules:
        cells = []
        for n in names:
            got = []
            for j in cols:
                b = next((b for b in (j or {}).get("bad") or [] if b["model"] == n), None)
                v = (b or {}).get("rules", {}).get(r.name)
                got.append("-" if v is None else f"{v:.0%}")
            cells.append(" / ".join(got))
        bad_rows.append([r.name, *cells])
    spread_rows = []
    for f in ("gain_se_groups", "gain_seed_sd", "gap_se_note", "gap_se_token",
              "gap_seed_sd_note", "gap_seed_sd_token", "piece_sd_note", "human_flag_rate"):
        vals = [getattr(s.spreads, f) if s is not None else None for s in (reg_sizes, run_sizes_)]
        where = (run_sizes_ or reg_sizes).spreads.source.get(f, "") if (run_sizes_ or reg_sizes) \
            else ""
        spread_rows.append([f, *["not available" if v is None else f"{v:.3g}" for v in vals],
                            where])
    good = (block or {}).get("joint", {}).get("good", {}).get("truth") or \
        (run_joint or {}).get("good", {}).get("truth", "")
    sizes_said = size_lines(block or {})
    if sizes_said:
        out.append(Para("At the registration's sizes the good model misses the 80% standard; "
                        + "; ".join(sizes_said) + "."))
    return [*out,
            Para(f"Pass rates of simulated experiments judged by the registered rules' own code "
                 f"(pipeline/decision/criteria_controls.py; the registration's "
                 f"{(block or {}).get('draws', '-')} draws, this run's {RUN_DRAWS}). The good "
                 f"model: {good}.", "note"),
            Table(["rule", f"at the registration's spreads{restated}",
                   "at this run's spreads"], rows),
            Para("Each rule alone on each bad model (registration / this run): a bad model "
                 "should fail the rule written to catch it; the others may pass it.", "note"),
            Table(["rule", *[f"bad: {n}" for n in names]], bad_rows),
            Table(["spread", "registration (val pilot)", "this run", "where this run's "
                   "comes from"], spread_rows)]


def _slug(text: str, words: int = 5) -> str:
    return "-".join(re.findall(r"[a-z0-9]+", text.lower())[:words]) or "figure"


def place_figures(doc: Document, folder: Path, md_folder: Path) -> Document:
    """Write every figure and sound that is not yet a file to ``folder`` (replaced whole, so no
    stale file survives) as ``NN-<first words of its caption>.png`` (``.flac``), in reading
    order, and return the
    document with those figures linked relative to ``md_folder`` (report.md's folder), so that
    report.md shows them on a git forge."""
    count = 0

    def walk(blocks: Sequence[Any], out_dir: Path) -> list[Any]:
        nonlocal count
        placed: list[Any] = []
        for b in blocks:
            if isinstance(b, Details):
                b = Details(b.summary, walk(b.blocks, out_dir))
            elif isinstance(b, Figure | Audio) and not b.path:
                data, ext = (b.png, "png") if isinstance(b, Figure) else (b.flac, "flac")
                if data:
                    count += 1
                    name = f"{count:02d}-{_slug(b.caption)}.{ext}"
                    (out_dir / name).write_bytes(data)
                    b = replace(b, path=Path(os.path.relpath(folder / name, md_folder))
                                .as_posix())
            placed.append(b)
        return placed

    with artifacts.atomic_dir(folder) as tmp:
        blocks = walk(doc.blocks, tmp)
    return Document(doc.title, blocks)


def headline_figures(criteria: CriteriaConfig, metrics: Mapping[str, Any], paths: ReportPaths,
                     level: float) -> list[Figure | Para]:
    """The first screen's figures: the transformer's gain over the n-gram per split (pooled
    and per seed, with the registered threshold), and the loss curves with the n-gram's val
    level."""
    from pipeline.render.compare_figures import forest_png

    out: list[Figure | Para] = []
    rows = gain_rows(metrics)
    rule = next((r for r in criteria.rules if r.metric == COMPARISON_METRIC), None)
    order = metrics.get("ngram.best_order")
    base = f"{order}-gram" if isinstance(order, int) else "n-gram"
    if rows:
        threshold = rule.threshold * 100 if rule is not None else None
        seeds = any(r.seeds for r in rows)
        out.append(Figure(
            f"The transformer's NLL per note, relative to the {base}'s, on each scored split: "
            f"the dot pools the training seeds, the bar is its {level:.0%} interval over groups"
            + (" and seeds, the diamonds are the seeds one by one" if seeds else "")
            + ". Right of 0 the transformer is better"
            + (f"; {rule.name} needs the whole test bar right of the dotted line at "
               f"{threshold:g}%." if rule is not None else "."),
            forest_png(rows, margin=None, level=level * 100, threshold=threshold,
                       threshold_label=f"{rule.name}: {threshold:g}%" if rule else "",
                       xlabel=f"gain of the transformer over the {base}: relative decrease of "
                              "NLL per note, %")))
    logs = train_logs(paths.train_log)
    ref = metrics.get(f"ngram.orders.{order}.val_nats_per_token")
    if logs:
        out.append(Figure(
            "Training (thin) and validation (markers) loss of the transformer, nats per token, "
            "one colour per training seed"
            + (f"; the dashed line is the {base}'s val loss. Validation below it means the "
               "transformer predicts val tokens better than the n-gram" if isinstance(
                   ref, float) else "")
            + ". A val curve still falling at the end means more steps would help; one "
            "turning up while training loss falls means overfitting.",
            loss_curves_png(logs, "nats per token", (ref, f"{base} val")
                            if isinstance(ref, float) else None)))
    else:
        out.append(Para("Loss curves: reports/plots/train_log/ not available.", "note"))
    return out


def scoring_evidence(per_piece: Any, ledger_path: Path, git: Mapping[str, Any],
                     history: Mapping[str, Any] | None = None, audit: Any = None,
                     code: Mapping[str, Any] | None = None) -> Evidence:
    """What the registration is checked against beside params: the pieces the per-piece table
    scored, the digest of its test scores, the ledger, git's facts, what history holds
    (:func:`pipeline.decision.trail.scan`, from the sidecar), the audit's judgements (whose
    digest its look recorded) and the code that runs."""
    scored, results = None, None
    if per_piece is not None and {"sha256", "split"} <= set(per_piece.columns):
        scored = {s: sorted(set(per_piece.loc[per_piece["split"] == s, "sha256"].astype(str)))
                  for s in ("val", "test")}
        rows = ledger.test_rows(per_piece)
        results = ledger.results_digest(rows) if len(rows) else None
    judged = audit.get("judged") if isinstance(audit, dict) else None
    return Evidence(scored, results, ledger.read(ledger_path), git,
                    code if code is not None else bound_code(), history,
                    {"audit": looks.digest_of(judged)} if judged is not None else {})


def rests_on(reg: Check, registered: Any, git: Mapping[str, Any],
             history: Mapping[str, Any] | None) -> str:
    """One line: what the registration status rests on, and what a reader can check outside
    the repository."""
    if not reg.registered or not isinstance(registered, dict):
        return "The status rests on nothing: there is no registration."
    head = chain_head(registered)
    parts = [f"the registration hash {head} (compare it with the hash published outside the "
             "repository when it was registered)"]
    if reg.unverified:
        parts.append(f"not on git history, which cannot be checked here ({reg.unverified})")
    else:
        h = history or {}
        n_regs = len(h.get("registrations") or [])
        parts.append(f"the ledger containing each of its {h.get('ledger_versions', 0)} "
                     f"committed versions, and {n_regs} committed registration"
                     f"{'s' * (n_regs != 1)} read for earlier ones of these test pieces")
        if git.get("registration_precedes_results"):
            parts.append(f"git showing the registration committed in "
                         f"{str(git.get('registration_commit'))[:12]} before the results")
    parts.append("the judging code, training recipe and stopping rule compared file by file "
                 "with the registered digests")
    return "The status rests on " + "; ".join(parts) + "."


def amendments_section(reg: Check) -> list[Any]:
    """The registered amendments: why, what changed, and the looks before each."""
    rows = [[str(a.get("n")), str(a.get("why")), "; ".join(a.get("changes") or []),
             str(len(a.get("looks_before") or []))] for a in reg.amendments]
    return [Heading("Amendments to the registration"),
            Para(f"{len(rows)} amendment(s) registered after the registration, each naming the "
                 "code it changed and hashed onto the one before; the looks before an amendment "
                 "were taken under the code it replaced.", "warn"),
            Table(["amendment", "why", "what changed", "looks before it"], rows)]


def test_sets_section(reg: Check) -> list[Any]:
    """Earlier test sets of this experiment: other test pieces looked at or registered."""
    rows = [[str(t["pieces_sha256"])[:12], str(t.get("n_pieces")), str(t.get("looks")),
             ", ".join(str(r)[:12] for r in t.get("registrations") or []) or "none",
             ", ".join(t.get("shared_criteria") or []) or "none known"] for t in reg.test_sets]
    return [Heading("Earlier test sets"),
            Para(f"Before this test set, {len(rows)} other test set(s) of this experiment were "
                 "looked at or registered. A hypothesis tried on several test sets is tested "
                 "more than once, whichever test set is reported: read the decision with them "
                 "in mind.", "warn"),
            Table(["test pieces (hash)", "pieces", "looks", "registrations",
                   "criteria shared with this registration"], rows)]


def looks_section(reg: Check, registered: Any) -> list[Any]:
    """Every earlier look at the registered test pieces, what differed from the registration
    then, and what to do about a spent test set."""
    rows = []
    n_test = len(((registered.get("identity") or {}).get("pieces") or {}).get("test") or [])
    for look in reg.looks:
        rec, then = look.record, look.registration
        changes = ledger.changes_since(look, registered)
        differs = ("no registration" if then is None else "; ".join(
            part for part in (
                ", ".join(changes["sections"]) and f"params {', '.join(changes['sections'])}",
                changes["criteria"] and f"criteria: {', '.join(changes['criteria'])}",
                "; ".join(changes["split"])) if part) or "same params and criteria")
        rows.append([str(look.index), str(rec.get("time") or "unknown"),
                     str(rec.get("commit") or "")[:12] or "none", str(rec.get("source")),
                     f"{look.overlap} of {n_test}",
                     str((then or {}).get("identity_hash") or "none")[:12], differs])
    n = reg.n_looks
    listed = len(rows)
    return [
        Heading("Earlier looks at the test pieces"),
        Para(f"The test-access ledger (reports/ledger.jsonl) shows the registered test pieces "
             f"scored {n} time{'s' * (n != 1)} before these results"
             + ("" if listed == n else f" ({listed} of them listed in the ledger; the "
                "registration records the others)")
             + ". Each look showed test results that could shape what was registered next, so "
             "the decision above is exploratory, not a confirmatory test. This test set is "
             "spent: for a confirmatory result, re-run the experiment with a fresh test split "
             "(pieces the ledger has never seen scored; `symkit ledger` tells how many of a "
             "split's test pieces were), register it with `symkit preregister` before any "
             "look, and commit the registration before `dvc repro`.", "warn"),
        Table(["look", "time (UTC)", "commit", "source", "test pieces", "registration",
               "differs from this registration"], rows)]


def _registration_cell(reg: Check, git: Mapping[str, Any]) -> str:
    """The registration status with where git shows it, in a few words."""
    if not reg.registered:
        return "NOT REGISTERED: no reports/preregistration.json"
    where = ""
    if git.get("git") and not git.get("registration_uncommitted"):
        where = f", committed in {str(git.get('registration_commit'))[:12]}"
        if git.get("registration_precedes_results"):
            where += " before the results"
    n = len(reg.deviations)
    looks = (f"; {reg.n_looks} earlier look{'s' * (reg.n_looks > 1)} at the test pieces"
             if reg.n_looks and reg.deviations else "")
    return f"{reg.status}{where}" + (f"; {n} deviation{'s' * (n > 1)}" if n else "") + looks


def ci_level(params: Mapping[str, Any]) -> float:
    """``evaluate.ci_level``: the coverage of every interval in the report."""
    value = (params.get("evaluate") or {}).get("ci_level", 0.95)
    return float(value) if isinstance(value, int | float) else 0.95


def _registration_sentence(reg: Check, registered: Any, git: Mapping[str, Any]) -> str:
    if not reg.registered:
        return ("Not registered: there is no reports/preregistration.json, so the criteria below "
                "come from params.yaml as it is now and were not frozen before the test set was "
                "scored. Run `symkit preregister` before `dvc repro evaluate`.")
    ident = registered.get("identity_hash", "") if isinstance(registered, dict) else ""
    head = (f"Judged with the rules registered in reports/preregistration.json (identity "
            f"{str(ident)[:12]}). ")
    if reg.deviations:
        head += "The experiment differs from its registration (see the deviations below). "
    else:
        head += ("The split, the val and test pieces scored, the params that shape results and "
                 "the package versions all match the registration. ")
    if reg.n_looks:
        head += (f"The ledger shows {reg.n_looks} earlier look{'s' * (reg.n_looks != 1)} at "
                 "these test pieces (see below). ")
    elif not reg.deviations:
        head += "The ledger shows no earlier look at these test pieces. "
    if reg.test_sets:
        n = len(reg.test_sets)
        head += (f"{n} earlier test set{'s' * (n != 1)} of this experiment "
                 f"{'were' if n != 1 else 'was'} looked at or registered (see below). ")
    if reg.unverified and not reg.deviations:
        head += (f"History cannot be checked ({reg.unverified}), so earlier looks and "
                 "registrations that only git would show are unknown: UNVERIFIED. ")
    return head + _order_sentence(git)


def _order_sentence(git: Mapping[str, Any]) -> str:
    if not git.get("git"):
        return "Without git history, when the registration was made cannot be checked."
    if git.get("registration_uncommitted"):
        return ("The registration is not committed, so git cannot show that it was made before "
                "the results.")
    reg = str(git.get("registration_commit"))[:12]
    if git.get("registration_precedes_results"):
        where = ("are not committed yet" if git.get("results_uncommitted")
                 else f"were committed later, in {str(git.get('results_commit'))[:12]}")
        return f"The registration was committed in {reg}; the results {where}."
    return (f"The registration was committed in {reg}, but reports/eval.json was committed in "
            f"{str(git.get('results_commit'))[:12]}, not after it: git does not show the "
            "registration preceding the results.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for f in fields(ReportPaths):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=Path, default=f.default,
                            dest=f"path_{f.name}")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("report", args.params, ReportConfig)
    load_section("criteria", args.params, CriteriaConfig)  # invalid rules fail fast
    params = read_params(args.params)
    paths = ReportPaths(**{f.name: getattr(args, f"path_{f.name}") for f in fields(ReportPaths)})
    hist = trail.scan(paths.preregistration, paths.ledger)
    artifacts.write_sidecar(paths.env, {
        "git_commit": head_commit(), "params_sha256": artifacts.sha256_json(params),
        "git": {**registration_order(paths.preregistration, paths.eval,
                                     trail.first_commit(hist, paths.preregistration)),
                "ledger_rewritten": ledger.rewritten(paths.ledger)},
        "history": hist})
    s = run(cfg, params, paths)
    print(f"report: decision {s.decision}, {s.n_deviations} deviation(s), {s.n_metrics} metrics "
          f"-> {paths.html_out}")
    return 0
