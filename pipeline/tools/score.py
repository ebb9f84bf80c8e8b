"""``symkit score``: the NLL of MIDI files under a trained transformer, outside the DVC stages
(docs/inference.md).

Files and folders (folders are searched recursively for ``.mid``/``.midi``/``.kar`` files, sorted)
are read, checked and encoded in worker processes as the tokenize stage encodes a piece
(:mod:`pipeline.inference.standalone`), then scored under the evaluate stage's protocol: each token
sequence framed ``BOS x_1..x_n EOS``, ``n + 1`` targets, special ids removed, long sequences in
sliding windows (:func:`pipeline.inference.pieces.score_rows`). A file's NLL is the sum over its
sequences; per note it divides by the file's notes counted as ingest counts them.

A model of compound tokens (CPWord, Octuple) scores as evaluate scores compound rows: a
sequence is its steps (one id per codebook each), framed by a step of every codebook's BOS and
one of every codebook's EOS, each of the ``n + 1`` target steps scored once, in the same sliding
windows (counted in steps), each codebook's distribution renormalised without its PAD, BOS and
``Ignore_None`` (:class:`pipeline.inference.scorer.CompoundScorer`,
:func:`pipeline.inference.pieces.score_codebooks`). A step's NLL is the sum over its codebooks
(the joint NLL), so ``n_tokens`` counts steps and a piece's ``nll_nats`` and ``nll_per_note``
are evaluate's; ``nll_nats_<codebook>`` columns (evaluate's per_piece names) give each
codebook's share, adding up to ``nll_nats``. Compound models are never conditioned.

A conditioned model scores each file with the file's own built-in conditions, measured as the
conditions stage measures them (``--conditions auto``; a label the model's vocabulary lacks
becomes "none" and is listed in ``conditions_unknown``), with "none" in every slot
(``--conditions none``), and ``--condition NAME=LABEL`` fixes a slot for every file.

Output (``--out``, CSV or Parquet by its extension): one row per file, in input order, bad files
included (:data:`pipeline.inference.standalone.STATUSES`); columns :data:`COLUMNS`, then for a
conditioned model one ``condition_<name>`` column per slot (the label used, ``<none>`` for "no
condition") and ``conditions_unknown``, for a compound model one ``nll_nats_<codebook>`` column
per codebook (:func:`pipeline.inference.pieces.per_piece_schema`'s).

Scoring a test piece spends the test set whichever command does it. So before anything is read
for scoring, each input file is hashed (sha256 of its bytes, as ingest names a piece); when any
is a test piece (the registration's, ``reports/preregistration.json``, or
``data/splits.parquet``'s: :func:`pipeline.decision.looks.registered_test_pieces`), the look is
appended to the test-access ledger ``reports/ledger.jsonl`` first
(:func:`pipeline.decision.looks.test_pieces_scored`, command ``score``) and one line says so.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.artifacts import sha256_file, write_parquet, write_text
from pipeline.core.progress import progress
from pipeline.decision import ledger, looks
from pipeline.inference.pieces import score_codebooks, score_rows
from pipeline.inference.standalone import (
    FileResult,
    Inference,
    InferenceError,
    labels_of,
    measured_conditions,
    open_model,
    parse_conditions,
    read_files,
)
from pipeline.music.midi import list_midi_paths

HELP = "NLL per note of MIDI files under a trained transformer"

COLUMNS = pa.schema([
    ("path", pa.string()), ("sha256", pa.string()), ("status", pa.string()),
    ("detail", pa.string()), ("n_notes", pa.int64()), ("n_sequences", pa.int64()),
    ("n_tokens", pa.int64()), ("nll_nats", pa.float64()), ("nll_per_note", pa.float64()),
    ("nll_per_token", pa.float64()),
])
"""Columns of every output; ``n_tokens`` counts the targets scored (each sequence's ids and its
EOS, as evaluate counts them; steps for compound tokens); the ``nll_*`` columns are null for a
file not scored."""

FILES_PER_CALL = 32
"""Files scored per model call (a progress step)."""


def collect_paths(inputs: Sequence[Path | str]) -> list[str]:
    """Each input as given: a folder becomes its MIDI files (recursively, sorted by path), any
    other path stays itself (a missing or non-MIDI file gets its status row). Repeats are
    dropped; the order is the inputs'."""
    out: dict[str, None] = {}
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            out.update(dict.fromkeys((p / rel).as_posix() for rel in list_midi_paths(p)))
        else:
            out[p.as_posix()] = None
    return list(out)


