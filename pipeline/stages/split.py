"""Stage ``split``: grouped, leakage-resistant train/val/test split (and optional group folds).

Inputs: ``data/manifest.parquet``, ``data/notes.parquet`` (for the leakage audit) and dedupe's
``data/dedupe/{clusters,pairs}.parquet`` + ``fingerprint.json``.
Outputs: ``data/splits.parquet`` (every kept piece: ``sha256``, ``group_id``, ``split``, ``fold``),
``reports/split.json`` (realised shares, ``split_hash``, moved pieces), ``reports/leakage.json``
and ``reports/figures/leakage.png`` (see :mod:`pipeline.similarity.leakage`).

Groups are the connected components of: each file's metadata ``group`` (byte duplicates included:
a duplicate has its canonical's sha256, so its label joins the canonical's group) and dedupe's
clusters (dropped copies included, so their labels still bind). A group's key is its smallest
metadata label (``group:<label>``), or its smallest sha256 (``sha256:<hex>``) when it has no label;
its split is a pure function of that key and ``split.seed``: ``u = sha256(seed, key) / 2**256``
compared with the cumulative ratios (:class:`pipeline.similarity.splitters.GroupHashSplit`,
whose hash and cut the leakage audit's per-piece contrast shares). Hence adding files that join
no existing group never moves an existing piece, the ratios hold in expectation, and
tokenisation never changes the split.

k-fold mode (``folds >= 2``) keeps scikit-learn ``GroupKFold``'s guarantee — a group never spans
folds — but assigns folds by the same kind of hash instead of greedy size balancing, so folds are
stable under additions. Test = ``test_fold``; val/train split the rest by ``val / (train + val)``.
``fold`` is -1 when folds are off.

Excluded from test (``split.exclude_test``, a file of sha256s, one a line, ``#`` comments): a
group holding a listed piece (kept or a dropped copy) never goes to test. Where the hash says test
(with folds: the group is in the test fold, and keeps its fold number) it goes to train when
``sha256(seed, "exclude_test", key) / 2**256 < train / (train + val)``, else to val, so the
train:val ratio holds in expectation. Every other group is assigned exactly as without the file,
and the split stays a pure function of (key, seed, the listed set). Drawing a fresh test set from
the ledger: ``symkit ledger --spent data/spent_test.txt`` lists every piece ever scored as test.

Excluded from train (``split.exclude_train``): the same rule the other way round, for a corpus
that pretrains a model later scored on another corpus's held-out pieces. A group holding a listed
piece never goes to train: where the hash says train it goes to val when
``sha256(seed, "exclude_train", key) / 2**256 < val / (val + test)``, else to test (a group listed
in both files goes to val). The file is a list of sha256s as above, or a ``matches.parquet``
written by ``symkit contamination`` (its ``ref_sha256`` column: this corpus's pieces that copy the
other corpus's held-out pieces), so decontamination is one stage and one key.

Minimum groups: a hash split of a few groups can leave val or test (the held-out fold, with folds)
empty or nearly so, and every later stage would run for nothing. Unless ``split.min_groups`` is 0,
the stage refuses, before writing anything, a split where val or test has fewer than
``min_groups`` groups or train has none, with :class:`SplitTooSmallError` naming the counts and the
remedies (more data, ``split.folds``, other ratios, a lower ``min_groups``). It never reassigns a
group: a split that passes is exactly the hash split, so it stays stable under additions.

Invariants: no group, metadata label or dedupe pair spans splits (``crossing_*`` counts of the
audit). They hold by construction, so the stage checks them before writing anything and raises
:class:`SplitInvariantError` otherwise: a bug here (or dedupe pairs that disagree with its
clusters), never a property of the data. The evidence about leakage is the audit's
``independent`` block (:mod:`pipeline.similarity.leakage`).

Moved pieces: the previous split is read from ``--previous FILE`` or, if that is not given, from the
output path before it is overwritten. ``dvc repro`` deletes outputs before a stage runs, so to list
moves under DVC pass the old table explicitly, e.g. ``dvc get . data/splits.parquet --rev HEAD -o
old.parquet && symkit split --previous old.parquet``.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field, model_validator
from scipy.sparse import coo_array
from scipy.sparse.csgraph import connected_components

from pipeline.core import artifacts
from pipeline.core.arrays import isin
from pipeline.core.config import ParamsError, RuntimeConfig, StageConfig, load_section
from pipeline.core.splits import SPLIT_NAMES, SPLITS_SCHEMA, split_hash
from pipeline.render.figures import histograms_png
from pipeline.similarity import fingerprints as fp
from pipeline.similarity import leakage
from pipeline.similarity.digests import note_digests
from pipeline.similarity.leakage_cache import AuditCache, audit_inputs, cache_key
from pipeline.similarity.rule import NearCopyRule
from pipeline.similarity.splitters import GroupHashSplit

HELP = "grouped train/val/test split and leakage audit"

MAX_MOVED_LISTED = 1000


class SplitConfig(StageConfig):
    """``split`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "split"

    seed: int = Field(1235, ge=0)
    train: float = Field(0.8, ge=0.0, le=1.0)
    val: float = Field(0.1, ge=0.0, le=1.0)
    test: float = Field(0.1, ge=0.0, le=1.0)
    folds: int = Field(0, ge=0, le=1000)
    test_fold: int = Field(0, ge=0)
    audit_max_test: int = Field(2000, ge=1)
    min_groups: int = Field(2, ge=0)
    exclude_test: str | None = "data/spent_test.txt"
    exclude_train: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> SplitConfig:
        total = self.train + self.val + self.test
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"train + val + test must be 1, got {self.train} + {self.val} + "
                             f"{self.test} = {total:g}")
        if self.folds == 1:
            raise ValueError("folds must be 0 (off) or >= 2, got 1")
        if self.folds >= 2 and self.test_fold >= self.folds:
            raise ValueError(f"test_fold must be in 0..{self.folds - 1}, got {self.test_fold}")
        if self.folds >= 2 and self.train + self.val <= 0:
            raise ValueError("k-fold mode needs train + val > 0")
        if self.exclude_test is not None and self.train + self.val <= 0:
            raise ValueError("exclude_test needs train + val > 0 (excluded groups go there)")
        if self.exclude_train is not None and self.val + self.test <= 0:
            raise ValueError("exclude_train needs val + test > 0 (excluded groups go there)")
        return self


SHA256 = re.compile(r"[0-9a-f]{64}")


def read_exclude_test(path: str | Path | None, key: str = "split.exclude_test") -> list[str]:
    """The distinct sha256s listed in ``path`` (``split.exclude_test``), sorted; [] for None.

    One sha256 (64 lowercase hex characters) a line; blank lines and lines starting with ``#``
    are skipped. A missing file or any other line is a :class:`ParamsError` naming ``key``."""
    if path is None:
        return []
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{key} = {str(path)!r}: file not found (a text file of "
                          "piece sha256s, one a line; write one with `symkit ledger --spent "
                          f"{path}`, or set {key} to null)")
    listed = set()
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if not SHA256.fullmatch(text):
            raise ParamsError(f"{key} = {str(path)!r}: line {i} is {text[:80]!r}; "
                              "allowed: a sha256 (64 lowercase hex characters), a blank line "
                              "or a line starting with '#'")
        listed.add(text)
    return sorted(listed)


