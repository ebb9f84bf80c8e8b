"""Stage ``corpus``: materialise the MIDI sources into ``data/raw/``.

Every later stage depends on repo-relative paths only, so ``dvc.lock`` never holds an absolute
path, whatever ``corpus.source`` points at.

Sources:
- ``music21:bach-chorales`` (default): the Bach chorales that ship inside music21's wheel, written
  as MIDI (byte-identical on every run and in any process). Their ``group`` is the chorale's title
  from music21's Riemenschneider/BWV list. Titles are hymn texts: one melody can appear under
  several titles, which the dedupe stage catches.
- ``music21:<composer>`` (e.g. ``music21:palestrina``): every score music21's corpus lists under
  that composer (``music21.corpus.getComposer``), sorted by corpus path, optionally narrowed by
  ``corpus.include`` (glob patterns on that path, e.g. ``palestrina/Kyrie*``), written as MIDI to
  ``<corpus path without its extension>.mid``. Their ``group`` is the parent work from music21's
  metadata bundle (a mass, for a mass movement: its movements share their material; none: the
  score is a group of its own); ``composer``, ``title`` and ``license`` (the encoding's
  copyright line) come from the same bundle, so rights travel with every piece.
- a folder: every ``.mid``/``.midi``/``.kar`` file below it (any case), sorted; symbolic links
  that lead outside the folder are not followed. Files are copied (or hard-linked) unchanged.

The stage runs on every ``dvc repro`` (``always_changed``) so that edits to a source folder are
seen, but it is incremental: ``data/raw/`` is synchronised (new or changed files copied, vanished
ones removed), and chorales already written are not converted again.

``data/raw_index.parquet`` is what DVC tracks of ``data/raw/``: one row per file (``path``,
``sha256``, ``size_bytes``), sorted by path. Later stages depend on it, so they re-run exactly when
a file's bytes, a path, or the set of files changes. The folder itself is not a DVC output: DVC
hashes a directory output file by file on every ``dvc status`` (over a minute for 100,000 files
here, see docs/scale.md), while this index costs one ``stat`` per unchanged file. A file is
hashed again when its size, modification time, inode or status-change time changed since the last
run (DVC's own state database uses the first three); those facts live in ``.cache/corpus/``,
never in the index, so the index is the same on every machine. ``data/raw/`` is rebuilt from the
source by this stage, so it needs no copy in the DVC cache.

``data/raw_metadata.csv`` always has ``path`` (relative to ``data/raw/``) and ``group`` plus any
extra columns from ``corpus.metadata``. A chorale music21 cannot resolve is listed with an empty
``path`` and its error in ``error`` — reported, never silently dropped.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from pipeline.core import artifacts
from pipeline.core.config import ParamsError, RuntimeConfig, StageConfig, load_section
from pipeline.core.parallel import ordered_map
from pipeline.music.midi import scan_midi_files

HELP = "materialise the MIDI sources into data/raw/"

BACH = "music21:bach-chorales"
MUSIC21 = "music21:"


class CorpusConfig(StageConfig):
    """``corpus`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "corpus"

    source: str = Field(BACH, min_length=1)
    metadata: str | None = None
    link: Literal["copy", "hardlink"] = "copy"
    include: list[str] | None = None


@dataclass(frozen=True)
class CorpusSummary:
    n_files: int
    n_unresolved: int
    n_hashed: int = 0


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


def scan_tree(root: Path) -> tuple[dict[str, os.stat_result], list[str]]:
    """Every non-folder entry under ``root`` (``lstat``, by POSIX path) and every folder."""
    files: dict[str, os.stat_result] = {}
    folders: list[str] = []
    stack = [("", os.fspath(root))]
    while stack:
        prefix, folder = stack.pop()
        with os.scandir(folder) as entries:
            for e in entries:
                rel = prefix + e.name
                if e.is_dir(follow_symlinks=False):
                    folders.append(rel)
                    stack.append((rel + "/", e.path))
                else:
                    files[rel] = e.stat(follow_symlinks=False)
    return files, folders


def _place(src: Path, dst: Path, src_stat: os.stat_result, dst_stat: os.stat_result | None,
           link: str) -> bool:
    """Copy (or hard-link) ``src`` to ``dst`` unless ``dst`` already has its size and mtime;
    return whether ``dst`` was (re)written."""
    if dst_stat is not None:
        if (src_stat.st_size == dst_stat.st_size
                and src_stat.st_mtime_ns == dst_stat.st_mtime_ns):
            return False
        dst.unlink()
    dst.parent.mkdir(parents=True, exist_ok=True)
    if link == "hardlink":
        try:
            os.link(src, dst)
            return True
        except OSError:  # other filesystem, or links not allowed: copy instead
            pass
    with artifacts.atomic_path(dst) as tmp:
        shutil.copy2(src, tmp)  # keeps mtime, so the next run can skip an unchanged file
    return True


def materialise_folder(
    cfg: CorpusConfig, source: Path, raw_dir: Path, existing: dict[str, os.stat_result]
) -> tuple[list[dict[str, str]], dict[str, os.stat_result]]:
    """Sync ``raw_dir`` with ``source``; the rows and the ``stat`` of every placed file."""
    files = scan_midi_files(source)
    meta = read_metadata_csv(Path(cfg.metadata), {rel for rel, _ in files}) if cfg.metadata else {}
    rows, placed = [], {}
    for rel, src_stat in files:
        old = existing.get(rel)
        if (
            old is not None
            and src_stat.st_size == old.st_size
            and src_stat.st_mtime_ns == old.st_mtime_ns
        ):
            placed[rel] = old  # the common case on a re-run: no path objects, no syscalls
        else:
            _place(source / rel, raw_dir / rel, src_stat, old, cfg.link)
            placed[rel] = os.stat(raw_dir / rel)
        row = {"path": rel, **meta.get(rel, {})}
        row.setdefault("group", "")
        rows.append(row)
    return rows, placed


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


# --------------------------------------------------------------------------- music21 composers
def composer_entries(composer: str, include: list[str] | None) -> list[dict[str, str]]:
    """One dict per score music21's corpus lists under ``composer`` (``path``: its corpus path,
    with ``group``, ``composer``, ``title`` and ``license`` from the metadata bundle), sorted by
    path and narrowed by ``include`` (glob patterns on the path; None = all)."""
    from music21 import common, corpus

    root = Path(common.getCorpusFilePath())
    paths = sorted(Path(str(p)).relative_to(root).as_posix()
                   for p in corpus.getComposer(composer))
    if not paths:
        raise ParamsError(f"corpus.source = {MUSIC21 + composer!r}: music21's corpus lists no "
                          f"score by {composer!r}; use {BACH!r}, a music21 composer with scores "
                          "(e.g. 'music21:palestrina', 'music21:monteverdi') or a folder")
    if include is not None:
        paths = [p for p in paths if any(fnmatch.fnmatchcase(p, pat) for pat in include)]
        if not paths:
            raise ParamsError(f"corpus.include = {include!r}: no score of {composer!r} matches; "
                              "patterns are globs on music21 corpus paths such as "
                              f"'{composer}/*'")
    bundle = corpus.corpora.CoreCorpus().metadataBundle
    # music21's MetadataBundle has no __iter__: iterating it indexes it, and each index copies
    # all its entries into a list, so a loop over the core corpus's 15,000 entries took 15 s.
    # Its entries dict is read directly (music21 is pinned); the loop is kept as the fallback.
    entries = getattr(bundle, "_metadataEntries", None)
    entries = list(entries.values()) if isinstance(entries, dict) else list(bundle)
    meta = {Path(str(e.sourcePath)).as_posix(): e.metadata for e in entries} if paths else {}
    rows = []
    for p in paths:
        m = meta.get(p)
        title = str(getattr(m, "title", None) or Path(p).stem)
        parent = getattr(m, "parentTitle", None)  # no parent work: a group of its own ("")
        rows.append({"path": p, "group": str(parent or ""), "title": title,
                     "composer": str(getattr(m, "composer", None) or composer),
                     "license": str(getattr(m, "copyright", None) or "not stated"),
                     "source": "music21 corpus"})
    return rows


def score_midi(corpus_path: str) -> tuple[bytes | None, str]:
    """MIDI bytes of one music21 corpus score, or ``(None, error)``."""
    from music21 import corpus
    from music21.midi import translate

    try:
        score = corpus.parse(corpus_path)
        return translate.music21ObjectToMidiFile(score).writestr(), ""
    except Exception as e:  # music21 raises many types for an unreadable score; report it
        return None, f"{type(e).__name__}: {e}"


def composer_filename(corpus_path: str) -> str:
    return Path(corpus_path).with_suffix(".mid").as_posix()


def materialise_composer(cfg: CorpusConfig, raw_dir: Path, workers: int,
                         show_progress: bool | str) -> list[dict[str, str]]:
    entries = composer_entries(cfg.source[len(MUSIC21):], cfg.include)
    # Conversion is deterministic, so a score already on disk (written atomically) is kept.
    todo = [e["path"] for e in entries if not (raw_dir / composer_filename(e["path"])).exists()]
    converted = dict(zip(todo, ordered_map(score_midi, todo, workers=workers, desc="scores",
                                           show_progress=show_progress), strict=True))
    rows = []
    for entry in entries:
        data, error = converted.get(entry["path"], (b"", ""))
        path = composer_filename(entry["path"]) if data is not None else ""
        if data:
            artifacts.write_bytes(raw_dir / path, data)
        rows.append({**entry, "path": path, "corpus_path": entry["path"], "error": error})
    return rows


# --------------------------------------------------------------------------- content index
INDEX_SCHEMA = pa.schema(
    [("path", pa.string()), ("sha256", pa.string()), ("size_bytes", pa.int64())]
)
STAT_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("size_bytes", pa.int64()),
        ("mtime_ns", pa.int64()),
        ("inode", pa.int64()),
        ("ctime_ns", pa.int64()),
        ("sha256", pa.string()),
    ]
)


def stat_cache_path(cache_dir: Path, raw_dir: Path) -> Path:
    """One stat file per materialised folder (a machine fact: never an artifact)."""
    key = artifacts.sha256_bytes(str(raw_dir.resolve()).encode())[:16]
    return cache_dir / f"stat-{key}.parquet"


def write_index(raw_dir: Path, stats: dict[str, os.stat_result], index_out: Path,
                cache_dir: Path | None) -> int:
    """Write ``index_out`` for the files ``stats`` names (relative to ``raw_dir``, with their
    ``stat``); return how many were hashed (the rest had the same size, mtime, inode and ctime
    recorded with their hash last time)."""
    known: dict[str, tuple[int, ...]] = {}
    stat_file = stat_cache_path(cache_dir, raw_dir) if cache_dir is not None else None
    if stat_file is not None and stat_file.exists():
        try:
            t = artifacts.read_table(stat_file).to_pydict()
            cols = [t[f.name] for f in STAT_SCHEMA]
            known = {row[0]: row[1:] for row in zip(*cols, strict=True)}
        except (artifacts.ArtifactError, KeyError):  # unreadable cache: hash everything again
            known = {}
    paths = sorted(stats)
    facts = [(s.st_size, s.st_mtime_ns, s.st_ino, s.st_ctime_ns) for s in map(stats.get, paths)]
    hashes = []
    for rel, fact in zip(paths, facts, strict=True):
        prev = known.get(rel)
        hashes.append(prev[4] if prev is not None and prev[:4] == fact else None)
    todo = [i for i, h in enumerate(hashes) if h is None]
    for i in todo:
        hashes[i] = artifacts.sha256_file(raw_dir / paths[i])
    hashed = len(todo)
    columns = list(zip(*facts, strict=True)) if facts else [[], [], [], []]
    rows = dict(zip([f.name for f in STAT_SCHEMA], [paths, *columns, hashes], strict=True))
    artifacts.write_parquet(
        index_out,
        pa.table({k: rows[k] for k in INDEX_SCHEMA.names}, schema=INDEX_SCHEMA),
    )
    if stat_file is not None:
        artifacts.write_parquet(stat_file, pa.table(rows, schema=STAT_SCHEMA))
    return hashed


# --------------------------------------------------------------------------- stage
def prune(raw_dir: Path, keep: set[str], files: dict[str, os.stat_result],
          folders: list[str]) -> None:
    """Remove ``files`` (and then empty ``folders``) under ``raw_dir`` not in ``keep``."""
    for rel in sorted(files):
        if rel not in keep:
            (raw_dir / rel).unlink(missing_ok=True)
    for rel in sorted(folders, reverse=True):  # children before their parents
        folder = raw_dir / rel
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def write_metadata(rows: list[dict[str, str]], path: Path) -> None:
    cols = ["path", "group", *sorted({k for r in rows for k in r} - {"path", "group"})]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    writer.writeheader()
    for r in sorted(rows, key=lambda r: (r["path"], r.get("riemenschneider", ""))):
        writer.writerow({c: r.get(c, "") for c in cols})
    artifacts.write_text(path, buf.getvalue())


def run(
    cfg: CorpusConfig,
    runtime: RuntimeConfig,
    *,
    raw_dir: Path,
    metadata_out: Path,
    index_out: Path | None = None,
    cache_dir: Path | None = None,
) -> CorpusSummary:
    """Synchronise ``raw_dir`` with the source; write ``metadata_out`` and, if given,
    ``index_out`` (hash facts kept in ``cache_dir`` when given)."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    existing, folders = scan_tree(raw_dir)
    if cfg.include is not None and not cfg.source.startswith(MUSIC21):
        raise ParamsError(f"corpus.include = {cfg.include!r}: only a music21 composer source "
                          f"takes it (corpus.source is {cfg.source!r}); set it to null")
    if cfg.source == BACH:
        rows = materialise_bach(raw_dir, runtime.n_workers(), runtime.progress)
        placed = {r["path"]: os.stat(raw_dir / r["path"]) for r in rows if r["path"]}
    elif cfg.source.startswith(MUSIC21):
        rows = materialise_composer(cfg, raw_dir, runtime.n_workers(), runtime.progress)
        placed = {r["path"]: os.stat(raw_dir / r["path"]) for r in rows if r["path"]}
    else:
        source = Path(cfg.source)
        if not source.is_dir():
            raise ParamsError(
                f"corpus.source = {cfg.source!r}: not a folder; use a folder of MIDI "
                f"files or {BACH!r}"
            )
        rows, placed = materialise_folder(cfg, source, raw_dir, existing)
    prune(raw_dir, set(placed), existing, folders)
    write_metadata(rows, metadata_out)
    hashed = write_index(raw_dir, placed, index_out, cache_dir) if index_out else 0
    unresolved = sum(1 for r in rows if not r["path"])
    return CorpusSummary(
        n_files=len(rows) - unresolved, n_unresolved=unresolved, n_hashed=hashed
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("data/raw"), help="output folder")
    parser.add_argument("--metadata-out", type=Path, default=Path("data/raw_metadata.csv"))
    parser.add_argument("--index-out", type=Path, default=Path("data/raw_index.parquet"),
                        help="path, sha256 and size of every file in --out (what DVC tracks)")
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/corpus"),
                        help="size, mtime and inode of hashed files, to skip re-hashing them")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("corpus", args.params, CorpusConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    summary = run(cfg, runtime, raw_dir=args.out, metadata_out=args.metadata_out,
                  index_out=args.index_out, cache_dir=args.cache_dir)
    print(
        f"corpus: {summary.n_files} files in {args.out} ({summary.n_hashed} hashed)"
        + (
            f", {summary.n_unresolved} unresolved (see {args.metadata_out})"
            if summary.n_unresolved
            else ""
        )
    )
    return 0