def record_look(inf: Inference, paths: Sequence[str], settings: dict[str, Any], *,
                ledger_path: Path | None, registration: Path, splits: Path | None
                ) -> looks.Look | None:
    """Hash each file of ``paths`` that exists (sha256 of its bytes) and, when any is a test
    piece of ``registration`` or ``splits``, record the look at those in ``ledger_path``
    before they are scored; None when none is. The look's input digest names the model, the
    files and the scoring ``settings``, so scoring them again the same way is the same look."""
    shas = sorted({sha256_file(p) for p in paths if Path(p).is_file()})
    test = looks.registered_test_pieces(registration, splits)
    if not set(shas) & set(test):
        return None
    inputs = looks.digest_of({"model": inf.identity(), "files": shas, "settings": settings})
    return looks.test_pieces_scored("score", shas, test, inputs, ledger_path=ledger_path,
                                    registration=registration)


def condition_rows(inf: Inference, results: Sequence[FileResult], mode: str,
                   fixed: dict[str, str | None]) -> tuple[list[dict[str, str | None]], list[str]]:
    """Per file, its label per slot (None: "none") and the measured labels the model lacks."""
    labels, unknown = [], []
    for r in results:
        if mode == "auto":
            got, missing = measured_conditions(inf, r.measured)
        else:
            got, missing = dict.fromkeys(inf.vocab.names), []
        got.update(fixed)
        labels.append(got)
        unknown.append("; ".join(m for m in missing if m.partition("=")[0] not in fixed))
    return labels, unknown


def run(inf: Inference, scorer: Any, results: Sequence[FileResult], paths: Sequence[str], *,
        mode: str = "auto", fixed: dict[str, str | None] | None = None,
        show_progress: bool | str = "auto") -> pa.Table:
    """Score the files ``read_files`` gave; one row per file (module docstring)."""
    fixed = fixed or {}
    conditioned = inf.vocab is not None
    books = list(inf.info.codebook_keys())  # compound tokens (never conditioned: open_model)
    labels, unknown = (condition_rows(inf, results, mode, fixed) if conditioned
                       else ([{}] * len(results), [""] * len(results)))
    ok = [i for i, r in enumerate(results) if r.status == "ok"]
    nll: dict[int, float] = {}
    shares: dict[int, list[float]] = {}
    bar = progress(total=len(ok), desc="score", enabled=show_progress)
    for lo in range(0, len(ok), FILES_PER_CALL):
        part = ok[lo : lo + FILES_PER_CALL]
        owner = np.asarray([i for i in part for _ in results[i].rows], dtype=np.int64)
        seqs = [ids for i in part for _, ids in results[i].rows]
        if books:  # compound: the joint NLL and each codebook's share, as evaluate scores them
            per_seq, per_book = (score_codebooks(scorer, seqs) if seqs
                                 else (np.zeros(0), np.zeros((0, len(books)))))
        else:
            conds = (np.stack([inf.vocab.encode(labels[i]) for i in owner])
                     if conditioned and seqs else None)
            per_seq = score_rows(scorer, seqs, conds) if seqs else np.zeros(0)
        for i in part:
            mine = owner == i
            nll[i] = math.fsum(per_seq[mine].tolist())
            if books:
                shares[i] = [math.fsum(col) for col in per_book[mine].T.tolist()]
        bar.update(len(part))
    bar.close()
    rows = []
    for i, (path, r) in enumerate(zip(paths, results, strict=True)):
        scored = i in nll
        n_tokens = sum(len(ids) + 1 for _, ids in r.rows) if scored else None
        row = {"path": path, "sha256": r.sha256, "status": r.status, "detail": r.detail,
               "n_notes": r.n_notes, "n_sequences": len(r.rows) if scored else None,
               "n_tokens": n_tokens, "nll_nats": nll.get(i),
               "nll_per_note": nll[i] / r.n_notes if scored else None,
               "nll_per_token": nll[i] / n_tokens if scored else None}
        row.update({f"nll_nats_{k}": shares[i][b] if scored else None
                    for b, k in enumerate(books)})
        if conditioned:
            shown = labels_of(inf, labels[i])
            row.update({f"condition_{n}": shown[n] if scored else None for n in inf.vocab.names})
            row["conditions_unknown"] = unknown[i] if scored else None
        rows.append(row)
    schema = pa.schema([*COLUMNS, *[(f"nll_nats_{k}", pa.float64()) for k in books]])
    if conditioned:
        schema = pa.schema([*schema, *[(f"condition_{n}", pa.string())
                                        for n in inf.vocab.names],
                            ("conditions_unknown", pa.string())])
    return pa.Table.from_pylist(rows, schema=schema)


