"""The report's samples (pipeline.report.sections.samples): which samples are shown, each with
its piano roll, audio and the training excerpt it shares the longest run of ids with."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from pipeline.render.document import NA, Audio, Figure, Para
from pipeline.report.sections import samples
from pipeline.report.sections.samples import pick_samples, span_blocks
from tests.report.test_context import make_context, rendered
from tests.stages.test_report import make_inputs, report, write_params

ROW = {"lcs_tokens": 30, "lcs_bars": 4.0, "lcs_train_sha256": "a" * 64, "nn_sha256": "b" * 64,
       "nn_jaccard": 0.25}
SAMPLE = {"onset": [0.0, 1.0, 2.0], "duration": [1.0] * 3, "pitch": [60, 62, 64],
          "in_span": [False, True, True]}
TRAIN = {"onset": [0.0, 10.0, 11.0], "duration": [1.0] * 3, "pitch": [50, 62, 64],
         "in_span": [False, True, True]}


def test_without_samples_or_their_audit_it_is_not_available(tmp_path):
    md = rendered(samples.render, make_context(tmp_path))
    assert f"sample piano rolls (reports/samples/): {NA}." in md
    assert "samples audited" not in md


@given(st.dictionaries(st.sampled_from(["ngram", "transformer", "lm_x"]),
                       st.dictionaries(st.sampled_from(["unconditional", "continuation"]),
                                       st.sets(st.integers(0, 30), min_size=1), min_size=1),
                       min_size=1),
       st.integers(0, 20))
def test_pick_samples_shows_each_model_and_kind_before_any_second_sample(drawn, n):
    pngs = sorted(Path(f"{m}_{k}_{i}.png") for m, kinds in drawn.items()
                  for k, idx in kinds.items() for i in idx)
    shown = pick_samples(pngs, n)
    assert len(shown) == min(n, len(pngs)) and len(set(shown)) == len(shown)
    kinds = sorted({p.stem.rsplit("_", 1)[0] for p in pngs})
    first_round = [min((p for p in pngs if p.stem.rsplit("_", 1)[0] == k),
                       key=lambda p: int(p.stem.rsplit("_", 1)[1])) for k in kinds]
    assert shown[:len(kinds)] == first_round[:n]  # the lowest index of each, in order


def test_a_sample_sharing_nothing_or_an_undecodable_run_is_said_in_words():
    assert span_blocks("s", None) == []
    (none,) = span_blocks("s", {"audit": {**ROW, "lcs_tokens": 0}})
    assert none.text == ("This sample shares no ids with any training piece. The nearest "
                         "training piece by shingle Jaccard is bbbbbbbbbbbb (0.25).")
    (undecoded,) = span_blocks("s", {"audit": ROW, "sample": SAMPLE})  # no train side
    assert "shares a span with training whose notes could not be decoded" in undecoded.text


def test_the_shared_run_as_two_rolls_the_excerpt_as_audio_and_the_flag_in_words():
    blocks = span_blocks("ngram, unconditional sample 0",
                         {"audit": ROW, "sample": SAMPLE, "train": TRAIN}, 20.0, 0.99)
    words, rolls, audio = blocks
    assert isinstance(words, Para) and isinstance(rolls, Figure) and isinstance(audio, Audio)
    assert "is 30 ids (4 bars), with training piece aaaaaaaaaaaa;" in words.text
    assert ("The audit flags a run longer than 20 ids (the 0.99 quantile of the runs of "
            "held-out val windows); this one is flagged.") in words.text
    assert words.text.endswith("is bbbbbbbbbbbb (0.25).")  # another piece than the run's
    # the training span starts at beat 10: shown from 2 beats before it
    assert audio.caption == ("training piece aaaaaaaaaaaa from beat 8 (2 beats before the "
                             "shared run), at most 10 s")
    assert audio.flac[:4] == b"fLaC"
    unflagged = span_blocks("s", {"audit": ROW, "sample": SAMPLE, "train": TRAIN}, 40.0)[0]
    assert "(set from the runs of held-out val windows); this one is not flagged." in \
        unflagged.text
    no_limit = span_blocks("s", {"audit": ROW, "sample": SAMPLE, "train": TRAIN})[0]
    assert "The audit's flag thresholds are in the memorisation section." in no_limit.text


def test_a_run_of_no_whole_note_marks_no_notes():
    bare = {**SAMPLE, "in_span": [False] * 3}
    _, note = span_blocks("s", {"audit": ROW, "sample": bare, "train": TRAIN})
    assert "holds no whole note (only time or bar ids), so no notes are marked" in note.text


def test_samples_have_a_piano_roll_and_a_player_per_model_and_kind(tmp_path):
    from pipeline.report.sections.samples import pick_samples

    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    raw = yaml.safe_load(params.read_text())
    params.write_text(yaml.safe_dump({**raw, "audit": {"flag_quantile": 0.95}}, sort_keys=False))
    report(tmp_path, params, p)
    md, html = p.md_out.read_text(), p.html_out.read_text()
    assert "### ngram, unconditional sample 0" in md
    link = re.search(r"\[Listen: the ngram, unconditional sample 0, at most its first 10 s\]"
                     r"\((figures/report/[^)]+\.flac)\)", md)
    assert link and (p.md_out.parent / link.group(1)).read_bytes()[:4] == b"fLaC"
    assert "the longest run of ids this sample shares with any training piece is 30 ids (4 " \
        "bars), with training piece a;" in md
    assert "The audit flags a run longer than 20 ids (the 0.95 quantile of the runs of " \
        "held-out val windows); this one is flagged." in md
    assert "The nearest training piece by shingle Jaccard is a (0.1), the same piece." in md
    assert "[Listen: training piece a from beat 3 (2 beats before the shared run), at most " \
        "10 s]" in md
    assert html.count('<audio controls preload="metadata"') == 2
    names = [Path(f"{m}_{k}_{i}.png") for m in ("ngram", "transformer")
             for k in ("continuation", "unconditional") for i in (0, 1, 2, 10)]
    assert [q.stem for q in pick_samples(sorted(names), 6)] == [
        "ngram_continuation_0", "ngram_unconditional_0", "transformer_continuation_0",
        "transformer_unconditional_0", "ngram_continuation_1", "ngram_unconditional_1"]
