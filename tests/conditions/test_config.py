"""The ``condition`` section (pipeline.conditions.config): the bands of each banded condition,
the names reserved for other jobs, and errors that say what was wrong and what is allowed."""

from __future__ import annotations

import itertools
import re

import pytest

from pipeline.conditions.config import (
    BUILTIN,
    IDENTITY_COLUMNS,
    MANIFEST_FACTS,
    MEASURED,
    ConditionConfig,
)
from pipeline.conditions.vocab import NONE_LABEL
from pipeline.core.config import ParamsError, parse_section


def cfg(**raw) -> ConditionConfig:
    return parse_section("condition", raw, ConditionConfig)


def test_bands_pair_each_conditions_edges_with_its_labels():
    c = cfg(density_edges=[1.0], density_labels=["sparse", "dense"],
            tempo_edges=[60.0, 100.0, 160.0], tempo_labels=["a", "b", "c", "d"])
    assert c.bands("density") == ([1.0], ["sparse", "dense"])
    assert c.bands("tempo") == ([60.0, 100.0, 160.0], ["a", "b", "c", "d"])
    assert c.bands("polyphony") == ([1.5, 3.5], ["mono", "few", "full"])  # the default
    assert cfg(use=["mode", "meter", "tempo", "collection"]).use == [
        "mode", "meter", "tempo", "collection"]


def test_the_reserved_names_are_disjoint():
    groups = {"builtin": BUILTIN, "identity": IDENTITY_COLUMNS, "facts": MANIFEST_FACTS,
              "measured": MEASURED}
    for (a, x), (b, y) in itertools.combinations(groups.items(), 2):
        assert not set(x) & set(y), (a, b)


@pytest.mark.parametrize(("raw", "message"), [
    ({"density_labels": ["a", "b"]},
     "2 labels for the 2 density_edges [2.0, 4.5]: needs 3 (one band below the first edge"),
    ({"tempo_edges": [100.0], "tempo_labels": ["slow", "moderate", "fast"]},
     "3 labels for the 1 tempo_edges [100.0]: needs 2"),
    ({"tempo_labels": ["slow", NONE_LABEL, "fast"]},
     f"labels must be distinct, not empty and not {NONE_LABEL!r}"),
    ({"polyphony_labels": ["mono", " ", "full"]}, "labels must be distinct, not empty"),
    ({"density_labels": ["low", "low", "high"]}, "labels must be distinct"),
    ({"density_edges": [2.0, 2.0]}, "edges must be strictly ascending"),
    ({"use": ["duration_s"]}, "'duration_s' is not a condition; allowed: key, mode, meter, "
                              "density, polyphony, tempo, or a metadata column of the manifest"),
    ({"use": ["tempo_qpm"]}, "'tempo_qpm' is not a condition"),
    ({"use": [" "]}, "' ' is not a condition"),
    ({"use": ["density", "meter", "density"]}, "names a condition twice"),
    ({"use": ["fold"]}, "'fold' is refused: its label identifies the piece's group"),
], ids=lambda v: "-".join(v) if isinstance(v, dict) else None)
def test_refusals_say_what_is_wrong(raw, message):
    with pytest.raises(ParamsError, match=re.escape(message)):
        cfg(**raw)
