"""Fixtures of the token tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def remi():
    import miditok

    return miditok.REMI(miditok.TokenizerConfig(use_programs=True))


@pytest.fixture(scope="session")
def kept_fixtures(midi_fixtures, midi_expected) -> list:
    """Paths of the committed MIDI fixtures that ingest keeps, sorted by name."""
    return [p for p in sorted(midi_fixtures.glob("*.mid"))
            if midi_expected["files"][p.name]["expect"] == "ok"]


@pytest.fixture(scope="session")
def base_encodings(kept_fixtures) -> dict:
    """sha256 -> base encoding (transposition 0) of each kept fixture under the project's
    tokenizer (REMI, programs in one stream), as the tokenize stage stores it."""
    from pipeline.core.artifacts import sha256_file
    from pipeline.tokens.encoding import encode_file
    from pipeline.tokens.tokenizer import make_tokenizer

    tok = make_tokenizer("REMI", {"use_programs": True})
    return {sha: encode_file(tok, p, sha, (0,))[0]
            for sha, p in sorted((sha256_file(p), p) for p in kept_fixtures)}