def read_exclude_train(path: str | Path | None) -> list[str]:
    """The distinct sha256s of ``split.exclude_train``, sorted; [] for None: a text list as
    :func:`read_exclude_test` reads it, or a contamination ``matches.parquet`` (its
    ``ref_sha256`` column). Anything else is a :class:`ParamsError` naming the key."""
    if path is None or Path(path).suffix != ".parquet":
        return read_exclude_test(path, "split.exclude_train")
    key = f"split.exclude_train = {str(path)!r}"
    try:
        table = artifacts.read_table(Path(path))
    except artifacts.ArtifactError as e:
        raise ParamsError(f"{key}: {e} (a matches.parquet written by `symkit contamination`, "
                          "or a text file of sha256s)") from e
    if "ref_sha256" not in table.column_names:
        raise ParamsError(f"{key}: no ref_sha256 column (columns: {table.column_names}); "
                          "allowed: a matches.parquet written by `symkit contamination`, or a "
                          "text file of sha256s")
    listed = sorted({str(v) for v in table["ref_sha256"].to_pylist() if v})
    bad = next((v for v in listed if not SHA256.fullmatch(v)), None)
    if bad is not None:
        raise ParamsError(f"{key}: ref_sha256 {bad[:80]!r} is not a sha256")
    return listed


class SplitInvariantError(RuntimeError):
    """A group, metadata label or dedupe pair spans splits: a bug, not a property of the data."""


INVARIANTS = ("crossing_groups", "crossing_metadata_groups", "crossing_pairs")


