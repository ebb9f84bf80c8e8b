"""``symkit check-params`` (pipeline.tools.check_params): every section of params.yaml validated
without running anything, the planned comparisons checked against the other sections."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main
from pipeline.core.config import ParamsError
from pipeline.tools import check_params
from tests.decision.test_registered_comparisons import RULE, SECTION, params_with


def test_every_section_is_validated_and_named(tmp_path: Path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text("report: {digits: 3}\ningest:\n  max_notes: 5\n")
    assert check_params.main(argparse.Namespace(params=params)) == 0
    assert capsys.readouterr().out == f"{params}: 2 sections valid (report, ingest)\n"
    params.write_text("report: {digits: 0}\n")
    with pytest.raises(ParamsError, match=r"report\.digits"):
        check_params.main(argparse.Namespace(params=params))
    assert capsys.readouterr().out == ""


def test_a_planned_comparison_is_checked_against_the_params_it_names(tmp_path: Path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(params_with(SECTION)))
    assert main(["check-params", "--params", str(params)]) == 0
    assert "compare" in capsys.readouterr().out
    typo = {**SECTION, "rules": [{**RULE, "baseline": {"tokenize.tokenzier": "REMI"},
                                  "arm": {"tokenize.tokenzier": "TSD"}}]}
    params.write_text(yaml.safe_dump(params_with(typo)))
    assert main(["check-params", "--params", str(params)]) == 2
    assert "'tokenize.tokenzier' is not a param" in capsys.readouterr().err


def test_unknown_section_is_refused(tmp_path: Path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text("ingset:\n  max_notes: 5\n")
    assert main(["check-params", "--params", str(params)]) == 2
    assert "unknown section 'ingset'" in capsys.readouterr().err


def test_shipped_params_are_valid(capsys):
    assert main(["check-params"]) == 0
