"""``symkit sample`` (pipeline.tools.sample): its settings' ranges, prompts read from MIDI files,
and the samples it writes: each from its own seeded generator, prompts taken in turn, stale
files removed, every sample listed in samples.json.

The tiny model of tests/tools/test_score.py; conditions and the tokenizer check are tested in
tests/inference/test_standalone.py."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.core.artifacts import read_json
from pipeline.inference.sampling import SamplingParams
from pipeline.inference.standalone import InferenceError, encode_midi, open_model
from pipeline.tools import sample
from pipeline.tools.sample import check_settings, prompt_ids
from tests.tools.test_score import TinyModel, tiny_model

DEFAULTS = {"n": 4, "prompt_tokens": 64, "temperature": 1.0, "top_k": 0, "top_p": 0.95,
            "max_new_tokens": 128, "seed": 1234, "batch_size": 8, "torch_threads": 2}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyModel:
    return tiny_model(tmp_path_factory.mktemp("tiny"))


def _run(tiny: TinyModel, out, *, n: int = 3, prompts=(), seed: int = 5, **kw):
    inf = open_model(tiny.model, tiny.tokenizer)
    return sample.run(inf, inf.scorer(torch_threads=1), n=n, prompts=list(prompts),
                      conditions={}, guidance=1.0, params=SamplingParams(1.0, 0, 0.95),
                      max_new_tokens=kw.pop("max_new_tokens", 12), seed=seed,
                      batch_size=kw.pop("batch_size", 8), out_dir=out, settings={"seed": seed},
                      show_progress=False, **kw)


@pytest.mark.parametrize(("option", "value", "allowed"), [
    ("n", 0, ">= 1"), ("prompt_tokens", 0, ">= 1"), ("temperature", -0.5, ">= 0"),
    ("top_k", -1, ">= 0"), ("top_p", 0.0, "in (0, 1]"), ("top_p", 1.5, "in (0, 1]"),
    ("max_new_tokens", 0, ">= 1"), ("seed", -1, ">= 0"), ("batch_size", 0, ">= 1"),
    ("torch_threads", 0, ">= 1")])
def test_a_setting_out_of_range_is_refused_naming_the_option(option, value, allowed):
    check_settings(argparse.Namespace(**DEFAULTS))  # the defaults pass
    with pytest.raises(InferenceError) as e:
        check_settings(argparse.Namespace(**{**DEFAULTS, option: value}))
    assert str(e.value) == f"--{option.replace('_', '-')} {value}: must be {allowed}"


def test_a_prompt_is_the_first_ids_of_its_file_and_a_bad_one_is_refused(tiny, tmp_path):
    inf = open_model(tiny.model, tiny.tokenizer)
    (p,) = prompt_ids(inf, [tiny.midi["two"]], 6)
    want = encode_midi(inf.tokenizer, tiny.midi["two"].read_bytes())[0][1][:6]
    assert p["name"] == "two.mid" and p["ids"].dtype == np.int64
    assert p["ids"].tolist() == want.tolist()
    bad = tmp_path / "notes.mid"
    bad.write_text("not a MIDI file")
    with pytest.raises(InferenceError, match=rf"--prompt {bad.as_posix()}: cannot be a prompt: "
                                             r"not_midi \(starts with"):
        prompt_ids(inf, [tiny.midi["one"], bad], 6)


def test_samples_take_the_prompts_in_turn_and_list_everything(tiny, tmp_path):
    inf = open_model(tiny.model, tiny.tokenizer)
    prompts = prompt_ids(inf, [tiny.midi["one"], tiny.midi["three"]], 4)
    record = _run(tiny, tmp_path, n=3, prompts=prompts, max_new_tokens=10)
    assert read_json(tmp_path / "samples.json") == record
    assert record["settings"] == {"seed": 5} and record["model"]["seed"] == 1
    assert [p["name"] for p in record["prompts"]] == ["one.mid", "three.mid"]
    for s in record["samples"]:
        start = prompts[s["index"] % 2]["ids"].tolist()
        assert s["prompt"] == s["index"] % 2 and s["prompt_len"] == 4
        assert s["ids"][:4] == start and 4 < len(s["ids"]) <= 4 + 10
        assert s["ended_by_eos"] is (len(s["ids"]) - 4 < 10)
        assert s["conditions"] == {} and s["condition_ids"] == []
        assert (s["file"] is not None) is s["decode_ok"] is (s["decode_error"] is None)
    written = sorted(p.name for p in tmp_path.glob("sample-*.mid"))
    assert written == sorted(s["file"] for s in record["samples"] if s["file"])


def test_the_same_seed_gives_the_same_samples_and_old_files_are_removed(tiny, tmp_path):
    first = _run(tiny, tmp_path / "a", seed=9)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "sample-099.mid").write_bytes(b"from an earlier run")
    (tmp_path / "b" / "mine.mid").write_bytes(b"not a sample")
    again = _run(tiny, tmp_path / "b", seed=9)
    assert again == first
    assert not (tmp_path / "b" / "sample-099.mid").exists()
    assert (tmp_path / "b" / "mine.mid").is_file()  # not a sample's name: kept
    other = _run(tiny, tmp_path / "c", seed=10)
    assert [s["ids"] for s in other["samples"]] != [s["ids"] for s in first["samples"]]
    unprompted = first["samples"][0]
    assert unprompted["prompt"] is None and unprompted["prompt_len"] == 0


def test_the_command_writes_its_samples_and_says_where(tiny, tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["sample", "--model", str(tiny.model), "--tokenizer", str(tiny.tokenizer),
                 "--n", "2", "--max-new-tokens", "8", "--torch-threads", "1",
                 "--out", str(out)]) == 0
    record = read_json(out / "samples.json")
    written = sum(s["decode_ok"] for s in record["samples"])
    assert capsys.readouterr().out.strip() == (
        f"sample: 2 samples, {written} MIDI files in {out.as_posix()}/ (samples.json lists "
        "their ids, prompts, conditions and settings)")
    assert record["settings"] == {"n": 2, "seed": 1234, "temperature": 1.0, "top_k": 0,
                                  "top_p": 0.95, "max_new_tokens": 8, "prompt_tokens": 64,
                                  "guidance": 1.0, "conditions": {}, "batch_size": 8,
                                  "device": "cpu", "torch_threads": 1}
    assert main(["sample", "--model", str(tiny.model), "--n", "0", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == "symkit sample: --n 0: must be >= 1"
