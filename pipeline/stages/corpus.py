"""Stage ``corpus``: materialise the MIDI sources into ``data/raw/``.

Every later stage depends on repo-relative paths only, so ``dvc.lock`` never holds an absolute
path, whatever ``corpus.source`` points at.

Sources:
- ``music21:bach-chorales`` (default): the Bach chorales that ship inside music21's wheel, written
  as MIDI (byte-identical on every run and in any process). Their ``group`` is the chorale's title
  from music21's Riemenschneider/BWV list. Titles are hymn texts: one melody can appear under
  several titles, which the dedupe stage catches.
- a folder: every ``.mid``/``.midi``/``.kar`` file below it (any case), sorted; symbolic links
  that lead outside the folder are not followed. Files are copied (or hard-linked) unchanged.

The stage runs on every ``dvc repro`` (``always_changed``) so that edits to a source folder are
seen, but it is incremental: ``data/raw/`` is a persistent output that is synchronised (new or
changed files copied, vanished ones removed), and chorales already written are not converted
again. Later stages re-run only when the bytes in ``data/raw/`` actually change.

``data/raw_metadata.csv`` always has ``path`` (relative to ``data/raw/``) and ``group`` plus any
extra columns from ``corpus.metadata``. A chorale music21 cannot resolve is listed with an empty
``path`` and its error in ``error`` — reported, never silently dropped.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field

from pipeline.core import artifacts
from pipeline.core.config import ParamsError, RuntimeConfig, StageConfig, load_section
from pipeline.core.parallel import ordered_map
from pipeline.music.midi import list_midi_files

BACH = "music21:bach-chorales"


class CorpusConfig(StageConfig):
    """``corpus`` section of params.yaml; each key is documented there, beside its value."""

    source: str = Field(BACH, min_length=1)
    metadata: str | None = None
    link: Literal["copy", "hardlink"] = "copy"


@dataclass(frozen=True)
class CorpusSummary:
    n_files: int
    n_unresolved: int


# --------------------------------------------------------------------------- folder sources
def read_metadata_csv(path: Path, known: set[str]) -> dict[str, dict[str, str]]:
    """Rows of a user metadata CSV keyed by ``path``; unknown paths are an error (typo guard)."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        cols = reader.fieldnames or []
        if "path" not in cols or "group" not in cols:
            raise ParamsError(
                f"corpus.metadata = {str(path)!r}: CSV needs columns 'path' and 'group', has {cols}"
            )
        rows = {}
        for row in reader:
            key = Path(row["path"]).as_posix()
            if key not in known:
                raise ParamsError(
                    f"corpus.metadata = {str(path)!r}: row path {key!r} is not a "
                    "MIDI file under corpus.source"
                )
            rows[key] = {k: (v or "") for k, v in row.items() if k != "path"}
    return rows


def _place(src: Path, dst: Path, link: str) -> None:
    """Copy (or hard-link) ``src`` to ``dst`` unless ``dst`` already has its size and mtime."""
    if dst.exists():
        a, b = src.stat(), dst.stat()
        if a.st_size == b.st_size and a.st_mtime_ns == b.st_mtime_ns:
            return
        dst.unlink()
    dst.parent.mkdir(parents=True, exist_ok=True)
    if link == "hardlink":
        try:
            os.link(src, dst)
            return
        except OSError:  # other filesystem, or links not allowed: copy instead
            pass
    with artifacts.atomic_path(dst) as tmp:
        shutil.copy2(src, tmp)  # keeps mtime, so the next run can skip an unchanged file


def materialise_folder(cfg: CorpusConfig, source: Path, raw_dir: Path) -> list[dict[str, str]]:
    files = list_midi_files(source)
    names = {p.as_posix() for p in files}
    meta = read_metadata_csv(Path(cfg.metadata), names) if cfg.metadata else {}
    rows = []
    for rel in files:
        _place(source / rel, raw_dir / rel, cfg.link)
        row = {"path": rel.as_posix(), **meta.get(rel.as_posix(), {})}
        row.setdefault("group", "")
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- music21 chorales
def chorale_list() -> list[dict]:
    """music21's Riemenschneider list: one dict per chorale (title, bwv, kalmus, number)."""
    from music21 import corpus

    table = corpus.chorales.ChoraleListRKBWV().byRiemenschneider
    return [dict(table[k]) for k in sorted(table)]


