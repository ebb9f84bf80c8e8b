"""Atomic, deterministic artifact writes, and readers that say which stage makes a file.

Every artifact is written to a temporary file in its destination folder and renamed over the
target, so a stage killed at any moment leaves either the old file or the new one, never half of
one; a folder written whole (:func:`atomic_dir`) is built beside its target and renamed over it.
Parquet files carry no pandas metadata and JSON has sorted keys and no NaN, so the same data gives
the same bytes on every run.

:func:`read_parquet` and :func:`read_json` turn a missing or unreadable input into an
:class:`ArtifactError` of one line naming the file and the ``dvc.yaml`` stage that writes it
(e.g. "data/manifest.parquet is not a readable Parquet file: re-run `dvc repro ingest`").
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import platform
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

PARQUET_OPTIONS = dict(
    compression="zstd", compression_level=3, use_dictionary=True, write_statistics=True
)


def _file_mode() -> int:
    """The mode ``open()`` gives a new file here: 0o666 less the process's umask (a temp file
    from ``mkstemp`` is 0o600, readable by its owner only)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success fsync it, give it the mode a plainly
    written file gets, and rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp_path, _file_mode())
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; on success it replaces ``path`` whole, so
    nothing of the old folder survives. A kill leaves the old folder (or, between the two renames,
    none); the temporary folders of a killed write are deleted by the next one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stale = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{8}}\.(tmp|old)")
    for p in sorted(path.parent.iterdir()):
        if p.is_dir() and stale.fullmatch(p.name):
            shutil.rmtree(p)
    tag = uuid.uuid4().hex[:8]
    tmp = path.with_name(f".{path.name}.{tag}.tmp")
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.{tag}.old")
            os.replace(path, old)
            os.replace(tmp, path)
            if old.is_dir():
                shutil.rmtree(old)
            else:  # a file where the folder goes (an older layout)
                old.unlink()
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_bytes(path: Path | str, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: Path | str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def _clean(obj: Any) -> Any:
    """Make ``obj`` JSON-safe: NaN/inf -> None, numpy scalars -> Python, tuples -> lists."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return obj.as_posix()
    return obj


def dumps_json(obj: Any) -> str:
    return (
        json.dumps(_clean(obj), sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)
        + "\n"
    )


def write_json(path: Path | str, obj: Any) -> None:
    """Pretty, sorted, NaN-free JSON (NaN and inf become null)."""
    write_text(path, dumps_json(obj))


class ArtifactError(ValueError):
    """An input artifact is missing or unreadable. The message is one line naming the file and
    the stage that makes it; the CLI prints it without a traceback."""

    @classmethod
    def for_path(cls, path: Path | str, problem: str) -> ArtifactError:
        return cls(f"{Path(path).as_posix()} {problem}: {rerun_hint(path)}")


@functools.cache
def _stage_outputs(dvc_yaml: Path) -> tuple[tuple[str, str], ...]:
    """(output path, stage) for every output, metric and plot declared in ``dvc_yaml``."""
    try:
        stages = (yaml.safe_load(dvc_yaml.read_text(encoding="utf-8")) or {}).get("stages", {})
    except (OSError, yaml.YAMLError, AttributeError):
        return ()
    found = []
    for stage, spec in stages.items():
        for kind in ("outs", "metrics", "plots"):
            for out in (spec or {}).get(kind, []) or []:
                name = next(iter(out)) if isinstance(out, dict) else out
                found.append((str(name).rstrip("/"), str(stage)))
    return tuple(found)


def producing_stage(path: Path | str) -> str | None:
    """The ``dvc.yaml`` stage whose output is ``path`` or a folder holding it, if any. The
    ``dvc.yaml`` is the nearest one in the folders above ``path``."""
    p = Path(path).absolute()
    for root in p.parents:
        if (root / "dvc.yaml").is_file():
            rel = p.relative_to(root).as_posix()
            for out, stage in _stage_outputs(root / "dvc.yaml"):
                if rel == out or rel.startswith(out + "/"):
                    return stage
            return None
    return None


def rerun_hint(path: Path | str) -> str:
    stage = producing_stage(path)
    return f"re-run `dvc repro {stage}`" if stage else "re-create it"


def read_json(path: Path | str) -> Any:
    """A JSON artifact; missing or not JSON -> :class:`ArtifactError` naming its stage."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArtifactError.for_path(path, "does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ArtifactError.for_path(path, f"cannot be read ({type(e).__name__})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ArtifactError.for_path(path, "is not a readable JSON file") from None


def to_table(df: Any, schema: pa.Schema | None = None) -> pa.Table:
    """pandas DataFrame (or pyarrow Table) -> Table without pandas metadata."""
    if isinstance(df, pa.Table):
        table = df
    else:
        table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
    return table.replace_schema_metadata(None)


ROW_GROUP_ROWS = 2048
"""Rows per row group of a Parquet output written as a stream (:func:`table_writer`)."""


@contextlib.contextmanager
def table_writer(path: Path | str, schema: pa.Schema, rows_per_group: int = ROW_GROUP_ROWS
                 ) -> Iterator[Callable[[pa.Table], None]]:
    """Write a Parquet output as a stream: ``put(table)`` rows in their final order, any number
    of times, with :data:`PARQUET_OPTIONS`. Row groups hold exactly ``rows_per_group`` rows (the
    last one fewer) however the rows came, so the file's bytes depend only on its rows (a table
    of at most ``rows_per_group`` rows gives the bytes of :func:`write_parquet`); it is renamed
    into place when the block ends without an error.

    Each row group is encoded in a thread while the caller makes the next one (pyarrow encodes
    a file on one thread, without the GIL); at most one group waits, so memory stays about two
    groups."""
    from concurrent.futures import Future, ThreadPoolExecutor

    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, schema, **PARQUET_OPTIONS) as writer, \
            ThreadPoolExecutor(1, thread_name_prefix="table_writer") as pool:
        last: Future | None = None

        def write(rows: pa.Table) -> None:
            nonlocal last
            if last is not None:
                last.result()  # in order, and an error of the last group surfaces here
            # One chunk per column: Parquet's encoder works through a column chunk by chunk, and
            # where a dictionary outgrows its page and falls back to plain encoding depends on
            # those chunks, so without this the bytes followed how the rows came.
            last = pool.submit(writer.write_table, rows.combine_chunks(),
                               row_group_size=rows_per_group)

        groups = RowGroupBuffer(write, rows_per_group)
        yield groups.put
        if groups.count or not groups.written:  # the rest (a table without rows still gets
            # its one empty group)
            write(pa.concat_tables([pa.Table.from_batches([], schema), *groups.pending]))
        if last is not None:
            last.result()


class RowGroupBuffer:
    """Rows put in chunks of any size, passed on to ``write`` in whole row groups of
    ``rows_per_group`` rows as soon as that many are in; fewer are held back (``pending``) for
    the caller to write last."""

    def __init__(self, write: Callable[[pa.Table], None], rows_per_group: int) -> None:
        self.write, self.rows_per_group = write, rows_per_group
        self.pending: list[pa.Table] = []
        self.count = self.written = 0  # rows held back, rows passed on

    def put(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.count += table.num_rows
        if self.count >= self.rows_per_group:
            rows = pa.concat_tables(self.pending)
            cut = self.count - self.count % self.rows_per_group
            self.write(rows.slice(0, cut))
            self.pending, self.count = [rows.slice(cut)], self.count - cut
            self.written += cut

def write_parquet(path: Path | str, df: Any, schema: pa.Schema | None = None) -> None:
    """Write a DataFrame/Table atomically as one deterministic Parquet file (its bytes depend on
    its rows, not on how its columns are chunked: see :func:`table_writer`)."""
    table = to_table(df, schema).combine_chunks()
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, **PARQUET_OPTIONS)


def read_parquet(path: Path | str, columns: list[str] | None = None):
    """Read a Parquet table into pandas (lists come back as numpy arrays); errors as
    :func:`read_table`."""
    return read_table(path, columns).to_pandas()


def read_table(path: Path | str, columns: list[str] | None = None) -> pa.Table:
    """Read a Parquet file as a pyarrow Table.

    A missing file, one that is not Parquet (e.g. truncated by a kill outside symkit) or one
    without a requested column raises :class:`ArtifactError` naming the file and its stage.
    """
    if not Path(path).exists():
        raise ArtifactError.for_path(path, "does not exist")
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError):
        raise ArtifactError.for_path(path, "is not a readable Parquet file") from None
    missing = [c for c in columns or [] if c not in schema.names]
    if missing:
        raise ArtifactError.for_path(path, f"has no column {', '.join(map(repr, missing))}")
    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError):
        raise ArtifactError.for_path(path, "is not a readable Parquet file") from None


