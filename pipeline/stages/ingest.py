"""Stage ``ingest``: hash, parse and quarantine every source file under ``data/raw/``.

The work is :func:`pipeline.music.ingestion.run` (see there for the outputs, the quarantine reasons
and the worker isolation); this module is its command line. Per-file results are cached by content
hash under ``--cache-dir`` (not an output: deletable at any time, outputs are the same without
it), so a re-run after adding files parses only the new ones.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.core.config import load_runtime, load_section
from pipeline.music.ingestion import run
from pipeline.music.manifest import IngestConfig

HELP = "hash, parse and quarantine sources -> data/manifest.parquet"


# --------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--raw", type=Path, default=Path("data/raw"))
    parser.add_argument("--metadata", type=Path, default=Path("data/raw_metadata.csv"))
    parser.add_argument("--index", type=Path, default=Path("data/raw_index.parquet"),
                        help="the corpus stage's sha256 of each file (files it does not list "
                             "with their current size are hashed here)")
    parser.add_argument("--manifest", type=Path, default=Path("data/manifest.parquet"))
    parser.add_argument("--notes", type=Path, default=Path("data/notes.parquet"))
    parser.add_argument("--report", type=Path, default=Path("reports/ingest.json"))
    parser.add_argument("--workers", help="override runtime.workers (does not change results)")
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/ingest"),
                        help="per-file results by content hash (does not change results)")
    parser.add_argument("--no-cache", action="store_true", help="parse every file, cache nothing")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("ingest", args.params, IngestConfig)
    runtime = load_runtime(args.params, args.workers)
    s = run(
        cfg,
        runtime,
        raw_dir=args.raw,
        metadata=args.metadata,
        manifest=args.manifest,
        notes=args.notes,
        report=args.report,
        cache_dir=None if args.no_cache else args.cache_dir,
        index=args.index,
    )
    print(
        f"ingest: {s.n_files} files: "
        + ", ".join(f"{k} {v}" for k, v in s.by_status.items())
        + (
            " (" + ", ".join(f"{k} {v}" for k, v in s.by_reason.items()) + ")"
            if s.by_reason
            else ""
        )
    )
    return 0
