"""The ``symkit`` command line: help, per-command arguments, parameter errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_command_help_shows_its_own_paths(capsys):
    with pytest.raises(SystemExit):
        main(["ingest", "--help"])
    out = capsys.readouterr().out
    assert "--manifest" in out and "--params" in out


def test_bad_params_exit_2_naming_the_key(tmp_path: Path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text("ingest:\n  max_notes: '100'\n")
    assert main(["ingest", "--params", str(params)]) == 2
    err = capsys.readouterr().err
    assert "ingest.max_notes = '100'" in err


def test_unknown_section_is_refused(tmp_path: Path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text("ingset:\n  max_notes: 5\n")
    assert main(["check-params", "--params", str(params)]) == 2
    assert "unknown section 'ingset'" in capsys.readouterr().err


def test_shipped_params_are_valid(capsys):
    assert main(["check-params"]) == 0
