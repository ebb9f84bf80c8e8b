"""Stage ``contamination``: which held-out pieces also appear in other corpora.

A test score means little when the test pieces sit in a corpus the model (or the model it is
compared with) was trained on. This stage checks the val and test pieces (``contamination.splits``)
against every reference corpus named in ``contamination.against``, or in ``--against`` for a check
outside the pipeline, with dedupe's own fingerprints and rules, so "duplicate" means here what it
means inside the corpus:

- ``note``: equal ``note_hash`` (the same music, saved differently);
- ``transposed``: the same music up to transposition and a uniform time scale;
- ``melody``: the same top-voice interval sequence (either melody view);
- ``near``: dedupe's near tier, its candidates (LSH and shared runs, across the two corpora only)
  confirmed by its rules (Jaccard, containment, whole-token, melody or excerpt alignment), with the
  settings of the ``dedupe`` section.

All four tiers are checked whatever ``dedupe.policy`` says: the policy decides what a pair does
inside the corpus, not whether two corpora share music.

A reference corpus is a folder of MIDI files, a file list or another symkit project's
``manifest.parquet``; its files are ingested with this project's ``ingest`` settings (a bad file is
quarantined and listed) and its ingest and fingerprints cached under ``--cache-dir`` by content
hash. Resolving, ingesting, fingerprinting and matching live in
:mod:`pipeline.similarity.reference_corpora`; this module runs them and writes what they find.

Outputs (sorted; no timestamps, no absolute paths unless a reference was named by one):

- ``reports/contamination/matches.parquet``: one row per held-out piece and reference piece
  linked, at the first tier that links them (see ``MATCHES_SCHEMA``);
- ``reports/contamination/quarantined.parquet``: the reference files quarantined, with reasons;
- ``reports/contamination.json``: per reference its files by status, per split the pieces with a
  match (by strongest tier), and ``test_in_reference`` / ``val_in_reference`` for the criteria
  (null when no reference is declared, so a criterion on them is "not available", not a pass).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field, model_validator

from pipeline.core import artifacts
from pipeline.core.config import RuntimeConfig, StageConfig, load_runtime, load_section
from pipeline.core.splits import SPLIT_NAMES
from pipeline.music import ingestion as ingest
from pipeline.similarity import duplicates as dedupe
from pipeline.similarity.reference_corpora import held_out, load_reference, match, resolve

HELP = "which val/test pieces also appear in other corpora (--against DIR)"

TIER_ORDER = {t: k for k, t in enumerate(dedupe.TIERS)}
MATCHES_SCHEMA = pa.schema([
    ("split", pa.string()), ("sha256", pa.string()), ("path", pa.string()),
    ("reference", pa.string()), ("ref_sha256", pa.string()), ("ref_path", pa.string()),
    ("tier", pa.string()), ("rule", pa.string()), ("similarity", pa.float64()),
    ("containment", pa.float64()), ("alignment", pa.float64()), ("part_of", pa.string()),
    ("part_start", pa.float64()), ("part_end", pa.float64()),
])
"""``tier`` is the first of note/transposed/melody/near that links the pair; for ``near``,
``rule`` is the first dedupe rule that holds, ``similarity`` the exact shingle Jaccard,
``containment`` the shingle containment and ``alignment`` the Indel similarity of that rule
(1.0 / null for the exact tiers). An excerpt (rules ``containment`` and ``excerpt``) names the
longer piece in ``part_of`` (``sha256`` or ``ref_sha256``) and where the shorter lies in it, in
beats (``part_start`` to ``part_end``)."""
QUARANTINE_SCHEMA = pa.schema([("reference", pa.string()), ("path", pa.string()),
                               ("reason", pa.string()), ("detail", pa.string())])


class ContaminationConfig(StageConfig):
    """``contamination`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "contamination"

    against: list[str] = Field(default_factory=list)
    splits: list[Literal["train", "val", "test"]] = Field(
        default_factory=lambda: ["val", "test"], min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> ContaminationConfig:
        for key in ("against", "splits"):
            values = getattr(self, key)
            if len(set(values)) != len(values):
                raise ValueError(f"{key}: {values} names an entry twice")
        return self


# ---------------------------------------------------------------------------------------------
# the stage


@dataclass(frozen=True)
class ContaminationSummary:
    references: int
    matched: dict[str, tuple[int, int]]  # split -> (pieces with a match, pieces)
    quarantined: int


def _table(rows: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    def column(f: pa.Field) -> list:
        if not len(rows):
            return []
        values = rows[f.name]
        if pa.types.is_string(f.type):  # pandas writes a missing string as NaN
            return [v if isinstance(v, str) else None for v in values.tolist()]
        return values.astype(np.float64).tolist()

    return pa.table({f.name: column(f) for f in schema}, schema=schema)


def run(cfg: ContaminationConfig, dcfg: dedupe.DedupeConfig, icfg: ingest.IngestConfig,
        runtime: RuntimeConfig, *, manifest: Path, notes: Path, splits: Path, out_dir: Path,
        report: Path, cache_dir: Path, against: list[str] | None = None
        ) -> ContaminationSummary:
    t0 = time.perf_counter()
    names = cfg.against if against is None else against
    key = "contamination.against" if against is None else "--against"
    sources = [resolve(s, key) for s in names]  # every reference checked before any work
    wanted = [s for s in SPLIT_NAMES if s in cfg.splits]
    if sources:
        q = held_out(manifest, notes, splits, wanted, dcfg, runtime)
        split_of = q.split
    else:  # nothing to compare: the pieces are only counted
        split_of = artifacts.read_parquet(splits, columns=["split"])["split"].to_numpy()
    frames, quarantined, refs_out = [], [], []
    cached = []
    for src in sources:
        ref = load_reference(src, icfg, dcfg, runtime, cache_dir)
        cached.append(ref.cached)
        m = match(q, ref.side, ref.views, dcfg)
        m["reference"] = src.name
        m["sha256"], m["path"], m["split"] = (q.sha256[m["qi"]], q.path[m["qi"]],
                                              q.split[m["qi"]])
        m["ref_sha256"], m["ref_path"] = ref.side.sha256[m["ri"]], ref.side.path[m["ri"]]
        frames.append(m)
        bad = ref.manifest[ref.manifest["status"] == "quarantined"]
        quarantined.append(bad.assign(reference=src.name))
        status = Counter(ref.manifest["status"])
        refs_out.append({
            "reference": src.name, "kind": src.kind, "content_hash": ref.content_hash,
            "files": len(ref.manifest),
            "by_status": {s: status.get(s, 0) for s in ("ok", "quarantined", "duplicate")},
            "by_reason": dict(sorted(Counter(bad["reason"]).items())),
            "pieces_matched": int(m["ri"].nunique()),  # reference pieces with a match
        })
    matches = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=[f.name for f in MATCHES_SCHEMA] + ["qi", "ri"])
    if len(matches):
        matches["_s"] = matches["split"].map({s: k for k, s in enumerate(SPLIT_NAMES)})
        matches["_t"] = matches["tier"].map(TIER_ORDER)
        matches = matches.sort_values(["_s", "sha256", "_t", "reference", "ref_sha256"],
                                      kind="stable")
        for c in ("similarity", "containment", "alignment"):
            matches[c] = np.round(matches[c].astype(np.float64), 12)
        matches["rule"] = matches["rule"].where(matches["tier"] == "near", None)
    bad = pd.concat(quarantined, ignore_index=True) if quarantined else pd.DataFrame(
        columns=[f.name for f in QUARANTINE_SCHEMA])
    bad = bad.sort_values(["reference", "path"], kind="stable") if len(bad) else bad

    by_split: dict[str, dict] = {}
    summary: dict = {"references": refs_out, "splits": wanted,
                     "tiers": list(dedupe.TIERS), "matches": len(matches)}
    matched: dict[str, tuple[int, int]] = {}
    checked = bool(sources)
    for s in wanted:
        pieces = int((split_of == s).sum())
        ms = matches[matches["split"] == s] if len(matches) else matches
        strongest = ms.groupby("sha256")["_t"].min() if len(ms) else pd.Series(dtype=int)
        block = {"pieces": pieces, "in_reference": int(strongest.size) if checked else None,
                 "by_tier": {t: int((strongest == k).sum()) if checked else None
                             for t, k in TIER_ORDER.items()}}
        for ref in refs_out:  # a list, not a dict keyed by paths: metric names stay plain
            ref.setdefault("in_reference", {})[s] = int(
                ms.loc[ms["reference"] == ref["reference"], "sha256"].nunique()) if len(ms) else 0
        by_split[s] = block
        matched[s] = (int(strongest.size), pieces)
        summary[f"{s}_in_reference"] = block["in_reference"]
        summary[f"{s}_in_reference_share"] = (
            round(block["in_reference"] / pieces, 6) if checked and pieces else None)
    summary["by_split"] = by_split

    out_dir.mkdir(parents=True, exist_ok=True)
    artifacts.write_parquet(out_dir / "matches.parquet", _table(matches, MATCHES_SCHEMA))
    artifacts.write_parquet(out_dir / "quarantined.parquet", _table(bad, QUARANTINE_SCHEMA))
    artifacts.write_json(report, summary)
    artifacts.write_sidecar(report.with_suffix(".env.json"), {
        "seconds": round(time.perf_counter() - t0, 3), "workers": runtime.n_workers(),
        "references_from_cache": cached})
    return ContaminationSummary(len(sources), matched, len(bad))


# --------------------------------------------------------------------------- CLI
CHECK_DIR = Path("reports/contamination-check")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--against", action="append", metavar="DIR_OR_MANIFEST",
                        help="a reference corpus to check against instead of "
                             "contamination.against (repeatable): a folder of MIDI files, a "
                             ".txt/.csv file list or a symkit manifest.parquet; results go to "
                             f"{CHECK_DIR.as_posix()}/ unless --out-dir/--report say otherwise")
    parser.add_argument("--manifest", type=Path, default=Path("data/manifest.parquet"))
    parser.add_argument("--notes", type=Path, default=Path("data/notes.parquet"))
    parser.add_argument("--split-table", type=Path, default=Path("data/splits.parquet"))
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="default: reports/contamination")
    parser.add_argument("--report", type=Path, default=None,
                        help="default: reports/contamination.json")
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/contamination"),
                        help="ingested and fingerprinted reference corpora, by content hash")
    parser.add_argument("--workers", help="override runtime.workers (does not change results)")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("contamination", args.params, ContaminationConfig)
    dcfg = load_section("dedupe", args.params, dedupe.DedupeConfig)
    icfg = load_section("ingest", args.params, ingest.IngestConfig)
    runtime = load_runtime(args.params, args.workers)
    adhoc = args.against is not None
    out_dir = args.out_dir or (CHECK_DIR if adhoc else Path("reports/contamination"))
    report = args.report or (CHECK_DIR / "summary.json" if adhoc
                             else Path("reports/contamination.json"))
    s = run(cfg, dcfg, icfg, runtime, manifest=args.manifest, notes=args.notes,
            splits=args.split_table, out_dir=out_dir, report=report, cache_dir=args.cache_dir,
            against=args.against)
    if not s.references:
        print("contamination: no reference corpus declared (contamination.against or "
              "--against); nothing to check")
        return 0
    found = ", ".join(f"{k} {m} of {n}" for k, (m, n) in s.matched.items())
    print(f"contamination: {s.references} reference corpus(es); held-out pieces with a match: "
          f"{found}; {s.quarantined} reference file(s) quarantined; "
          f"matches -> {(out_dir / 'matches.parquet').as_posix()}")
    return 0
