"""The test-access ledger: every time test pieces were scored, and under which registration.

A pre-registration means something only if the test set was not looked at before it. The ledger,
``reports/ledger.jsonl``, is the record that says so. It is a log of events, not a result: one
JSON object a line, appended, never rewritten, kept in git beside the results. A *look* is one
set of test scores:

- ``pieces``: the sorted sha256s of the test pieces scored, ``n_pieces``, ``pieces_sha256``;
- ``results_sha256``: the hash of the test rows of ``reports/eval/per_piece.parquet`` (model,
  seed, sha256, NLL), so the same scores recorded twice are one look;
- ``registration``: the registration in force (:func:`registration_summary`: its identity hash,
  one hash per frozen params section and per criterion, the split hash, whether it was forced),
  or null;
- ``source`` (``evaluate``, the stage that scored; ``git``, a committed per-piece table found by
  ``symkit ledger --rebuild``; ``dvc-cache``, one found in the DVC cache), ``commit`` (the code
  commit that scored, or the commit that holds the table) and ``time`` (UTC, ISO 8601). These
  describe the event; they take no part in any result.

``evaluate`` appends a look whenever it scores test pieces (:func:`record_look`); a look already
present (same results under the same registration) is not appended again, so re-running an
unchanged experiment leaves the ledger as it is. :func:`earlier_looks` tells the report which
looks at the current test pieces came from another registration or other scores, and
:func:`scan_history` finds test scores in git history (every ref, DVC experiments included) and
in the DVC cache, for ``symkit preregister`` (which refuses to register over them) and
``symkit ledger --rebuild``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import yaml

from pipeline.core import artifacts
from pipeline.core.artifacts import ArtifactError
from pipeline.decision import history
from pipeline.training.config import LATER_KEYS

LEDGER = Path("reports/ledger.jsonl")
PER_PIECE = Path("reports/eval/per_piece.parquet")
EVAL = Path("reports/eval.json")
REGISTRATION = Path("reports/preregistration.json")
SCHEMA = 1


# ---- records ---------------------------------------------------------------------------------
def registration_summary(registered: Any) -> dict[str, Any] | None:
    """What a look records of the registration in force: enough to name what changed since
    (sections and criteria by hash), small enough for a line. None without a registration.
    Reads every schema symkit has written (schema 1 kept its criteria, split hash and
    evaluate section at the top level)."""
    if not isinstance(registered, dict):
        return None
    ident = registered.get("identity") if isinstance(registered.get("identity"), dict) else None
    if ident is not None:
        params = ident.get("params") if isinstance(ident.get("params"), dict) else {}
        criteria = params.get("criteria") if isinstance(params.get("criteria"), dict) else {}
        rules, split = criteria.get("rules") or [], ident.get("split_hash")
    else:  # schema 1
        protocol = registered.get("protocol") if isinstance(registered.get("protocol"),
                                                            dict) else {}
        params = {"evaluate": protocol.get("params")}
        rules, split = registered.get("criteria") or [], registered.get("split_hash")
    return {
        "identity_hash": str(registered.get("identity_hash")
                             or artifacts.sha256_json(registered)),
        "split_hash": split,
        "sections": {s: artifacts.sha256_json(_with_later_keys(s, v))
                     for s, v in sorted(params.items()) if s != "criteria"},
        "criteria": {str(r.get("name")): artifacts.sha256_json(r) for r in rules
                     if isinstance(r, dict)},
        "forced": bool(registered.get("forced") or registered.get("registered_after_scoring")),
        "amendments": len(registered.get("amendments") or []),
    }


class AlreadyScored(RuntimeError):
    """Test scores of the pieces a registration names already exist (a look in the ledger, in
    git history or in the workspace): a registration made now would not precede them."""


def _with_later_keys(section: str, value: Any) -> Any:
    """A params section with the keys added after earlier registrations filled in at the value
    that keeps the earlier behaviour (:data:`pipeline.training.config.LATER_KEYS`), so a section
    that only writes such a key out hashes as before."""
    if section != "transformer" or not isinstance(value, dict):
        return value
    out = dict(value)
    for sub, keys in LATER_KEYS.items():
        if isinstance(out.get(sub), dict):
            out[sub] = {**keys, **out[sub]}
    return out


def test_rows(per_piece: pd.DataFrame) -> pd.DataFrame:
    """The test rows of a per-piece table, in a canonical order."""
    if not {"sha256", "split"} <= set(per_piece.columns):
        return per_piece.iloc[0:0]
    rows = per_piece[per_piece["split"] == "test"]
    keys = [c for c in ("model", "seed", "sha256") if c in rows.columns]
    return rows.sort_values(keys, na_position="first").reset_index(drop=True)


def results_digest(rows: pd.DataFrame) -> str:
    """sha256 of the scores in ``rows`` (test rows of a per-piece table): model, seed, piece and
    NLL, so equal scores give equal digests whatever else the table holds."""
    cols = [c for c in ("model", "seed", "sha256", "nll_nats") if c in rows.columns]
    values = [[None if pd.isna(v) else (float(v) if c == "nll_nats" else
                                        int(v) if c == "seed" else str(v))
               for c, v in zip(cols, row, strict=True)]
              for row in rows[cols].itertuples(index=False, name=None)]
    return artifacts.sha256_json({"columns": cols, "rows": values})


def look_record(per_piece: pd.DataFrame, registered: Any, *, source: str, commit: str | None,
                time: str | None) -> dict[str, Any] | None:
    """The ledger record of the test scores in ``per_piece`` (None when it holds none)."""
    rows = test_rows(per_piece)
    if rows.empty:
        return None
    pieces = sorted(set(rows["sha256"].astype(str)))
    models = sorted(set(rows["model"].astype(str))) if "model" in rows.columns else []
    return {"schema": SCHEMA, "source": source, "commit": commit, "time": time,
            "pieces": pieces, "n_pieces": len(pieces),
            "pieces_sha256": hashlib.sha256("\n".join(pieces).encode()).hexdigest(),
            "results_sha256": results_digest(rows), "models": models,
            "registration": registration_summary(registered)}


def look_key(record: Mapping[str, Any]) -> tuple[str, str | None]:
    """What makes a record new: a look (:mod:`pipeline.decision.looks`) by its hash; scores
    by their digest under one registration."""
    reg = record.get("registration") or {}
    if record.get("kind") == "look":
        return f"look:{record.get('look')}", reg.get("identity_hash")
    return str(record.get("results_sha256")), reg.get("identity_hash")


def group_of(record: Mapping[str, Any]) -> str:
    """The look a record belongs to: a look and the scores it computed are one look (they share
    ``look``), but each different set of scores read from the same rows is a look of its own
    (the models changed); a record written before looks were named is a look of its own
    scores."""
    if not record.get("look"):
        return "|".join(map(str, look_key(record)))
    results = record.get("results_sha256")
    return f"{record['look']}|{results}" if results else str(record["look"])


def one_per_look(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One record per look (:func:`group_of`), in order: the first of each; a look's access
    record stands for it only when no record of its scores exists."""
    scored = {str(r.get("look")) for r in records if r.get("look") and r.get("results_sha256")}
    out, seen = [], set()
    for r in records:
        g = group_of(r)
        access = r.get("look") and not r.get("results_sha256")
        if g in seen or (access and str(r["look"]) in scored):
            continue
        seen.add(g)
        out.append(r)
    return out


