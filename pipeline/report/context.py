"""What every section of the report is given: the ``report`` section of params.yaml and one frozen
:class:`ReportContext`, built once by the report stage.

A section is a function ``render(doc, ctx) -> None`` (:data:`Section`) that appends its blocks to
``doc`` and reads nothing but ``ctx``: it degrades to "not available" when an input is missing
and never raises on a missing key or column. ``pipeline/report/sections/`` holds one module per
section; the report stage lists them in reading order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from pipeline.core.config import StageConfig
from pipeline.render.document import Document


class ReportConfig(StageConfig):
    """``report`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "report"

    title: str = Field("symkit experiment report", min_length=1)
    max_samples_shown: int = Field(8, ge=0, le=1000)
    nll_unit: Literal["note", "token", "second"] = "note"
    nll_split: Literal["val", "test"] = "test"
    digits: int = Field(4, ge=1, le=12)


@dataclass(frozen=True)
class ReportContext:
    """Everything a section reads."""

    cfg: ReportConfig
    params: Mapping[str, Any]
    """params.yaml as read (every section)."""
    reports: Mapping[str, Any]
    """Stage report stem (``eval``, ``audit``, ...) -> its JSON as read (None when missing or
    unreadable)."""
    metrics: Mapping[str, Any]
    """The flat metrics written to reports/metrics.json, the decision's keys included."""
    inputs: Mapping[str, Path]
    """Every path of the report stage by name (its ``ReportPaths`` fields: ``per_piece``,
    ``samples_dir``, ``md_out``, ...)."""
    registered: Any
    """reports/preregistration.json as read (None without it)."""
    env: Mapping[str, Any]
    """The environment sidecar reports/report.env.json as read ({} without it)."""

    @property
    def digits(self) -> int:
        """Significant digits of numbers in tables (``report.digits``)."""
        return self.cfg.digits


Section = Callable[[Document, ReportContext], None]
"""One section of the report: appends its blocks to the document."""
