"""``symkit ledger``: the looks at the test pieces, and ``--rebuild`` from git history.

Without flags it lists every look in ``reports/ledger.jsonl`` that scored any of the current
split's test pieces (``data/splits.parquet``; the per-piece table's when there is no split), so a
user can tell, before registering, whether a test set is fresh. ``--rebuild`` first appends the
looks that git history (every ref, DVC experiments included), the DVC cache and the workspace's
per-piece table hold and the ledger lacks; it never changes or removes a line.
``--spent FILE`` (after ``--rebuild``, when both are given) writes every piece any look scored,
sorted, one sha256 a line under a ``#`` header: the file ``split.exclude_test`` reads to draw a
test set no look has seen. The same ledger gives the same bytes.
(:mod:`pipeline.decision.ledger` holds the format and the scans.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.core import artifacts
from pipeline.decision import ledger

HELP = "the test-access ledger: every look at the test pieces (--rebuild from git)"


def current_test_pieces(splits: Path, per_piece: Path) -> tuple[list[str], str]:
    """The test pieces looks are counted against, and where they come from."""
    if splits.is_file():
        table = artifacts.read_parquet(splits, columns=["sha256", "split"])
        return sorted(table.loc[table["split"] == "test", "sha256"].astype(str)), str(splits)
    here = ledger.workspace_look(per_piece)
    return (here["pieces"], str(per_piece)) if here is not None else ([], "none")


def rebuild(path: Path, per_piece: Path) -> list[dict]:
    """Append the looks found in git history, the DVC cache and the workspace."""
    found = ledger.read(path) + ledger.scan_history(per_piece)
    here = ledger.workspace_look(per_piece, known=found)
    return ledger.append(found + ([here] if here is not None else []), path)


def spent_pieces(records: list[dict]) -> list[str]:
    """The sorted, distinct sha256s of every look's ``pieces``."""
    return sorted({str(p) for r in records for p in r.get("pieces") or []})


def spent_text(records: list[dict]) -> str:
    """``--spent``'s file: a header, then :func:`spent_pieces`, one a line."""
    pieces = spent_pieces(records)
    header = (f"# Test pieces scored at least once: the union of the pieces of the {len(records)} "
              f"look{'s' * (len(records) != 1)}\n"
              "# in the test-access ledger, one sha256 a line, for split.exclude_test.\n"
              "# Written by `symkit ledger --spent FILE`. Written again after the next look,\n"
              "# it lists that test set too, and a split reading it draws yet another one.\n")
    return header + "".join(f"{p}\n" for p in pieces)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ledger", type=Path, default=ledger.LEDGER)
    parser.add_argument("--splits", type=Path, default=Path("data/splits.parquet"))
    parser.add_argument("--per-piece", type=Path, default=ledger.PER_PIECE)
    parser.add_argument("--rebuild", action="store_true",
                        help="append the looks that git history, the DVC cache and the "
                             "workspace hold and the ledger lacks")
    parser.add_argument("--spent", type=Path, default=None, metavar="FILE",
                        help="write every piece any look scored to FILE, one sha256 a line, "
                             "for split.exclude_test (after --rebuild)")


def main(args: argparse.Namespace) -> int:
    if args.rebuild:
        added = rebuild(args.ledger, args.per_piece)
        print(f"ledger: {len(added)} look{'s' * (len(added) != 1)} added to {args.ledger}"
              + (" (commit it: the ledger lives in git)" if added else ""))
    if args.spent is not None:
        records = ledger.read(args.ledger)
        artifacts.write_text(args.spent, spent_text(records))
        n = len(spent_pieces(records))
        print(f"ledger: {n} piece{'s' * (n != 1)} scored in {len(records)} "
              f"look{'s' * (len(records) != 1)} written to {args.spent}")
    pieces, source = current_test_pieces(args.splits, args.per_piece)
    looks = ledger.looks_at(ledger.read(args.ledger), pieces)
    print(f"ledger: {len(looks)} look{'s' * (len(looks) != 1)} at the {len(pieces)} test pieces "
          f"of {source}")
    for look in looks:
        reg = (look.registration or {}).get("identity_hash")
        print(f"  {look.label()}: {look.record.get('source')}, {look.overlap} of {len(pieces)} "
              f"test pieces, registration {str(reg)[:12] if reg else 'none'}")
    if looks:
        print("ledger: these test pieces have been scored; a registration made now reads "
              "FOLLOWED AFTER n LOOKS at best. A split whose test pieces show no look (`symkit "
              "ledger --spent data/spent_test.txt`, split.exclude_test set to it, a new "
              "split.seed, `dvc repro split`, then `symkit preregister`) gives a test set no "
              "look has seen, but the report still names the earlier test sets the same "
              "criteria were tried on (AFTER n EARLIER TEST SETS): a hypothesis tried on "
              "several test sets is tested more than once.")
    return 0