def write_scores(table: pa.Table, out: Path) -> None:
    """CSV or Parquet by ``out``'s extension, written atomically."""
    if out.suffix.lower() == ".parquet":
        write_parquet(out, table)
    else:
        write_text(out, table.to_pandas().to_csv(index=False))


# ----------------------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("inputs", nargs="+", type=Path, metavar="PATH",
      help="MIDI files and/or folders (searched recursively for .mid/.midi/.kar, sorted)")
    a("--model", type=Path, default=Path("data/transformer"),
      help="a trained transformer's folder: model.json + model.safetensors (default: "
           "data/transformer; a training seed: data/transformer/replicates/seed-<seed>)")
    a("--tokenizer", type=Path, default=Path("data/tokenizer.json"),
      help="the tokenizer the model was trained with (default: data/tokenizer.json)")
    a("--out", type=Path, default=Path("scores.csv"),
      help="output table, .csv or .parquet (default: scores.csv)")
    a("--conditions", choices=["auto", "none"], default="auto",
      help="conditioned model: auto = each file's own measured conditions, none = every slot "
           "'none' (default: auto)")
    a("--condition", action="append", default=[], metavar="NAME=LABEL",
      help="conditioned model: use this label for every file (repeatable; overrides "
           "--conditions for that condition)")
    a("--stride", type=int, default=None,
      help="sliding-window step for sequences longer than the model's context, in tokens "
           "(steps for a compound model) (default: max_seq_len // 4, which is "
           "evaluate.stride's default for the default model)")
    a("--batch-size", type=int, default=32, help="windows per model call (speed only)")
    a("--device", default="cpu", help="torch device: cpu | cuda | cuda:N (default: cpu)")
    a("--torch-threads", type=int, default=2,
      help="torch CPU threads (default: 2, runtime.torch_threads' default; results depend on it)")
    a("--workers", type=int, default=1, help="processes that read and encode files (default: 1)")
    a("--ledger", type=Path, default=ledger.LEDGER,
      help="test-access ledger a look at test pieces is appended to (default: "
           "reports/ledger.jsonl)")
    a("--preregistration", type=Path, default=ledger.REGISTRATION,
      help="the registration whose test pieces (and registration) a look records (default: "
           "reports/preregistration.json)")
    a("--splits", type=Path, default=Path("data/splits.parquet"),
      help="the split whose test pieces a look records (default: data/splits.parquet)")


def main(args: argparse.Namespace) -> int:
    try:
        return _main(args)
    except InferenceError as e:
        print(f"symkit score: {e}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    if args.out.suffix.lower() not in (".csv", ".parquet"):
        raise InferenceError(f"--out {args.out.as_posix()}: name a .csv or .parquet file")
    for name in ("batch_size", "torch_threads", "workers"):
        if getattr(args, name) < 1:
            raise InferenceError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    inf = open_model(args.model, args.tokenizer)
    fixed = parse_conditions(args.condition, inf)
    paths = collect_paths(args.inputs)
    if not paths:
        raise InferenceError(f"no MIDI files (.mid, .midi, .kar) under "
                             f"{', '.join(p.as_posix() for p in args.inputs)}")
    look = record_look(inf, paths, {"conditions": args.conditions, "fixed": fixed,
                                    "stride": args.stride}, ledger_path=args.ledger,
                       registration=args.preregistration, splits=args.splits)
    if look is not None:
        n = look.record["n_pieces"]
        print(f"score: {n} of these files {'are test pieces' if n != 1 else 'is a test piece'}: "
              f"scoring {'them' if n != 1 else 'it'} is a look at the test set, recorded in "
              f"{args.ledger.as_posix()}")
    # Files are read in forked workers before torch loads the model.
    results = read_files(paths, inf, with_conditions=inf.vocab is not None
                         and args.conditions == "auto", workers=args.workers)
    scorer = inf.scorer(args.device, args.stride, args.batch_size, args.torch_threads)
    table = run(inf, scorer, results, paths, mode=args.conditions, fixed=fixed)
    write_scores(table, args.out)
    statuses = Counter(table["status"].to_pylist())
    n_ok = statuses.pop("ok", 0)
    scored = table.filter(pc.equal(table["status"], "ok"))
    notes = sum(scored["n_notes"].to_pylist())
    summary = (f", {sum(scored['nll_nats'].to_pylist()) / notes:.4f} nats per note over them"
               if notes else "")
    others = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
    print(f"score: {len(paths)} files, {n_ok} scored{summary}"
          + (f"; not scored: {others}" if others else "") + f" -> {args.out.as_posix()}")
    return 0