def check_invariants(counts: dict[str, int]) -> None:
    """Raise :class:`SplitInvariantError` naming the counts unless every crossing count is 0."""
    bad = {k: counts.get(k, 0) for k in INVARIANTS if counts.get(k, 0) != 0}
    if bad:
        raise SplitInvariantError(
            "split invariant violated: " + ", ".join(f"{k}={v}" for k, v in bad.items())
            + " (must be 0). The split is a function of groups built from these labels and "
            "pairs, so this is a bug in pipeline/stages/split.py, or data/dedupe/pairs.parquet "
            "disagrees with clusters.parquet (re-run `dvc repro dedupe`).")


class SplitTooSmallError(ValueError):
    """Val or test got fewer than ``split.min_groups`` groups (or train none): a property of the
    data and the ratios. The message names the counts and the remedies."""


EVALUATED = ("val", "test")


def check_min_groups(groups: dict[str, int], cfg: SplitConfig) -> None:
    """Raise :class:`SplitTooSmallError` unless val and test each have ``cfg.min_groups`` groups
    and train has one (``groups``: split name -> number of groups). ``min_groups`` 0: no check."""
    if cfg.min_groups == 0:
        return
    need = {"train": 1, **dict.fromkeys(EVALUATED, cfg.min_groups)}
    short = [s for s in SPLIT_NAMES if groups.get(s, 0) < need[s]]
    if not short:
        return
    total = sum(groups.get(s, 0) for s in SPLIT_NAMES)
    counts = ", ".join(f"{s} {groups.get(s, 0)}" for s in SPLIT_NAMES)
    if cfg.folds >= 2:
        where = f"{cfg.folds} folds, test = fold {cfg.test_fold}"
        folds = (f"fewer folds (split.folds = {cfg.folds}; test gets about 1/folds of the "
                 "groups)")
    else:
        where = f"ratios train {cfg.train:g} / val {cfg.val:g} / test {cfg.test:g}"
        folds = ("k folds (split.folds >= 2: test is one fold, about 1/k of the groups; "
                 "val comes from the rest)")
    raise SplitTooSmallError(
        f"{total} group{'s' * (total != 1)} split into {counts} ({where}); "
        + " and ".join(f"{s} needs >= {need[s]}" for s in short)
        + f" (split.min_groups = {cfg.min_groups} for val and test, 1 for train). Nothing was "
        "written, so no model is trained or scored on this split. Remedies: more data (more "
        f"groups), {folds}, other ratios (split.train / split.val / split.test), or a lower "
        "split.min_groups (0 turns this check off).")


@dataclass(frozen=True)
class SplitSummary:
    pieces: int
    groups: int
    counts: dict[str, int]
    split_hash: str
    moved: int


# ---------------------------------------------------------------------------------------------
# pure core


def group_keys(files: pd.DataFrame, clusters: pd.DataFrame) -> pd.Series:
    """Group key of every piece in ``clusters`` (index: sha256).

    ``files``: every manifest row that is ok or a byte duplicate, with ``sha256`` and ``group``
    ("" = no label). ``clusters``: dedupe's ``sha256``/``cluster_id`` for every ok piece.
    """
    shas = np.sort(clusters["sha256"].unique())
    labelled = files[(files["group"] != "").to_numpy() & isin(files["sha256"], shas)]
    labels = np.sort(labelled["group"].unique())
    n_s = shas.size
    node_of_sha = pd.Series(np.arange(n_s), index=shas)
    node_of_label = pd.Series(np.arange(labels.size) + n_s, index=labels)
    a = np.concatenate([node_of_sha[labelled["sha256"]].to_numpy(),
                        node_of_sha[clusters["sha256"]].to_numpy()])
    b = np.concatenate([node_of_label[labelled["group"]].to_numpy(),
                        node_of_sha[clusters["cluster_id"]].to_numpy()])
    n = n_s + labels.size
    graph = coo_array((np.ones(a.size, dtype=np.int8), (a, b)), shape=(n, n)).tocsr()
    _, comp = connected_components(graph, directed=False)
    names = np.concatenate([np.char.add("sha256:", shas.astype(str)),
                            np.char.add("group:", labels.astype(str))]).astype(object)
    # key: smallest label of the component, else its smallest sha256
    rank = np.concatenate([np.full(n_s, 1), np.full(labels.size, 0)])
    order = np.lexsort((names, rank, comp))
    first = np.ones(n, dtype=bool)
    first[1:] = comp[order][1:] != comp[order][:-1]
    key_of_comp = dict(zip(comp[order][first], names[order][first], strict=True))
    return pd.Series([key_of_comp[c] for c in comp[:n_s]], index=shas, name="group_id")


