"""The words and the document of ``symkit compare``: verdict sentences, the blocks of compare.md
and compare.html, and what its figures show.

Input is compare.json's content (built by :mod:`pipeline.tools.compare`, which also loads the
arms); for the figures, each arm's per-piece scores (:class:`pipeline.stats.paired.ArmScores`)
and validation-loss curves (:class:`Curves`). Everything here is pure: the same content gives the
same text and the same PNG bytes. matplotlib is imported only inside :func:`draw_figures` (by
:mod:`pipeline.render.compare_figures`), so the command's help and ``--no-figures`` never load it.

Not a stage dependency: no stage imports this module (``symkit check-deps`` would list it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pipeline.decision.registered_comparisons import level_words
from pipeline.render.document import (
    Details,
    Document,
    Figure,
    Heading,
    Para,
    Table,
    render_html,
    render_markdown,
    with_captions,
)
from pipeline.stats.paired import ArmScores, canonical

if TYPE_CHECKING:
    from pipeline.render.compare_figures import ForestRow

METRIC_NAMES = {"nats_per_note": "NLL per note", "nats_per_second": "NLL per second",
                "nats_per_token": "NLL per token"}
FIGURES_DIR = "figures"
"""Where the PNGs go, relative to compare.md (which links them there)."""


class Options(Protocol):
    """The command's options that the words use (:class:`pipeline.tools.compare.Settings`)."""

    split: str
    ci_level: float
    equivalence_margin: float

    @property
    def alpha(self) -> float: ...


# ---- words ----------------------------------------------------------------------------------
def _value(v: Any, limit: int = 40) -> str:
    """A parameter value as text, cut to ``limit`` characters in prose and tables (compare.json
    keeps it whole)."""
    text = v if isinstance(v, str) else canonical(v)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _side(row: dict[str, Any], side: str) -> str:
    """One side of a params-diff row as text (``(absent)`` where the key is missing)."""
    return "(absent)" if row["absent"] == side else _value(row[side])


def _change(row: dict[str, Any]) -> str:
    return f"{row['key']} {_side(row, 'baseline')} → {_side(row, 'arm')}"


def design_words(c: dict[str, Any]) -> str:
    """``controlled: one param differs (transformer.train.max_steps 400 → 800)``; for a
    confounded comparison the keys only (their values are in the table)."""
    diff = c["params_diff"]
    if not diff:
        text = "identical: no param differs"
    elif len(diff) == 1:
        text = f"controlled: one param differs ({_change(diff[0])})"
    else:
        text = f"confounded: {len(diff)} params differ ({', '.join(r['key'] for r in diff)})"
    if c["protocol_diff"]:
        text += f"; scoring protocol differs ({'; '.join(map(_change, c['protocol_diff']))})"
    return text


def _pct(x: float) -> str:
    return f"{abs(x) * 100:.1f}%"


def _interval_words(lo: float, hi: float) -> str:
    if lo >= 0:
        return f"{_pct(lo)}–{_pct(hi)} lower"
    if hi <= 0:
        return f"{_pct(hi)}–{_pct(lo)} higher"
    return f"{_pct(lo)} higher to {_pct(hi)} lower"


