"""Generated dance tunes and their edited copies: the ``tunes`` set of
``benchmarks/bench_dedupe_quality.py``.

A *tune* is monophonic, 40-120 notes, in AABB form written out (A1 A2 B1 B2): each part is a body
and an ending, the second time through the same body with another ending (a first-time ending on
another degree, then a cadence on the tonic). Tunes share one *style*: a mode and key from the
few that dance music uses, a tune type (reel, jig or hornpipe: its rhythm per beat), melodic steps
weighted towards steps and thirds with chord tones on the beats, and a small library of stock
material that many tunes share: openings of the A part, openings of the B part, first-time
endings, cadences, and per tune type a dozen stock bars. A figure fills at most a quarter of its
part and stock material at most half, so two tunes with the same figures and bars still differ in
at least half of every part.

A *sibling* of a tune is an unrelated tune made to share all it can without being the same tune:
the same tune type, mode and key, and the same four stock figures; its bodies and rhythm are its
own. Siblings and the other tunes are what precision is measured against.

An *edited copy* changes ``max(1, round(rate * n))`` notes of an ``n``-note tune, several kinds of
edit in one copy (``MIXES``), each at its own note, spread evenly over the tune and made in the
parts, so a note of a body is edited both times through (:func:`edit`):

- ``diatonic``: the note moves to a neighbouring scale tone (one step, sometimes two);
- ``chromatic``: the note moves a semitone, off the scale where one direction leads off it;
- ``dropped``: the note is left out and the one before it held through its time;
- ``split``: the note is split in two, its second half on a neighbouring scale tone;
- ``passing``: a passing note between it and the next takes its second half (the scale tone
  between notes a third apart, the semitone between notes a tone apart, else a step towards
  the next note).

The copy is then transposed by -5..5 semitones and saved at another tempo and resolution, as a
copy found elsewhere would be. Everything is drawn from the numpy Generator passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tests.midi_utils import make_midi

MODES = ((0, 2, 4, 5, 7, 9, 11), (0, 2, 3, 5, 7, 9, 10), (0, 2, 4, 5, 7, 9, 10),
         (0, 2, 3, 5, 7, 8, 10))  # major, dorian, mixolydian, natural minor
MODE_P = (0.5, 0.2, 0.15, 0.15)
TONICS = (2, 7, 9, 4)  # D, G, A, E
TONIC_P = (0.4, 0.3, 0.2, 0.1)
# tune type: sixteenths per beat and the rhythms of one beat, with their probabilities
TYPES = {
    "reel": (4, (((2, 2), 0.8), ((4,), 0.12), ((3, 1), 0.08))),
    "jig": (6, (((2, 2, 2), 0.75), ((4, 2), 0.2), ((6,), 0.05))),
    "hornpipe": (4, (((3, 1), 0.7), ((2, 2), 0.15), ((4,), 0.15))),
}
TYPE_NAMES = tuple(TYPES)
TYPE_P = (0.5, 0.35, 0.15)
BAR_BEATS = {"reel": 4, "jig": 2, "hornpipe": 4}
PLAIN = {"reel": (2,) * 8, "jig": (2,) * 6, "hornpipe": (3, 1) * 4}  # a bar's plain rhythm
STOCK_BARS = 12  # stock bars per tune type
STOCK_P = 0.3  # probability that a bar of a body is a stock bar
STEP = np.arange(-5, 6)  # melodic steps in scale degrees
STEP_W = np.array([0.5, 1.0, 2.0, 8.0, 30.0, 4.0, 30.0, 8.0, 2.0, 1.0, 0.5])
LOW, HIGH = -3, 10  # the range in scale degrees (0 = the tonic near D4)
EDITS = ("diatonic", "chromatic", "dropped", "split", "passing")
MIXES = {
    "changed+dropped+inserted": ("diatonic", "dropped", "split"),
    "chromatic+dropped": ("chromatic", "dropped"),
    "ornaments": ("split", "passing"),
    "all kinds": EDITS,
}


@dataclass(frozen=True)
class Style:
    """The stock figures of the style, in scale degrees: figures relative to where they start
    or end, bars relative to their first note."""

    openings: tuple[tuple[int, ...], ...]  # A part, from its first note
    b_openings: tuple[tuple[int, ...], ...]  # B part, from the upper tonic region
    first_endings: tuple[tuple[int, ...], ...]  # end on the second or fifth degree
    cadences: tuple[tuple[int, ...], ...]  # end on the tonic
    bars: dict[str, tuple[tuple[int, ...], ...]]  # per tune type, bars in its plain rhythm


def make_style(seed: int) -> Style:
    rng = np.random.default_rng([seed, 100])
    small = np.abs(STEP) <= 2
    w = STEP_W[small] / STEP_W[small].sum()

    def walk(n: int) -> np.ndarray:
        while True:
            d = np.concatenate([[0], np.cumsum(rng.choice(STEP[small], size=n - 1, p=w))])
            if np.ptp(d) <= 7 and np.all(d[1:] != d[:-1]):
                return d

    def figures(count: int, start: tuple[int, ...] | None, end: tuple[int, ...] | None
                ) -> tuple[tuple[int, ...], ...]:
        out = []
        for _ in range(count):
            d = walk(int(rng.integers(5, 8)))
            d = d - d[0] + int(rng.choice(start)) if start else d - d[-1] + int(rng.choice(end))
            out.append(tuple(int(x) for x in d))
        return tuple(out)

    bars = {kind: tuple(tuple(int(x) for x in walk(len(PLAIN[kind])))
                        for _ in range(STOCK_BARS)) for kind in TYPE_NAMES}
    return Style(figures(3, (0, 2, 4), None), figures(3, (7, 9, 4), None),
                 figures(3, None, (1, 4)), figures(3, None, (0,)), bars)


@dataclass(frozen=True)
class Plan:
    """What a tune shares with its siblings."""

    kind: str
    mode: int
    tonic: int
    opening: int
    b_opening: int
    first_ending: int
    cadence: int


def make_plan(rng: np.random.Generator) -> Plan:
    return Plan(TYPE_NAMES[rng.choice(3, p=TYPE_P)], int(rng.choice(4, p=MODE_P)),
                TONICS[rng.choice(4, p=TONIC_P)], *(int(x) for x in rng.integers(3, size=4)))


@dataclass(frozen=True)
class Tune:
    """Notes on a 16th grid (``onset``, ``dur`` in sixteenths; ``pitch`` MIDI), where each comes
    from in the parts (``source``: a body's notes are played twice) and the key."""

    onset: np.ndarray
    dur: np.ndarray
    pitch: np.ndarray
    source: np.ndarray  # per note, its note in the parts before the repeats are written out
    tonic: int
    mode: tuple[int, ...]
    tempo: float = 110.0
    tpq: int = 480

    @property
    def n(self) -> int:
        return int(self.pitch.size)

    def midi(self, velocity: int = 80) -> bytes:
        notes = [(o / 4.0, d / 4.0, int(p), velocity) for o, d, p in
                 zip(self.onset.tolist(), self.dur.tolist(), self.pitch.tolist(), strict=True)]
        return make_midi([notes], tpq=self.tpq, tempo=self.tempo, programs=[73])


def _cell(rng: np.random.Generator, kind: str) -> list[int]:
    """The durations (sixteenths) of one beat of a tune type."""
    cells = TYPES[kind][1]
    p = np.array([q for _, q in cells])
    return list(cells[rng.choice(len(cells), p=p / p.sum())][0])


def _rhythm(rng: np.random.Generator, kind: str, m: int) -> list[int]:
    """Durations (sixteenths) of ``m`` notes, drawn a beat at a time."""
    out: list[int] = []
    while len(out) < m:
        out += _cell(rng, kind)
    return out[:m]


def _walk(rng: np.random.Generator, start: int, n: int, on_beat: list[bool],
          chord: tuple[int, ...]) -> list[int]:
    """``n`` degrees after ``start``: weighted steps within the range, chord tones on beats."""
    out, d = [], start
    for k in range(n):
        cand = d + STEP
        w = STEP_W * ((cand >= LOW) & (cand <= HIGH))
        if on_beat[k]:
            w = w * np.where(np.isin(cand % 7, chord), 3.0, 1.0)
        d = int(rng.choice(cand, p=w / w.sum()))
        out.append(d)
    return out


def _ending_size(m: int) -> int:
    """Notes of each ending of a part of ``m`` notes: a quarter of it, within every stock
    figure's length (5 to 7)."""
    return min(max(2, m // 4), 5)


def _part(rng: np.random.Generator, style: Style, plan: Plan, m: int, b: bool
          ) -> tuple[list[int], list[int], list[int]]:
    """One part of ``m`` notes: (body + first-time ending, body + cadence, durations).

    The body is the part's opening figure, then bars: a stock bar of the tune type (in its
    plain rhythm) with probability ``STOCK_P``, else a bar of the tune's own, a weighted walk
    with chord tones on the beats. Stock figures and bars fill at most half of the part (a
    stock bar is cut short to fit), so two tunes differ in at least half of every part."""
    room = max(2, m // 4)  # a stock figure fills at most a quarter of its part
    opening = (style.b_openings[plan.b_opening] if b else style.openings[plan.opening])[:room]
    size = _ending_size(m)
    first = list(style.first_endings[plan.first_ending][-size:])
    cadence = list(style.cadences[plan.cadence][-size:])
    beat = TYPES[plan.kind][0]
    chords = ((0, 2, 4), (3, 5, 0), (4, 6, 1))  # I, IV, V
    body, dur = list(opening), _rhythm(rng, plan.kind, len(opening))
    stock = m // 2 - len(opening) - size  # stock notes left: at most half the part is stock
    while len(body) < m - size:
        if stock >= 3 and rng.random() < STOCK_P:
            bar = style.bars[plan.kind][rng.integers(STOCK_BARS)][:stock]
            stock -= len(bar)
            start = min(max(body[-1] + int(rng.choice([-2, -1, 1, 2])), LOW - min(bar)),
                        HIGH - max(bar))
            body += [start + x for x in bar]
            dur += PLAIN[plan.kind][: len(bar)]
        else:
            bar_dur = []
            while sum(bar_dur) < beat * BAR_BEATS[plan.kind]:
                bar_dur += _cell(rng, plan.kind)
            on_beat = [o % beat == 0 for o in np.cumsum([0, *bar_dur[:-1]]).tolist()]
            body += _walk(rng, body[-1], len(bar_dur), on_beat, chords[rng.integers(3)])
            dur += bar_dur
    body, dur = body[: m - size], dur[: m - size]
    dur += [*_rhythm(rng, plan.kind, size - 1), beat]  # the ending's last note: a whole beat

    def placed(end: list[int]) -> list[int]:  # the ending in the octave nearest the body's end
        return [x + 7 * round((body[-1] - end[0]) / 7) for x in end]

    return body + placed(first), body + placed(cadence), dur


def compose(rng: np.random.Generator, style: Style, n: int, plan: Plan) -> Tune:
    """A tune of ``n`` notes, or ``n - 1`` when ``n`` is odd (AABB: each part twice), following
    ``plan``; ``n`` >= 40."""
    m_a = (n + 2) // 4
    a1, a2, dur_a = _part(rng, style, plan, m_a, False)
    b1, b2, dur_b = _part(rng, style, plan, n // 2 - m_a, True)
    degrees = np.array(a1 + a2 + b1 + b2)
    dur = np.array(dur_a + dur_a + dur_b + dur_b)
    source, first = [], 0  # the second time through, a body's notes are the first time's
    for m in (len(a1), len(b1)):
        body = m - _ending_size(m)
        ids = list(range(first, first + m))
        source += ids + ids[:body] + list(range(first + m, first + 2 * m - body))
        first += 2 * m - body
    mode = MODES[plan.mode]
    base = 62 + (plan.tonic - 2 + 6) % 12 - 6  # the tonic nearest D4
    pitch = base + 12 * (degrees // 7) + np.asarray(mode)[degrees % 7]
    onset = np.concatenate([[0], np.cumsum(dur)[:-1]])
    return Tune(onset, dur, pitch.astype(np.int64), np.array(source), plan.tonic, mode,
                tempo=float(rng.integers(90, 130)))


def _scale(t: Tune) -> np.ndarray:
    allp = np.arange(128)
    return allp[np.isin((allp - t.tonic) % 12, t.mode)]


def _step(scale: np.ndarray, pitch: int, steps: int) -> int:
    """``pitch`` moved ``steps`` scale tones (a pitch off the scale: its neighbouring scale tone
    on that side is the first step)."""
    at = int(np.searchsorted(scale, pitch))
    if at >= scale.size or scale[at] != pitch:  # off the scale, between at - 1 and at
        steps -= steps > 0
    return int(scale[min(max(at + steps, 0), scale.size - 1)])


def _spread(rng: np.random.Generator, u: int) -> list[int]:
    """``0..u-1`` in an order whose every prefix is spread evenly over them: the points of a
    van der Corput sequence shifted by a random offset, each taking the index it falls on (the
    first time)."""
    offset, out, seen, j = rng.random(), [], set(), 1
    while len(out) < u:
        x, k, f = 0.0, j, 0.5
        while k:
            x, k, f = x + f * (k & 1), k >> 1, f / 2
        s = int(((offset + x) % 1.0) * u)
        if s not in seen:
            seen.add(s)
            out.append(s)
        j += 1
    return out


def edit(rng: np.random.Generator, t: Tune, kinds: tuple[str, ...], rate: float
         ) -> tuple[Tune, dict[str, int]]:
    """An edited copy of ``t`` (see the module docstring) and how many of its notes each kind
    of edit changed.

    Edits are made to the parts, before the repeats are written out, as another version of a
    tune differs from it: a little in every phrase, and an edited note of a body is edited
    both times through. Notes are edited until ``max(1, round(rate * n))`` of the ``n``
    written notes are, spread evenly over the tune (:func:`_spread`), the kinds taking turns
    from a random one."""
    n, src = t.n, t.source
    times = np.bincount(src)
    _, first = np.unique(src, return_index=True)  # each source note's first written note
    pitch, dur = t.pitch, t.dur

    def eligible(kind: str, s: int) -> bool:
        i = first[s]
        if kind == "dropped":
            return i > 0
        if kind == "split":
            return dur[i] >= 2
        if kind == "passing":
            return i + 1 < n and dur[i] >= 2 and pitch[i] != pitch[i + 1]
        return True

    target = max(1, round(rate * n))
    order = _spread(rng, times.size)
    at: dict[int, str] = {}
    done, turn, idle = 0, int(rng.integers(len(kinds))), 0
    while done < target and idle < len(kinds):
        kind = kinds[turn % len(kinds)]
        turn += 1
        free = [s for s in order if s not in at and eligible(kind, s)]
        fits = [s for s in free if times[s] <= target - done]
        if not (fits or free):  # no note left where this kind applies
            idle += 1
            continue
        s, idle = (fits or free)[0], 0
        at[s] = kind
        done += int(times[s])
    scale = _scale(t)
    # each edited source note's choices, the same every time it is played
    step = {s: int(rng.choice([-2, -1, 1, 2], p=[0.1, 0.4, 0.4, 0.1])) for s in sorted(at)}
    side = {s: int(rng.choice([-1, 1])) for s in sorted(at)}
    out: list[list[int]] = []  # [onset, dur, pitch]
    counts = dict.fromkeys(EDITS, 0)
    for i in range(n):
        o, d, p = int(t.onset[i]), int(dur[i]), int(pitch[i])
        s = int(src[i])
        kind = at.get(s)
        if kind is not None:
            counts[kind] += 1
        if kind == "dropped":
            if out:
                out[-1][1] = o + d - out[-1][0]
            continue
        if kind == "diatonic":
            p = _step(scale, p, step[s])
        elif kind == "chromatic":
            off = [x for x in (-1, 1) if (p + x) not in scale]
            p += off[0] if len(off) == 1 else side[s]
        if kind == "split" or (kind == "passing" and i + 1 < n):
            half = d // 2
            if kind == "split":
                q = _step(scale, p, side[s])
            else:
                nxt = int(pitch[i + 1])
                between = [x for x in scale.tolist() if min(p, nxt) < x < max(p, nxt)]
                if abs(nxt - p) == 2:
                    q = (p + nxt) // 2
                elif len(between) == 1:
                    q = between[0]
                else:
                    q = _step(scale, p, 1 if nxt > p else -1)
            out += [[o, half, p], [o + half, d - half, q]]
            continue
        out.append([o, d, p])
    arr = np.array(out, dtype=np.int64)
    shift = int(rng.integers(-5, 6))
    return Tune(arr[:, 0], arr[:, 1], arr[:, 2] + shift, np.arange(arr.shape[0]), t.tonic,
                t.mode, tempo=t.tempo + float(rng.integers(-20, 21)),
                tpq=int(rng.choice([384, 480, 960]))), counts
