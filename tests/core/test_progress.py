"""pipeline.core.progress: bars on stderr only, shown on a terminal by default, never on stdout."""

from __future__ import annotations

import io
import sys

import pytest

from pipeline.core.progress import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_shown_bar_writes_to_stderr_only(capsys):
    with progress(3, desc="ingest", enabled=True) as bar:
        bar.update(3)
    out, err = capsys.readouterr()
    assert out == ""
    assert "ingest" in err and "3/3" in err


def test_a_hidden_bar_writes_nothing(capsys):
    with progress(3, desc="ingest", enabled=False) as bar:
        assert bar.disable
        bar.update(3)
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "file"])
def test_auto_shows_the_bar_only_on_a_terminal(monkeypatch, tty: bool):
    stream = Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    with progress(2, desc="split", enabled="auto") as bar:
        assert bar.disable is not tty
        bar.update(2)
    assert ("2/2" in stream.getvalue()) is tty
