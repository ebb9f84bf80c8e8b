"""The one way symkit reads test rows: record the look first, then hand the rows over.

Each scoring of test pieces spends the test set, whichever command does it. So every symkit path
that scores test pieces (evaluate, the audit, an adaptation experiment's evaluate and audit,
``symkit score`` on registered test pieces, ``symkit compare --split test``) reads them through
this module, which appends a *look* to the experiment's test-access ledger
(``reports/ledger.jsonl``, :mod:`pipeline.decision.ledger`) before returning them:

- ``command``: the symkit command that scores;
- ``pieces`` (sorted sha256s), ``n_pieces``, ``pieces_sha256``;
- ``registration``: the registration in force
  (:func:`pipeline.decision.ledger.registration_summary`, with its amendments), or null;
- ``code``: the digest of the judging code that runs (:mod:`pipeline.decision.bound_code`);
- ``inputs``: a digest of what is read (the token table, or the score rows);
- ``look``: the hash of all of the above, which names the look. The same command reading the
  same rows under the same registration and code is the same look, recorded once.

A command that computes scores afterwards may add them (:meth:`Look.scored`), so the report can
tell its own run's looks from earlier ones. ``commit`` and ``time`` describe the event and take
no part in any result.

The raw reader lives in :mod:`pipeline.core.sealed`; an import-linter ``forbidden`` contract
(``pyproject.toml``) shows that no other module imports it, and
:func:`pipeline.tokens.contract.read_tokens` refuses the test split.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.core import artifacts, sealed
from pipeline.decision import bound_code, history, ledger

LOOK_SCHEMA = 2


@dataclass(frozen=True)
class Look:
    """A recorded look: its ledger record, and where the ledger is."""

    record: dict[str, Any]
    path: Path | None

    @property
    def id(self) -> str:
        return str(self.record["look"])

    def scored(self, results_sha256: str, what: str = "scores") -> dict[str, Any] | None:
        """Append the digest of what this look computed (``what``: e.g. ``scores`` for evaluate's
        test rows, ``audit`` for the audit's judgements); None when already recorded."""
        if self.path is None:
            return None
        rec = {**{k: self.record[k] for k in ("command", "pieces", "n_pieces", "pieces_sha256",
                                              "registration", "code")},
               "schema": LOOK_SCHEMA, "kind": what, "look": self.id,
               "source": self.record["source"],
               "results_sha256": results_sha256, "commit": self.record.get("commit"),
               "time": self.record.get("time")}
        return (ledger.append([rec], self.path) or [None])[0]


def _registration(path: Path | None) -> dict[str, Any] | None:
    registered = artifacts.read_json_or_none(path) if path is not None else None
    return ledger.registration_summary(registered)


def record(command: str, pieces: Iterable[str], inputs: str, *,
           ledger_path: Path | None = ledger.LEDGER,
           registration: Path | None = ledger.REGISTRATION,
           code: str | None = None) -> Look:
    """Append the look of ``command`` at ``pieces`` (``inputs``: a digest of the rows read) to
    ``ledger_path`` (None: a look with nowhere to go, for callers that keep no ledger; the
    record is still returned) and return it."""
    shas = sorted({str(p) for p in pieces})
    reg = _registration(registration)
    rec: dict[str, Any] = {
        "schema": LOOK_SCHEMA, "kind": "look", "command": command, "source": command,
        "pieces": shas, "n_pieces": len(shas),
        "pieces_sha256": hashlib.sha256("\n".join(shas).encode()).hexdigest(),
        "registration": reg, "code": code or bound_code.judging_digest(), "inputs": inputs}
    rec["look"] = artifacts.sha256_json(rec)
    rec.update(commit=history.head_commit(), time=ledger.now_utc())
    if ledger_path is not None and shas:
        if not ledger_path.exists():
            artifacts.write_bytes(ledger_path, b"")
        ledger.append([rec], ledger_path)
    return Look(rec, ledger_path)


def test_tokens(command: str, tokens: Path, columns: Iterable[str] | None = None, *,
                ledger_path: Path | None = ledger.LEDGER,
                registration: Path | None = ledger.REGISTRATION,
                ) -> tuple[pd.DataFrame, Look]:
    """The test rows of the token table ``tokens`` (sorted by sha256, track), after recording the
    look. ``columns`` must include ``sha256`` and ``split``."""
    rows = sealed.read_test_tokens(tokens, columns)
    look = record(command, rows["sha256"].astype(str), artifacts.sha256_file(tokens),
                  ledger_path=ledger_path, registration=registration)
    return rows, look


def test_scores(command: str, table: pd.DataFrame, *,
                ledger_path: Path | None = ledger.LEDGER,
                registration: Path | None = ledger.REGISTRATION,
                ) -> tuple[pd.DataFrame, Look | None]:
    """The test rows of a per-piece score table (``symkit compare --split test`` reads the arms'
    scores of test pieces), after recording the look; no look when it holds none."""
    rows = sealed.select_test(table)
    if rows.empty:
        return rows, None
    look = record(command, rows["sha256"].astype(str),
                  ledger.results_digest(ledger.test_rows(table)),
                  ledger_path=ledger_path, registration=registration)
    return rows, look


def test_pieces_scored(command: str, sha256s: Iterable[str], test_pieces: Iterable[str],
                       inputs: str, *, ledger_path: Path | None = ledger.LEDGER,
                       registration: Path | None = ledger.REGISTRATION) -> Look | None:
    """For commands that score files rather than the token table (``symkit score``): the look
    at those of ``sha256s`` that are test pieces (``test_pieces``), recorded before scoring;
    None when none is."""
    hit = sorted(set(map(str, sha256s)) & set(map(str, test_pieces)))
    if not hit:
        return None
    return record(command, hit, inputs, ledger_path=ledger_path, registration=registration)


def registered_test_pieces(registration: Path = ledger.REGISTRATION,
                           splits: Path | None = Path("data/splits.parquet")) -> list[str]:
    """The test pieces a look would spend: the registration's, and the split's (read without
    its rows' content: only sha256 and split)."""
    found: set[str] = set()
    registered = artifacts.read_json_or_none(registration)
    if isinstance(registered, dict):
        ident = registered.get("identity") if isinstance(registered.get("identity"), dict) else {}
        found.update(map(str, ((ident.get("pieces") or {}).get("test") or [])))
    if splits is not None and splits.is_file():
        table = artifacts.read_parquet(splits, columns=["sha256", "split"])
        found.update(sealed.select_test(table)["sha256"].astype(str))
    return sorted(found)


def digest_of(values: Mapping[str, Any] | Iterable[Any]) -> str:
    """A digest of what a command computed, for :meth:`Look.scored`."""
    return artifacts.sha256_json(values if isinstance(values, Mapping) else list(values))
