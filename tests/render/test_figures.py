"""pipeline.render.figures: every plot is PNG bytes of a size fixed by its inputs, the same
bytes for the same data, no software tag, and no figure left open."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from pipeline.render import figures
from pipeline.render.figures import (
    DPI,
    band_png,
    count_bars_png,
    grouped_bars_png,
    histograms_png,
    loss_curves_png,
    pair_rolls_png,
    piano_roll_png,
)

NOTES = {"onset": [0.0, 1.0, 1.0, 2.5], "duration": [1.0, 0.5, 2.0, 1.5],
         "pitch": [60, 64, 67, 62]}
NO_NOTES = {"onset": [], "duration": [], "pitch": []}


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """(type, content) of each chunk of a PNG, after checking its signature."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    out, at = [], 8
    while at < len(data):
        n = int.from_bytes(data[at:at + 4], "big")
        out.append((data[at + 4:at + 8], data[at + 8:at + 8 + n]))
        at += 12 + n
    assert out[-1][0] == b"IEND"
    return out


def png_size(data: bytes) -> tuple[int, int]:
    (kind, ihdr), *_ = png_chunks(data)
    assert kind == b"IHDR"
    return int.from_bytes(ihdr[:4], "big"), int.from_bytes(ihdr[4:8], "big")


LOG = {"step": np.arange(1, 101), "train_loss": 3 + 5 / np.arange(1, 101),
       "val_loss": np.where(np.arange(1, 101) % 25 == 0, 3.2, np.nan)}
PLOTS = {
    "piano_roll": (lambda: piano_roll_png(NOTES, "a title"), (7.0, 2.6)),
    "piano_roll_prompt": (lambda: piano_roll_png(NOTES, prompt=[True, True, False, False]),
                          (7.0, 3.0)),
    "piano_roll_empty": (lambda: piano_roll_png(NO_NOTES), (7.0, 2.6)),
    "pair_rolls": (lambda: pair_rolls_png(NOTES, NO_NOTES, ("left", "right")), (9.0, 2.6)),
    "pair_rolls_marked": (lambda: pair_rolls_png(
        NOTES, NOTES, ("a", "b"), ranges=((0, 2), (1, 4)),
        marked=(np.array([1, 0, 0, 1], bool), np.zeros(4, bool)), marked_label="shared"),
        (9.0, 3.0)),
    "loss_curves": (lambda: loss_curves_png({"seed 1": LOG, "seed 2": LOG}, "nats",
                                            reference=(3.3, "n-gram")), (8.0, 3.6)),
    "histograms": (lambda: histograms_png({"a": np.arange(10.0), "b": [np.nan, 2.0]}, "x"),
                   (7.0, 3.0)),
    "histograms_empty": (lambda: histograms_png({"a": [np.nan]}, "x"), (7.0, 3.0)),
    "grouped_bars": (lambda: grouped_bars_png(["x", "y"], {"a": [1, np.nan], "b": [2, 3]},
                                              reference=1.5), (7.5, 3.2)),
    "count_bars": (lambda: count_bars_png(["one", "two", "three"], [3, 0, 7], "files"),
                   (7.0, 0.45 * 3 + 0.9)),
    "band": (lambda: band_png(["pitch_range", "ioi"], [0.8, 0.3], [0.5, 0.6], [True, False]),
             (7.5, 1.2 + 0.42 * 2)),
}


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_each_plot_is_a_png_of_its_size_with_no_software_tag(name):
    draw, (w, h) = PLOTS[name]
    data = draw()
    assert png_size(data) == (round(w * DPI), round(h * DPI))
    assert not [c for c in png_chunks(data) if c[0] in (b"tEXt", b"iTXt", b"zTXt", b"tIME")]
    assert data == draw()  # same data, same bytes
    assert plt.get_fignums() == []  # closed after saving


def test_different_data_draws_different_pixels():
    moved = {**NOTES, "pitch": [p + 5 for p in NOTES["pitch"]]}
    assert piano_roll_png(NOTES) != piano_roll_png(moved)
    assert count_bars_png(["a"], [1], "n") != count_bars_png(["a"], [2], "n")


def test_drawing_leaves_matplotlib_s_global_settings_alone():
    before = dict(plt.rcParams)
    piano_roll_png(NOTES)
    assert dict(plt.rcParams) == before
    assert figures._STYLE["font.family"] == "DejaVu Sans"