def splitter(cfg: SplitConfig, exclude_test: Collection[str] = (),
             exclude_train: Collection[str] = ()) -> GroupHashSplit:
    """The grouped splitter ``cfg`` describes (:class:`~pipeline.similarity.splitters.
    GroupHashSplit`); ``exclude_test``, ``exclude_train``: keys of the groups that never go to
    test, to train (see the module docstring)."""
    return GroupHashSplit((cfg.train, cfg.val, cfg.test), cfg.seed, folds=cfg.folds,
                          test_fold=cfg.test_fold, exclude_test=exclude_test,
                          exclude_train=exclude_train)


def held_groups(keys: pd.Series, exclude: Collection[str]) -> np.ndarray:
    """Sorted keys of the groups holding a piece in ``exclude`` (``keys``: from
    :func:`group_keys`, so dropped copies count)."""
    return np.unique(keys[isin(keys.index.to_numpy().astype(str), exclude)].to_numpy()
                     .astype(str))


def split_table(files: pd.DataFrame, clusters: pd.DataFrame, cfg: SplitConfig,
                exclude: Collection[str] = (), exclude_train: Collection[str] = ()
                ) -> pd.DataFrame:
    """The split of every kept piece, sorted by sha256. ``exclude``: sha256s whose groups never
    go to test (:func:`read_exclude_test`); ``exclude_train``: whose groups never go to train
    (:func:`read_exclude_train`)."""
    keys = group_keys(files, clusters)
    kept = np.sort(clusters.loc[clusters["keep"], "sha256"].to_numpy().astype(str))
    group_id = keys[kept].to_numpy()
    uniq, inverse = np.unique(group_id.astype(str), return_inverse=True)
    held = held_groups(keys, exclude) if len(exclude) else ()
    held_train = held_groups(keys, exclude_train) if len(exclude_train) else ()
    splits, folds = splitter(cfg, held, held_train).assign(uniq.astype(object))
    return pd.DataFrame({"sha256": kept, "group_id": group_id, "split": splits[inverse],
                         "fold": folds[inverse]})


def exclusion_counts(files: pd.DataFrame, clusters: pd.DataFrame, table: pd.DataFrame,
                     exclude: Collection[str], cfg: SplitConfig) -> dict[str, int | None]:
    """``reports/split.json``'s ``exclude_test_*`` keys: sha256s listed, kept pieces listed,
    groups holding a listed piece, and those of them the hash alone would put in test (all None
    when ``split.exclude_test`` is null)."""
    names = ("listed", "pieces", "groups", "moved")
    if cfg.exclude_test is None:
        return {f"exclude_test_{k}": None for k in names}
    held = held_groups(group_keys(files, clusters), exclude) if len(exclude) else np.array([])
    plain, _ = splitter(cfg).assign(held.astype(object))
    counts = (len(exclude), int(isin(table["sha256"], exclude).sum()), held.size,
              int((plain == "test").sum()))
    return {f"exclude_test_{k}": v for k, v in zip(names, counts, strict=True)}


def train_exclusion_counts(files: pd.DataFrame, clusters: pd.DataFrame, table: pd.DataFrame,
                           listed: Collection[str], cfg: SplitConfig) -> dict[str, int | None]:
    """``reports/split.json``'s ``exclude_train_*`` keys: sha256s listed, kept pieces listed,
    groups holding a listed piece, those of them the hash alone would put in train (moved out),
    and the listed pieces left in train (0 by construction; all None when
    ``split.exclude_train`` is null)."""
    names = ("listed", "pieces", "groups", "moved", "in_train")
    if cfg.exclude_train is None:
        return {f"exclude_train_{k}": None for k in names}
    held = held_groups(group_keys(files, clusters), listed) if len(listed) else np.array([])
    plain, _ = splitter(cfg).assign(held.astype(object))
    in_listed = isin(table["sha256"], listed)
    counts = (len(listed), int(in_listed.sum()), held.size, int((plain == "train").sum()),
              int((in_listed & (table["split"] == "train").to_numpy()).sum()))
    return {f"exclude_train_{k}": v for k, v in zip(names, counts, strict=True)}


