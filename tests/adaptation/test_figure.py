"""The adaptation report's figure: a deterministic PNG of the arms' gain against trainable
parameters and their forgetting against the bound."""

from __future__ import annotations

import io

import matplotlib.image
import numpy as np

from pipeline.adaptation.figure import adaptation_png


def _iv(v: float, half: float = 0.01) -> dict[str, float]:
    return {"value": v, "ci_low": v - half, "ci_high": v + half}


def _measures(trainable: dict[str, int]) -> dict[str, dict]:
    gains = {"zero_shot": 0.05, "scratch": None, "full": 0.12, "lora": 0.10}
    return {n: {"params_trainable": trainable[n],
                "vs_scratch": None if gains[n] is None else {"test": _iv(gains[n])},
                "forgetting": None if n == "zero_shot" else _iv(0.1)}
            for n in gains}


def _decision(chosen: str | None) -> dict:
    return {"smallest_adequate": chosen, "pretraining_helps": {"threshold": 0.02},
            "forgetting_bound_nats_per_note": 0.2}


def _pixels(png: bytes) -> np.ndarray:
    return matplotlib.image.imread(io.BytesIO(png), format="png")


TRAINABLE = {"zero_shot": 0, "scratch": 1000, "full": 1000, "lora": 20}


def test_the_figure_is_a_deterministic_png():
    a = adaptation_png(_measures(TRAINABLE), _decision("lora"))
    assert a[:8] == b"\x89PNG\r\n\x1a\n"
    assert adaptation_png(_measures(TRAINABLE), _decision("lora")) == a
    height, width, _ = _pixels(a).shape
    assert width > height > 100


def test_the_chosen_arm_and_the_values_show_in_the_image():
    lora, full, none = (_pixels(adaptation_png(_measures(TRAINABLE), _decision(c)))
                        for c in ("lora", "full", None))
    assert lora.shape == full.shape == none.shape
    assert not np.array_equal(lora, full) and not np.array_equal(lora, none)


def test_no_trainable_parameters_anywhere_still_draws():
    png = adaptation_png(_measures(dict.fromkeys(TRAINABLE, 0)), _decision(None))
    assert png[:4] == b"\x89PNG"
