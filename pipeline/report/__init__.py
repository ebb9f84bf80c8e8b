"""The report: decision rules (``criteria``), the pre-registration record (``registration``),
documents and their Markdown/HTML rendering (``document``), sections and figures."""
