"""Trained models at work: the scoring protocol, loading, sampling, per-piece scores."""
