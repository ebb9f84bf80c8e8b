"""``symkit preregister``: freeze the experiment's identity and its decision rules before the test
set is scored.

Pre-registration is an explicit act, not a pipeline stage: run it after ``split`` (it needs the
split) and before ``evaluate`` has scored the test split, then commit
``reports/preregistration.json`` on its own, before the results. The record
(:mod:`pipeline.decision.preregistration`) holds:

- ``identity.split_hash``: computed from ``data/splits.parquet`` (and checked against
  ``reports/split.json``);
- ``identity.pieces``: the sorted sha256s of the val and test pieces;
- ``identity.params``: the params sections that shape results, as written (``tokenize``,
  ``ngram``, ``transformer``, ``evaluate``, ``generate``, ``audit``, ``criteria``);
- ``identity.packages``: the installed versions of the packages results depend on;
- ``identity.code``: a digest of each file of the code that judges, trains and stops training
  (:mod:`pipeline.decision.bound_code`);
- ``identity_hash``: the hash of ``identity`` (the report recomputes it);
- ``power``: before any test piece is scored, each rule's pass rates under its good and bad
  controls, and all rules' together for the good model and each bad one, at the registered
  sizes (split counts, audit and generate params) and the spreads of a val pilot
  (``--pilot``: the trained models scored on val only; :mod:`pipeline.decision.spreads`), the
  gain the comparison rule passes with 80% probability, what the recipe can reach with these
  pieces (more samples, twice the seeds) and the smallest larger design that would pass the
  good model 80% of the time (:mod:`pipeline.decision.criteria_controls`); the report shows it
  beside the same simulation at the run's spreads;
- ``forced``, ``looks_before`` and ``supersedes``: set only by ``--force``, which registers
  although test scores of these pieces, or an earlier registration of them in git, exist; the
  report then reads ``FOLLOWED AFTER n LOOKS`` or ``REPLACING n REGISTRATIONS`` at best;
- ``amendments``: appended by ``--amend "why"``, a fix to the bound code after a look
  (:func:`pipeline.decision.preregistration.amend`), each with the power statement restated by
  the amended code (the registration's own stays as it was stated).

It prints the hash to publish outside the repository (the identity hash, or the last
amendment's), so that no later rewrite of the file and its history can pass for it.

It refuses when test scores of any of the test pieces exist anywhere symkit can see: the
test-access ledger (``reports/ledger.jsonl``), the workspace's per-piece table and eval.json,
every committed version of them on any git ref (DVC experiments included), and the DVC cache
(:func:`pipeline.decision.ledger.scan_history`). Looks found there are appended to the ledger.
No timestamps: the commit that adds the file dates it, and the report's status says whether that
commit precedes the results.

The planned comparisons between runs (params.yaml's ``compare`` section) are frozen into a file of
their own, ``reports/preregistration_compare.json``
(:mod:`pipeline.decision.registered_comparisons`), so that
registering a comparison never changes the experiment's registration, which evaluate reads.
Register them before the runs they compare (commit the file, then ``symkit sweep`` or ``dvc exp
run``): every experiment carries the file it ran with, and ``symkit compare`` calls a rule
DEVIATED when an arm holds another registration or none. ``--comparisons-only`` registers them
alone, e.g. on an experiment whose test set is already scored.

In an adaptation experiment's folder (params.yaml with an ``adaptation`` section, e.g.
``experiments/adaptation``) it registers that experiment instead: the target's and the source's
splits, the frozen sections and the decision (:mod:`pipeline.adaptation.adaptation_registration`),
refusing
when the experiment's target test scores exist (its ledger, git history, the workspace).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.adaptation import adaptation_registration as adapt_registration
from pipeline.audit.memorisation import window_offsets
from pipeline.core import artifacts
from pipeline.core.artifacts import ArtifactError
from pipeline.core.config import load_section, parse_section, read_params
from pipeline.core.splits import split_hash, split_hash_of
from pipeline.decision import ledger, trail
from pipeline.decision import registered_comparisons as comparisons
from pipeline.decision.bound_code import bound_code
from pipeline.decision.criteria import CriteriaConfig
from pipeline.decision.criteria_controls import Sizes, design_sizes, power_block, power_lines
from pipeline.decision.preregistration import (
    BOUND_SPLITS,
    NothingToAmend,
    amend,
    build,
    chain_head,
    identity,
    power_sentence,
    reproduction_tolerance,
    test_scores_exist,
)
from pipeline.decision.registered_comparisons import CompareConfig
from pipeline.decision.spreads import SpreadsUnavailable, from_pilot
from pipeline.tokens.contract import read_tokens

HELP = "freeze the decision criteria before scoring test"


def split_pieces(splits: Path, split_report: Path) -> tuple[str, dict[str, list[str]]]:
    """The split hash of ``data/splits.parquet`` and its val and test pieces; refuses when
    ``reports/split.json`` names another split (the two come from one run of the split stage)."""
    table = artifacts.read_parquet(splits, columns=["sha256", "split"])
    digest = split_hash(table["sha256"].astype(str), table["split"].astype(str))
    reported = split_hash_of(artifacts.read_json_or_none(split_report))
    if reported is not None and reported != digest:
        raise ArtifactError(f"{split_report} names split {reported[:12]} but {splits} hashes to "
                            f"{digest[:12]}: re-run `dvc repro split`")
    pieces = {s: sorted(table.loc[table["split"] == s, "sha256"].astype(str))
              for s in BOUND_SPLITS}
    return digest, pieces


def _where(records: list[dict[str, Any]], eval_scored: bool, eval_report: Path) -> str:
    parts = [f"{r.get('source')} {str(r.get('commit') or '')[:12]}".strip()
             + f" ({r.get('time') or 'time unknown'})" for r in records[:5]]
    if len(records) > 5:
        parts.append(f"{len(records) - 5} more")
    if eval_scored and not records:
        parts.append(str(eval_report))
    return "; ".join(parts)


def run(params: Path, *, split_report: Path, eval_report: Path, out: Path,
        splits: Path = Path("data/splits.parquet"), per_piece: Path = ledger.PER_PIECE,
        ledger_path: Path = ledger.LEDGER, force: bool = False,
        power_draws: int = 0, pilot: Path = Path("reports/pilot"),
        tokens: Path = Path("data/tokens/tokens.parquet")) -> dict[str, Any]:
    """Write the registration; refuse when test scores of these test pieces already exist,
    unless ``force`` (which the record then states, with the looks it registered over).
    ``power_draws`` > 0 adds ``power``: every rule's control pass rates, and all rules'
    together for the good and the bad models, at the registered sizes and the spreads of the
    val pilot in ``pilot`` (:func:`design_power`), stated before any test piece is scored;
    without a pilot, ``power`` says what is missing."""
    criteria = load_section("criteria", params, CriteriaConfig)  # valid rules only are frozen
    digest, pieces = split_pieces(splits, split_report)
    data = read_params(params)
    ident = identity(data, digest, artifacts.package_versions(), pieces, bound_code())
    ident["reproduction"] = reproduction_tolerance(data.get("criteria"))
    old = artifacts.read_json_or_none(out)
    if isinstance(old, dict) and old.get("identity") == ident:
        return old  # the same registration again: nothing to change
    looks = ledger.existing_looks(pieces["test"], ledger_path=ledger_path,
                                  per_piece=per_piece, eval_report=eval_report,
                                  registration=out)
    ledger.append(looks, ledger_path)  # looks found elsewhere are looks: the ledger keeps them
    eval_scored = test_scores_exist(artifacts.read_json_or_none(eval_report), digest)
    replaced = earlier_registrations(out, ident)
    if (looks or eval_scored or replaced) and not force:
        n = len(looks) or int(eval_scored)
        why = [f"{n} look{'s' * (n != 1)}: {_where(looks, eval_scored, eval_report)}"] \
            if n else []
        why += [f"a different registration of them committed in {r['commit'][:12]} "
                f"(identity {str(r['identity_hash'])[:12]})" for r in replaced[:3]]
        raise ledger.AlreadyScored(
            f"these {len(pieces['test'])} test pieces were already scored or registered ("
            + "; ".join(why) + "): a registration made now would not precede them. Register "
            "a fresh test split (`symkit ledger` says which test pieces were scored), or pass "
            "--force (the report will read FOLLOWED AFTER n LOOKS or REPLACING n "
            "REGISTRATIONS at best, and name what it registered over)")
    if eval_scored and not looks:
        looks = [{"source": "workspace", "commit": None, "time": None,
                  "n_pieces": len(pieces["test"]),
                  "results_sha256": artifacts.sha256_file(eval_report)}]
    record = build(ident, looks, replaced)
    if power_draws > 0:
        try:
            record["power"] = design_power(criteria, read_params(params), splits, pilot, tokens,
                                           power_draws)
        except SpreadsUnavailable as e:
            record["power"] = {"not_stated": str(e)}
    artifacts.write_json(out, record)
    return record


def earlier_registrations(out: Path, ident: dict[str, Any]) -> list[dict[str, Any]]:
    """The committed registrations of ``out`` (any ref) that registered these test pieces with
    another identity, oldest first (none without git history)."""
    pieces = ((ident.get("pieces") or {}).get("test")) or []
    mine = trail.test_pieces_sha256({"identity": ident})
    found, seen = [], set()
    for v in trail.registrations(out) if pieces else []:
        h = v.get("identity_hash")
        if v.get("test_pieces_sha256") == mine and h != artifacts.sha256_json(ident) \
                and h not in seen:
            seen.add(h)
            found.append(v)
    return found


def amend_registration(out: Path, why: str, ledger_path: Path,
                       restate: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
                       ) -> dict[str, Any]:
    """Append an amendment to the registration at ``out``: the code that runs now, with the
    looks at its test pieces the ledger holds, and (``restate``, given the registration) the
    power statement as the amended code gives it. Refuses (:class:`NothingToAmend`) without a
    registration, for a registration that binds no code, or when the code is unchanged."""
    registered = artifacts.read_json_or_none(out)
    if not isinstance(registered, dict):
        raise NothingToAmend(f"{out} does not exist: there is nothing to amend; register first")
    pieces = ((registered.get("identity") or {}).get("pieces") or {}).get("test") or []
    looks = [x.record for x in ledger.looks_at(ledger.one_per_look(ledger.read(ledger_path)),
                                                pieces)]
    amend(registered, why, bound_code(), looks)  # refuses before minutes of restating power
    record = amend(registered, why, bound_code(), looks,
                   restate(registered) if restate is not None else None)
    artifacts.write_json(out, record)
    return record


def restated_power(params: Path, splits: Path, pilot: Path, tokens: Path, draws: int
                   ) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """For an amendment: the registration's power statement computed again by the code that
    runs now, with its own draws, at the registered sizes and the val pilot's spreads; None
    when the registration stated none or ``draws`` is 0."""
    def restate(registered: dict[str, Any]) -> dict[str, Any] | None:
        block = registered.get("power")
        if draws <= 0 or not isinstance(block, dict) or not block.get("joint"):
            return None
        criteria = load_section("criteria", params, CriteriaConfig)
        try:
            return design_power(criteria, read_params(params), splits, pilot, tokens,
                                int(block.get("draws") or draws))
        except SpreadsUnavailable as e:
            return {"not_stated": str(e)}
    return restate


def split_counts(splits: Path) -> dict[str, tuple[int, int]]:
    """Pieces and groups per split of ``data/splits.parquet``."""
    table = artifacts.read_parquet(splits, columns=["sha256", "group_id", "split"])
    return {str(s): (int(part["sha256"].nunique()), int(part["group_id"].nunique()))
            for s, part in table.groupby("split", sort=True)}


def windows_per_piece(tokens: Path, params: dict[str, Any]) -> float:
    """The audit's human windows per held-out piece, from val's token lengths (the audit cuts
    every sequence of a piece into windows, :func:`pipeline.audit.memorisation.window_offsets`)."""
    audit = {"human_window": 128, "human_stride": 64, "human_windows": 4,
             **(params.get("audit") or {})}
    rows = read_tokens(tokens, ["sha256", "n_tokens"], ["val"])
    if rows.empty:
        raise SpreadsUnavailable(f"{tokens} has no val rows to count the audit's windows on")
    n = sum(len(window_offsets(int(k), int(audit["human_window"]), int(audit["human_stride"]),
                               int(audit["human_windows"]))) for k in rows["n_tokens"])
    return n / rows["sha256"].nunique()


def pilot_sizes(params: dict[str, Any], splits: Path, pilot: Path, tokens: Path) -> Sizes:
    """The registered design's sizes with a val pilot's spreads: ``pilot`` holds the
    ``eval.json`` and ``per_piece.parquet`` of an evaluate run on val only (``symkit evaluate
    --splits val --report <pilot>/eval.json --per-piece <pilot>/per_piece.parquet``)."""
    report = artifacts.read_json_or_none(pilot / "eval.json")
    table = artifacts.read_table_or_none(pilot / "per_piece.parquet")
    if not isinstance(report, dict) or table is None:
        raise SpreadsUnavailable(f"{pilot} holds no eval.json and per_piece.parquet of a val "
                                 "pilot")
    if any(isinstance(m, dict) and "test" in m for m in (report.get("models") or {}).values()):
        raise SpreadsUnavailable(f"{pilot}/eval.json scored test: a pilot scores val only")
    counts = split_counts(splits)
    audit = {"flag_quantile": 0.95, **(params.get("audit") or {})}
    evaluate = {"train_pieces": 256, "ci_level": 0.95, **(params.get("evaluate") or {})}
    held = counts.get("val", (0, 0))[0] + counts.get("test", (0, 0))[0]
    train = min(int(evaluate["train_pieces"]) or held, counts.get("train", (0, 0))[0])
    spreads = from_pilot(report, table, held_out=held, train_pieces=train,
                         flag_quantile=float(audit["flag_quantile"]),
                         level=float(evaluate["ci_level"]))
    return design_sizes(params, counts, spreads, windows_per_piece(tokens, params))


def design_power(criteria: CriteriaConfig, params: dict[str, Any], splits: Path, pilot: Path,
                 tokens: Path, draws: int) -> dict[str, Any]:
    """The registration's ``power`` block: :func:`pipeline.decision.criteria_controls.power_block`
    at the sizes of this split and these params, with the val pilot's spreads
    (:func:`pilot_sizes`)."""
    return power_block(criteria, pilot_sizes(params, splits, pilot, tokens), draws)


def register_comparisons(params: Path, out: Path) -> dict[str, Any] | None:
    """Write the registration of params.yaml's ``compare`` section (validated, its rules' keys
    checked against params.yaml) to ``out``; None, and nothing written, without a section."""
    data = read_params(params)
    if data.get("compare") is None:
        return None
    cfg = parse_section("compare", data["compare"], CompareConfig, str(params))
    comparisons.check_against(cfg, data, str(params))
    rec = comparisons.record(data["compare"])
    if artifacts.read_json_or_none(out) != rec:
        artifacts.write_json(out, rec)
    return rec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split-report", type=Path, default=Path("reports/split.json"))
    parser.add_argument("--splits", type=Path, default=Path("data/splits.parquet"))
    parser.add_argument("--eval-report", type=Path, default=Path("reports/eval.json"))
    parser.add_argument("--per-piece", type=Path, default=ledger.PER_PIECE)
    parser.add_argument("--ledger", type=Path, default=ledger.LEDGER,
                        help="the test-access ledger (looks found elsewhere are appended)")
    parser.add_argument("--out", type=Path, default=Path("reports/preregistration.json"))
    parser.add_argument("--pilot", type=Path, default=Path("reports/pilot"),
                        help="the val pilot whose spreads the power statement simulates at: a "
                             "folder with eval.json and per_piece.parquet of `symkit evaluate "
                             "--splits val` (default reports/pilot)")
    parser.add_argument("--tokens", type=Path, default=Path("data/tokens/tokens.parquet"),
                        help="the token table (val's lengths give the audit's windows)")
    parser.add_argument("--power-draws", type=int, default=400,
                        help="simulated experiments per control for the power statement "
                             "(0: none; default 400); with --amend, 0 leaves the power "
                             "statement as it stands and any other value restates it with "
                             "the registration's own draws, so the two stay comparable")
    parser.add_argument("--force", action="store_true",
                        help="register although test scores or an earlier registration of the "
                             "test pieces exist (recorded, and named in the report)")
    parser.add_argument("--amend", metavar="WHY", default=None,
                        help="register a fix to the code that judges, trains or stops training "
                             "as an amendment, with the reason; the report reads FOLLOWED WITH "
                             "n AMENDMENTS and names the change and the looks before it")
    parser.add_argument("--compare-out", type=Path,
                        default=Path(comparisons.REGISTRATION),
                        help="where the planned comparisons (params.yaml's compare section) "
                             "are registered")
    parser.add_argument("--target-splits", type=Path, default=Path("../../data/splits.parquet"),
                        help="an adaptation experiment's target split (the top-level "
                             "pipeline's; adaptation experiments only)")
    parser.add_argument("--target-split-report", type=Path,
                        default=Path("../../reports/split.json"),
                        help="its split report (adaptation experiments only)")
    parser.add_argument("--comparisons-only", action="store_true",
                        help="register the planned comparisons only, leaving the experiment's "
                             "registration as it is")


def main(args: argparse.Namespace) -> int:
    if args.amend is not None:
        try:
            rec = amend_registration(args.out, args.amend, args.ledger, restated_power(
                args.params, args.splits, args.pilot, args.tokens, args.power_draws))
        except NothingToAmend as e:
            print(f"symkit preregister: --amend: {e}", file=sys.stderr)
            return 1
        a = rec["amendments"][-1]
        print(f"preregister: amendment {a['n']} ({'; '.join(a['changes'])}), after "
              f"{len(a['looks_before'])} look(s) -> {args.out} (commit it before the results)")
        print(f"preregister: publish this hash outside the repository: {chain_head(rec)}")
        for line in power_lines(a.get("power") or {}):
            print(f"preregister: power, restated: {line}")
        return 0
    if adapt_registration.is_adaptation(args.params):
        return _register_adaptation(args)
    if not args.comparisons_only:
        rc = _register_experiment(args)
        if rc:
            return rc
    rec = register_comparisons(args.params, args.compare_out)
    if rec is None:
        print(f"preregister: no compare section in {args.params}: no comparison registered")
        if args.comparisons_only:
            return 1
    else:
        rules = rec["compare"].get("rules") or []
        print(f"preregister: {len(rules)} planned comparison{'s' * (len(rules) != 1)} "
              f"({', '.join(r['name'] for r in rules) or 'none'}), {rec['hash'][:12]} -> "
              f"{args.compare_out} (commit it before running the arms)")
    return 0


def _register_adaptation(args: argparse.Namespace) -> int:
    """An adaptation experiment's registration
    (:mod:`pipeline.adaptation.adaptation_registration`), run in
    its folder: the source's split is ``--splits``, the target's ``--target-splits``."""
    try:
        rec = adapt_registration.register(
            args.params, target_splits=args.target_splits,
            target_split_report=args.target_split_report, source_splits=args.splits,
            source_split_report=args.split_report, out=args.out, ledger_path=args.ledger,
            force=args.force)
    except ledger.AlreadyScored as e:
        print(f"symkit preregister: {e}", file=sys.stderr)
        return 1
    ident = rec["identity"]
    print(f"preregister: adaptation decision ({', '.join(sorted(ident['params']['decision']))})"
          f", target split {ident['split_hash'][:12]} ({len(ident['pieces']['val'])} val, "
          f"{len(ident['pieces']['test'])} test pieces), source split "
          f"{ident['source']['split_hash'][:12]} ({len(ident['source']['pieces']['val'])} val "
          f"pieces), identity {rec['identity_hash'][:12]} -> {args.out} (commit it before the "
          "results)")
    if rec["forced"]:
        n = len(rec["looks_before"])
        print(f"preregister: warning: registered over {n} earlier look{'s' * (n != 1)} at these "
              "target test pieces (--force); the report will read FOLLOWED AFTER "
              f"{n} LOOK{'S' * (n != 1)} at best", file=sys.stderr)
    return 0


def _register_experiment(args: argparse.Namespace) -> int:
    try:
        rec = run(args.params, split_report=args.split_report, eval_report=args.eval_report,
                  out=args.out, splits=args.splits, per_piece=args.per_piece,
                  ledger_path=args.ledger, force=args.force, power_draws=args.power_draws,
                  pilot=args.pilot, tokens=args.tokens)
    except ledger.AlreadyScored as e:
        print(f"symkit preregister: {e}", file=sys.stderr)
        print("symkit preregister: to register the planned comparisons alone: symkit "
              "preregister --comparisons-only", file=sys.stderr)
        return 1
    ident = rec["identity"]
    rules = (ident["params"].get("criteria") or {}).get("rules") or []
    counts = ", ".join(f"{len(ident['pieces'][s])} {s}" for s in BOUND_SPLITS)
    print(f"preregister: {len(rules)} criteria, split {ident['split_hash'][:12]} ({counts} "
          f"pieces), identity {rec['identity_hash'][:12]} -> {args.out} (commit it before the "
          "results)")
    print(f"preregister: publish this hash outside the repository (a post, an e-mail, a "
          f"registry), so no later edit of the file can pass for it: {chain_head(rec)}")
    for line in power_lines(rec.get("power") or {}):
        print(f"preregister: power: {line}")
    if (rec.get("power") or {}).get("not_stated"):
        print(f"preregister: power not stated: {rec['power']['not_stated']}")
    criteria = load_section("criteria", args.params, CriteriaConfig)
    block = rec.get("power") or {}
    if block.get("spreads"):
        sizes, sp = block["sizes"], block["spreads"]
        note = power_sentence(criteria, sp["gain_se_groups"], sp["gain_seed_sd"],
                              int(sizes["seeds"]), float(sizes["level"]), "the val pilot's "
                              "spreads")
        if note:
            print(f"preregister: {note}")
    if rec["forced"]:
        n, r = len(rec["looks_before"]), len(rec.get("supersedes") or [])
        print(f"preregister: warning: registered over {n} earlier look{'s' * (n != 1)} at these "
              f"test pieces and {r} earlier registration{'s' * (r != 1)} of them (--force); the "
              "report names them and reads FOLLOWED AFTER n LOOKS or REPLACING n "
              "REGISTRATIONS at best", file=sys.stderr)
    return 0
