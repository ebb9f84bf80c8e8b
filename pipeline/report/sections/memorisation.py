"""The report's memorisation audit: flag thresholds, the audited groups' measures, flag rate,
extraction and membership per model and per training seed, and the longest shared runs."""

from __future__ import annotations

from pipeline.core.artifacts import read_table_or_none
from pipeline.render.document import Document, Figure, Heading, Para, Table, fmt
from pipeline.render.figures import histograms_png
from pipeline.report.context import ReportContext
from pipeline.report.sections.common import not_available


def render(doc: Document, ctx: ReportContext) -> None:
    d, audit, inputs = ctx.digits, ctx.reports.get("audit"), ctx.inputs
    doc.add(Heading("Memorisation audit"))
    if not isinstance(audit, dict):
        not_available(doc, "reports/audit.json")
        return
    doc.add(Para("Every measure is computed for generated samples and for held-out human pieces "
                 "against the training set; thresholds are calibrated on the val human pieces."))
    doc.add(Table(["flag threshold", "value"],
                  [[k, fmt(v, d)] for k, v in sorted((audit.get("thresholds") or {}).items())]))
    groups = {"human val": (audit.get("human") or {}).get("val") or {},
              "human test": (audit.get("human") or {}).get("test") or {}}
    for name, block in sorted((audit.get("samples") or {}).items()):
        if name != "all" and isinstance(block, dict):
            groups[f"samples {name}"] = block.get("all") or {}
    cols = ["n", "flag_rate", "lcs_tokens_median", "lcs_tokens_max", "lcs_bars_max",
            "novelty_tok_8_mean", "novelty_tok_16_mean", "novelty_int_8_mean", "nn_jaccard_mean",
            "decode_failures"]
    doc.add(Table(["group", *cols], [[g, *[fmt(b.get(c), d) for c in cols]]
                                     for g, b in groups.items()]))
    fr = audit.get("flag_rate") or {}
    doc.add(Para(f"Flag rate: samples {fmt(fr.get('samples'), d)} vs human test pieces "
                 f"{fmt(fr.get('human_test'), d)} (excess {fmt(fr.get('excess'), d)})."))
    ext = audit.get("extraction") or {}
    doc.add(Table(["model", "train exact", "test exact", "exact gap", "train token match",
                   "test token match"],
                  [[m, *[fmt(e.get(k), d) for k in ("train_exact", "test_exact", "exact_gap",
                                                    "train_token_match", "test_token_match")]]
                   for m, e in sorted(ext.items())]))
    mem = audit.get("membership") or {}
    doc.add(Table(["model", "membership AUC (0.5 = no signal)", "TPR at the FPR (chance = FPR)",
                   "FPR", "train pieces", "held-out pieces"],
                  [[m, fmt(e.get("auc"), d), fmt(e.get("tpr"), d), fmt(e.get("fpr"), d),
                    fmt(e.get("n_train")), fmt(e.get("n_heldout", e.get("n_test")))]
                   for m, e in sorted(mem.items())]))
    seed_rows = []
    for m, block in sorted((audit.get("judged") or {}).items()):
        per_seed = (block or {}).get("per_seed") or {}
        for seed, c in sorted(per_seed.items(), key=lambda x: int(x[0])):
            auc, ext = c.get("membership_auc") or {}, (c.get("extraction_rate") or {})
            excess = ext.get("excess") or {}
            flags = (c.get("flag_rate") or {}).get("excess") or {}
            seed_rows.append([m, seed, fmt(auc.get("value"), d),
                              f"{fmt(auc.get('ci_low'), d)} to {fmt(auc.get('ci_high'), d)}",
                              fmt((auc.get("tpr") or {}).get("value"), d),
                              fmt((ext.get("train") or {}).get("value"), d),
                              f"{fmt(excess.get('ci_low'), d)} to {fmt(excess.get('ci_high'), d)}",
                              f"{fmt(flags.get('ci_low'), d)} to {fmt(flags.get('ci_high'), d)}"])
    if seed_rows:
        doc.add(Para("Every training seed's own membership, extraction and copying (its own "
                     "samples against the same human windows), on the same pieces; the criteria "
                     "judge each guard on every seed alone, and one seed failing fails it:"),
                Table(["model", "seed", "membership AUC", "AUC CI", "TPR at the FPR",
                       "train exact", "extraction excess CI", "flag excess CI"], seed_rows))
    table = read_table_or_none(inputs["per_sample"])
    if table is not None and {"lcs_tokens", "model", "kind"} <= set(table.columns):
        hist = {"human test": table[(table["model"] == "human") & (table["kind"] == "test")]}
        for m in sorted(set(table["model"].astype(str)) - {"human"}):
            hist[f"samples {m}"] = table[table["model"] == m]
        doc.add(Figure("Longest run of tokens each sequence shares with any training piece: "
                       "samples of each model against windows of held-out human test pieces "
                       "(which never saw training). A sample distribution shifted right of the "
                       "human one means the model copies longer stretches than chance overlap "
                       "explains.",
                       histograms_png({k: v["lcs_tokens"].to_numpy(dtype=float)
                                       for k, v in hist.items()}, "tokens")))
