"""pipeline.render.compare_figures: the forest plot, learning curves and per-piece scatter of
``symkit compare``, as PNG bytes of a size fixed by their inputs, the same for the same data."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from pipeline.render import figures
from pipeline.render.compare_figures import (
    COLOURS,
    STYLE,
    ForestRow,
    curves_png,
    forest_png,
    scatter_png,
    short,
)
from tests.render.test_figures import png_chunks, png_size

DPI = figures.DPI
ROWS = [ForestRow("runs/a-long-folder-name/of-an-arm", "controlled", 0.02, 0.005, 0.035,
                  (0.01, 0.03)),
        ForestRow("b", "confounded", -0.01, -0.03, 0.01)]


def curve(final: float, steps=(50, 100, 150, 200)) -> tuple[np.ndarray, np.ndarray]:
    step = np.array(steps)
    return step, final + 3.0 / np.sqrt(step)


def test_short_keeps_a_label_s_end():
    assert short("runs/b") == "runs/b"
    cut = short("experiments/adaptation/arms/full-finetune")
    assert len(cut) == 24 and cut == "…" + "experiments/adaptation/arms/full-finetune"[-23:]
    assert short("abcdef", limit=4) == "…def"


def test_the_style_is_figures_two_points_larger():
    assert STYLE == {**figures._STYLE, "font.size": 11}
    assert len(COLOURS) == 10 and len(set(COLOURS)) == 10


@pytest.mark.parametrize("n", [1, 2, 4])
def test_the_forest_grows_one_row_per_comparison(n):
    rows = (ROWS * 2)[:n]
    data = forest_png(rows, margin=0.5, level=95, threshold=1.0, threshold_label="rule")
    assert png_size(data) == (round(9.5 * DPI), round((1.7 + 0.7 * n) * DPI))
    assert data == forest_png(rows, margin=0.5, level=95, threshold=1.0, threshold_label="rule")
    assert plt.get_fignums() == []


def test_the_forest_draws_what_it_is_given():
    plain = forest_png(ROWS, margin=None, level=95)
    assert plain != forest_png(ROWS, margin=0.5, level=95)
    assert plain != forest_png(ROWS, margin=None, level=95, threshold=2.0)
    moved = [ForestRow("b", "confounded", 0.01, -0.03, 0.04), *ROWS[1:]]
    assert plain != forest_png(moved, margin=None, level=95)
    # an interval the bootstrap could not give (NaN) does not stop the plot
    forest_png([ForestRow("c", "identical", 0.0, float("nan"), float("nan"))], margin=None,
               level=90)


def test_learning_curves_one_arm_or_several_seeds():
    arms = [(0, "base", {"seed 1": curve(3.9), "seed 2": curve(3.95, (50, 100, 150))}),
            (1, "runs/b", {"train_log.tsv": curve(3.8)})]
    data = curves_png(arms)
    assert png_size(data) == (round(9.5 * DPI), round(4.6 * DPI))
    assert data == curves_png(arms)
    assert data != curves_png([arms[0], (1, "runs/b", {"train_log.tsv": curve(3.7)})])
    assert not [c for c in png_chunks(data) if c[0] == b"tEXt"]
    assert plt.get_fignums() == []


@pytest.mark.parametrize("k", [1, 3])
def test_the_scatter_has_one_square_panel_per_arm(k):
    rng = np.random.default_rng(0)
    x = rng.normal(4.0, 0.3, 40)
    panels = [(f"arm{i}", x * (1 - 0.01 * i) + rng.normal(0, 0.05, 40)) for i in range(k)]
    panels[0][1][3] = np.nan  # a piece an arm could not score is left out, not drawn at 0
    data = scatter_png("base", x, panels)
    assert png_size(data) == (round((4.4 * k + 0.4) * DPI), round(4.8 * DPI))
    assert data == scatter_png("base", x, panels)
    assert plt.get_fignums() == []
