"""The ``symkit`` command line: help, per-command arguments, parameter errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.core.commands import commands


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in commands())


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


def test_workers_override_is_validated(tmp_path: Path, capsys):
    from pipeline.core.config import load_runtime

    params = tmp_path / "params.yaml"
    params.write_text("runtime:\n  workers: 1\n")
    assert load_runtime(params, "3").n_workers() == 3
    assert load_runtime(params, None).n_workers() == 1
    assert main(["ingest", "--params", str(params), "--workers", "0"]) == 2
    assert "--workers: runtime.workers = 0" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncate", "text", "missing"])
def test_an_unreadable_input_is_one_line_naming_its_stage(tmp_path: Path, monkeypatch, capsys,
                                                           damage: str):
    """A truncated manifest (e.g. a copy killed half-way outside symkit) is not a traceback."""
    import pyarrow as pa

    from pipeline.core.artifacts import write_parquet

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "dvc.yaml").write_text((root / "dvc.yaml").read_text())
    (tmp_path / "params.yaml").write_text((root / "params.yaml").read_text())
    manifest = tmp_path / "data" / "manifest.parquet"
    write_parquet(manifest, pa.table({"sha256": ["a" * 64] * 50, "status": ["ok"] * 50}))
    data = manifest.read_bytes()
    if damage == "truncate":
        manifest.write_bytes(data[: len(data) // 2])
    elif damage == "text":
        manifest.write_text("sha256,status\n")
    else:
        manifest.unlink()
    monkeypatch.chdir(tmp_path)
    assert main(["split"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    problem = "does not exist" if damage == "missing" else "is not a readable Parquet file"
    assert err == [f"symkit split: data/manifest.parquet {problem}: re-run `dvc repro ingest`"]

