"""The one reader of an evaluated run, shared by ``symkit compare`` and ``symkit reproduce``.

A run is what ``dvc repro`` up to ``evaluate`` leaves, read from a *source*
(:func:`resolve_source`): a directory (``workspace`` is the current one) or a git revision of the
repository in the current directory (a commit, branch, tag or DVC experiment name), whose files
are read with ``git show``, never from the working tree. A run's files, relative to its root:
``params.yaml``, ``reports/eval.json``, ``reports/eval/per_piece.parquet`` and, optionally,
``reports/train.json``, the registered comparisons (``reports/preregistration_compare.json``)
and the training logs (``reports/plots/train_log/``, for the learning curves,
:func:`read_curves`). :func:`read_run` reads them into an :class:`EvaluatedRun`; a missing or
unreadable file raises :class:`~pipeline.core.artifacts.ArtifactError` or
:class:`~pipeline.core.config.ParamsError` naming it, and a source that is neither a directory
nor a revision raises :class:`RunSourceError` listing what was tried.

A run's test rows are left out unless the command reads them through a :class:`Gate`: reading
test scores to compare them is a look, recorded in the test-access ledger of the working
directory (``reports/ledger.jsonl``) by :func:`pipeline.decision.looks.test_scores` before the
rows are handed over.

A library of the tools, not a command (it declares no ``HELP``). Nothing here imports torch or
matplotlib.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from ruamel.yaml import YAMLError

from pipeline.core import artifacts
from pipeline.core.artifacts import ArtifactError
from pipeline.core.config import ParamsError, parse_yaml, read_params
from pipeline.decision import ledger, looks
from pipeline.decision.registered_comparisons import REGISTRATION
from pipeline.report.compare_document import Curves

PARAMS, EVAL, PER_PIECE, TRAIN = ("params.yaml", "reports/eval.json",
                                  "reports/eval/per_piece.parquet", "reports/train.json")
"""A run's files, relative to its root (a directory or a commit's tree)."""
TRAIN_LOG_DIR, TRAIN_LOG_FILE = "reports/plots/train_log", "reports/plots/train_log.tsv"
"""Training logs, read for the learning curves: ``seed-<s>.tsv`` per training seed in the
folder, or, in runs made before training seeds existed, the one file."""
COLUMNS = ["sha256", "split", "model", "group_id", "nll_nats", "n_tokens", "n_notes",
           "duration_s"]
"""per_piece.parquet columns a run needs; ``seed`` too when present (results written before
training seeds existed lack it: one model per name, as a null seed)."""


class RunSourceError(ValueError):
    """A run's source is neither a directory nor a git revision; the message lists what was
    tried."""


# ---- where a run comes from -----------------------------------------------------------------
@dataclass(frozen=True)
class RunSource:
    """A run's source: ``kind`` ``directory`` (``root``) or ``git`` (``commit``, and ``ref``
    when the name was a DVC experiment under ``refs/exps``). ``name`` is a revision as the user
    gave it, or a directory's :func:`relative_name` (compare writes it into its outputs)."""

    name: str
    kind: Literal["directory", "git"]
    root: Path | None = None
    commit: str | None = None
    ref: str | None = None

    def where(self, rel: str) -> str:
        """How a file of this run is named in messages."""
        if self.kind == "directory":
            return (Path(self.name) / rel).as_posix()
        return f"{self.name}:{rel} (commit {self.commit[:12] if self.commit else '?'})"

    def read(self, rel: str) -> bytes | None:
        """The file's bytes, or None when the run has no such file."""
        if self.kind == "directory":
            path = self.root / rel  # type: ignore[operator]
            return path.read_bytes() if path.is_file() else None
        done = _git("show", f"{self.commit}:{rel}")
        return done.stdout if done.returncode == 0 else None

    def listdir(self, rel: str) -> list[str]:
        """Names of the entries directly in folder ``rel``, sorted; [] when there is none
        (``git ls-tree --full-tree``: paths from the repository's root, as ``git show``)."""
        if self.kind == "directory":
            path = self.root / rel  # type: ignore[operator]
            return sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        done = _git("ls-tree", "--full-tree", "--name-only", f"{self.commit}", f"{rel}/")
        if done.returncode != 0:
            return []
        return sorted(PurePosixPath(line).name for line in done.stdout.decode().splitlines())


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    """``git args`` in the current directory, without a shell; output as bytes."""
    try:
        return subprocess.run(["git", *args], capture_output=True, check=False)
    except FileNotFoundError:  # git not installed: every lookup fails the same way
        return subprocess.CompletedProcess(["git", *args], 127, b"", b"git: command not found")


def relative_name(path: str) -> str:
    """A directory's path relative to the current directory, normalised and with ``/``:
    ``./runs//a/``, ``runs/b/../a`` and ``/abs/path/to/runs/a`` (from ``/abs/path/to``) are all
    ``runs/a``; a folder outside the current one is ``../...``. Never absolute, so an output
    that records it does not depend on where the project lies. Lexical: symbolic links are not
    followed."""
    return Path(os.path.relpath(Path(path).absolute())).as_posix()


