"""What git history shows about the ledger and the registrations: the checks ``symkit report``
runs itself before it reads a status as FOLLOWED.

A registration and its ledger live in the same repository as the results, so whoever writes the
results can also rewrite them: edit the registration and recompute its hash, drop the ledger
line that named the old one, commit both at once. Every commit keeps what was there before,
though, so :func:`scan` reads every committed version, on every ref:

- **the ledger**: every committed version must still be contained, in order, in the current
  file (for a history without merges: be a prefix of it). A merge of two branches keeps both
  sides' lines (``.gitattributes``: ``merge=union``), so each side stays contained;
- **the registrations**: every committed version of ``reports/preregistration.json``, with the
  test pieces it registered and its identity hash, so the check
  (:func:`pipeline.decision.preregistration.check`) can name an earlier, different
  registration of the same test pieces that the current one does not declare;
- **the code at the registration's commit**, for a registration that predates binding the
  judging code (:mod:`pipeline.decision.bound_code`): git still holds what it was.

Where history cannot be read (no git, a shallow clone, a tarball), ``checked`` is False with the
reason, and the report reads UNVERIFIED instead of FOLLOWED. These are facts about the working
copy, so they go to the report's environment sidecar, never into a result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.decision import bound_code, history


def contained(old: Sequence[str], new: Sequence[str]) -> bool:
    """Is ``old`` a subsequence of ``new`` (every line, in order)?"""
    it = iter(new)
    return all(any(line == other for other in it) for line in old)


def _lines(data: bytes) -> list[str]:
    return [x for x in data.decode("utf-8", "replace").splitlines() if x.strip()]


def ledger_problems(path: Path) -> tuple[int, list[str]]:
    """(committed versions read, one sentence per version not kept in the current ledger)."""
    now = _lines(path.read_bytes()) if path.exists() else []
    path = history.project_path(path)
    versions = history.commits_touching(path)
    out = []
    for commit, _ in versions:
        data = history.file_at(commit, path)
        if data is None:
            continue  # the commit deleted it: the deletion itself shows as the next version's
        old = _lines(data)
        if not contained(old, now):
            lost = sum(1 for x in old if x not in set(now))
            out.append(f"{path} as committed in {commit[:12]} is not contained in the current "
                       f"one ({lost} of its {len(old)} lines removed or changed): looks recorded "
                       "in git were rewritten")
    return len(versions), out


def test_pieces_sha256(registered: Any) -> str | None:
    """The hash of the sorted test pieces a registration names (None: it names none)."""
    ident = registered.get("identity") if isinstance(registered, dict) else None
    pieces = ((ident or {}).get("pieces") or {}).get("test") if isinstance(ident, dict) else None
    if not pieces:
        return None
    return hashlib.sha256("\n".join(sorted(map(str, pieces))).encode()).hexdigest()


def registrations(path: Path) -> list[dict[str, Any]]:
    """Every committed version of the registration at ``path``, oldest first: commit, time,
    identity hash, test pieces (their hash and count), criteria names, amendments and whether
    it was forced, and what it declares it supersedes."""
    out, path = [], history.project_path(path)
    for commit, when in history.commits_touching(path):
        data = history.file_at(commit, path)
        try:
            reg = json.loads(data) if data is not None else None
        except json.JSONDecodeError:
            reg = None
        if not isinstance(reg, dict):
            continue
        ident = reg.get("identity") if isinstance(reg.get("identity"), dict) else {}
        rules = ((ident.get("params") or {}).get("criteria") or {}).get("rules") or []
        pieces = (ident.get("pieces") or {}).get("test") or []
        out.append({"commit": commit, "time": when,
                    "identity_hash": reg.get("identity_hash"),
                    "test_pieces_sha256": test_pieces_sha256(reg), "n_test": len(pieces),
                    "criteria": sorted(str(r.get("name")) for r in rules if isinstance(r, dict)),
                    "amendments": [a.get("hash") for a in reg.get("amendments") or []
                                   if isinstance(a, dict)],
                    "forced": bool(reg.get("forced"))})
    return out


def code_at(commit: str) -> dict[str, dict[str, Any]]:
    """:func:`pipeline.decision.bound_code.bound_code`'s files as ``commit`` held them."""
    root = bound_code.CODE_ROOT

    def read(path: str) -> str | None:
        # git paths are relative to the working directory; the code root may lie above it
        rel = Path(path)
        try:
            rel = (root / path).relative_to(Path.cwd().resolve())
        except ValueError:
            rel = Path(path)
        data = history.file_at(commit, rel)
        return data.decode("utf-8", "replace") if data is not None else None

    return bound_code.bound_code(read=read)


def scan(registration: Path, ledger: Path) -> dict[str, Any]:
    """The history block of the report's sidecar: ``checked`` (and ``why_not``), the ledger's
    committed versions and problems, every committed registration, and the code at the
    registration's commit when the registration binds none."""
    why = history.unreadable()
    if why is not None:
        return {"checked": False, "why_not": why}
    n, problems = ledger_problems(ledger)
    regs = registrations(registration)
    current = None
    if registration.exists():
        try:
            current = json.loads(registration.read_bytes())
        except json.JSONDecodeError:
            current = None
    block: dict[str, Any] = {"checked": True, "why_not": None, "ledger_versions": n,
                             "ledger_problems": problems, "registrations": regs}
    ident = current.get("identity") if isinstance(current, dict) else None
    if isinstance(ident, dict) and ident.get("code") is None:
        commit = next((r["commit"] for r in reversed(regs)
                       if r["identity_hash"] == current.get("identity_hash")), None)
        block["code_at_registration"] = code_at(commit) if commit else None
        block["registration_commit"] = commit
    return block


def first_commit(block: dict[str, Any], registration: Path) -> str | None:
    """The first commit that held the current registration's identity (later ones may only
    have amended it); None without history or a committed registration."""
    try:
        current = json.loads(registration.read_bytes()) if registration.exists() else None
    except json.JSONDecodeError:
        return None
    if not isinstance(current, dict):
        return None
    return next((r["commit"] for r in block.get("registrations") or []
                 if r.get("identity_hash") == current.get("identity_hash")), None)
