"""``symkit adapt-evaluate``: score every arm of an adaptation experiment and choose one.

Every arm (``zero_shot``, the pretrained model as it is, and each trained arm of
``adaptation.arms`` with every training seed) is scored under the evaluation protocol
(``docs/evaluation.md``) on three sets of pieces:

- the target's ``val`` and ``test`` (the top-level pipeline's split of the target corpus, in the
  source tokenizer's ids: ``data/target/tokens``);
- ``source_val``: the source corpus's val pieces, for retention. Source *train* pieces are never
  scored: a model is not asked to remember what it can recite.

The models are loaded with :func:`~pipeline.inference.loading.load_models` (``any_split``: they
were trained on other splits than the one scored, with this very tokenizer, which is checked).
The aggregates are :func:`~pipeline.stats.aggregate.aggregate`'s, with
``adaptation.decision``'s bootstrap plan; the measures and the decision are
:mod:`pipeline.adaptation.decision`'s.

Outputs: ``reports/adaptation/per_piece.parquet`` (one row per piece, arm and seed; split
``source_val`` for the source pieces), ``reports/adaptation.json`` (measures, intervals, the
decision, licences of both corpora, the decontamination count), ``reports/adaptation.md`` (the
choice and why in its first lines, then the table of arms), ``reports/figures/adaptation.png`` and
the sidecar ``reports/adaptation.env.json`` (each arm's wall time and measured peak memory, from
the training sidecars, beside the estimator's figure; scoring time; git's facts on the
registration's order). Results are a pure function of the inputs; the sidecar holds what a
machine measured.

The decision is judged with the registered one when ``reports/preregistration.json`` holds it
(:mod:`pipeline.adaptation.adaptation_registration`); the report's first line is the registration's
status.
Every scoring of target test pieces is a look: the target's test rows are read through
:func:`pipeline.decision.looks.test_tokens` (command ``adapt_evaluate``), which appends the look
to the experiment's test-access ledger ``reports/ledger.jsonl`` with the registration in force
before handing them over, and the digest of the test scores follows before anything reads them.
The registration check counts the looks at the target test pieces that are not this run's
(:func:`pipeline.adaptation.adaptation_registration.check`).

With ``reports/adapt_audit.json`` (``symkit adapt-audit``) the report and ``adaptation.json``
(``memorisation``) also carry each arm's memorisation against target train and source train:
flag-rate excess, extraction excess and membership AUC with their intervals. They are measures
beside the decision, not part of it.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from pipeline.adaptation import adaptation_registration as adapt_registration
from pipeline.adaptation.arms import arm_specs, same_tokenizer
from pipeline.adaptation.config import ZERO_SHOT, AdaptationConfig
from pipeline.adaptation.decision import decide, measures
from pipeline.adaptation.figure import adaptation_png
from pipeline.core.artifacts import (
    read_json,
    read_json_or_none,
    read_parquet,
    write_bytes,
    write_json,
    write_parquet,
    write_sidecar,
    write_text,
)
from pipeline.core.config import ParamsError, RuntimeConfig, load_section
from pipeline.decision import ledger, looks
from pipeline.inference.loading import (
    load_models,
    set_torch_threads,
)
from pipeline.inference.pieces import (
    PER_PIECE_SCHEMA,
    match_facts,
    piece_facts,
    piece_table,
    score_rows,
)
from pipeline.inference.protocol import clean_sequences
from pipeline.stats.aggregate import aggregate
from pipeline.tokens.contract import TokenInfo, read_tokens, refuse_compound

HELP = "score every adaptation arm on target and source; choose the arm"

SOURCE_VAL = "source_val"
SPLITS = ("val", "test", SOURCE_VAL)


@dataclass(frozen=True)
class Plan:
    """The bootstrap plan of :func:`~pipeline.stats.aggregate.aggregate`."""

    splits: Sequence[str]
    n_boot: int
    ci_level: float
    seed: int


@dataclass(frozen=True)
class PieceSet:
    """Token rows to score and their pieces' facts (split, group, notes, seconds)."""

    rows: pd.DataFrame
    pieces: pd.DataFrame
    excluded: list[dict[str, Any]]


COLUMNS = ["sha256", "split", "track", "ids"]
"""The token tables' columns scored."""


