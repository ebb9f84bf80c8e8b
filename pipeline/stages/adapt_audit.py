"""``symkit adapt-audit``: the memorisation audit of every arm of an adaptation experiment,
against the target's training pieces *and* the source's.

An adapted model can copy two corpora: the one it was fine-tuned on (target train) and the one
it was pretrained on (source train). Each arm (``zero_shot``, and every trained arm with its
samples shared out among its training seeds, as the ``generate`` stage does) draws
``generate.n_samples`` unconditional samples once; the ``audit`` stage's code then audits the
same samples twice, once per reference corpus, each with its own human baseline:

- ``target``: against target train; flag thresholds from the target val windows, the baseline
  rate from the target test windows, extraction on target train against target test pieces,
  membership target train against target val and test: exactly the default experiment's audit;
- ``source``: the same with the source's split (source train, val and test).

Two arms are controls by construction: ``zero_shot`` never saw the target (its target row is the
chance level a fine-tuned arm is read against) and ``scratch`` never saw the source (its source
row is the chance level of the pretrained arms). The audit judges nothing against a margin here:
the adaptation report shows each excess with its interval.

Settings: the experiment's ``generate`` and ``audit`` sections (keys as in the top-level
params.yaml). ``models`` is not read (every arm is sampled and audited) and giving it is an
error; continuations are refused (their prompts would be target test pieces).

Outputs: ``data/adapt_audit/samples.parquet`` (generate's table, ``model`` = arm),
``reports/adaptation/samples/<arm>_unconditional_<i>.mid`` and ``.png`` (the first
``generate.files_per_kind`` of each arm), per reference ``reports/adaptation/audit/<ref>.json``,
``<ref>_per_sample.parquet`` and ``<ref>_spans.parquet`` (audit's outputs, documented there), and
``reports/adapt_audit.json``: per reference its thresholds, human flag rates and each arm's judged
blocks (flag rate, extraction, membership, quality). Timings go to the sidecar
``reports/adapt_audit.env.json``.

Each reference's test rows (its human test windows, the extraction test) are read through
:func:`pipeline.decision.looks.test_tokens`, which appends a look (command ``adapt_audit``) to the
experiment's test-access ledger (``reports/ledger.jsonl`` in the experiment's folder, with its
``reports/preregistration.json``) before handing them over; the digest of that reference's
``judged`` block follows once it is computed. Called as a library without ``ledger_path`` the
looks are recorded nowhere (tests); ``symkit adapt-audit`` always passes it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from models.base import SequenceModel
from pipeline.adaptation.arms import arm_specs, same_tokenizer
from pipeline.adaptation.config import AdaptationConfig
from pipeline.audit import judging as audit
from pipeline.audit.overlap import Shingling
from pipeline.core.artifacts import read_json, write_json, write_sidecar
from pipeline.core.config import (
    ParamsError,
    RuntimeConfig,
    load_section,
    read_params,
)
from pipeline.decision import ledger, looks
from pipeline.inference import generation as generate
from pipeline.inference.loading import ModelUnavailable, load_models, set_torch_threads
from pipeline.tokens.contract import TokenInfo, read_tokens, refuse_compound

HELP = "memorisation audit of every adaptation arm against target and source"

REFERENCES = ("target", "source")
"""The reference corpora, in the report's order."""


def check_sections(params: Path) -> None:
    """Refuse what the experiment's ``generate`` and ``audit`` sections cannot mean here."""
    data = read_params(params)
    for section in ("generate", "audit"):
        raw = data.get(section) or {}
        if "models" in raw:
            raise ParamsError(f"{section}.models: {raw['models']!r} is not read in an adaptation "
                              "experiment: every arm (adaptation.arms and zero_shot) is sampled "
                              "and audited; remove the key")
    n = (data.get("generate") or {}).get("n_continuations", 16)
    if n != 0:
        raise ParamsError(f"generate.n_continuations: {n!r}; an adaptation experiment allows 0 "
                          "(a continuation's prompt is a target test piece): set it to 0")


def token_rows(tokens: Path, *, ledger_path: Path | None,
               registration: Path | None) -> tuple[pd.DataFrame, looks.Look]:
    """A reference's rows of its token table for the audit: train and val read plainly, test
    through the gate (the look recorded in ``ledger_path`` first), sorted by (sha256, track)."""
    rows = read_tokens(tokens, audit.TOKEN_COLUMNS, splits=["train", "val"])
    test, look = looks.test_tokens("adapt_audit", tokens, audit.TOKEN_COLUMNS,
                                   ledger_path=ledger_path, registration=registration)
    table = pd.concat([rows, test], ignore_index=True)
    return table.sort_values(["sha256", "track"], kind="stable").reset_index(drop=True), look


