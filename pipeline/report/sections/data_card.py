"""The report's data card: files by status, quarantine reason and licence; duplicates by dedupe
tier with an example pair each; split sizes and shares; the leakage audit; contamination against
other corpora; tokenisation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.artifacts import read_table_or_none
from pipeline.render.document import NA, Document, Figure, Heading, Para, Table, fmt
from pipeline.render.figures import count_bars_png, grouped_bars_png, pair_rolls_png
from pipeline.report.context import ReportContext
from pipeline.report.sections.common import count_rows, kv_block, not_available


def read_notes(path: Path, shas: list[str]) -> dict[str, dict[str, Any]] | None:
    """The notes (onset, duration, pitch) of the pieces ``shas`` from data/notes.parquet, read
    for those rows only; None when the file is missing or unreadable."""
    try:
        table = pq.read_table(path, columns=["sha256", "onset", "duration", "pitch"],
                              filters=[("sha256", "in", shas)]).to_pandas()
    except (OSError, ValueError, pa.ArrowException):
        return None
    return {r["sha256"]: r for r in table.to_dict("records")}


TIER_WORDS = {"note": "the same notes saved differently",
              "transposed": "the same music transposed or uniformly time-scaled",
              "melody": "the same top-voice melody under other harmony",
              "near": "a near duplicate, confirmed by shingle similarity or by alignment of the "
                      "notes or melodies"}


def dedupe_tiers(dedupe: Any) -> list[Figure]:
    """Pairs per dedupe tier, zeros included, and the near candidates verification rejected,
    from reports/dedupe.json."""
    if not isinstance(dedupe, dict):
        return []
    rows = [("byte-identical files", dedupe.get("byte_duplicates"))]
    rows += [(f"{tier}: {TIER_SHORT[tier]}", dedupe.get(f"{tier}_pairs")) for tier in TIER_SHORT]
    rows += [(f"near, confirmed by {key.removeprefix('near_by_')}", v)
             for key, v in dedupe.items() if key.startswith("near_by_")]
    rows.append(("near: candidates rejected", dedupe.get("near_rejected")))
    rows = [(label, int(v)) for label, v in rows if isinstance(v, int | float)]
    if not rows:
        return []
    return [Figure(
        "Duplicates found by each dedupe tier, in the order the tiers run (a pair counts for the "
        "first tier that links it; byte-identical files are set aside at ingest), the rule that "
        "confirmed each near pair, and the near-duplicate candidates that verification "
        "rejected. Look for a tier far above what the corpus's provenance suggests (over-"
        "merging) or empty where copies are expected.",
        count_bars_png([r[0] for r in rows], [r[1] for r in rows], "files or pairs"))]


TIER_SHORT = {"note": "same notes", "transposed": "transposed or time-scaled",
              "melody": "same melody", "near": "near duplicates"}


def dedupe_examples(pairs: pd.DataFrame | None, notes_path: Path) -> list[Figure | Para]:
    """One example pair per dedupe tier, the most similar (ties: smallest sha256s), as
    side-by-side piano rolls of their first 32 beats."""
    if pairs is None or pairs.empty or not {"a", "b", "tier"} <= set(pairs.columns):
        return []
    sim = pairs["similarity"] if "similarity" in pairs.columns else 0.0
    ranked = pairs.assign(rank_sim=sim).sort_values(["tier", "rank_sim", "a", "b"],
                                               ascending=[True, False, True, True])
    examples = ranked.drop_duplicates("tier")
    wanted = sorted(set(examples["a"]) | set(examples["b"]))
    by_sha = read_notes(notes_path, wanted)
    if by_sha is None:
        return [Para(f"Example pairs of duplicates: data/notes.parquet {NA}.", "note")]
    out: list[Figure | Para] = []
    for row in examples.itertuples():
        if row.a not in by_sha or row.b not in by_sha:
            continue
        similarity = f", similarity {row.rank_sim:.2f}" if "similarity" in pairs.columns else ""
        out.append(Figure(
            f"Dedupe tier {row.tier} ({TIER_WORDS.get(row.tier, row.tier)}): the most similar "
            f"pair{similarity}, pieces {row.a[:12]} and {row.b[:12]}, first 32 beats. The two "
            "rolls should share their material as the tier says; a pair that looks unrelated "
            "would be a false link.",
            pair_rolls_png(by_sha[row.a], by_sha[row.b], (row.a[:12], row.b[:12]))))
    return out


def split_notes(splits: pd.DataFrame | None, manifest: pd.DataFrame | None) -> dict[str, int]:
    """split -> total notes of its pieces ({} without the tables or their columns)."""
    if splits is None or manifest is None or "n_notes" not in manifest.columns \
            or not {"split", "sha256"} <= set(splits.columns):
        return {}
    notes = manifest.drop_duplicates("sha256").set_index("sha256")["n_notes"]
    joined = splits.assign(n=splits["sha256"].map(notes).fillna(0))
    return {str(k): int(v) for k, v in joined.groupby("split")["n"].sum().items()}


def split_counts(splits: pd.DataFrame | None) -> dict[str, tuple[int, int]]:
    """split -> (pieces, groups) from data/splits.parquet ({} without it or its columns)."""
    if splits is None or not {"split", "sha256", "group_id"} <= set(splits.columns):
        return {}
    out = {}
    for s in sorted(splits["split"].astype(str).unique()):
        part = splits[splits["split"].astype(str) == s]
        out[s] = (len(part), int(part["group_id"].nunique()))
    return out


def render(doc: Document, ctx: ReportContext) -> None:
    d, reports, inputs = ctx.digits, ctx.reports, ctx.inputs
    doc.add(Heading("Data card"))
    manifest = read_table_or_none(inputs["manifest"])
    if manifest is None:
        not_available(doc, "data/manifest.parquet")
    else:
        reasons = count_rows(manifest[manifest["status"] == "quarantined"]
                          if "status" in manifest.columns else None, "reason")
        doc.add(Para(f"{len(manifest)} files found."),
                Table(["status", "files"], count_rows(manifest, "status")),
                Table(["quarantine reason", "files"], reasons) if reasons
                else Para("No file was quarantined.", "note"))
        lic = next((c for c in ("licence", "license", "licence_name") if c in manifest.columns),
                   None)
        if lic:
            doc.add(Table(["licence", "files"], count_rows(manifest, lic)))
        else:
            doc.add(Para("Licences: not given in the metadata.", "note"))
    pairs = read_table_or_none(inputs["pairs"])
    doc.add(Heading("Deduplication", 3),
            Table(["tier", "duplicate pairs"], count_rows(pairs, "tier")) if pairs is not None
            else Para(f"data/dedupe/pairs.parquet: {NA}.", "note"),
            *dedupe_tiers(reports.get("dedupe")))
    doc.add(*dedupe_examples(pairs, Path(inputs["notes"])),
            kv_block(reports.get("dedupe"), "dedupe", d))
    splits = read_table_or_none(inputs["splits"])
    counts = split_counts(splits)
    doc.add(Heading("Split", 3))
    if counts:
        notes = split_notes(splits, manifest)
        order = [s for s in ("train", "val", "test") if s in counts]
        order += sorted(set(counts) - set(order))
        doc.add(Table(["split", "pieces", "groups", "notes"],
                      [[s, str(counts[s][0]), str(counts[s][1]), fmt(notes.get(s))]
                       for s in order]))
        total = {k: sum(v[i] for v in counts.values()) for i, k in enumerate(("pieces",
                                                                              "groups"))}
        shares = {"pieces": [counts[s][0] / total["pieces"] for s in order],
                  "groups": [counts[s][1] / total["groups"] for s in order]}
        if notes and sum(notes.values()):
            shares["notes"] = [notes.get(s, 0) / sum(notes.values()) for s in order]
        doc.add(Figure("Share of pieces, groups and notes in each split. The three bars of a "
                       "split should be about equal: a split whose share of notes is far from "
                       "its share of pieces holds unusually long or short pieces, and one whose "
                       "share of groups is far from its share of pieces holds unusually large "
                       "or small groups.", grouped_bars_png(order, shares)))
    else:
        not_available(doc, "data/splits.parquet")
    doc.add(kv_block(reports.get("split"), "split", d), Heading("Leakage audit", 3))
    leak_png = Path(inputs["leakage_png"])
    if leak_png.is_file():
        doc.add(Figure("Similarity (exact shingle Jaccard) of each test piece to its nearest "
                       "neighbour, for this grouped split and for a random split of the same "
                       "pieces. Look at the right tail: test pieces close to a train piece are "
                       "leaks; a grouped split should have fewer there than the random one.",
                       leak_png.read_bytes(),
                       Path(os.path.relpath(leak_png, Path(inputs["md_out"]).parent))
                       .as_posix()))
    doc.add(kv_block(reports.get("leakage"), "leakage", d),
            Heading("Contamination against other corpora", 3),
            *contamination(reports.get("contamination"), Path(inputs["contamination_dir"]), d),
            Heading("Tokenisation", 3),
            *tokenisation_table(reports.get("tokenize"), d),
            kv_block(reports.get("tokenize"), "tokenize", d))


MAX_MATCHES_SHOWN = 10


def contamination(summary: Any, folder: Path, d: int) -> list[Table | Para]:
    """What ``symkit contamination`` found: per reference corpus its files, per held-out split
    the pieces with a match in any of them by strongest tier, and the first matches."""
    if not isinstance(summary, dict):
        return [Para(f"reports/contamination.json: {NA}.", "note")]
    refs = [r for r in summary.get("references") or [] if isinstance(r, dict)]
    if not refs:
        return [Para("No reference corpus declared: name one in contamination.against "
                     "(docs/contamination.md) to learn which held-out pieces also appear in "
                     "another corpus, such as a model's pretraining set.", "note")]
    def reasons(r: dict) -> str:
        why = ", ".join(f"{k} {v}" for k, v in (r.get("by_reason") or {}).items())
        return fmt((r.get("by_status") or {}).get("quarantined")) + (f" ({why})" if why else "")

    out: list[Table | Para] = [Para(
        "Each held-out piece was compared with every piece of these corpora by dedupe's tiers "
        "and rules (docs/contamination.md): a match means its music, or a near copy of it, also "
        "lies there, and a model trained on that corpus has seen it."), Table(
        ["reference corpus", "files", "ok", "quarantined", "byte duplicates",
         "its pieces matched"],
        [[str(r.get("reference")), fmt(r.get("files")),
          fmt((r.get("by_status") or {}).get("ok")), reasons(r),
          fmt((r.get("by_status") or {}).get("duplicate")), fmt(r.get("pieces_matched"))]
         for r in refs])]
    tiers = list(summary.get("tiers") or TIER_SHORT)
    by_split = summary.get("by_split") or {}
    order = [s for s in summary.get("splits") or by_split if s in by_split]
    out.append(Table(
        ["split", "pieces", "with a match", *(f"strongest: {t}" for t in tiers)],
        [[s, fmt(by_split[s].get("pieces")), fmt(by_split[s].get("in_reference")),
          *(fmt((by_split[s].get("by_tier") or {}).get(t)) for t in tiers)]
         for s in order if isinstance(by_split[s], dict)]))
    matches = read_table_or_none(folder / "matches.parquet")
    if matches is not None and len(matches):
        shown = matches.drop_duplicates("sha256").head(MAX_MATCHES_SHOWN)
        out.append(Table(
            ["split", "held-out piece", "tier (rule)", "similarity", "reference piece"],
            [[r.split, r.path, r.tier + (f" ({r.rule})" if isinstance(r.rule, str) else ""),
              fmt(r.alignment if r.tier == "near" and pd.notna(r.alignment) else r.similarity,
                  d),
              f"{r.reference}: {r.ref_path}"] for r in shown.itertuples()]))
        more = matches["sha256"].nunique() - len(shown)
        out.append(Para(
            f"Each held-out piece's strongest match{f' ({more} more pieces)' if more > 0 else ''};"
            " every match is in reports/contamination/matches.parquet. A near match's similarity "
            "is its alignment for the alignment rules and its shingle Jaccard otherwise.", "note"))
    return out


def tokenisation_table(tok: Any, d: int) -> list[Table]:
    """The tokenizer and what it did to the corpus, under human labels ([] without the
    report)."""
    if not isinstance(tok, dict):
        return []
    by_split = tok.get("tokens_by_split") if isinstance(tok.get("tokens_by_split"), dict) else {}
    pieces = tok.get("pieces_by_split") if isinstance(tok.get("pieces_by_split"), dict) else {}
    model = tok.get("model")
    rows = [["tokenizer", fmt(tok.get("tokenizer"))],
            ["trained vocabulary", f"{fmt(model)}, {fmt(tok.get('vocab_size'))} tokens "
             f"(base {fmt(tok.get('base_vocab_size'))}), learned on "
             f"{fmt(tok.get('model_trained_on_pieces'))} train pieces"
             if model and model != "none" else "none"],
            ["compression", f"{fmt(tok.get('compression'), d)} base tokens per token"],
            ["tokens per split", ", ".join(
                f"{s} {fmt(by_split[s])} ({fmt(pieces.get(s))} "
                f"piece{'' if pieces.get(s) == 1 else 's'})"
                for s in ("train", "val", "test") if s in by_split) or NA],
            ["round trip (notes back from tokens)",
             f"mean F1 {fmt(tok.get('roundtrip_f1_mean'), d)}, lowest "
             f"{fmt(tok.get('roundtrip_f1_min'), d)}; {fmt(tok.get('roundtrip_below_1'))} "
             f"pieces below 1, {fmt(tok.get('flagged_pieces'))} flagged"]]
    return [Table(["tokenisation", ""], rows)]