def read_json_or_none(path: Path) -> Any:
    """An optional JSON input: None when it is missing or unreadable."""
    try:
        return read_json(path) if path.is_file() else None
    except ValueError:
        return None


def read_table_or_none(path: Path, **kw: Any) -> Any:
    """An optional Parquet or TSV input as a DataFrame: None when it is missing or unreadable."""
    try:
        if not path.is_file():
            return None
        if path.suffix == ".tsv":
            import pandas as pd

            return pd.read_csv(path, sep="\t", **kw)
        return read_parquet(path)
    except Exception:  # a corrupt optional input becomes "not available"
        return None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path | str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def code_digest(modules: tuple[str, ...]) -> str:
    """sha256 over the source files of ``modules`` (dotted names), in the order given: the code a
    cache's entries depend on. A test checks that each such list holds every symkit module its
    members import, save those that cannot change a result (I/O, scheduling, parameters)."""
    import importlib

    h = hashlib.sha256()
    for name in modules:
        h.update(Path(importlib.import_module(name).__file__).read_bytes())
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """Hash of a JSON-able object's canonical form (sorted keys, compact)."""
    text = json.dumps(_clean(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def stable_int(text: str) -> int:
    """A seed component from a name that does not depend on Python's hash seed."""
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16)


RESULT_PACKAGES = ("miditok", "symusic", "music21", "numpy", "scipy", "pandas", "pyarrow",
                   "torch", "scikit-learn", "datasketch", "rapidfuzz", "safetensors")
"""Packages whose versions can change results (the pre-registration freezes them)."""
ENV_PACKAGES = ("symkit", *RESULT_PACKAGES, "dvc")


def package_versions(names: tuple[str, ...] = ENV_PACKAGES) -> dict[str, str | None]:
    """Installed version of each package (None when it is not installed)."""
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for pkg in names:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return versions


def environment_facts() -> dict[str, Any]:
    """Facts about this machine and library versions, for sidecars only (never for artifacts)."""
    versions = package_versions()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "packages": versions,
    }


def write_sidecar(path: Path | str, facts: dict[str, Any]) -> None:
    """Timings and environment facts: kept out of results so results stay byte-identical."""
    write_json(path, {**facts, "environment": environment_facts()})