def resolve_source(name: str) -> RunSource:
    """A directory that exists wins (``workspace`` is the current directory); then a git
    revision (``git rev-parse --verify --quiet <name>^{commit}``); then a DVC experiment: a ref
    under ``refs/exps`` whose last component is ``name``. :class:`RunSourceError` lists the
    tries. A directory is named by its :func:`relative_name` and read from ``name`` as given."""
    if name == "workspace":
        return RunSource(name, "directory", root=Path("."))
    if Path(name).is_dir():
        return RunSource(relative_name(name), "directory", root=Path(name))
    tried = [f"no directory {name!r}"]
    rev = _git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
    if rev.returncode == 0:
        return RunSource(name, "git", commit=rev.stdout.decode().strip())
    err = rev.stderr.decode(errors="replace").strip()
    tried.append(f"not a git revision (`git rev-parse --verify {name}^{{commit}}`"
                 + (f": {err.splitlines()[0]})" if err else ")"))
    refs = _git("for-each-ref", "--format=%(refname)", "refs/exps")
    matches = sorted(r for r in refs.stdout.decode().split()
                     if r.rsplit("/", 1)[-1] == name and not r.startswith("refs/exps/exec/"))
    if len(matches) > 1:
        raise RunSourceError(f"arm {name!r} is ambiguous: DVC experiments "
                             f"{', '.join(matches)}; give one of their commits instead")
    if len(matches) == 1:
        commit = _git("rev-parse", "--verify", "--quiet", f"{matches[0]}^{{commit}}")
        if commit.returncode == 0:
            return RunSource(name, "git", commit=commit.stdout.decode().strip(), ref=matches[0])
    tried.append(f"no DVC experiment named {name!r} under refs/exps")
    raise RunSourceError(f"cannot find arm {name!r}: {'; '.join(tried)}. Give a directory "
                         f"holding {PARAMS} and {EVAL}, `workspace`, a commit, branch, tag or "
                         "experiment name")


# ---- what a run holds -----------------------------------------------------------------------
@dataclass(frozen=True)
class EvaluatedRun:
    """One evaluated run: its label, source, params, eval.json, per-piece rows (test rows only
    when read through a :class:`Gate`) and, when it has one, the training summary."""

    label: str
    source: RunSource
    params: dict[str, Any]
    eval: dict[str, Any]
    per_piece: pd.DataFrame
    train: dict[str, Any] | None
    registration: Any = None
    """The run's :data:`pipeline.decision.registered_comparisons.REGISTRATION`, parsed (None
    without one)."""

    @property
    def protocol(self) -> dict[str, Any]:
        return self.eval.get("protocol") or {}


def _required(src: RunSource, rel: str) -> bytes:
    data = src.read(rel)
    if data is None:
        raise ArtifactError(f"{src.where(rel)} does not exist: an arm needs {PARAMS}, {EVAL} and "
                            f"{PER_PIECE} (run `dvc repro evaluate` for it)")
    return data


def _yaml(src: RunSource, rel: str, data: bytes) -> Any:
    """A YAML file's content, read as DVC reads it (:func:`pipeline.core.config.parse_yaml`)."""
    try:
        return parse_yaml(data.decode("utf-8"))
    except (YAMLError, UnicodeDecodeError) as e:
        raise ParamsError(f"{src.where(rel)}: not valid YAML: {e}") from e


def _json(src: RunSource, rel: str, data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ArtifactError(f"{src.where(rel)} is not a readable JSON file") from None


@dataclass(frozen=True)
class Gate:
    """How a command reads a run's test rows: through
    :func:`pipeline.decision.looks.test_scores`, which records the look (``command``) in
    ``ledger_path`` (None: nowhere) under the registration ``registration`` first."""

    command: str
    ledger_path: Path | None = ledger.LEDGER
    registration: Path | None = ledger.REGISTRATION


def _per_piece(src: RunSource, gate: Gate | None) -> pd.DataFrame:
    """The run's per-piece rows (:data:`COLUMNS`, and ``seed``): without the test rows, or with
    them read through ``gate``."""
    if src.kind == "directory":
        table = artifacts.read_table(src.root / PER_PIECE)  # type: ignore[operator]
    else:
        try:
            table = pq.read_table(pa.BufferReader(_required(src, PER_PIECE)))
        except (pa.ArrowException, OSError):
            raise ArtifactError(f"{src.where(PER_PIECE)} is not a readable Parquet file") from None
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise ArtifactError(f"{src.where(PER_PIECE)} has no column "
                            f"{', '.join(map(repr, missing))}: re-run `dvc repro evaluate`")
    per_piece = table.select([c for c in [*COLUMNS, "seed"] if c in table.column_names]
                             ).to_pandas()
    if "seed" not in per_piece:
        per_piece["seed"] = pd.Series(pd.NA, index=per_piece.index, dtype="Int64")
    rows = per_piece[per_piece["split"] != "test"]
    if gate is not None:
        test, _ = looks.test_scores(gate.command, per_piece, ledger_path=gate.ledger_path,
                                    registration=gate.registration)
        rows = pd.concat([rows, test], ignore_index=True)
    return rows.reset_index(drop=True)


def read_run(src: RunSource, label: str, gate: Gate | None = None) -> EvaluatedRun:
    """Read a run's files (a directory through the project's readers, a commit through
    ``git show``); missing or unreadable files raise ArtifactError or ParamsError naming them.
    The per-piece rows hold no test row unless ``gate`` reads them (:func:`with_test_rows`)."""
    if src.kind == "directory":
        root = src.root
        params = read_params(root / PARAMS)  # type: ignore[operator]
        evaluation = artifacts.read_json(root / EVAL)  # type: ignore[operator]
    else:
        params = _yaml(src, PARAMS, _required(src, PARAMS)) or {}
        evaluation = _json(src, EVAL, _required(src, EVAL))
    per_piece = _per_piece(src, gate)
    if not isinstance(params, dict):
        raise ParamsError(f"{src.where(PARAMS)}: top level must be a mapping of sections")
    if not isinstance(evaluation, dict):
        raise ArtifactError(f"{src.where(EVAL)} is not a JSON object")
    train_bytes = src.read(TRAIN)
    train = _json(src, TRAIN, train_bytes) if train_bytes is not None else None
    reg_bytes = src.read(REGISTRATION)
    reg = _json(src, REGISTRATION, reg_bytes) if reg_bytes is not None else None
    return EvaluatedRun(label, src, params, evaluation, per_piece,
                        train if isinstance(train, dict) else None, reg)


def add_gate_arguments(parser: Any, reads: str) -> None:
    """``--ledger`` and ``--preregistration``: where a command that ``reads`` test scores
    records its look, and under which registration (relative to the working directory)."""
    parser.add_argument("--ledger", type=Path, default=ledger.LEDGER,
                        help=f"test-access ledger the look is recorded in when the command "
                             f"{reads} (default reports/ledger.jsonl)")
    parser.add_argument("--preregistration", type=Path, default=ledger.REGISTRATION,
                        help="the registration the look records (default "
                             "reports/preregistration.json)")


def with_test_rows(run: EvaluatedRun, gate: Gate) -> EvaluatedRun:
    """``run`` with its test rows, read through ``gate`` (the look recorded first)."""
    return replace(run, per_piece=_per_piece(run.source, gate))


def params_section(src: RunSource, section: str) -> Any:
    """``section`` of the run's params.yaml as written, unchecked; None when the run has no
    params.yaml, its top level is not a mapping or it has no such section. :class:`ParamsError`
    when the file is not valid YAML. Unlike :func:`read_run`, a folder's file is read as a
    commit's: an unknown section is not refused."""
    data = src.read(PARAMS)
    if data is None:
        return None
    parsed = _yaml(src, PARAMS, data)
    return parsed.get(section) if isinstance(parsed, dict) else None


def _val_curve(data: bytes) -> tuple[np.ndarray, np.ndarray] | str:
    """``(step, val_loss)`` at the steps where val loss was measured, from a training log's
    bytes (tab-separated, columns ``step, train_loss, val_loss, lr, grad_norm``), or why not."""
    try:
        log = pd.read_csv(io.BytesIO(data), sep="\t")
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError):
        return "not a readable tab-separated file"
    if not {"step", "val_loss"} <= set(log.columns):
        return "no step or val_loss column"
    step = pd.to_numeric(log["step"], errors="coerce").to_numpy(dtype=float)
    val = pd.to_numeric(log["val_loss"], errors="coerce").to_numpy(dtype=float)
    ok = np.isfinite(step) & np.isfinite(val)
    if not ok.any():
        return "no val_loss value"
    order = np.argsort(step[ok], kind="stable")
    return step[ok][order], val[ok][order]


def read_curves(src: RunSource) -> Curves:
    """A run's validation-loss curves, from the same source as its other files: every
    ``seed-<s>.tsv`` in :data:`TRAIN_LOG_DIR` (labelled ``seed <s>``, in seed order), else the
    single :data:`TRAIN_LOG_FILE`. A log that cannot be read is left out with a note."""
    names = [n for n in src.listdir(TRAIN_LOG_DIR) if re.fullmatch(r"seed-.+\.tsv", n)]
    if names:
        files = [(f"{TRAIN_LOG_DIR}/{n}", f"seed {n.removeprefix('seed-').removesuffix('.tsv')}")
                 for n in sorted(names, key=lambda n: (len(n), n))]
    else:
        files = [(TRAIN_LOG_FILE, Path(TRAIN_LOG_FILE).name)]
    seeds: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    notes: list[str] = []
    for rel, label in files:
        data = src.read(rel)
        if data is None:  # only the single file can be missing
            return Curves(missing=f"{TRAIN_LOG_DIR}/seed-<s>.tsv or {TRAIN_LOG_FILE}")
        curve = _val_curve(data)
        if isinstance(curve, str):
            notes.append(f"{src.where(rel)} left out: {curve}")
        else:
            seeds[label] = curve
    return Curves(seeds, tuple(notes))
