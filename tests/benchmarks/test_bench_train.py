"""The training benchmark's tokenizer comparison (``--tokenizers``): the arms it accepts, the
chorale tables each arm trains on, and the figures it derives from one timed round."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import bench_train as bench

ROOT = Path(__file__).resolve().parents[2]


def test_arms_are_distinct_known_names_first_the_baseline():
    assert bench.arm_names("REMI, Octuple") == ["REMI", "Octuple"]
    assert bench.arm_names(bench.DEFAULT_ARMS)[0] == "REMI"
    assert {"REMI", "Octuple"} <= set(bench.arm_names(bench.DEFAULT_ARMS))
    for bad in ("REMI,Octupel", "REMI,REMI", "Octuple", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="REMI, REMI\\+BPE, CPWord, Octuple"):
            bench.arm_names(bad)


@pytest.mark.parametrize(("flags", "named"), [
    (["--tokenizers", "REMI,MIDILike"], "--tokenizers"),
    (["--tokenizers", "--pack"], "--pack"),
    (["--tokenizers", "--pieces", "5"], "--pieces 5"),
])
def test_bad_options_are_refused_naming_the_flag(flags, named):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_train.py"), *flags],
                         capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 2
    assert named in run.stderr


@pytest.fixture(scope="module")
def arms(tmp_path_factory) -> list[bench.Arm]:
    root = tmp_path_factory.mktemp("chorales")
    assert bench.write_chorales(root, 10) == 9
    return [bench.tokenize_arm(root, name) for name in ("REMI", "Octuple")]


def test_each_arm_tokenises_the_same_chorales(arms):
    remi, octuple = arms
    assert not remi.info.compound and octuple.info.compound
    assert len(remi.corpus.train) == len(octuple.corpus.train) == 9  # one sequence per piece
    assert all(e.ndim == 1 for e in remi.corpus.train)
    assert all(e.shape[1] == len(octuple.info.codebooks) for e in octuple.corpus.train)
    # an Octuple step is one note; REMI spends several tokens on one
    assert octuple.tokens_per_note == 1.0
    assert remi.tokens_per_note > 2
    steps = sum(len(e) - 2 for e in octuple.corpus.train)  # less each piece's BOS and EOS
    tokens = sum(len(e) - 2 for e in remi.corpus.train)
    assert tokens / steps == pytest.approx(remi.tokens_per_note)


def test_figures_of_a_round(arms):
    args = argparse.Namespace(device="cpu", precision="fp32", steps=4, repeats=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the default model, kept quick
    try:
        res = bench.compare(args, arms)
    finally:
        torch.set_num_threads(threads)
    remi, octuple = res["REMI"], res["Octuple"]
    assert remi["tokens_ratio"] == remi["notes_ratio"] == remi["tokens_ratio_cpu"] == 1.0
    for arm in arms:
        r = res[arm.name]
        assert r["notes_per_s"] == pytest.approx(r["tokens_per_s"] / arm.tokens_per_note)
        assert 0 <= r["padded_share"] < 1
    # tokens/s counts trained targets: a padded position is not a token
    assert octuple["tokens_per_s"] == pytest.approx(
        octuple["steps_per_s"] * 4 * 256 * (1 - octuple["padded_share"]))
    assert octuple["notes_ratio"] == pytest.approx(
        octuple["tokens_ratio"] * arms[0].tokens_per_note / arms[1].tokens_per_note)
    assert np.isfinite(list(octuple.values())).all()
