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


def test_workers_override_is_validated(tmp_path: Path, capsys):
    from pipeline.config import load_runtime

    params = tmp_path / "params.yaml"
    params.write_text("runtime:\n  workers: 1\n")
    assert load_runtime(params, "3").n_workers() == 3
    assert load_runtime(params, None).n_workers() == 1
    assert main(["ingest", "--params", str(params), "--workers", "0"]) == 2
    assert "--workers: runtime.workers = 0" in capsys.readouterr().err
