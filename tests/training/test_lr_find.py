"""pipeline.training.lr_find: the range test's schedule, smoothing and suggestion rule, and a
real test on a tiny model: it stops once the loss climbs back to an untrained model's, suggests
a learning rate below that point, and gives the same numbers twice."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.tokens.contract import TokenInfo
from pipeline.training import lr_find
from pipeline.training.data import load_corpus
from tests._transformer_data import tiny_config, write_token_data


def test_the_schedule_is_geometric_and_bad_ranges_are_refused():
    lrs = lr_find.schedule(1e-6, 1e-2, 5)
    assert lrs[0] == pytest.approx(1e-6) and lrs[-1] == pytest.approx(1e-2)
    assert np.allclose(lrs[1:] / lrs[:-1], 10.0)
    for bad in ((1e-2, 1e-6, 5), (0.0, 1.0, 5), (1e-6, 1.0, 1)):
        with pytest.raises(ValueError, match="0 < start < end"):
            lr_find.schedule(*bad)


def test_the_centred_median_has_no_lag_and_ignores_a_spike():
    falling = list(np.linspace(6.0, 2.0, 41))
    assert lr_find.smooth(falling)[20] == pytest.approx(falling[20])  # no trail
    spiky = [5.0] * 41
    spiky[20] = 50.0
    assert lr_find.smooth(spiky)[20] == 5.0


def test_the_suggestion_is_a_tenth_of_the_lowest_point():
    lrs = list(np.geomspace(1e-6, 1.0, 61))
    loss = [6.0 - 3.0 / (1 + math.exp(-(math.log10(x) + 3) * 3)) + (x > 0.1) * 10 * x
            for x in lrs]
    suggestion, steepest = lr_find.suggest(lrs, loss)
    best = lrs[int(np.argmin(loss))]
    assert suggestion == pytest.approx(best / 10)
    assert steepest == pytest.approx(1e-3, rel=0.3)  # the logistic's midpoint
    assert lr_find.suggest(lrs[:2], loss[:2]) == (None, None)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    paths = write_token_data(tmp_path_factory.mktemp("tokens"), n_pieces=30, mean_len=60)
    info = TokenInfo.read(paths["info"])
    return tiny_config(), info, load_corpus(paths["tokens"], info)


def test_a_range_test_on_a_tiny_model_stops_when_the_loss_blows_up(tiny):
    cfg, info, corpus = tiny
    test = lr_find.range_test(cfg, info, corpus, start=1e-5, end=30.0, steps=120)
    assert test.stopped == "diverged" and len(test.lrs) < 120
    start = float(np.median(test.losses[:28]))
    assert min(test.smoothed) < start - 0.1  # it learned before it blew up
    assert test.suggestion is not None and test.suggestion < test.lrs[-1] / 10
    assert test.steepest is not None and test.lrs[0] <= test.steepest <= test.lrs[-1]
    again = lr_find.range_test(cfg, info, corpus, start=1e-5, end=30.0, steps=120)
    assert again == test
