"""The figures of ``symkit compare`` as deterministic PNG bytes: forest plot, learning curves,
per-piece scatter.

Imported only when figures are drawn (:func:`pipeline.report.compare_document.draw_figures`): this
module
loads matplotlib. It reuses :mod:`pipeline.render.figures`' settings and PNG writer (Agg, fixed
font and DPI, no software tag, figure closed after saving), and draws everything inside one
``rc_context`` so no global matplotlib state leaks in: the same data gives the same bytes.
Functions take plain arrays and never read files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

from pipeline.render.figures import _STYLE, png_bytes

STYLE = {**_STYLE, "font.size": 11}
"""figures.py's settings, two points larger: compare.html shows these figures at their natural
size, beside 16 px body text."""
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
"""Arm ``k`` (0 = baseline) is drawn in ``COLOURS[k % 10]`` (matplotlib's tab10)."""
BETTER, WORSE = "#2a7ab9", "#d9822b"


@dataclass(frozen=True)
class ForestRow:
    """One row of a forest plot: a relative improvement (a fraction) with its interval, and each
    training seed's own effect (the comparison's arm against its baseline, or the report's
    transformer against the n-gram)."""

    arm: str
    design: str
    value: float
    ci_low: float
    ci_high: float
    seeds: tuple[float, ...] = ()


def _pct(x: float) -> str:
    return f"{x:+.1f}%"


def short(label: str, limit: int = 24) -> str:
    """An arm's label cut to its last ``limit`` characters (a folder's path ends in its name),
    so one long label cannot squeeze the plot; the document names arms whole."""
    return label if len(label) <= limit else "…" + label[-(limit - 1):]


def forest_png(rows: Sequence[ForestRow], *, margin: float | None, level: float,
               threshold: float | None = None, threshold_label: str = "",
               xlabel: str = "relative improvement (A − B) / A of NLL per note, % (right: arm "
                             "better)") -> bytes:
    """One row per comparison, top to bottom in order: the relative improvement (in %) as a dot
    with its interval as a bar, each training seed's effect as a small hollow diamond just below,
    a line at 0, dashed lines at ± ``margin`` (in %, None: none) and a dotted line at a rule's
    ``threshold`` (in %, None: none). The value and interval are written at the right of each
    row."""
    n = len(rows)
    y = np.arange(n)[::-1].astype(float)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(9.5, 1.7 + 0.7 * n), layout="constrained")
        ax.axvline(0.0, color="#333", linewidth=1.0)
        if margin:
            for m in (-margin, margin):
                ax.axvline(m, color="#777", linewidth=0.9, linestyle="--")
        if threshold is not None:
            ax.axvline(threshold, color="#b03a2e", linewidth=1.2, linestyle=":")
        xs = [0.0, *((-margin, margin) if margin else ()),
              *(() if threshold is None else (threshold,))]
        for yi, r in zip(y, rows, strict=True):
            lo, v, hi = r.ci_low * 100, r.value * 100, r.ci_high * 100
            ax.plot([lo, hi], [yi, yi], color="#1f4e79", linewidth=2.2, solid_capstyle="butt")
            ax.plot([v], [yi], "o", color="#1f4e79", markersize=7)
            seeds = np.asarray(r.seeds, dtype=float) * 100
            if seeds.size:
                ax.plot(seeds, np.full(seeds.size, yi - 0.22), "D", markersize=4,
                        markerfacecolor="white", markeredgecolor="#c0504d", markeredgewidth=1.1)
            xs += [lo, hi, v, *seeds.tolist()]
        finite = [x for x in xs if np.isfinite(x)]
        lo_x, hi_x = min(finite), max(finite)
        pad = 0.08 * (hi_x - lo_x) if hi_x > lo_x else 1.0
        ax.set_xlim(lo_x - pad, hi_x + pad)
        ax.set_ylim(-0.7, n - 0.4)
        ax.set_yticks(y, [f"{short(r.arm)}\n{r.design}" for r in rows])
        ax.set_xlabel(xlabel)
        right = ax.twinx()
        right.set_ylim(ax.get_ylim())
        right.set_yticks(y, [f"{_pct(r.value * 100)} [{_pct(r.ci_low * 100)}, "
                             f"{_pct(r.ci_high * 100)}]" for r in rows])
        right.tick_params(length=0)
        handles = [Line2D([], [], color="#1f4e79", marker="o", linewidth=2.2,
                          label=f"estimate, {level:g}% interval")]
        if any(r.seeds for r in rows):
            handles.append(Line2D([], [], linestyle="none", marker="D", markersize=4,
                                  markerfacecolor="white", markeredgecolor="#c0504d",
                                  label="one training seed"))
        if margin:
            handles.append(Line2D([], [], color="#777", linestyle="--",
                                  label=f"equivalence margin ±{margin:g}%"))
        if threshold is not None:
            handles.append(Line2D([], [], color="#b03a2e", linestyle=":",
                                  label=threshold_label or f"threshold {threshold:g}%"))
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles),
                   frameon=False)
        return png_bytes(fig)