def _p_words(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"= {p:.2g}"


def finding(c: dict[str, Any], key: str, cfg: Options, *, n_comparisons: int) -> str:
    """What a comparison shows for one metric: the effect, its interval, p and the conclusion."""
    m, a, b = c["metrics"][key], c["baseline"], c["arm"]
    name, rel = METRIC_NAMES[key], m["rel_improvement"]
    if n_comparisons > 1:
        p_text = f"Holm p {_p_words(m['p_holm'])}, raw p {_p_words(m['p_value'])}"
    else:
        p_text = f"p {_p_words(m['p_value'])}"
    if m["diff"]["value"] == 0 and m["diff"]["ci_low"] == 0 and m["diff"]["ci_high"] == 0:
        head = f"{b}'s {name} equals {a}'s on every piece (difference 0, {p_text})"
    else:
        v = rel["value"]
        direction = "lower" if v > 0 else "higher" if v < 0 else "the same as"
        head = (f"{b}'s {name} is {_pct(v)} {direction} than {a}'s ({cfg.ci_level * 100:g}% CI "
                f"{_interval_words(rel['ci_low'], rel['ci_high'])}, {p_text})")
    alpha = f"alpha = {cfg.alpha:g}" + (" after Holm" if n_comparisons > 1 else "")
    margin = f"±{cfg.equivalence_margin * 100:g}%"
    return (f"{head}: " + (f"a real difference at {alpha}" if m["significant"]
                           else f"no difference shown at {alpha}")
            + (f", equivalent within {margin}" if m["equivalent"]
               else f", not shown equivalent within {margin}"))


def context(c: dict[str, Any], split: str) -> str:
    """On which pieces, groups and seeds a comparison stands, and its design."""
    a, b = c["baseline"], c["arm"]
    sa, sb = c["n_seeds_baseline"], c["n_seeds_arm"]
    if sa == sb:
        seeds = "" if sa == 1 else f", {sa} training seeds each" + (
            " (paired by seed)" if c["seed_pairing"] == "paired" else "")
    else:
        seeds = f", {a} {sa} training seed{'s' * (sa > 1)} and {b} {sb}"
    return (f"on {c['n_pieces']} {split} pieces in {c['n_groups']} groups{seeds}; "
            f"{design_words(c)}")


def verdict(c: dict[str, Any], key: str, cfg: Options, *, n_comparisons: int) -> str:
    """One self-contained sentence on a comparison's metric, in plain words."""
    return (f"{finding(c, key, cfg, n_comparisons=n_comparisons)}; "
            f"{context(c, cfg.split)}.")


def _ci(block: dict[str, Any], scale: float = 1.0, digits: int = 4) -> str:
    f = f"{{:.{digits}g}}"
    return (f"{f.format(block['value'] * scale)} [{f.format(block['ci_low'] * scale)}, "
            f"{f.format(block['ci_high'] * scale)}]")


# ---- what the figures show ------------------------------------------------------------------
@dataclass(frozen=True)
class Curves:
    """One arm's validation loss during training: label (``seed 1234``, or the file's name for a
    single log) -> ``(step, val_loss)``, only the steps where val loss was measured. ``notes``:
    logs left out and why; ``missing``: where logs were looked for, when there was none."""

    seeds: Mapping[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    missing: str | None = None


@dataclass(frozen=True)
class Drawn:
    """One figure: written to ``figures/<name>.png``; ``png`` None when it could not be drawn
    (``notes`` say why); ``notes`` also name arms or logs left out of a drawn figure."""

    name: str
    title: str
    caption: str
    png: bytes | None
    notes: tuple[str, ...] = ()


def piece_nll(s: ArmScores, col: str = "n_notes") -> np.ndarray:
    """(n,) per-piece NLL per ``col`` unit (notes by default), averaged over the training seeds
    (as in eval.json); NaN where a piece has no units."""
    den = s.units[col]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, s.nll.mean(axis=0) / np.where(den > 0, den, 1.0), np.nan)


def seed_effects(a: ArmScores, b: ArmScores, *, paired: bool,
                 col: str = "n_notes") -> list[float]:
    """Each of B's training seeds' own relative improvement over A, as ratios of sums over the
    pieces (both arms scored the same pieces). ``paired`` (both arms list the same seeds): seed
    ``s`` of B against seed ``s`` of A, ``(A_s − B_s) / A_s``; otherwise B's seed ``s`` against A
    averaged over its seeds, ``(A − B_s) / A``, whose mean over B's seeds is the comparison's
    point estimate. Empty when B has one seed."""
    if b.n_seeds < 2:
        return []
    rate_a = a.nll.sum(axis=1) / a.units[col].sum()  # (S_a,)
    rate_b = b.nll.sum(axis=1) / b.units[col].sum()  # (S_b,)
    base = rate_a if paired else np.full(len(rate_b), rate_a.mean())
    return [float(x) for x in (base - rate_b) / base]


def forest_rows(result: Mapping[str, Any],
                effects: Mapping[str, Sequence[float]]) -> list[ForestRow]:
    """One row per comparison, in order: the relative improvement of NLL per note with its
    interval, and each of the arm's training seeds' own effect (:func:`seed_effects`). Loads
    matplotlib, as drawing them does (the row type lives with the figure)."""
    from pipeline.render.compare_figures import ForestRow

    rows = []
    for c in result["comparisons"]:
        rel = c["metrics"]["nats_per_note"]["rel_improvement"]
        rows.append(ForestRow(c["arm"], c["design"], rel["value"], rel["ci_low"],
                              rel["ci_high"], tuple(effects.get(c["arm"], ()))))
    return rows


def scatter_panels(result: Mapping[str, Any]) -> list[str]:
    """Arms drawn against the baseline: every other arm when there are at most 4 arms, else the
    first other arm only."""
    others = [a["label"] for a in result["arms"][1:]]
    return others if len(result["arms"]) <= 4 else others[:1]


def draw_figures(result: Mapping[str, Any], scores: Mapping[str, ArmScores],
                 curves: Mapping[str, Curves], cfg: Options) -> list[Drawn]:
    """The forest plot, the learning curves and the per-piece scatter, as :class:`Drawn`.

    ``scores``: arm label -> its scores of the compared model on the split (pieces sorted by
    sha256, the same pieces in every arm, as the comparison checked); ``curves``: arm label ->
    its validation-loss curves. Imports matplotlib (through
    :mod:`pipeline.render.compare_figures`)."""
    from pipeline.render import compare_figures as draw

    base, comps = result["baseline"], result["comparisons"]
    effects = {c["arm"]: seed_effects(scores[base], scores[c["arm"]],
                                      paired=c["seed_pairing"] == "paired") for c in comps}
    pairing = {c["seed_pairing"] == "paired" for c in comps if effects[c["arm"]]}
    seeds_text = ("" if not pairing else
            "; diamonds: each training seed of the arm against " + (
                "the same seed of the baseline" if pairing == {True} else
                "the baseline averaged over its seeds" if pairing == {False} else
                "the same seed of the baseline where both list the same seeds, else against "
                "the baseline averaged over its seeds"))
    margin = cfg.equivalence_margin * 100
    forest = Drawn(
        "forest", "Relative improvement over the baseline",
        f"Relative improvement (A − B)/A of NLL per note of each arm (B) over {base} (A), with "
        f"{cfg.ci_level * 100:g}% intervals{seeds_text}. Right of 0 the arm is better; an "
        f"interval that crosses 0 shows no difference, one inside the dashed ±{margin:g}% lines "
        "shows equivalence.",
        draw.forest_png(forest_rows(result, effects), margin=margin,
                        level=cfg.ci_level * 100))
    return [forest, _learning_curves(result, curves, draw), _scatter(result, scores, draw)]


def _learning_curves(result: Mapping[str, Any], curves: Mapping[str, Curves],
                     draw: ModuleType) -> Drawn:
    """Val loss against step for every arm with training logs; the others are named in notes.
    The logs (``reports/plots/train_log``) are the transformer's: not drawn for another model."""
    title = "Learning curves"
    if result["model"] != "transformer":
        return Drawn("learning_curves", title, "", None, (
            f"Not drawn: the training logs are the transformer's, not {result['model']}'s.",))
    labels = [a["label"] for a in result["arms"]]
    got = {label: curves.get(label, Curves(missing="not read")) for label in labels}
    notes = [f"{label}: {n}" for label in labels for n in got[label].notes]
    missing = [label for label in labels if got[label].missing]
    where = " or ".join(sorted({got[label].missing or "" for label in missing}))
    if missing:
        notes.append(f"No training logs ({where}) in {', '.join(missing)}: not drawn." if
                     len(missing) < len(labels) else f"No arm has training logs ({where}).")
    shown = [(k, label, got[label].seeds) for k, label in enumerate(labels) if got[label].seeds]
    if not shown:
        return Drawn("learning_curves", title, "", None, tuple(notes))
    drawn = {label for _, label, _ in shown}
    if len({a["tokenizer_hash"] for a in result["arms"] if a["label"] in drawn}) > 1:
        notes.append("The arms use different tokenizers: their losses per token are not "
                     "comparable, only the curves' shapes are.")
    return Drawn(
        "learning_curves", title,
        "Validation loss (nats per token) against training step, one colour per arm (thin: "
        "each training seed, thick: their mean). Look for a curve still falling at its last "
        "step (more steps would help) or turning up (overfitting), and for seeds that spread "
        "as wide as the arms do.", draw.curves_png(shown), tuple(notes))


def _scatter(result: Mapping[str, Any], scores: Mapping[str, ArmScores],
             draw: ModuleType) -> Drawn:
    """The baseline's per-piece NLL per note against each drawn arm's (:func:`scatter_panels`)."""
    base, panels = result["baseline"], scatter_panels(result)
    n_others = len(result["arms"]) - 1
    return Drawn(
        "scatter", "Per-piece NLL",
        f"NLL per note of each {result['split']} piece, averaged over training seeds: {base} "
        f"(x) against {'the arm' if len(panels) == 1 else 'each arm'} (y). Points below the "
        "diagonal are pieces where the arm is better: a cloud shifted below is a gain shared "
        "by most pieces, a few far points a gain carried by a few pieces.",
        draw.scatter_png(base, piece_nll(scores[base]),
                         [(label, piece_nll(scores[label])) for label in panels]),
        () if len(panels) == n_others else
        (f"{n_others} arms besides the baseline: only the first, {panels[0]}, is drawn.",))


# ---- the document ---------------------------------------------------------------------------
def build_document(result: dict[str, Any], cfg: Options,
                   figures: Sequence[Drawn] | None = None) -> Document:
    """compare.md / compare.html's blocks from compare.json's content; a Figures section when
    ``figures`` is given (None: drawn with ``--no-figures``, no section)."""
    split, model, level = result["split"], result["model"], result["settings"]["ci_level"]
    doc = Document(f"symkit compare: {model} on {split}")
    arms = result["arms"]
    doc.add(Para(f"{len(arms) - 1} arm{'s' * (len(arms) > 2)} compared with the baseline "
                 f"{result['baseline']} on the {split} pieces both scored; NLL in nats, lower is "
                 f"better; intervals are {level * 100:g}% bootstrap intervals over groups and "
                 "training seeds."))
    doc.add(*(Para(w, kind="warn") for w in result["warnings"]))
    reg = result.get("registered") or {}
    doc.add(*registered_blocks(reg, result["settings"]["ci_level"]))
    by_rule = {e["rule"]: e for e in reg.get("rules") or []}
    for c in result["comparisons"]:
        doc.add(Heading(f"{c['arm']} against {c['baseline']}"))
        here = context(c, split)
        doc.add(Para(here[0].upper() + here[1:] + "."))
        rules = c.get("registered_rules") or []
        doc.add(Para("Registered: " + "; ".join(
            f"{r} ({by_rule[r]['status']})" for r in rules) + "." if rules else
            "NOT REGISTERED: no registered rule covers this comparison; read it as "
            "exploratory.", kind="note"))
        doc.add(*(Para(finding(c, k, cfg, n_comparisons=len(result["comparisons"])) + ".")
                  for k in c["metrics"]))
        doc.add(*(Para(f"{METRIC_NAMES[k]} not compared: {why}", kind="note")
                  for k, why in c["omitted_metrics"].items()))
    if figures is not None:
        doc.add(Heading("Figures"))
        for d in figures:
            doc.add(Heading(d.title, 3))
            doc.add(*(Para(n, kind="note") for n in d.notes))
            if d.png is not None:
                doc.add(Figure(d.caption, d.png, f"{FIGURES_DIR}/{d.name}.png"))
    doc.add(Heading("Arms"),
            Table(["arm", "source", "commit", "split hash", "tokenizer hash", "seeds", "pieces"],
                  [[a["label"], a["source"], (a["commit"] or "")[:12], a["split_hash"][:12],
                    str(a["tokenizer_hash"] or "")[:12],
                    ", ".join(map(str, a["seeds"])) or "none", str(a["n_pieces"])]
                   for a in arms]))
    rows = [[c["arm"], c["design"], r["key"], _side(r, "baseline"), _side(r, "arm")]
            for c in result["comparisons"] for r in c["params_diff"] + c["protocol_diff"]]
    doc.add(Heading("What differs from the baseline"),
            Para("params.yaml keys, flattened, with the runtime, report, criteria and compare "
                 "sections left out (they never change scores), then the scoring protocol's "
                 "transformer_stride and bootstrap settings from eval.json; long values are "
                 "cut here and whole in compare.json.", kind="note"),
            Table(["arm", "design", "key", "baseline", "arm value"], rows) if rows
            else Para("No parameter or protocol setting differs from the baseline."))
    doc.add(Heading("Method"), Para(
        f"Each comparison pairs the baseline (A) and the arm (B) on the same pieces. Replicate "
        f"b of {result['settings']['n_boot']} draws the groups with replacement, then each "
        "arm's training seeds (one draw for both when the arms list the same seeds); NLL per "
        "note, second or token is a ratio of sums over the drawn groups of the NLL averaged "
        "over the drawn seeds. The relative improvement (A − B) / A is formed inside each "
        "replicate. p is the two-sided bootstrap p-value of A − B "
        f"({result['settings']['p_value']}); with several arms, Holm's correction per metric. "
        f"Equivalent: the whole relative-improvement interval lies within "
        f"±{result['settings']['equivalence_margin'] * 100:g}%. See docs/compare.md.",
        kind="note"))
    doc.add(Heading("Statistics"), Details(
        "Every statistic: each metric's values, difference, relative improvement, p-values and "
        "the median piece's effect, with intervals (compare.json holds them unrounded)",
        [Table(["arm", "metric", "baseline", "arm value", "A − B", "relative improvement %",
                "p", "Holm p", "significant", "equivalent", "median piece effect %"],
               [[c["arm"], k, _ci(m["baseline"]), _ci(m["arm"]), _ci(m["diff"], digits=3),
                 _ci(m["rel_improvement"], 100, 3), f"{m['p_value']:.3g}",
                 f"{m['p_holm']:.3g}", str(m["significant"]).lower(),
                 str(m["equivalent"]).lower(), f"{c['median_piece_effect'] * 100:.3g}"]
                for c in result["comparisons"] for k, m in c["metrics"].items()])]))
    return doc


def registered_blocks(reg: Mapping[str, Any], ci_level: float) -> list[Any]:
    """The "Registered comparisons" section: each registered rule's verdict on these arms, with
    one sentence of evidence and any deviation; rules these arms do not cover, and why."""
    out: list[Any] = [Heading("Registered comparisons")]
    if not reg.get("registered"):
        out.append(Para((reg.get("note") or "No comparison was registered.") + " Every "
                        "comparison below is exploratory (NOT REGISTERED).", kind="note"))
        return out
    judged, not_run = reg.get("rules") or [], reg.get("not_run") or []
    counts = ", ".join(f"{k} {v}" for k, v in (reg.get("counts") or {}).items())
    out.append(Para(
        f"The rules registered in {reg['source']}'s reports/preregistration_compare.json "
        f"({str(reg['hash'])[:12]}), judged with the registered settings on "
        f"{level_words(reg, ci_level)}" + (f": {counts}." if counts else ".")
        + " A rule applies to a pair of arms whose params hold its baseline and arm values "
        "and agree on every other param; DEVIATED names what was not followed."))
    rows = [[e["rule"], f"{e['baseline']} → {e['arm']}", e["status"],
             e["evidence"] + (" Deviations: " + "; ".join(e["deviations"]) + "."
                              if e["deviations"] else "")] for e in judged]
    rows += [[e["rule"], "", "NOT RUN", e["reason"]] for e in not_run]
    out.append(Table(["rule", "baseline → arm", "verdict", "evidence"], rows))
    return out


def render(doc: Document) -> tuple[str, str]:
    """(compare.md, compare.html). In Markdown a figure's caption is also a line under the image
    (an image's alt text is not shown where the image loads); HTML has it as the figcaption."""
    return render_markdown(Document(doc.title, with_captions(doc.blocks))), render_html(doc)
