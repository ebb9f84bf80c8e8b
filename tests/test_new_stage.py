"""CONTRIBUTING.md's recipe for a new stage, followed on a copy of the repository: three edits
(the stage module, its params section, its dvc.yaml stage), then ``symkit check-deps --write``.
Nothing else is registered anywhere: the command, the section and the code deps are found."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]

STAGE = '''"""Stage ``toy``: count the ok pieces of the manifest, times a scale."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from pipeline.core import artifacts
from pipeline.core.config import StageConfig, load_section

HELP = "count the ok pieces of the manifest (a toy stage)"


class ToyConfig(StageConfig):
    """``toy`` section of params.yaml."""

    SECTION: ClassVar[str] = "toy"
    scale: int = Field(1, ge=1)


def run(cfg: ToyConfig, *, manifest: Path, out: Path) -> int:
    table = artifacts.read_parquet(manifest, ["status"])
    n = int((table["status"] == "ok").sum()) * cfg.scale
    artifacts.write_json(out, {"pieces": n})
    return n


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--manifest", type=Path, default=Path("data/manifest.parquet"))
    parser.add_argument("--out", type=Path, default=Path("reports/toy.json"))


def main(args: argparse.Namespace) -> int:
    run(load_section("toy", args.params, ToyConfig), manifest=args.manifest, out=args.out)
    return 0
'''

DVC_STAGE = """
  toy:
    cmd: symkit toy
    deps:
      - data/manifest.parquet
    params:
      - toy
    outs:
      - reports/toy.json
"""


def symkit(root: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *argv], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_stage_added_in_three_edits_runs_and_passes_every_check(tmp_path: Path) -> None:
    for d in ("pipeline", "models"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "params.yaml", "dvc.yaml", "experiments/adaptation/dvc.yaml",
              "experiments/adaptation/params.yaml"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f, tmp_path / f)
    # edit 1: the stage module
    (tmp_path / "pipeline" / "stages" / "toy.py").write_text(STAGE, encoding="utf-8")
    # edit 2: its params section
    params = tmp_path / "params.yaml"
    params.write_text(params.read_text(encoding="utf-8") + "\ntoy:\n  scale: 2  # a toy\n",
                      encoding="utf-8")
    # edit 3: its dvc.yaml stage, after the stage whose output it reads
    dvc = tmp_path / "dvc.yaml"
    text = dvc.read_text(encoding="utf-8")
    stages, sep, rest = text.partition("\nplots:\n")
    dvc.write_text(stages.rstrip("\n") + "\n" + DVC_STAGE + sep + rest, encoding="utf-8")

    wrote = symkit(tmp_path, "check-deps", "--write")
    assert wrote.returncode == 0, wrote.stdout + wrote.stderr
    assert "wrote dvc.yaml" in wrote.stdout and "0 problem(s)" in wrote.stdout
    assert "      - pipeline/stages/toy.py\n" in dvc.read_text(encoding="utf-8")
    assert symkit(tmp_path, "check-params").returncode == 0
    assert "toy" in symkit(tmp_path, "--help").stdout

    manifest = tmp_path / "data" / "manifest.parquet"
    manifest.parent.mkdir()
    pd.DataFrame({"sha256": ["a", "b", "c"], "status": ["ok", "ok", "empty"]}).to_parquet(manifest)
    ran = symkit(tmp_path, "toy")
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "reports" / "toy.json").read_text(encoding="utf-8").strip() in (
        '{"pieces": 4}', '{\n  "pieces": 4\n}')

    params.write_text(params.read_text(encoding="utf-8").replace("scale: 2", "scale: 0"),
                      encoding="utf-8")
    bad = symkit(tmp_path, "toy")
    assert bad.returncode == 2 and "toy.scale" in bad.stderr

    lint = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout
