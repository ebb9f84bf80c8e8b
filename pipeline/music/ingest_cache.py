"""Ingest's per-file results kept between runs: a :class:`ResultCache` keyed by each file's
sha256 under ``<cache dir>/<cache_key>/``, so a later run parses only contents it has not seen
under the same limits and code (timeouts and crashes are never stored)."""

from __future__ import annotations

from importlib.metadata import version as package_version
from pathlib import Path

import numpy as np

from pipeline.core import artifacts
from pipeline.core.segments import SegmentStore
from pipeline.music.inspection import RESULTS_SCHEMA
from pipeline.music.manifest import IngestConfig

CACHE_FORMAT = 1
"""Bump when the cache's layout changes (the code's own bytes are part of the key anyway)."""
CACHE_SEGMENTS = 16
"""More segments than this are merged into one at the end of a run."""
CACHE_CODE = ("pipeline.music.inspection", "pipeline.music.manifest", "pipeline.music.parsing",
              "pipeline.core.arrays")
"""The modules whose code a cached result depends on (:func:`cache_key`)."""


def cache_key(cfg: IngestConfig) -> str:
    """What a file's result depends on besides its bytes: the limits inspect_many applies, the
    code that parses and judges (the bytes of the modules in ``CACHE_CODE``) and the parser's
    and numpy's versions. ``timeout_s`` is left out (a result that finished does not depend on it,
    and timeouts and crashes are never cached), and so is ``max_file_bytes`` (the parent applies
    it before a file is parsed)."""
    return artifacts.sha256_json({
        "format": CACHE_FORMAT,
        "code": artifacts.code_digest(CACHE_CODE),
        "symusic": package_version("symusic"),
        "numpy": np.__version__,
        "limits": cfg.model_dump(exclude={"timeout_s", "max_file_bytes"}),
    })[:20]


class ResultCache(SegmentStore):
    """Per-file results keyed by sha256 under ``root/<cache_key>/`` (a
    :class:`~pipeline.core.segments.SegmentStore`: one segment per run that parsed something,
    merged into one when there are more than CACHE_SEGMENTS)."""

    def __init__(self, root: Path, cfg: IngestConfig):
        super().__init__(Path(root) / cache_key(cfg), RESULTS_SCHEMA, "sha256", CACHE_SEGMENTS)