def piece_set(rows: pd.DataFrame, info: TokenInfo, manifest: Path, splits: Path,
              label: Mapping[str, str] | None = None) -> PieceSet:
    """The usable ``rows`` (a token table's rows of the splits scored, :data:`COLUMNS`) with
    their facts; ``label`` renames splits (the source's ``val`` becomes ``source_val``) after
    matching them to ``splits.parquet``."""
    rows = rows.sort_values(["sha256", "track"], kind="stable").reset_index(drop=True)
    rows, excluded = clean_sequences(rows, info)
    facts = piece_facts(read_parquet(manifest), read_parquet(splits))
    rows, more = match_facts(rows, facts)
    facts = facts[facts["sha256"].isin(set(rows["sha256"]))].copy()
    if label:
        rows = rows.assign(split=rows["split"].map(lambda s: label.get(s, s)))
        facts["split"] = facts["split"].map(lambda s: label.get(s, s))
    bad = sorted(excluded["pieces"] + more, key=lambda p: p["sha256"])
    return PieceSet(rows, facts, bad)


@dataclass(frozen=True)
class Registration:
    """What the registration check reads: the record, the experiment's ledger, and the current
    identity (:func:`pipeline.adaptation.adaptation_registration.identity`)."""

    path: Path
    ledger: Path
    identity: dict[str, Any]


def licences(metadata: Path) -> dict[str, Any]:
    """The ``license`` column of a corpus's ``raw_metadata.csv``: pieces per value."""
    if not Path(metadata).is_file():
        return {"column": None, "counts": {}, "note": f"{Path(metadata).as_posix()} not found"}
    with Path(metadata).open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    column = next((c for c in ("license", "licence", "rights") if rows and c in rows[0]), None)
    if column is None:
        return {"column": None, "counts": {}, "note": "no license, licence or rights column"}
    counts: dict[str, int] = {}
    for r in rows:
        v = (r.get(column) or "").strip() or "(empty)"
        counts[v] = counts.get(v, 0) + 1
    return {"column": column, "counts": dict(sorted(counts.items())), "note": None}


def decontamination(report: Path, split_report: Path) -> dict[str, Any]:
    """How many source pieces were kept out of source train for copying a target val/test
    piece: the contamination matches and what the source split did with them."""
    c = read_json_or_none(Path(report)) or {}
    s = read_json_or_none(Path(split_report)) or {}
    return {"target_pieces_with_a_copy": {k: v.get("in_reference") for k, v in
                                          sorted((c.get("by_split") or {}).items())},
            "matches": c.get("matches"),
            "listed": s.get("exclude_train_listed"),
            "groups_kept_out_of_train": s.get("exclude_train_groups"),
            "pieces_kept_out_of_train": s.get("exclude_train_pieces"),
            "moved_from_train": s.get("exclude_train_moved")}


