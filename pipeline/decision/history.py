"""What the repository's git history shows: whether the registration was committed before the
results, and every committed version of a file (the test-access ledger reads earlier scores from
them, :mod:`pipeline.decision.ledger`).

These are facts about the working copy, not results: ``symkit report`` stores them in its
environment sidecar (``reports/report.env.json``), and the report states them. Without git every
function answers "nothing known" (``None``, ``[]`` or ``{"git": False}``), never an error.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def _git(*args: str) -> tuple[int, str]:
    rc, out = _git_bytes(*args)
    return rc, out.decode("utf-8", "replace").strip()


def _git_bytes(*args: str) -> tuple[int, bytes]:
    try:
        out = subprocess.run(["git", *args], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return 1, b""
    return out.returncode, out.stdout


def file_at(commit: str, path: Path | str) -> bytes | None:
    """The bytes of ``path`` (relative to the working directory, as every other path here: the
    repository root, or an experiment's folder) at ``commit``; None when the file is absent there
    or there is no git."""
    rc, out = _git_bytes("show", f"{commit}:./{Path(path).as_posix()}")
    return out if rc == 0 else None


def project_path(path: Path) -> Path:
    """``path`` as git and dvc.lock name it: relative to the project root (the working
    directory, where every symkit command runs)."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()) if path.is_absolute() else path
    except ValueError:
        return path


def committed_version(path: Path) -> bytes | None:
    """``path`` as HEAD holds it (None: not committed, or no git)."""
    return file_at("HEAD", path) if head_commit() is not None else None


def commits_touching(path: Path | str) -> list[tuple[str, int]]:
    """Every commit on any ref (branches, tags, DVC experiments under ``refs/exps``, the stash)
    that changed ``path``, oldest first, with its committer time (Unix seconds)."""
    if head_commit() is None:
        return []
    rc, out = _git("log", "--all", "--reverse", "--format=%H %ct", "--",
                   Path(path).as_posix())
    if rc != 0:
        return []
    found = []
    for line in out.splitlines():
        commit, _, when = line.partition(" ")
        if commit and when.isdigit():
            found.append((commit, int(when)))
    return found


def unreadable() -> str | None:
    """Why history cannot be checked here (None when it can): no git repository, or a shallow
    clone (its history stops short, so earlier versions cannot be read)."""
    if head_commit() is None:
        return "no git history (not a git repository, e.g. a tarball, or no commit yet)"
    rc, out = _git("rev-parse", "--is-shallow-repository")
    if rc != 0 or out == "true":
        return "a shallow clone: history before its first commit cannot be read"
    return None


def head_commit() -> str | None:
    rc, out = _git("rev-parse", "HEAD")
    return out or None if rc == 0 else None


def _last_commit(path: Path) -> str | None:
    rc, out = _git("log", "-1", "--format=%H", "--", path.as_posix())
    return out or None if rc == 0 else None


def _uncommitted(path: Path) -> bool:
    rc, out = _git("status", "--porcelain", "--", path.as_posix())
    return rc == 0 and bool(out)


def registration_order(registration: Path, results: Path,
                       registered_in: str | None = None) -> dict[str, Any]:
    """Facts for the report: the commit that last changed the registration, the commit that last
    changed the results (``reports/eval.json``), and whether the first precedes the second.

    ``registration_precedes_results`` is True when the registration is committed and the results
    are either uncommitted (so newer) or committed in a later commit that descends from it; False
    when the results were committed first or in the same commit; None without git history or
    without a committed registration. ``registered_in``: the commit that first held the
    registration's identity, when later commits only amended it (the order that matters is
    the registration's, not its amendment's).
    """
    if head_commit() is None:
        return {"git": False}
    reg, res = registered_in or _last_commit(registration), _last_commit(results)
    reg_dirty = not registration.exists() or reg is None or _uncommitted(registration)
    res_dirty = results.exists() and (res is None or _uncommitted(results))
    facts: dict[str, Any] = {"git": True, "registration_commit": reg, "results_commit": res,
                             "registration_uncommitted": reg_dirty,
                             "results_uncommitted": res_dirty}
    if reg_dirty:
        precedes = None
    elif res_dirty or res is None:
        precedes = True
    elif res == reg:
        precedes = False
    else:
        precedes = _git("merge-base", "--is-ancestor", reg, res)[0] == 0
    facts["registration_precedes_results"] = precedes
    return facts
