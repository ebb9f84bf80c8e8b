"""The report's music statistics: each model's samples against held-out human test music, and
each judged model against the human band."""

from __future__ import annotations

import numpy as np

from pipeline.music.descriptors import STATS
from pipeline.render.document import Document, Figure, Heading, Table, fmt
from pipeline.render.figures import band_png, grouped_bars_png
from pipeline.report.context import ReportContext
from pipeline.report.sections.common import not_available


def render(doc: Document, ctx: ReportContext) -> None:
    d, audit = ctx.digits, ctx.reports.get("audit")
    doc.add(Heading("Music statistics"))
    block = (audit or {}).get("music") if isinstance(audit, dict) else None
    if not isinstance(block, dict) or not isinstance(block.get("test"), dict):
        not_available(doc, "music statistics in reports/audit.json")
        return
    names = sorted(k for k, v in block.items() if isinstance(v, dict) and k != "test"
                   and not k.endswith("_abs_diff"))
    stats = list(STATS)
    doc.add(Table(["statistic", "human test", *names],
                  [[s, fmt(block["test"].get(s), d), *[fmt(block[n].get(s), d) for n in names]]
                   for s in stats]))
    ratios = {}
    for n in names:
        ratios[n] = [(block[n].get(s) / block["test"][s])
                     if block[n].get(s) is not None and block["test"].get(s) else np.nan
                     for s in stats]
    if names:
        doc.add(Figure("Each music statistic of the samples, as a ratio to held-out human test "
                       "music (1 = the same on average; the dashed line). Bars far from 1 name "
                       "what the model gets wrong; the human band and which statistics fall "
                       "outside it are in the memorisation audit's quality table.",
                       grouped_bars_png(stats, ratios, reference=1.0)))
    judged = audit.get("judged") if isinstance(audit.get("judged"), dict) else {}
    for model in sorted(judged):
        q = (judged[model] or {}).get("quality") if isinstance(judged[model], dict) else None
        per_stat = (q or {}).get("stats") if isinstance(q, dict) else None
        if not isinstance(per_stat, dict) or not per_stat:
            continue
        order = sorted(per_stat)
        rows = [[s.replace("_", " "), fmt(per_stat[s].get("sample_mean"), d),
                 fmt(per_stat[s].get("human_mean"), d), fmt(per_stat[s].get("overlap"), d),
                 fmt(per_stat[s].get("band_low"), d),
                 "inside" if per_stat[s].get("inside") else "outside"] for s in order]
        doc.add(Heading(f"{model} against the human band", 3),
                Table(["statistic", "samples (mean)", "human (mean)", "overlap",
                       "band lower end", "verdict"], rows),
                Figure(f"How far each statistic of the {model}'s samples overlaps held-out "
                       "human music, against the lower end of the band that sets of human "
                       "windows themselves reach (the tick). An orange bar ending left of its "
                       "tick is a statistic outside the human band: there the samples are "
                       "unlike human music.",
                       band_png(order, [float(per_stat[s].get("overlap") or np.nan)
                                        for s in order],
                                [float(per_stat[s].get("band_low") or np.nan) for s in order],
                                [bool(per_stat[s].get("inside")) for s in order])))