def run(cfg: AdaptationConfig, runtime: RuntimeConfig, *, target: Mapping[str, Path],
        source: Mapping[str, Path], arms_dir: Path, arm_reports: Path, per_piece: Path,
        report: Path, markdown: Path, figure: Path, extra: Mapping[str, Any] | None = None,
        registration: Registration | None = None, arm_env: Path | None = None,
        audit: Path | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    info = same_tokenizer(target["info"], source["info"])
    refuse_compound(info, "symkit adapt-evaluate")  # before the look at the target test rows
    # a look at the target test pieces, recorded in the ledger before their rows are read
    test, look = looks.test_tokens(
        "adapt_evaluate", target["tokens"], COLUMNS,
        ledger_path=registration.ledger if registration is not None else None,
        registration=registration.path if registration is not None else None)
    target_rows = pd.concat([read_tokens(target["tokens"], COLUMNS, splits=["val"]), test],
                            ignore_index=True)
    sets = [piece_set(target_rows, info, target["manifest"], target["splits"]),
            piece_set(read_tokens(source["tokens"], COLUMNS, splits=["val"]), info,
                      source["manifest"], source["splits"], {"val": SOURCE_VAL})]
    specs = arm_specs(cfg, arms_dir)
    set_torch_threads(runtime.torch_threads, ["transformer"])  # results depend on it
    models, _ = load_models(specs, "cpu", info, strict=True, any_split=True)
    tables, seconds = [], {}
    for spec in specs:
        t = time.perf_counter()
        for ps in sets:
            nll = score_rows(models[spec.key], list(ps.rows["ids"]))
            tables.append(piece_table(ps.rows, nll, ps.pieces, spec.name, spec.seed))
        seconds[spec.key] = time.perf_counter() - t
    table = pd.concat(tables, ignore_index=True)
    table = table.sort_values(["model", "seed", "split", "sha256"]).reset_index(drop=True)
    assert set(table["split"]) <= set(SPLITS), "only target val/test and source val are scored"
    write_parquet(per_piece, pa.Table.from_pandas(table, schema=PER_PIECE_SCHEMA,
                                                  preserve_index=False))
    if not test.empty:  # the scores of the look, before anyone reads them
        look.scored(ledger.results_digest(ledger.test_rows(table)))
    reg, git = None, {}
    if registration is not None:
        registered = read_json_or_none(registration.path)
        git = adapt_registration.order(registration.path, report)
        checked, registered_decision = adapt_registration.check(
            registered, registration.identity, table, ledger.read(registration.ledger), git,
            code=look.record["code"])
        if registered_decision is not None:  # judged with the registered decision
            cfg = cfg.model_copy(update={"decision": registered_decision})
        reg = {"status": checked.status, "deviations": checked.deviations,
               "looks_before": checked.n_looks,
               "identity_hash": (registered or {}).get("identity_hash")
               if isinstance(registered, dict) else None,
               "judged_with": "the registered decision" if registered_decision is not None
               else "params.yaml's adaptation.decision"}
    d = cfg.decision
    plan = Plan(SPLITS, d.n_boot, d.ci_level, d.seed)
    names = cfg.arm_names
    agg, paired = aggregate(table, plan, names)
    _, paired_back = aggregate(table, plan, names[::-1])  # both orders of every pair
    paired = {**paired, **paired_back}
    params = {ZERO_SHOT: _zero_shot_params(cfg)}
    summaries = {}
    for name in cfg.arms:
        summaries[name] = read_json(Path(arm_reports) / f"{name}.json")
        params[name] = summaries[name]["params"]
    m = measures(cfg, agg, paired, params)
    for name, s in summaries.items():
        m[name]["estimate_bytes"] = (s.get("estimate") or {}).get("total_bytes")
        m[name]["steps"], m[name]["lr"] = s.get("steps"), s.get("lr")
    m[ZERO_SHOT]["estimate_bytes"] = None
    decision = decide(cfg, m, paired)
    seeds = {n: sorted(int(x) for x in table.loc[table["model"] == n, "seed"].dropna().unique())
             for n in names}
    out = {
        "arms": m,
        "decision": decision,
        "seeds": seeds,
        "pieces": {s: int(table.loc[table["split"] == s, "sha256"].nunique()) for s in SPLITS},
        "excluded": {"target": sets[0].excluded, "source": sets[1].excluded},
        "tokenizer_hash": info.tokenizer_hash,
        "protocol": {"unit": "nats_per_note", "n_boot": d.n_boot, "ci_level": d.ci_level,
                     "seed": d.seed, "splits": list(SPLITS)},
        "models": agg,
        "paired": paired,
        **({"registration": reg} if reg is not None else {}),
        **({"memorisation": memorisation(read_json(audit), names)}
           if audit is not None and Path(audit).is_file() else {}),
        **(extra or {}),
    }
    write_json(report, out)
    write_text(markdown, render_markdown(cfg, out))
    write_bytes(figure, adaptation_png(m, decision))
    sidecars = Path(arm_env) if arm_env is not None else Path(arm_reports)
    env = {n: read_json_or_none(sidecars / f"{n}.env.json") or {} for n in cfg.arms}
    write_sidecar(report.with_name(report.stem + ".env.json"), {
        "arms": {n: {"peak_rss_cold_bytes": e.get("peak_rss_cold_bytes"),
                     "peak_rss_warm_bytes": e.get("peak_rss_warm_bytes"),
                     "estimate_bytes": m[n]["estimate_bytes"],
                     "stage_seconds": e.get("stage_seconds"),
                     "tokens_per_s": e.get("tokens_per_s")} for n, e in env.items()},
        "scoring_seconds": {**seconds, "total": time.perf_counter() - t0},
        "registration_order": git,
        "torch_threads": runtime.torch_threads})
    return out


def memorisation(audit: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """Per reference corpus (target, source) and arm, the audit's judged flag-rate excess,
    extraction excess and membership AUC with their intervals (``symkit adapt-audit``)."""
    keep = {"flag_rate": "excess", "extraction_rate": "excess", "membership_auc": None}
    out: dict[str, Any] = {}
    for ref, block in audit.get("references", {}).items():
        arms = {}
        for name in names:
            judged = block.get("judged", {}).get(name, {})
            arms[name] = {k: {f: judged[k][sub][f] if sub else judged[k][f]
                              for f in ("value", "ci_low", "ci_high")}
                          for k, sub in keep.items() if k in judged}
            if "flag_rate" in judged:
                arms[name]["flag_rate_value"] = judged["flag_rate"]["value"]
            if "quality" in judged:
                q = judged["quality"]
                arms[name]["quality"] = {k: q.get(k) for k in ("score", "score_band_low")}
        out[ref] = {"human_test_flag_rate": block.get("human_flag_rate", {}).get("test"),
                    "human_test_pieces": block.get("human_pieces", {}).get("test"),
                    "arms": arms}
    return out


def _zero_shot_params(cfg: AdaptationConfig) -> dict[str, int]:
    meta = read_json(Path(cfg.pretrained) / "model.json")
    total = int(meta["params"]["total"])
    return {"total": total, "trainable": 0, "frozen": total}


# ---- report ------------------------------------------------------------------------------------
def _iv(iv: Mapping[str, float] | None, fmt: str = "{:.4f}", scale: float = 1.0) -> str:
    if iv is None:
        return "–"
    v, lo, hi = (scale * iv[k] for k in ("value", "ci_low", "ci_high"))
    if not all(math.isfinite(x) for x in (v, lo, hi)):
        return "n/a"
    return f"{fmt.format(v)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def _count(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1_000_000 else f"{n / 1e3:.1f} k" if n >= 1000 else str(n)


def _size(n: int | None) -> str:
    if n is None:
        return "–"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def render_markdown(cfg: AdaptationConfig, out: Mapping[str, Any]) -> str:
    m, d = out["arms"], out["decision"]
    helps = d["pretraining_helps"]
    level = f"{100 * cfg.decision.ci_level:g}%"
    chosen = d["smallest_adequate"]
    lines = ["# Adaptation: which arm, and why", ""]
    reg = out.get("registration")
    if reg is not None:
        lines.append(f"**Registration: {reg['status']}** ({reg['judged_with']}"
                     + (f"; registration {str(reg['identity_hash'])[:12]}"
                        if reg.get("identity_hash") else "") + ").")
        lines += [f"- deviation: {x}" for x in reg["deviations"]]
        if reg["status"] == "NOT REGISTERED":
            lines.append("- register with `symkit preregister` in this folder before the target "
                         "test set is scored, and commit reports/preregistration.json first")
        lines.append("")
    if chosen is None:
        lines.append(f"**No arm is adequate.** None is within {cfg.decision.margin:.0%} of the "
                     f"best arm ({d['best_arm']}) on target val NLL per note while keeping its "
                     "forgetting within the bound; see each arm's reasons below.")
    else:
        c = m[chosen]
        lines.append(
            f"**Choice: `{chosen}`** ({c['kind']}, {_count(c['params_trainable'])} trainable "
            f"parameters, {_size(c['bytes_to_ship'])} to ship beside the pretrained model). "
            f"It has the fewest trainable parameters among the arms whose target val NLL per "
            f"note is within {cfg.decision.margin:.0%} of the best arm's (`{d['best_arm']}`) "
            f"over the whole {level} interval and whose forgetting on source val stays within "
            f"{d['forgetting_bound_nats_per_note']:.4f} nats per note "
            f"({cfg.decision.forgetting_share:.0%} of the "
            f"{d['taught_nats_per_note']:.4f} that pretraining taught the source).")
        lines.append("")
        lines.append(f"- target val NLL per note: {_iv(c['val'])}; test: {_iv(c['test'])}")
        lines.append(f"- above the best arm on val: "
                     f"{_iv(d['standing'][chosen]['excess_over_best'], '{:+.2f}%', 100)}")
        lines.append(f"- forgetting on source val: {_iv(c['forgetting'])} nats per note")
    lines += ["", f"**Does pretraining help?** {helps['verdict']}: `{helps['arm']}` (the adapted "
              f"arm best on target val) against `scratch` on target test, relative NLL per note "
              f"gain {_iv(helps['interval'], '{:+.2f}%', 100)}; PASS needs the whole interval "
              f"at or above {helps['threshold']:.0%}.", ""]
    if d.get("note"):
        lines += [f"Note: {d['note']}.", ""]
    lines += [f"Intervals: {level}, target and source pieces' groups resampled "
              f"({cfg.decision.n_boot} replicates), the training seeds ({cfg.seeds} per trained "
              "arm) as a Student-t term. Pieces scored: " + ", ".join(
                  f"{k} {v}" for k, v in out["pieces"].items()) + ".", "",
              "## Arms", "",
              "| arm | kind | trainable | target val NLL/note | target test NLL/note | gain over "
              "scratch (test) | forgetting (source val) | estimated memory | to ship | adequate |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, a in m.items():
        gain = a["vs_scratch"]["test"] if a["vs_scratch"] else None
        st = d["standing"][name]
        lines.append(
            f"| `{name}` | {a['kind']} | {_count(a['params_trainable'])} | {_iv(a['val'])} | "
            f"{_iv(a['test'])} | {_iv(gain, '{:+.2f}%', 100)} | {_iv(a['forgetting'])} | "
            f"{_size(a.get('estimate_bytes'))} | {_size(a['bytes_to_ship'])} | "
            f"{'yes' if st['adequate'] else 'no: ' + '; '.join(st['why_not'])} |")
    lines += ["", "Forgetting: the arm's source val NLL per note minus the pretrained model's, on "
              "the same pieces (> 0: it forgot). Gain: (scratch − arm) / scratch. To ship: the "
              "trained tensors in fp32 (a LoRA arm's adapters, a partial arm's unfrozen "
              "tensors; scratch and full ship a whole model). Estimated memory: `symkit "
              "estimate` for the arm on CPU in fp32 (optimiser state for trainable parameters "
              "only); the measured peak memory and wall time are machine facts, in "
              "`reports/adaptation.env.json`.", ""]
    lines += _memorisation_lines(out.get("memorisation"), level)
    lines += ["## Data", ""]
    dc = out.get("decontamination") or {}
    copied = dc.get("target_pieces_with_a_copy") or {}
    lines.append("- decontamination: target pieces with a copy in the source: "
                 + (", ".join(f"{k} {v}" for k, v in copied.items()) or "not checked")
                 + f"; {dc.get('pieces_kept_out_of_train')} source pieces in "
                 f"{dc.get('groups_kept_out_of_train')} groups kept out of source train, "
                 f"{dc.get('moved_from_train')} of them groups the split would otherwise have "
                 "trained on")
    for corpus in ("source", "target"):
        lic = (out.get("licences") or {}).get(corpus) or {}
        counts = ", ".join(f"{k}: {v}" for k, v in (lic.get("counts") or {}).items())
        lines.append(f"- {corpus} licences ({lic.get('column') or 'none recorded'}): "
                     f"{counts or lic.get('note') or '–'}")
    lines.append("")
    return "\n".join(lines)


def _memorisation_lines(mem: Mapping[str, Any] | None, level: str) -> list[str]:
    if not mem:
        return []
    refs = [r for r in ("target", "source") if r in mem]
    head = ["arm"] + [f"{what} ({r})" for r in refs for what in
                      ("flag-rate excess", "extraction excess", "membership AUC",
                       "human-like statistics")]
    lines = ["## Memorisation", "",
             "Samples of every arm (`symkit adapt-audit`) against **target train** and against "
             "**source train**, each read against held-out human music of that corpus: "
             + "; ".join(f"{r} test windows flagged at "
                         f"{100 * (mem[r]['human_test_flag_rate'] or 0):.1f}% "
                         f"({mem[r]['human_test_pieces']} pieces)" for r in refs)
             + f". Excesses in points with {level} intervals; > 0 over the whole interval: the "
             "arm copies that corpus more than new human music overlaps it. `zero_shot` never "
             "saw the target and `scratch` never saw the source: those rows are the chance "
             "level.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    names = list(mem[refs[0]]["arms"]) if refs else []
    for name in names:
        cells = [f"`{name}`"]
        for r in refs:
            a = mem[r]["arms"].get(name, {})
            cells += [_iv(a.get("flag_rate"), "{:+.1f}", 100),
                      _iv(a.get("extraction_rate"), "{:+.1f}", 100),
                      _iv(a.get("membership_auc"), "{:.3f}"), _quality(a.get("quality"))]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Flag rate: samples whose longest shared span or nearest-neighbour similarity "
              "with a training piece is above the 95% quantile of that corpus's val windows. "
              "Extraction: greedy continuations that reproduce a training piece's next ids "
              "exactly, minus the rate on its test pieces. Membership: training pieces told "
              "from held-out ones by the arm's loss per note (0.5: cannot). Human-like "
              "statistics: the share of the audit's music statistics inside that corpus's "
              "held-out human band, against the share held-out human sets reach in 95% of draws "
              "(below it: not human-like; a sample that is not music copies nothing, so read "
              "a low flag rate beside it). The full blocks are in `reports/adaptation/audit/`.",
              ""]
    return lines


def _quality(q: Mapping[str, Any] | None) -> str:
    if not q or q.get("score") is None:
        return "–"
    low = q.get("score_band_low")
    return f"{q['score']:.2f}" + (f" (humans ≥ {low:.2f})" if low is not None else "")


# ---- CLI ---------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--tokens", type=Path, default=Path("data/target/tokens/tokens.parquet"))
    a("--info", type=Path, default=Path("data/target/tokens/info.json"))
    a("--manifest", type=Path, default=Path("../../data/manifest.parquet"))
    a("--splits", type=Path, default=Path("../../data/splits.parquet"))
    a("--metadata", type=Path, default=Path("../../data/raw_metadata.csv"))
    a("--source-tokens", type=Path, default=Path("data/tokens/tokens.parquet"))
    a("--source-info", type=Path, default=Path("data/tokens/info.json"))
    a("--source-manifest", type=Path, default=Path("data/manifest.parquet"))
    a("--source-splits", type=Path, default=Path("data/splits.parquet"))
    a("--source-metadata", type=Path, default=Path("data/raw_metadata.csv"))
    a("--decontamination", type=Path, default=Path("reports/decontamination.json"))
    a("--source-split-report", type=Path, default=Path("reports/split.json"))
    a("--arms-dir", type=Path, default=Path("data/arms"))
    a("--arm-reports", type=Path, default=Path("reports/arms"))
    a("--arm-env", type=Path, default=Path("reports/sidecars/arms"),
      help="the arms' sidecars (adapt-train --env), read for the timing sidecar only")
    a("--per-piece", type=Path, default=Path("reports/adaptation/per_piece.parquet"))
    a("--report", type=Path, default=Path("reports/adaptation.json"))
    a("--markdown", type=Path, default=Path("reports/adaptation.md"))
    a("--figure", type=Path, default=Path("reports/figures/adaptation.png"))
    a("--split-report", type=Path, default=Path("../../reports/split.json"),
      help="the target's split report (its split hash is checked against --splits)")
    a("--audit", type=Path, default=Path("reports/adapt_audit.json"),
      help="the arms' memorisation audit (symkit adapt-audit); its section is left out when "
           "the file is missing")
    a("--preregistration", type=Path, default=adapt_registration.REGISTRATION)
    a("--ledger", type=Path, default=adapt_registration.LEDGER,
      help="the experiment's test-access ledger; this run's target test scores are appended")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("adaptation", args.params, AdaptationConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    extra = {"licences": {"source": licences(args.source_metadata),
                          "target": licences(args.metadata)},
             "decontamination": decontamination(args.decontamination,
                                                args.source_split_report)}
    try:
        registration = Registration(args.preregistration, args.ledger, adapt_registration.identity(
            args.params, target_splits=args.splits, target_split_report=args.split_report,
            source_splits=args.source_splits, source_split_report=args.source_split_report))
        out = run(cfg, runtime,
                  target={"tokens": args.tokens, "info": args.info, "manifest": args.manifest,
                          "splits": args.splits},
                  source={"tokens": args.source_tokens, "info": args.source_info,
                          "manifest": args.source_manifest, "splits": args.source_splits},
                  arms_dir=args.arms_dir, arm_reports=args.arm_reports,
                  per_piece=args.per_piece, report=args.report, markdown=args.markdown,
                  figure=args.figure, extra=extra, registration=registration,
                  arm_env=args.arm_env, audit=args.audit)
    except ParamsError:
        raise
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"symkit adapt-evaluate: {e}", file=sys.stderr)
        return 1
    d = out["decision"]
    helps = d["pretraining_helps"]
    print(f"adapt-evaluate: pretraining helps: {helps['verdict']} ({helps['arm']} vs scratch on "
          f"test, gain {100 * helps['interval']['value']:+.2f}% "
          f"[{100 * helps['interval']['ci_low']:+.2f}%, {100 * helps['interval']['ci_high']:+.2f}%]"
          f"); smallest adequate arm: {d['smallest_adequate']}; best on val: {d['best_arm']}; "
          f"registration: {out['registration']['status']}")
    return 0