@dataclass(frozen=True)
class Run:
    """What the current run is: a look under this registration whose scores are the current
    ones is this run's own, whatever code took it (a look is what was seen; a change to the
    code is judged apart, against the registered code); a look that recorded no scores is this
    run's when the same code took it, or code that an amendment since registered."""

    key: tuple[str, str | None]
    """:func:`look_key` of the current test scores under the current registration."""
    identity: str | None = None
    amendments: int = 0
    code: str | None = None
    results: Mapping[str, str] = field(default_factory=dict)
    """kind (``scores``, ``audit``) -> the current digest of what that kind of record holds."""

    def owns(self, records: Sequence[Mapping[str, Any]]) -> bool:
        """Are the records of one look this run's?"""
        if any(look_key(r) == self.key for r in records):
            return True
        for r in records:
            reg = r.get("registration") or {}
            if r.get("code") is None or reg.get("identity_hash") != self.identity:
                return False
            if r.get("results_sha256") is not None:
                want = self.results.get(str(r.get("kind")))
                if want is not None and r["results_sha256"] != want:
                    return False
            elif r.get("code") != self.code \
                    and int(reg.get("amendments") or 0) == self.amendments:
                return False  # rows read by other code, no amendment registering it
        return True


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- the file --------------------------------------------------------------------------------
def read(path: Path = LEDGER) -> list[dict[str, Any]]:
    """Every record of the ledger, in order ([] when the file does not exist)."""
    if not path.exists():
        return []
    return parse(path.read_bytes(), path)


