"""The adaptation report's figure: target gain against trainable parameters, and retention.

Left: each arm's relative NLL-per-note gain over ``scratch`` on target test, with its interval,
against its trainable parameters (log scale; ``zero_shot`` trains none and sits at the left
edge). Right: each arm's forgetting on source val with its interval, and the bound no chosen arm
may exceed. Deterministic PNG bytes (:func:`pipeline.render.figures.png_bytes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from pipeline.render.figures import _STYLE, png_bytes

_CHOSEN, _OTHER, _BOUND = "#1f4e79", "#8a8a8a", "#b03a2e"


def adaptation_png(measures: Mapping[str, Mapping[str, Any]], decision: Mapping[str, Any]
                   ) -> bytes:
    names = list(measures)
    chosen = decision.get("smallest_adequate")
    trainable = np.array([max(int(measures[n]["params_trainable"]), 0) for n in names], float)
    positive = trainable[trainable > 0]
    floor = float(positive.min()) / 4 if positive.size else 1.0
    x = np.where(trainable > 0, trainable, floor)
    with plt.rc_context(_STYLE):
        fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 4.0), layout="constrained",
                                          gridspec_kw={"width_ratios": [1.4, 1.0]})
        for i, n in enumerate(names):
            gain = measures[n]["vs_scratch"]
            colour = _CHOSEN if n == chosen else _OTHER
            if gain is None:  # scratch itself: the zero line
                continue
            g = gain["test"]
            left.errorbar([x[i]], [100 * g["value"]],
                          yerr=[[100 * (g["value"] - g["ci_low"])],
                                [100 * (g["ci_high"] - g["value"])]],
                          fmt="o", color=colour, capsize=3, markersize=6)
            left.annotate(n + (" (chosen)" if n == chosen else ""), (x[i], 100 * g["value"]),
                          textcoords="offset points", xytext=(6, 4), fontsize=8, color=colour)
        left.axhline(0.0, color="#444", linewidth=0.8)
        threshold = decision["pretraining_helps"]["threshold"]
        left.axhline(100 * threshold, color=_BOUND, linestyle=":", linewidth=1.0,
                     label=f"min_gain {100 * threshold:g}%")
        left.set_xscale("log")
        left.set_xlim(floor / 2, float(x.max()) * 3)
        left.set_xlabel("trainable parameters (log; zero_shot: none, drawn at the left)")
        left.set_ylabel("gain over scratch on target test (% NLL per note)")
        left.grid(True, color="#e5e5e5", linewidth=0.6)
        left.legend(loc="lower right", frameon=False)

        rows = [n for n in names if measures[n]["forgetting"] is not None]
        y = np.arange(len(rows))
        for j, n in enumerate(rows):
            f = measures[n]["forgetting"]
            colour = _CHOSEN if n == chosen else _OTHER
            right.errorbar([f["value"]], [j], xerr=[[f["value"] - f["ci_low"]],
                                                    [f["ci_high"] - f["value"]]],
                           fmt="o", color=colour, capsize=3, markersize=6)
        bound = decision["forgetting_bound_nats_per_note"]
        right.axvline(bound, color=_BOUND, linestyle="--", linewidth=1.0,
                      label=f"bound {bound:.3f}")
        right.axvline(0.0, color="#444", linewidth=0.8)
        right.set_yticks(y, rows)
        right.invert_yaxis()
        right.set_xlabel("forgetting: source val NLL per note − zero_shot's (nats)")
        right.grid(True, axis="x", color="#e5e5e5", linewidth=0.6)
        right.legend(loc="lower right", frameon=False)
        return png_bytes(fig)