def chorale_midi(entry: dict) -> tuple[bytes | None, str]:
    """MIDI bytes of one chorale, or ``(None, error)`` when music21 cannot resolve it."""
    from music21 import corpus
    from music21.midi import translate

    try:
        score = corpus.parse(f"bach/bwv{entry['bwv']}")
        mf = translate.music21ObjectToMidiFile(score)
        return mf.writestr(), ""
    except Exception as e:  # music21 raises many types for a missing work; report, don't crash
        return None, f"{type(e).__name__}: {e}"


def chorale_filename(entry: dict) -> str:
    return f"bach/riem{int(entry['riemenschneider']):03d}_bwv{entry['bwv']}.mid"


def materialise_bach(
    raw_dir: Path, workers: int, show_progress: bool | str
) -> list[dict[str, str]]:
    entries = chorale_list()
    # Conversion is deterministic, so a chorale already on disk (written atomically) is kept.
    todo = [e for e in entries if not (raw_dir / chorale_filename(e)).exists()]
    converted = dict(
        zip(
            (e["riemenschneider"] for e in todo),
            ordered_map(
                chorale_midi, todo, workers=workers, desc="chorales", show_progress=show_progress
            ),
            strict=True,
        )
    )
    rows = []
    for entry in entries:
        data, error = converted.get(entry["riemenschneider"], (b"", ""))
        path = chorale_filename(entry) if data is not None else ""
        if data:
            artifacts.write_bytes(raw_dir / path, data)
        rows.append(
            {
                "path": path,
                "group": str(entry["title"]),
                "riemenschneider": str(entry["riemenschneider"]),
                "bwv": str(entry["bwv"]),
                "composer": "Johann Sebastian Bach",
                "license": "public domain",
                "source": "music21 corpus",
                "error": error,
            }
        )
    return rows


# --------------------------------------------------------------------------- stage
def prune(raw_dir: Path, keep: set[str]) -> None:
    """Remove files (and then empty folders) under ``raw_dir`` that the source no longer has."""
    for p in sorted(raw_dir.rglob("*"), reverse=True):
        rel = p.relative_to(raw_dir).as_posix()
        if p.is_file() or p.is_symlink():
            if rel not in keep:
                p.unlink()
        elif p.is_dir() and not any(p.iterdir()):
            p.rmdir()


def write_metadata(rows: list[dict[str, str]], path: Path) -> None:
    cols = ["path", "group", *sorted({k for r in rows for k in r} - {"path", "group"})]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    writer.writeheader()
    for r in sorted(rows, key=lambda r: (r["path"], r.get("riemenschneider", ""))):
        writer.writerow({c: r.get(c, "") for c in cols})
    artifacts.write_text(path, buf.getvalue())


def run(
    cfg: CorpusConfig, runtime: RuntimeConfig, *, raw_dir: Path, metadata_out: Path
) -> CorpusSummary:
    """Synchronise ``raw_dir`` with the source and write ``metadata_out``."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    if cfg.source == BACH:
        rows = materialise_bach(raw_dir, runtime.n_workers(), runtime.progress)
    else:
        source = Path(cfg.source)
        if not source.is_dir():
            raise ParamsError(
                f"corpus.source = {cfg.source!r}: not a folder; use a folder of MIDI "
                f"files or {BACH!r}"
            )
        rows = materialise_folder(cfg, source, raw_dir)
    prune(raw_dir, {r["path"] for r in rows if r["path"]})
    write_metadata(rows, metadata_out)
    unresolved = sum(1 for r in rows if not r["path"])
    return CorpusSummary(n_files=len(rows) - unresolved, n_unresolved=unresolved)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("data/raw"), help="output folder")
    parser.add_argument("--metadata-out", type=Path, default=Path("data/raw_metadata.csv"))


def main(args: argparse.Namespace) -> int:
    cfg = load_section("corpus", args.params, CorpusConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    summary = run(cfg, runtime, raw_dir=args.out, metadata_out=args.metadata_out)
    print(
        f"corpus: {summary.n_files} files in {args.out}"
        + (
            f", {summary.n_unresolved} unresolved (see {args.metadata_out})"
            if summary.n_unresolved
            else ""
        )
    )
    return 0