def run(gcfg: generate.GenerateConfig, acfg: audit.AuditConfig,
        models: Mapping[str, SequenceModel],
        seeds: Mapping[str, Mapping[int, SequenceModel]], *,
        references: Mapping[str, Mapping[str, Path]], info: Path, tokenizer: Path,
        fingerprint: Path | None, samples_out: Path, samples_dir: Path, audit_dir: Path,
        report: Path, ledger_path: Path | None = None,
        registration: Path | None = None) -> dict[str, Any]:
    """Sample every arm in ``models`` (in its order; ``seeds``: an arm's training seeds), then
    audit the samples against each of ``references`` (name -> ``tokens`` and ``splits``
    paths, in the one tokenizer of ``info``), each reference's test rows read through the gate
    (its look to ``ledger_path``, None: nowhere, under ``registration``). Returns what
    ``report`` holds."""
    refuse_compound(TokenInfo.read(info), "symkit adapt-audit")  # before any look at test rows
    t0 = time.perf_counter()
    names = list(models)
    # no continuations here (check_sections), so no test row is read for prompts
    g = generate.run(gcfg, models, prompt_rows=None, info=info, tokenizer=tokenizer,
                     samples_out=samples_out, samples_dir=samples_dir, seeds=seeds,
                     names=names)
    seconds = {"generate": time.perf_counter() - t0}
    shingling = Shingling.read(fingerprint) if fingerprint is not None else None
    out: dict[str, Any] = {"arms": names, "n_samples": g.n_samples,
                           "decode_failures": g.n_decode_failures, "references": {}}
    for ref, paths in references.items():
        t = time.perf_counter()
        ref_json = Path(audit_dir) / f"{ref}.json"
        table, look = token_rows(paths["tokens"], ledger_path=ledger_path,
                                 registration=registration)
        audit.run(acfg, models, samples=samples_out, table=table, info=info,
                  tokenizer=tokenizer, per_sample=Path(audit_dir) / f"{ref}_per_sample.parquet",
                  report=ref_json, spans=Path(audit_dir) / f"{ref}_spans.parquet",
                  shingling=shingling, splits=paths.get("splits"), seeds=seeds)
        full = read_json(ref_json)
        look.scored(looks.digest_of(full["judged"]), "audit")
        out["references"][ref] = {
            "thresholds": full["thresholds"],
            "human_flag_rate": {k: full["human"][k].get("flag_rate") for k in ("val", "test")},
            "human_pieces": {k: full["human"][k].get("n_pieces") for k in ("val", "test")},
            "judged": {n: full["judged"][n] for n in names if n in full["judged"]}}
        seconds[ref] = time.perf_counter() - t
    write_json(report, out)
    write_sidecar(Path(report).with_name(Path(report).stem + ".env.json"),
                  {"seconds": {**seconds, "total": time.perf_counter() - t0}})
    return out


# ---- CLI ---------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--tokens", type=Path, default=Path("data/target/tokens/tokens.parquet"),
      help="the target's tokens, in the source's tokenizer")
    a("--info", type=Path, default=Path("data/target/tokens/info.json"))
    a("--splits", type=Path, default=Path("../../data/splits.parquet"),
      help="the target's split (its groups are resampled whole)")
    a("--source-tokens", type=Path, default=Path("data/tokens/tokens.parquet"))
    a("--source-info", type=Path, default=Path("data/tokens/info.json"))
    a("--source-splits", type=Path, default=Path("data/splits.parquet"))
    a("--tokenizer", type=Path, default=Path("data/tokenizer.json"))
    a("--fingerprint", type=Path, default=Path("data/dedupe/fingerprint.json"),
      help="dedupe's shingle settings, reused for nearest-neighbour similarity")
    a("--arms-dir", type=Path, default=Path("data/arms"))
    a("--samples-out", type=Path, default=Path("data/adapt_audit/samples.parquet"))
    a("--samples-dir", type=Path, default=Path("reports/adaptation/samples"))
    a("--audit-dir", type=Path, default=Path("reports/adaptation/audit"))
    a("--report", type=Path, default=Path("reports/adapt_audit.json"))
    a("--preregistration", type=Path, default=ledger.REGISTRATION,
      help="the experiment's registration, recorded with each look")
    a("--ledger", type=Path, default=ledger.LEDGER,
      help="the experiment's test-access ledger; each reference's look at its test pieces is "
           "appended")


def main(args: argparse.Namespace) -> int:
    check_sections(args.params)
    cfg = load_section("adaptation", args.params, AdaptationConfig)
    gcfg = load_section("generate", args.params, generate.GenerateConfig)
    acfg = load_section("audit", args.params, audit.AuditConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    try:
        info = same_tokenizer(args.info, args.source_info)
        refuse_compound(info, "symkit adapt-audit")
    except ParamsError as e:
        print(f"symkit adapt-audit: {e}", file=sys.stderr)
        return 1
    set_torch_threads(runtime.torch_threads, ["transformer"])  # samples depend on it
    specs = arm_specs(cfg, args.arms_dir)
    try:
        loaded, _ = load_models(specs, gcfg.device, info, strict=True, any_split=True)
    except ModelUnavailable as e:
        print(f"symkit adapt-audit: cannot use an arm: {e}", file=sys.stderr)
        return 1
    models: dict[str, SequenceModel] = {}
    seeds: dict[str, dict[int, SequenceModel]] = {}
    for spec in specs:  # an arm is its first seed's model; its seeds share out the samples
        models.setdefault(spec.name, loaded[spec.key])
        if spec.seed is not None:
            seeds.setdefault(spec.name, {})[spec.seed] = loaded[spec.key]
    seeds = {n: s for n, s in seeds.items() if len(s) > 1}
    out = run(gcfg, acfg, models, seeds,
              references={"target": {"tokens": args.tokens, "splits": args.splits},
                          "source": {"tokens": args.source_tokens,
                                     "splits": args.source_splits}},
              info=args.info, tokenizer=args.tokenizer,
              fingerprint=args.fingerprint if args.fingerprint.exists() else None,
              samples_out=args.samples_out, samples_dir=args.samples_dir,
              audit_dir=args.audit_dir, report=args.report, ledger_path=args.ledger,
              registration=args.preregistration)
    for ref in REFERENCES:
        rates = ", ".join(
            f"{n} {100 * b['flag_rate']['excess']['value']:+.1f}"
            for n, b in out["references"][ref]["judged"].items() if "flag_rate" in b)
        print(f"adapt-audit: flag-rate excess over {ref} humans (points): {rates}")
    return 0