def parse(data: bytes, path: Path | str = LEDGER) -> list[dict[str, Any]]:
    out = []
    for i, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise ArtifactError(f"{path} line {i} is not a JSON object: the ledger is damaged; "
                                "restore it from git (`git checkout -- reports/ledger.jsonl`)"
                                ) from None
        if not isinstance(rec, dict):
            raise ArtifactError(f"{path} line {i} is not a JSON object: restore it from git")
        out.append(rec)
    return out


def line(record: Mapping[str, Any]) -> str:
    return json.dumps(dict(record), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False) + "\n"


def append(records: Iterable[Mapping[str, Any]], path: Path = LEDGER) -> list[dict[str, Any]]:
    """Append the records whose look is not yet in the ledger; the old bytes are kept as they
    are, and the whole file is replaced atomically. Returns the records added."""
    old = path.read_bytes() if path.exists() else b""
    seen = {look_key(r) for r in parse(old, path)}
    added = []
    for r in records:
        if look_key(r) not in seen:
            seen.add(look_key(r))
            added.append(dict(r))
    if added:
        if old and not old.endswith(b"\n"):
            old += b"\n"
        artifacts.write_bytes(path, old + "".join(line(r) for r in added).encode("utf-8"))
    return added


def record_look(per_piece: pd.DataFrame, registered: Any,
                path: Path = LEDGER) -> dict[str, Any] | None:
    """``evaluate``'s entry: append the look at the test pieces just scored (None when no test
    piece was scored or the look is already recorded)."""
    rec = look_record(per_piece, registered, source="evaluate", commit=history.head_commit(),
                      time=now_utc())
    if not path.exists():  # the report reads the ledger: it exists once evaluate has run
        artifacts.write_bytes(path, b"")
    return (append([rec], path) or [None])[0] if rec is not None else None


def rewritten(path: Path = LEDGER) -> str | None:
    """Why the ledger is not an extension of its committed version (None when it is, or when
    git holds none): an append-only file that lost or changed lines hides earlier looks."""
    committed = history.committed_version(path)
    if committed is None:
        return None
    now = path.read_bytes() if path.exists() else b""
    if now.startswith(committed):
        return None
    return (f"{path} is not its committed version plus new lines: looks recorded in git were "
            "removed or changed (restore it with `git checkout -- reports/ledger.jsonl`)")


# ---- looks at the current pieces -------------------------------------------------------------
@dataclass(frozen=True)
class Look:
    """A ledger record seen from the current experiment."""

    index: int
    """1-based position in the ledger."""
    record: dict[str, Any]
    overlap: int
    """How many of the current test pieces it scored."""

    @property
    def registration(self) -> dict[str, Any] | None:
        return self.record.get("registration")

    def label(self) -> str:
        commit = str(self.record.get("commit") or "")[:12] or "no commit"
        return f"look {self.index} ({self.record.get('time') or 'time unknown'}, {commit})"


def looks_at(records: Sequence[Mapping[str, Any]], pieces: Iterable[str]) -> list[Look]:
    """The records that scored any of ``pieces``, in ledger order."""
    wanted = set(pieces)
    out = []
    for i, r in enumerate(records, 1):
        overlap = len(wanted.intersection(r.get("pieces") or []))
        if overlap:
            out.append(Look(i, dict(r), overlap))
    return out


def earlier_looks(records: Sequence[Mapping[str, Any]], pieces: Iterable[str],
                  current: tuple[str, str | None] | Run | None) -> tuple[list[Look], Look | None]:
    """(earlier, this): ``this`` is the record of the current scores under the current
    registration (``current``: a :class:`Run`, or the :func:`look_key` of those scores),
    ``earlier`` one record per other look at ``pieces``: other scores, the same scores under
    another registration or none, or another command's look under other code or registration.
    The records of one look (:func:`group_of`: the look and its scores; one from evaluate, one
    from git history) count once."""
    run = current if isinstance(current, Run) else Run(current or ("", None))
    groups: dict[str, list[Look]] = {}
    found = looks_at(records, pieces)
    first_scores: dict[str, str] = {}  # look id -> the group of its first recorded scores
    for x in found:
        if x.record.get("look") and x.record.get("results_sha256"):
            first_scores.setdefault(str(x.record["look"]), group_of(x.record))
    for look in found:
        r = look.record
        access = r.get("look") and not r.get("results_sha256")
        # an access whose scores are recorded belongs to the look of its first scores
        key = first_scores.get(str(r["look"]), group_of(r)) if access else group_of(r)
        groups.setdefault(key, []).append(look)
    # a look's scores found again in git history (a record of its own) belong to the same look
    first: dict[tuple[str, str | None], str] = {}
    parent = {g: g for g in groups}
    for g, xs in groups.items():
        for x in xs:
            other = first.setdefault(look_key(x.record), g)
            parent[_root(parent, g)] = _root(parent, other)
    merged: dict[str, list[Look]] = {}
    for g, xs in groups.items():
        merged.setdefault(_root(parent, g), []).extend(xs)
    earlier: list[Look] = []
    this = None
    for xs in merged.values():
        if run.owns([x.record for x in xs]):
            this = this or next((x for x in xs if look_key(x.record) == run.key), xs[0])
        else:
            earlier.append(xs[0])
    return earlier, this


