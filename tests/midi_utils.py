"""Tiny MIDI files generated on the fly, for tests and benchmarks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Note = tuple[float, float, int, int]  # (onset beats, duration beats, pitch, velocity)


def make_midi(
    tracks: Sequence[Sequence[Note]] | Sequence[Note],
    *,
    tpq: int = 480,
    tempo: float = 120.0,
    tempo_changes: Sequence[tuple[float, float]] = (),
    programs: Sequence[int] | None = None,
    drums: Sequence[bool] | None = None,
) -> bytes:
    """MIDI bytes for the given notes; ``tracks`` is a list of note lists (or one note list)."""
    import symusic

    if tracks and isinstance(tracks[0], tuple):
        tracks = [tracks]  # type: ignore[list-item]
    score = symusic.Score(tpq)
    score.tempos.append(symusic.Tempo(0, float(tempo)))
    for beat, bpm in tempo_changes:
        score.tempos.append(symusic.Tempo(round(beat * tpq), float(bpm)))
    for i, notes in enumerate(tracks):
        program = programs[i] if programs else 0
        is_drum = bool(drums[i]) if drums else False
        track = symusic.Track(f"track{i}", program, is_drum)
        for onset, dur, pitch, vel in notes:
            ticks = round(onset * tpq), max(1, round(dur * tpq))
            track.notes.append(symusic.Note(*ticks, pitch, vel))
        score.tracks.append(track)
    return score.dumps_midi()


def random_piece(rng: np.random.Generator, n: int = 64, voices: int = 1) -> list[list[Note]]:
    """A random but plausible piece: per voice, a walk on a 1/4-beat grid."""
    out = []
    for v in range(voices):
        t, pitch, notes = 0.0, int(rng.integers(48, 72)) + 7 * v, []
        for _ in range(n):
            dur = float(rng.choice([0.25, 0.5, 1.0, 1.5, 2.0]))
            pitch = int(np.clip(pitch + rng.integers(-4, 5), 21, 108))
            notes.append((t, dur, pitch, int(rng.integers(40, 110))))
            t += dur
        out.append(notes)
    return out


def write_tiny_corpus(root, n_groups: int = 12, per_group: int = 2, seed: int = 0) -> None:
    """A small corpus with known structure: ``n_groups`` works of ``per_group`` pieces each, a
    transposed copy, a byte duplicate and a corrupt file, plus ``metadata.csv`` beside the files.
    """
    from pathlib import Path

    root = Path(root)
    (root / "midi").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = ["path,group,license"]
    for g in range(n_groups):
        for k in range(per_group):
            piece = random_piece(rng, n=int(rng.integers(30, 60)), voices=2)
            name = f"w{g:02d}_{k}.mid"
            (root / "midi" / name).write_bytes(make_midi(piece))
            rows.append(f"{name},work {g},cc0")
    first = make_midi(random_piece(np.random.default_rng(seed + 1), n=40, voices=2))
    (root / "midi" / "orig.mid").write_bytes(first)
    (root / "midi" / "orig_copy.mid").write_bytes(first)
    transposed = [[(o, d, p + 3, v) for o, d, p, v in voice]
                  for voice in random_piece(np.random.default_rng(seed + 1), n=40, voices=2)]
    (root / "midi" / "orig_up3.mid").write_bytes(make_midi(transposed))
    (root / "midi" / "broken.mid").write_bytes(b"MThd\x00\x00\x00\x06garbage")
    (root / "metadata.csv").write_text("\n".join(rows) + "\n")