def moved_pieces(previous: pd.DataFrame | None, table: pd.DataFrame) -> list[str]:
    """``sha256:old->new`` for each piece in both tables whose split changed (sorted)."""
    if previous is None:
        return []
    both = table.merge(previous[["sha256", "split"]], on="sha256", suffixes=("", "_old"))
    moved = both[both["split"] != both["split_old"]].sort_values("sha256")
    return [f"{s}:{o}->{n}" for s, o, n in zip(moved["sha256"], moved["split_old"],
                                                 moved["split"], strict=True)]


# ---------------------------------------------------------------------------------------------
# the stage


def run(cfg: SplitConfig, runtime: RuntimeConfig, *, manifest: Path, notes: Path,
        dedupe_dir: Path, splits: Path, report: Path, leakage_report: Path, figure: Path,
        previous: Path | None = None, cache_dir: Path | None = None) -> SplitSummary:
    """Split the kept pieces and audit the split. With ``cache_dir``, the audit's results are
    kept there (:class:`~pipeline.similarity.leakage_cache.AuditCache`) and the next run compares
    its queries only with the pieces they have not met; the outputs are the same without it."""
    t0 = time.perf_counter()
    man = artifacts.read_parquet(manifest, columns=["sha256", "status", "group", "n_notes"])
    man["group"] = man["group"].fillna("")
    files = man[man["status"].isin(["ok", "duplicate"])]
    clusters = artifacts.read_parquet(dedupe_dir / "clusters.parquet")
    pairs = artifacts.read_parquet(dedupe_dir / "pairs.parquet")
    rule = NearCopyRule.read(dedupe_dir / "fingerprint.json")

    exclude = read_exclude_test(cfg.exclude_test)
    exclude_train = read_exclude_train(cfg.exclude_train)
    prev_path = previous if previous is not None else (splits if splits.exists() else None)
    prev = artifacts.read_parquet(prev_path) if prev_path is not None else None
    table = split_table(files, clusters, cfg, exclude, exclude_train)
    labels = files.drop_duplicates("sha256").set_index("sha256")["group"]
    pieces = table.assign(group=labels.reindex(table["sha256"]).fillna("").to_numpy(),
                          cluster_id=clusters.set_index("sha256")["cluster_id"]
                          .reindex(table["sha256"]).to_numpy())
    check_invariants(leakage.crossing_counts(pieces, pairs))
    check_min_groups(table.groupby("split")["group_id"].nunique().to_dict(), cfg)
    moved = moved_pieces(prev, table)
    artifacts.write_parquet(splits, pa.Table.from_pandas(table, schema=SPLITS_SCHEMA,
                                                         preserve_index=False))

    n_notes = man[man["status"] == "ok"].set_index("sha256")["n_notes"]
    notes_of = n_notes.reindex(table["sha256"]).fillna(0).to_numpy()
    counts = table["split"].value_counts()
    out: dict = {"pieces": len(table), "groups": int(table["group_id"].nunique()),
                 "split_hash": split_hash(table["sha256"], table["split"]),
                 "moved_pieces": len(moved),
                 "moved": moved[:MAX_MOVED_LISTED], "compared_with_previous": prev is not None,
                 # ok pieces dedupe did not see (a stale data/dedupe): reported, never split
                 "ok_missing_from_dedupe": int((~isin(man.loc[man["status"] == "ok", "sha256"],
                                                      clusters["sha256"])).sum()),
                 **exclusion_counts(files, clusters, table, exclude, cfg),
                 **train_exclusion_counts(files, clusters, table, exclude_train, cfg)}
    if prev is not None:  # pieces that entered or left (e.g. a new, fuller copy was kept instead)
        out["pieces_added"] = int((~isin(table["sha256"], prev["sha256"])).sum())
        out["pieces_removed"] = int((~isin(prev["sha256"], table["sha256"])).sum())
    for s in SPLIT_NAMES:
        mask = (table["split"] == s).to_numpy()
        out[f"{s}_pieces"] = int(counts.get(s, 0))
        out[f"{s}_groups"] = int(table.loc[mask, "group_id"].nunique())
        out[f"{s}_share_pieces"] = round(mask.mean(), 6) if len(table) else None
        out[f"{s}_share_notes"] = (round(notes_of[mask].sum() / notes_of.sum(), 6)
                                   if notes_of.sum() else None)
    artifacts.write_json(report, out)

    # leakage audit over the kept pieces
    t1 = time.perf_counter()
    note_arrays = _kept_notes(notes, table["sha256"].to_numpy())
    ioi = rule.ioi_resolution
    cache, inputs = None, {}
    if cache_dir is not None:
        digests = note_digests(note_arrays)
        sm, mel, tok = audit_inputs(note_arrays, rule.shingle_k, ioi, digests, cache_dir, inputs)
        context = cfg.model_dump(include={"seed", "train", "val", "test", "folds", "test_fold",
                                          "audit_max_test"})
        if exclude:  # the listed set moves groups out of test: keep its state apart
            context["exclude_test"] = artifacts.sha256_bytes("\n".join(exclude).encode())
        if exclude_train:
            context["exclude_train"] = artifacts.sha256_bytes("\n".join(exclude_train).encode())
        cache = AuditCache(cache_dir, cache_key(rule, context), digests)
    else:
        sm, mel, tok = audit_inputs(note_arrays, rule.shingle_k, ioi, [], None, inputs)
    t2 = time.perf_counter()
    metrics, curves = leakage.audit(pieces, pairs, sm, mel, tok, seed=cfg.seed,
                                    ratios=(cfg.train, cfg.val, cfg.test),
                                    max_test=cfg.audit_max_test, rule=rule,
                                    workers=runtime.n_workers(), cache=cache)
    artifacts.write_json(leakage_report, metrics)
    artifacts.write_bytes(figure, histograms_png(
        curves, xlabel="exact shingle Jaccard of the nearest neighbour",
        title="Leakage: similarity of test pieces to their nearest neighbour"))
    t3 = time.perf_counter()
    artifacts.write_sidecar(report.with_suffix(".env.json"), {
        "seconds_split": round(t1 - t0, 3), "seconds_audit_inputs": round(t2 - t1, 3),
        "seconds_audit": round(t3 - t2, 3), "workers": runtime.n_workers(),
        # pieces whose shingles, tokens and melodies came from .cache/split, and per comparison
        # the queries whose results came from there (compared only with the pieces they had not
        # met) and those measured in full
        **inputs, "audit_cache": cache.stats if cache is not None else None,
    })
    return SplitSummary(len(table), out["groups"], {s: out[f"{s}_pieces"] for s in SPLIT_NAMES},
                        out["split_hash"], len(moved))