def _root(parent: dict[str, str], g: str) -> str:
    while parent[g] != g:
        g = parent[g]
    return g


def changes_since(look: Look, registered: Any) -> dict[str, list[str]]:
    """What differs between the registration in force at ``look`` and ``registered``:
    ``sections`` (frozen params sections), ``criteria`` (rules changed, added or removed, by
    name) and ``split`` (a changed split hash). Empty lists when the look had no registration."""
    then, now = look.registration, registration_summary(registered)
    if then is None or now is None:
        return {"sections": [], "criteria": [], "split": []}
    sections = sorted(s for s in set(then["sections"]) | set(now["sections"])
                      if then["sections"].get(s) != now["sections"].get(s))
    a, b = then.get("criteria") or {}, now.get("criteria") or {}
    criteria = ([f"{n!r} changed" for n in sorted(set(a) & set(b)) if a[n] != b[n]]
                + [f"{n!r} added" for n in sorted(set(b) - set(a))]
                + [f"{n!r} removed" for n in sorted(set(a) - set(b))])
    split = ([] if then.get("split_hash") == now.get("split_hash")
             else [f"split {str(then.get('split_hash'))[:12]} then, "
                   f"{str(now.get('split_hash'))[:12]} now"])
    return {"sections": sections, "criteria": criteria, "split": split}


# ---- test scores elsewhere: git history and the DVC cache ------------------------------------
def _table(data: bytes) -> pd.DataFrame | None:
    try:
        return pq.read_table(io.BytesIO(data)).to_pandas()
    except Exception:
        return None


def _registration_at(commit: str) -> Any:
    data = history.file_at(commit, REGISTRATION)
    try:
        return json.loads(data) if data is not None else None
    except json.JSONDecodeError:
        return None


def _scored_test(eval_report: bytes | None) -> bool:
    """Does this eval.json hold test scores? (A commit that re-registers and deletes eval.json
    still holds the old per-piece table: that is no look under the new registration.)"""
    try:
        report = json.loads(eval_report) if eval_report is not None else None
    except json.JSONDecodeError:
        return False
    models = report.get("models") if isinstance(report, dict) else None
    return isinstance(models, dict) and any(isinstance(m, dict) and m.get("test")
                                            for m in models.values())


def scan_git(per_piece: Path = PER_PIECE, eval_report: Path = EVAL) -> list[dict[str, Any]]:
    """A look for every commit, on any ref, that changed the per-piece table or eval.json and
    holds test scores in both, oldest first; its registration is the one committed beside it.
    Commits that change neither scores nor registration give the same look, recorded once."""
    out, seen = [], set()
    per_piece, eval_report = history.project_path(per_piece), history.project_path(eval_report)
    commits = sorted(set(history.commits_touching(per_piece))
                     | set(history.commits_touching(eval_report)), key=lambda c: c[1])
    for commit, when in commits:
        data = history.file_at(commit, per_piece)
        table = _table(data) if data is not None else None
        if table is None or not _scored_test(history.file_at(commit, eval_report)):
            continue
        rec = look_record(table, _registration_at(commit), source="git", commit=commit,
                          time=utc(when))
        if rec is not None and look_key(rec) not in seen:
            seen.add(look_key(rec))
            out.append(rec)
    return out


