"""Deterministic PNG figures (matplotlib Agg): piano rolls and the report's plots.

Each function returns PNG bytes. ``metadata={"Software": None}`` drops the matplotlib version from
the file, fonts and DPI are fixed, and figures are closed after saving, so the same data gives the
same bytes on every run. Plot functions take plain arrays/tables and never read files.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

DPI = 80
MARKED = "#e07b24"
"""Colour of marked notes (a shared span) against the blue of the rest."""
_STYLE = {"font.family": "DejaVu Sans", "font.size": 9, "svg.hashsalt": "symkit",
          "path.simplify": False}


def png_bytes(fig) -> bytes:
    """Render and close ``fig``; no software tag or timestamp in the PNG."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _figure(w: float = 7.0, h: float = 3.0):
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(w, h), layout="constrained")
    return fig, ax


def piano_roll_png(notes: Mapping, title: str = "",
                   prompt: np.ndarray | None = None) -> bytes:
    """Piano roll of a notes table (``onset``/``duration`` in beats, ``pitch``). ``prompt``: a
    boolean per note, True for notes given to the model (a continuation's prompt): those are
    drawn grey, the rest blue, with a dashed line where the last prompt note starts and a
    legend."""
    onset = np.asarray(notes["onset"], dtype=float)
    duration = np.asarray(notes["duration"], dtype=float)
    pitch = np.asarray(notes["pitch"], dtype=float)
    given = (np.zeros(onset.size, dtype=bool) if prompt is None
             else np.asarray(prompt, dtype=bool))
    fig, ax = _figure(7.0, 2.6 if not given.any() else 3.0)
    if onset.size:
        for mask, colour, label in ((given, "#a0a7b0", "prompt (the test piece's opening)"),
                                    (~given, "#3b6ea5", "model" if given.any() else None)):
            if mask.any():
                ax.barh(pitch[mask], np.maximum(duration[mask], 0.05), left=onset[mask],
                        height=0.8, color=colour, edgecolor="none", label=label)
        if given.any():
            ax.axvline(float(onset[given].max()), color="#555", linewidth=0.8, linestyle="--")
            fig.legend(loc="outside lower center", frameon=False, ncols=2)
        ax.set_ylim(pitch.min() - 2, pitch.max() + 2)
        ax.set_xlim(0, max(float((onset + duration).max()), 1.0))
    else:
        ax.text(0.5, 0.5, "no notes", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("beats")
    ax.set_ylabel("pitch")
    if title:
        ax.set_title(title)
    return png_bytes(fig)


def pair_rolls_png(left: Mapping, right: Mapping, titles: tuple[str, str],
                   max_beats: float = 32.0,
                   ranges: tuple[tuple[float, float], tuple[float, float]] | None = None,
                   marked: tuple[np.ndarray, np.ndarray] | None = None,
                   marked_label: str = "") -> bytes:
    """Two piano rolls side by side on one pitch axis (notes tables as for
    :func:`piano_roll_png`), each cut to its first ``max_beats`` beats or to its own
    ``ranges`` (beats, from, to), so a pair's shared material shows at a glance. ``marked``: a
    boolean per note of each side, drawn orange (``marked_label`` in a legend), the rest blue."""
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(1, 2, figsize=(9.0, 2.6 if marked is None else 3.0),
                                 sharey=True, layout="constrained")
    spans = ranges or ((0.0, max_beats), (0.0, max_beats))
    masks = marked or (None, None)
    pitches = []
    for ax, notes, title, (lo, hi), mask in zip(axes, (left, right), titles, spans, masks,
                                                strict=True):
        onset = np.asarray(notes["onset"], dtype=float)
        duration = np.asarray(notes["duration"], dtype=float)
        pitch = np.asarray(notes["pitch"], dtype=float)
        hot = np.zeros(onset.size, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
        keep = (onset < hi) & (onset + np.maximum(duration, 0.05) > lo)
        onset, duration, pitch, hot = onset[keep], duration[keep], pitch[keep], hot[keep]
        for sel, colour in ((~hot, "#3b6ea5"), (hot, MARKED)):
            if sel.any():
                ax.barh(pitch[sel], np.maximum(np.minimum(duration[sel], hi - onset[sel]), 0.05),
                        left=onset[sel], height=0.8, color=colour, edgecolor="none")
        if onset.size:
            pitches.append(pitch)
        ax.set_xlim(lo, hi)
        ax.set_xlabel("beats")
        ax.set_title(title)
    axes[0].set_ylabel("pitch")
    if pitches:
        allp = np.concatenate(pitches)
        axes[0].set_ylim(allp.min() - 2, allp.max() + 2)
    if marked is not None and marked_label:
        fig.legend(handles=[Patch(color=MARKED, label=marked_label)],
                   loc="outside lower center", frameon=False)
    return png_bytes(fig)


def loss_curves_png(logs: Mapping[str, Mapping[str, np.ndarray]], ylabel: str,
                    reference: tuple[float, str] | None = None) -> bytes:
    """Training curves of several runs (e.g. training seeds): per run, the per-step training loss
    as a thin line and the validation loss as a line with markers, in the run's colour. Each log
    maps ``step``, ``train_loss`` and ``val_loss`` to arrays (NaN where not measured).
    ``reference``: ``(level, label)`` drawn as a dashed horizontal line (e.g. the n-gram's val
    loss). The y axis ends a little above the highest loss after the first tenth of training,
    so the end, where runs differ, fills the plot; the legend sits below the axes."""
    fig, ax = _figure(8.0, 3.6)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if reference is not None and np.isfinite(reference[0]):
        ax.axhline(reference[0], color="#444", linewidth=1.0, linestyle="--", label=reference[1])
    tops, bottoms = [], []
    for k, name in enumerate(sorted(logs)):
        log, colour = logs[name], colours[k % len(colours)]
        step = np.asarray(log["step"], dtype=float)
        late = step >= (np.nanmax(step) * 0.1 if step.size else 0.0)
        for col, style in (("train_loss", {"linewidth": 0.6, "alpha": 0.45}),
                           ("val_loss", {"linewidth": 1.4, "marker": "o", "markersize": 3})):
            if col not in log:
                continue
            y = np.asarray(log[col], dtype=float)
            ok = np.isfinite(y)
            if ok.any():
                label = f"{name} {col.removesuffix('_loss')}".strip()
                ax.plot(step[ok], y[ok], color=colour, label=label, **style)
                if (ok & late).any():
                    tops.append(float(y[ok & late].max()))
                    bottoms.append(float(y[ok & late].min()))
    if tops:
        lo, hi = min(bottoms), max(tops)
        if reference is not None and np.isfinite(reference[0]):
            lo, hi = min(lo, reference[0]), max(hi, reference[0])
        pad = 0.05 * (hi - lo) if hi > lo else 0.5
        ax.set_ylim(lo - pad, hi + pad)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if logs:
        fig.legend(loc="outside lower center", frameon=False, ncols=4)
    return png_bytes(fig)


def training_dynamics_png(logs: Mapping[str, Mapping[str, np.ndarray]]) -> bytes:
    """Beside the loss curves: per run (e.g. training seed), the gradient norm before clipping
    (left, log scale: a spike of ten times stands out at any level) and the learning rate
    (right), one colour per run. Each log maps ``step``, ``grad_norm`` and ``lr`` to arrays."""
    with plt.rc_context(_STYLE):
        fig, (left, right) = plt.subplots(1, 2, figsize=(8.0, 3.0), layout="constrained")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, name in enumerate(sorted(logs)):
        log, colour = logs[name], colours[k % len(colours)]
        step = np.asarray(log["step"], dtype=float)
        for ax, col, style in ((left, "grad_norm", {"linewidth": 0.6, "alpha": 0.6}),
                               (right, "lr", {"linewidth": 1.2})):
            y = np.asarray(log.get(col, np.full(step.shape, np.nan)), dtype=float)
            ok = np.isfinite(y) & (y > 0)
            if ok.any():
                ax.plot(step[ok], y[ok], color=colour, label=name or None, **style)
    left.set_yscale("log")
    left.set_ylabel("gradient norm (before clipping)")
    right.set_ylabel("learning rate")
    for ax in (left, right):
        ax.set_xlabel("step")
    if any(logs):
        fig.legend(*left.get_legend_handles_labels(), loc="outside lower center", frameon=False,
                   ncols=4)
    return png_bytes(fig)


def lr_range_png(lrs: np.ndarray, losses: np.ndarray, smoothed: np.ndarray,
                 marks: Mapping[str, float]) -> bytes:
    """A learning-rate range test: the loss of each step (thin) and its smoothed curve against
    the learning rate (log scale), with each of ``marks`` (label -> learning rate, e.g. the
    suggestion and the configured one) as a dashed vertical line."""
    fig, ax = _figure(7.0, 3.2)
    lrs = np.asarray(lrs, dtype=float)
    ax.plot(lrs, np.asarray(losses, dtype=float), linewidth=0.6, alpha=0.45, color="#1f77b4",
            label="loss of the step")
    ax.plot(lrs, np.asarray(smoothed, dtype=float), linewidth=1.6, color="#1f77b4",
            label="smoothed")
    styles = ("--", ":", "-.")
    for k, (label, lr) in enumerate(marks.items()):
        if lr is not None and np.isfinite(lr) and lr > 0:
            ax.axvline(lr, color="#444", linewidth=1.0, linestyle=styles[k % len(styles)],
                       label=f"{label}: {lr:.2g}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss, nats per token")
    finite = np.asarray(smoothed, dtype=float)
    finite = finite[np.isfinite(finite)]
    if finite.size:
        lo, hi = float(finite.min()), float(finite[0])
        ax.set_ylim(lo - 0.1 * (hi - lo + 0.1), hi + 0.5 * (hi - lo + 0.1))
    fig.legend(loc="outside lower center", frameon=False, ncols=4)
    return png_bytes(fig)


def histograms_png(groups: Mapping[str, np.ndarray], xlabel: str, title: str = "",
                   bins: int = 30) -> bytes:
    """Overlaid density histograms on shared bins, one per named group."""
    fig, ax = _figure()
    values = [np.asarray(v, dtype=float) for v in groups.values()]
    finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.array([])
    if finite.size:
        lo, hi = float(finite.min()), float(finite.max())
        edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
        for name in sorted(groups):
            v = np.asarray(groups[name], dtype=float)
            v = v[np.isfinite(v)]
            if v.size:
                ax.hist(v, bins=edges, density=True, histtype="step", linewidth=1.4,
                        label=f"{name} (n={v.size})")
        ax.legend(loc="best", frameon=False)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("density")
    if title:
        ax.set_title(title)
    return png_bytes(fig)


def grouped_bars_png(categories: Sequence[str], groups: Mapping[str, Sequence[float]],
                     title: str = "", reference: float | None = None) -> bytes:
    """Grouped bar chart: one bar per group within each category (NaN drawn as 0), with an
    optional horizontal reference line."""
    fig, ax = _figure(7.5, 3.2)
    names = sorted(groups)
    width = 0.8 / max(len(names), 1)
    x = np.arange(len(categories))
    for k, name in enumerate(names):
        y = np.nan_to_num(np.asarray(groups[name], dtype=float), nan=0.0)
        ax.bar(x + k * width - 0.4 + width / 2, y, width=width, label=name)
    if reference is not None:
        ax.axhline(reference, color="#444", linewidth=0.8, linestyle="--")
    ax.set_xticks(x, list(categories), rotation=20, ha="right")
    if names:
        ax.legend(loc="best", frameon=False)
    if title:
        ax.set_title(title)
    return png_bytes(fig)


def count_bars_png(labels: Sequence[str], counts: Sequence[int], xlabel: str) -> bytes:
    """Horizontal bars, first label on top, each with its count written beside it (a zero
    shows as "0", not as a missing bar)."""
    fig, ax = _figure(7.0, 0.45 * len(labels) + 0.9)
    y = np.arange(len(labels))[::-1]
    values = np.asarray(counts, dtype=float)
    ax.barh(y, values, height=0.6, color="#3b6ea5")
    top = max(float(values.max()) if values.size else 0.0, 1.0)
    for yi, v in zip(y, values, strict=True):
        ax.text(v + top * 0.01, yi, f"{int(v)}", va="center", fontsize=8)
    ax.set_yticks(y, list(labels))
    ax.set_xlim(0, top * 1.12)
    ax.set_xlabel(xlabel)
    return png_bytes(fig)


def band_png(names: Sequence[str], overlap: Sequence[float], band_low: Sequence[float],
             inside: Sequence[bool], title: str = "") -> bytes:
    """One horizontal bar per statistic: the samples' overlap with held-out human music, with
    the human band's lower end as a tick; a bar that ends left of its tick (outside the band) is
    drawn in orange, one inside in blue."""
    fig, ax = _figure(7.5, 1.2 + 0.42 * max(len(names), 1))
    y = np.arange(len(names))[::-1]
    colours = ["#2a7ab9" if ok else "#d9822b" for ok in inside]
    ax.barh(y, np.nan_to_num(np.asarray(overlap, dtype=float)), color=colours, height=0.6)
    ax.plot(np.asarray(band_low, dtype=float), y, "|", color="#222", markersize=16,
            markeredgewidth=2, label="lower end of the human band")
    ax.set_yticks(y, [n.replace("_", " ") for n in names])
    ax.set_xlim(0, 1)
    ax.set_xlabel("overlap of the samples' distribution with held-out human music (1 = same)")
    fig.legend(loc="outside lower center", frameon=False)
    if title:
        ax.set_title(title)
    return png_bytes(fig)