def _kept_notes(notes: Path, kept: np.ndarray) -> fp.NoteArrays:
    """Notes of the kept pieces, in sha256 order (a kept piece without notes is empty)."""

    cols = ["sha256", "onset", "duration", "pitch", "is_drum", "track"]
    table = artifacts.read_table(notes, columns=cols)
    missing = sorted(set(kept.tolist()) - set(table["sha256"].to_pylist()))
    if missing:
        empty = pa.table({c: (pa.array(missing, pa.string()) if c == "sha256" else
                              pa.array([[]] * len(missing), type=table.schema.field(c).type))
                          for c in cols}, schema=table.schema)
        table = pa.concat_tables([table, empty])
    return fp.notes_from_table(table, keep=kept.tolist())


# --------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--manifest", type=Path, default=Path("data/manifest.parquet"))
    parser.add_argument("--notes", type=Path, default=Path("data/notes.parquet"))
    parser.add_argument("--dedupe-dir", type=Path, default=Path("data/dedupe"))
    parser.add_argument("--splits", type=Path, default=Path("data/splits.parquet"))
    parser.add_argument("--report", type=Path, default=Path("reports/split.json"))
    parser.add_argument("--leakage-report", type=Path, default=Path("reports/leakage.json"))
    parser.add_argument("--figure", type=Path, default=Path("reports/figures/leakage.png"))
    parser.add_argument("--previous", type=Path, default=None,
                        help="an earlier splits.parquet to list moved pieces against "
                             "(default: the existing --splits file, if any)")
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/split"),
                        help="the leakage audit's results of the last run (does not change "
                             "results)")
    parser.add_argument("--no-cache", action="store_true",
                        help="measure every audit comparison in full")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("split", args.params, SplitConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    try:
        s = run(cfg, runtime, manifest=args.manifest, notes=args.notes,
                dedupe_dir=args.dedupe_dir, splits=args.splits, report=args.report,
                leakage_report=args.leakage_report, figure=args.figure, previous=args.previous,
                cache_dir=None if args.no_cache else args.cache_dir)
    except SplitTooSmallError as e:
        print(f"symkit split: {e}", file=sys.stderr)
        return 1
    print(f"split: {s.pieces} pieces in {s.groups} groups -> "
          + ", ".join(f"{k} {v}" for k, v in s.counts.items())
          + f"; split_hash {s.split_hash[:12]}; {s.moved} moved")
    return 0
