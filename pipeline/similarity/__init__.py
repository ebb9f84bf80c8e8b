"""Which pieces are the same music: fingerprints, LSH, alignment, duplicates, leakage."""
