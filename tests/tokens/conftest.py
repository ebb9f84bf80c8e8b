"""Fixtures of the token tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def remi():
    import miditok

    return miditok.REMI(miditok.TokenizerConfig(use_programs=True))