def _cache_entries(cache: Path) -> set[str]:
    """The md5 of every file the DVC cache at ``cache`` holds (both layouts: DVC 3's
    ``files/md5/ab/cdef...`` and DVC 2's ``ab/cdef...``); empty when there is no cache."""
    found: set[str] = set()
    for root in (cache / "files" / "md5", cache):
        if not root.is_dir():
            continue
        for prefix in os.scandir(root):
            if len(prefix.name) == 2 and prefix.is_dir():
                found.update(prefix.name + e.name for e in os.scandir(prefix.path)
                             if len(e.name) == 30 and e.is_file())
    return found


_MD5 = re.compile(rb"\b[0-9a-f]{32}\b")
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML has it


def _cached_md5s(per_piece: Path, held: set[str]) -> list[tuple[str, str | None]]:
    """(md5, commit) of every version of ``per_piece`` that a dvc.lock in git history or the
    workspace records and the cache holds (``held``), oldest first. A lock version is parsed only
    when one of the md5s written in it is held: parsing every version of a long history took
    most of a minute."""
    if not held:
        return []
    versions: list[tuple[bytes | None, str | None]] = [
        (history.file_at(c, "dvc.lock"), c) for c, _ in history.commits_touching("dvc.lock")]
    if Path("dvc.lock").exists():
        versions.append((Path("dvc.lock").read_bytes(), None))
    found: list[tuple[str, str | None]] = []
    for data, commit in versions:
        if not data or held.isdisjoint(m.decode() for m in _MD5.findall(data)):
            continue
        try:
            lock = yaml.load(data, Loader=_YAML_LOADER)
        except yaml.YAMLError:
            continue
        for stage in ((lock or {}).get("stages") or {}).values():
            for out in (stage or {}).get("outs") or []:
                if isinstance(out, dict) and out.get("path") == per_piece.as_posix() \
                        and out.get("md5") in held and out["md5"] not in {m for m, _ in found}:
                    found.append((out["md5"], commit))
    return found


def scan_dvc_cache(per_piece: Path = PER_PIECE, cache: Path = Path(".dvc/cache")
                   ) -> list[dict[str, Any]]:
    """A look for every version of the per-piece table that dvc.lock names and the DVC cache
    holds (symkit's dvc.yaml keeps it out of the cache, ``cache: false``, but a changed
    dvc.yaml or ``dvc add`` would put it there)."""
    out = []
    for md5, commit in _cached_md5s(history.project_path(per_piece), _cache_entries(cache)):
        for where in (cache / "files" / "md5" / md5[:2] / md5[2:], cache / md5[:2] / md5[2:]):
            table = _table(where.read_bytes()) if where.is_file() else None
            if table is not None:
                rec = look_record(table, _registration_at(commit) if commit else None,
                                  source="dvc-cache", commit=commit, time=None)
                if rec is not None:
                    out.append(rec)
                break
    return out


def scan_history(per_piece: Path = PER_PIECE, eval_report: Path = EVAL
                 ) -> list[dict[str, Any]]:
    """Every look that git history and the DVC cache hold, git first, one record a look."""
    out, seen = [], set()
    for rec in scan_git(per_piece, eval_report) + scan_dvc_cache(per_piece):
        if look_key(rec) not in seen:
            seen.add(look_key(rec))
            out.append(rec)
    return out


def existing_looks(test_pieces: Sequence[str], *, ledger_path: Path = LEDGER,
                   per_piece: Path = PER_PIECE, eval_report: Path = EVAL,
                   registration: Path = REGISTRATION) -> list[dict[str, Any]]:
    """Every record of test scores of any of ``test_pieces``: the ledger's, git history's, the
    DVC cache's and the workspace's, one per look (what ``symkit preregister`` refuses over)."""
    found = read(ledger_path) + scan_history(per_piece, eval_report)
    here = workspace_look(per_piece, registration, known=found)
    found += [here] if here is not None else []
    out, seen = [], set()
    for look in looks_at(one_per_look(found), test_pieces):
        if look_key(look.record) not in seen:
            seen.add(look_key(look.record))
            out.append(look.record)
    return out


def workspace_look(per_piece: Path = PER_PIECE, registration: Path = REGISTRATION,
                   known: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any] | None:
    """The look the workspace's per-piece table holds, under the workspace's registration;
    None when the table holds no test scores or scores already in ``known`` (a table committed
    earlier and left in place was scored under the registration of its own commit)."""
    table = _table(per_piece.read_bytes()) if per_piece.is_file() else None
    if table is None:
        return None
    rec = look_record(table, artifacts.read_json_or_none(registration), source="workspace",
                      commit=None, time=None)
    if rec is None or rec["results_sha256"] in {r.get("results_sha256") for r in known}:
        return None
    return rec