def _mean_curve(seeds: Mapping[str, tuple[np.ndarray, np.ndarray]]
                ) -> tuple[np.ndarray, np.ndarray]:
    """The mean val loss over the seeds at the steps every seed measured (steps sorted)."""
    curves = list(seeds.values())
    common = curves[0][0]
    for step, _ in curves[1:]:
        common = np.intersect1d(common, step)
    values = [np.interp(common, step, val) for step, val in curves]  # exact: common steps
    return common, np.mean(values, axis=0)


def curves_png(arms: Sequence[tuple[int, str, Mapping[str, tuple[np.ndarray, np.ndarray]]]]
               ) -> bytes:
    """Val loss against step; ``arms``: ``(k, label, seed -> (step, val_loss))`` with ``k`` the
    arm's position (its colour). An arm with several seeds: each seed thin, the mean over the
    seeds (at the steps all of them measured) thick; with one, that curve thick. The y axis
    starts at the lowest loss and ends a little above the highest loss after the first fifth of
    training, so the end of training, where arms differ, fills the plot (earlier points are cut
    off at the top)."""
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(9.5, 4.6), layout="constrained")
        lows, tails = [], []
        for k, _, seeds in arms:  # thin lines first, under every arm's thick one
            for step, val in seeds.values():
                if len(seeds) > 1:
                    ax.plot(step, val, color=COLOURS[k % len(COLOURS)], linewidth=0.9,
                            alpha=0.5)
                lows.append(float(np.min(val)))
                late = val[step >= 0.2 * float(np.max(step))]
                tails.append(float(np.max(late if late.size else val)))
        for k, label, seeds in arms:
            if len(seeds) > 1:
                step, val = _mean_curve(seeds)
                name = f"{short(label)}: mean of {len(seeds)} seeds"
            else:
                only = next(iter(seeds))
                step, val = seeds[only]
                name = f"{short(label)}: {only if only.startswith('seed') else '1 run'}"
            ax.plot(step, val, color=COLOURS[k % len(COLOURS)], linewidth=2.2, marker="o",
                    markersize=3.5, label=name)
        lo, hi = min(lows), max(tails)
        pad = 0.06 * (hi - lo) if hi > lo else 0.1
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xlabel("training step")
        ax.set_ylabel("val loss (nats per token)")
        ax.grid(True, color="#e5e5e5", linewidth=0.6)
        ax.legend(loc="upper right", frameon=False)
        return png_bytes(fig)


def scatter_png(baseline: str, x: np.ndarray, panels: Sequence[tuple[str, np.ndarray]]) -> bytes:
    """One panel per ``(arm, y)``: per-piece NLL per note, the baseline's ``x`` against the
    arm's ``y`` (same pieces, same order), the diagonal, and the points below it (the arm
    better) in blue, above it in orange; every panel on the same square axes."""
    k = max(len(panels), 1)
    values = np.concatenate([x, *(y for _, y in panels)])
    values = values[np.isfinite(values)]
    lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
    pad = 0.04 * (hi - lo) if hi > lo else 0.5
    lim = (lo - pad, hi + pad)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, k, figsize=(4.4 * k + 0.4, 4.8), layout="constrained",
                                 squeeze=False)
        for ax, (label, y) in zip(axes[0], panels, strict=False):
            ok = np.isfinite(x) & np.isfinite(y)
            below = ok & (y < x)
            above = ok & ~below
            ax.plot(lim, lim, color="#555", linewidth=0.9)
            ax.scatter(x[above], y[above], s=20, color=WORSE, label="arm worse or equal",
                       edgecolors="none")
            ax.scatter(x[below], y[below], s=20, color=BETTER, label="arm better",
                       edgecolors="none")
            ax.set_xlim(lim)
            ax.set_ylim(lim)
            ax.set_aspect("equal")
            ax.set_xlabel(f"{short(baseline)} (nats per note)")
            ax.set_ylabel(f"{short(label)} (nats per note)")
            ax.set_title(f"{short(label, 16)}: better on {int(below.sum())} of {int(ok.sum())} "
                         "pieces")
        axes[0][0].legend(loc="upper left", frameon=False, fontsize="small")
        return png_bytes(fig)
