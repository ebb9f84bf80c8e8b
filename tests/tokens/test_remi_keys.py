"""The REMI reader (pipeline.tokens.remi_keys): the notes it reads straight from ids equal
miditok's decode, read alone or together, and other configurations are left to miditok."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.tokens.remi_keys import remi_note_keys, remi_note_keys_batch


def decoded_keys(tok, ids: list[int]) -> list[tuple[int, ...]]:
    from miditok import TokSequence

    from pipeline.tokens.roundtrip import note_keys

    score = tok.decode(TokSequence(ids=list(ids)))
    return sorted(map(tuple, note_keys(score, int(score.ticks_per_quarter)).tolist()))


def token_events(tok):
    """Hypothesis strategy: REMI id sequences, well formed or not."""
    v = tok.vocab
    by_type: dict[str, list[int]] = {}
    for token, i in v.items():
        by_type.setdefault(token.split("_")[0], []).append(i)
    pick = lambda typ: st.sampled_from(sorted(by_type[typ]))  # noqa: E731
    note = st.tuples(st.sampled_from(sorted(by_type["Pitch"] + by_type["PitchDrum"])),
                     pick("Velocity"), pick("Duration")).map(list)
    one = st.one_of(pick("Bar").map(lambda i: [i]), pick("Position").map(lambda i: [i]),
                    pick("TimeSig").map(lambda i: [i]),
                    pick("Program").map(lambda i: [i]), note, note,
                    st.sampled_from(sorted(v.values())).map(lambda i: [i]))
    return st.lists(one, max_size=40).map(lambda xs: [i for x in xs for i in x])


def test_remi_note_keys_equal_miditok_decode(remi):
    from hypothesis import HealthCheck

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(token_events(remi))
    def check(ids):
        fast = remi_note_keys(remi, np.asarray(ids, np.int64))
        assert sorted(map(tuple, fast.tolist())) == decoded_keys(remi, ids)

    check()


@pytest.mark.parametrize("kwargs", [
    {"use_programs": False}, {"use_programs": True, "use_rests": True},
    {"use_programs": True, "use_velocities": False}, {"use_programs": True, "use_chords": True},
], ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_remi_note_keys_refuses_other_configurations(kwargs):
    import miditok

    tok = miditok.REMI(miditok.TokenizerConfig(**kwargs))
    assert remi_note_keys(tok, np.zeros(3, np.int64)) is None
    assert remi_note_keys(miditok.TSD(miditok.TokenizerConfig(use_programs=True)),
                          np.zeros(3, np.int64)) is None


def test_remi_note_keys_batch_equals_one_at_a_time(remi):
    """Read together, every sequence gives what it gives alone: no look-back (time signature,
    bar, position, program) and no Pitch-Velocity-Duration triple crosses into a neighbour, and
    ids outside the vocabulary spoil only their own sequence."""
    from hypothesis import HealthCheck

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(token_events(remi), max_size=6), st.integers(0, 6))
    def check(seqs, spoil):
        arrays = [np.asarray(s, np.int64) for s in seqs]
        if spoil < len(arrays):
            arrays[spoil] = np.append(arrays[spoil], len(remi.vocab))
        batch = remi_note_keys_batch(remi, arrays)
        assert len(batch) == len(arrays)
        for k, (ids, got) in enumerate(zip(arrays, batch, strict=True)):
            alone = remi_note_keys(remi, ids)
            if k == spoil:
                assert got is None and alone is None
            else:
                np.testing.assert_array_equal(got, alone)

    check()


def assert_reader_equals_decode(data: bytes) -> None:
    from miditok import TokSequence
    from symusic import Score

    from pipeline.tokens.roundtrip import note_keys
    from pipeline.tokens.tokenizer import make_tokenizer

    tok = make_tokenizer("REMI", {"use_programs": True})
    ts = tok.encode(Score.from_midi(data))
    fast = remi_note_keys(tok, np.asarray(ts.ids, np.int64))
    dec = tok.decode(TokSequence(tokens=list(ts.tokens), ids=list(ts.ids)))
    ref = note_keys(dec, int(dec.ticks_per_quarter))
    assert len(ref) and sorted(map(tuple, fast.tolist())) == sorted(map(tuple, ref.tolist()))


def test_fast_note_reader_equals_miditok_decode(good_midi):
    """The round-trip check's vectorised REMI reader gives miditok's decoded notes on each kept
    MIDI fixture (drums, several programs, 3/4, tempo changes, format 0 and 2)."""
    assert_reader_equals_decode(good_midi.read_bytes())


def test_fast_note_reader_equals_miditok_decode_on_real_chorales_and_a_gap(bach_dir,
                                                                          midi_fixtures):
    """... on real multitrack chorales, and on a piece whose two notes are 500 bars apart."""
    for path in sorted(bach_dir.rglob("*.mid")):
        assert_reader_equals_decode(path.read_bytes())
    assert_reader_equals_decode((midi_fixtures / "absurd_gap.mid").read_bytes())
