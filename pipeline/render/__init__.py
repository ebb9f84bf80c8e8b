"""Deterministic drawing and documents: Markdown/HTML blocks, PNG figures, FLAC audio."""
