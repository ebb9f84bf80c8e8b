"""What every section of the report reads (pipeline.report.context): the ``report`` section of
params.yaml and the frozen ``ReportContext``; and the contract every section keeps on it: on a
context built from nothing, each renders without raising and says what is not available.

:func:`make_context` and :func:`rendered` are the helpers the section tests share."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.config import ParamsError, parse_section
from pipeline.render.document import NA, Document, Heading, render_markdown
from pipeline.report.context import ReportConfig, ReportContext, Section
from pipeline.stages.report import SECTIONS, STAGE_REPORTS, ReportPaths


def make_context(root: Path, *, reports: Mapping[str, Any] | None = None,
                 params: Mapping[str, Any] | None = None,
                 metrics: Mapping[str, Any] | None = None, registered: Any = None,
                 env: Mapping[str, Any] | None = None, **cfg: Any) -> ReportContext:
    """A context as the report stage builds it, every input path under ``root`` (where nothing
    exists unless a test writes it), every stage report missing unless given in ``reports``."""
    return ReportContext(ReportConfig(**cfg), params or {},
                         {**dict.fromkeys(STAGE_REPORTS), **(reports or {})}, metrics or {},
                         {f.name: root / f.default for f in fields(ReportPaths)}, registered,
                         env or {})


def rendered(section: Section, ctx: ReportContext) -> str:
    """The Markdown of one section rendered alone."""
    doc = Document("t")
    section(doc, ctx)
    return render_markdown(doc)


def test_the_report_section_defaults_and_refusals_name_the_key():
    cfg = parse_section("report", None, ReportConfig)
    assert (cfg.title, cfg.max_samples_shown, cfg.nll_unit, cfg.nll_split, cfg.digits) == (
        "symkit experiment report", 8, "note", "test", 4)
    for raw, key in (({"nll_unit": "bar"}, "report.nll_unit"), ({"digits": 0}, "report.digits"),
                     ({"title": ""}, "report.title"), ({"digits": "4"}, "report.digits"),
                     ({"colour": "red"}, "colour")):
        with pytest.raises(ParamsError, match=key.replace(".", r"\.")):
            parse_section("report", raw, ReportConfig)


def test_the_context_is_frozen_and_gives_the_configured_digits(tmp_path):
    ctx = make_context(tmp_path, digits=6)
    assert ctx.digits == 6 == ctx.cfg.digits
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.metrics = {}  # type: ignore[misc]
    assert set(ctx.inputs) == {f.name for f in fields(ReportPaths)}


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.__module__.rsplit(".", 1)[-1])
def test_every_section_renders_a_context_of_nothing_and_says_what_is_missing(tmp_path, section):
    ctx = make_context(tmp_path)
    doc = Document("t")
    section(doc, ctx)
    assert list(tmp_path.iterdir()) == []  # a section writes nothing
    if section.__module__.endswith(".conditioning"):
        assert doc.blocks == []  # shown only for a conditioned model
        return
    assert isinstance(doc.blocks[0], Heading)
    assert NA in render_markdown(doc)
