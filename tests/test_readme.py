"""The README starts where a user starts. Its first 60 lines say what symkit is in one sentence,
draw the pipeline, give the two commands and what they need, show where the report appears (with
a picture of its first screen), how to point symkit at your own MIDI folder, and the layout.

The README holds no result numbers: every measured figure lives in the report and in
docs/results/. A result number, outside fenced code blocks, is a percentage, a time or a size
(``13 min``, ``72.5 MB``), a decimal other than a Python version (``3.584``), a count out of a
total (``0 of 51``) or a ratio (``2.2×``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.browser import HEIGHT, WIDTH

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TOP = "\n".join(README.splitlines()[:60])
SCREENSHOT = "docs/images/report-first-screen.png"
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)

RESULT_NUMBERS = {
    "a percentage": r"\d+(?:\.\d+)?\s?%",
    "a time or a size": r"\b\d+(?:\.\d+)?\s?(?:ms|s|min|minutes?|h|hours?|[KMG]i?B)\b",
    "a decimal": r"(?<!Python )\b\d+\.\d+\b",
    "a count out of a total": r"\b\d+ (?:of|out of) \d+\b",
    "a ratio": r"\b\d+(?:\.\d+)?\s?×",
}


def fenced_blocks(text: str) -> list[str]:
    return FENCED.findall(text)


def result_numbers(text: str) -> list[str]:
    """Every result number in ``text`` outside fenced code blocks, as ``kind: match``."""
    prose = FENCED.sub("", text)
    return [f"{kind}: {m.group(0)!r}" for kind, pattern in RESULT_NUMBERS.items()
            for m in re.finditer(pattern, prose)]


def test_it_opens_with_one_sentence_saying_what_symkit_is() -> None:
    lines = README.splitlines()
    assert lines[0] == "# symkit"
    paragraph = " ".join(README.split("\n\n")[1].split())
    assert paragraph.startswith("symkit is "), paragraph
    assert len(re.findall(r"[.!?](?=\s|$)", paragraph)) == 1 and paragraph.endswith("."), \
        f"the first paragraph is not one sentence: {paragraph}"


def test_a_picture_of_the_pipeline_names_every_stage_in_order() -> None:
    stages = list(yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"])
    pictures = [b for b in fenced_blocks(TOP) if "→" in b]
    assert pictures, "no picture of the pipeline (a fenced block with arrows) in lines 1-60"
    picture = pictures[0]
    for name in [*stages, "symkit preregister"]:
        assert re.search(rf"(?<![\w-]){name}(?![\w-])", picture), f"the picture lacks {name}"
    first = [picture.index(s) for s in ("corpus", "ingest", "dedupe", "split")]
    last = [picture.rindex(s) for s in ("evaluate", "generate", "audit", "report")]
    assert first == sorted(first) and last == sorted(last), "stages drawn out of order"


def test_the_two_commands_and_what_they_need() -> None:
    commands = "\n".join(fenced_blocks(TOP))
    for command in ("make repro", "make test"):
        assert re.search(rf"^{command}\b", commands, re.M), f"no `{command}` in lines 1-60"
    assert any("Python 3.11" in line and "make" in line for line in TOP.splitlines()), \
        "lines 1-60 do not say, in one line, that Python 3.11 and make are needed"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^repro:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(encoding="utf-8"), re.M), \
        ".ci/run does not run the README's test command"


def test_where_the_report_appears_with_a_picture_of_its_first_screen() -> None:
    assert "`reports/report.md`" in TOP and "`reports/report.html`" in TOP
    image = re.search(rf"!\[([^\]]*)\]\({re.escape(SCREENSHOT)}\)", TOP)
    assert image, f"no image link to {SCREENSHOT} in lines 1-60"
    assert image.group(1).strip(), "the screenshot has no alt text"
    data = (ROOT / SCREENSHOT).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{SCREENSHOT} is no PNG"
    size = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert size == (WIDTH, HEIGHT), \
        f"{SCREENSHOT} is {size}, not the browser test's first screen: run `make screenshot`"
    assert len(data) < 256 * 1024, f"{SCREENSHOT} is {len(data)} bytes; keep the README light"


def test_how_to_use_your_own_midi_folder() -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    assert "source" in params["corpus"], "params.yaml has no corpus.source"
    assert "`corpus.source`" in TOP, "lines 1-60 do not name the params key corpus.source"
    example = next((b for b in fenced_blocks(TOP) if b.startswith("corpus:")), None)
    assert example and re.search(r"^  source: ", example, re.M), "no corpus.source example"
    after = TOP[TOP.index("`corpus.source`"):]
    assert "make repro" in after.split("```")[0], "no command after the corpus.source key"


def test_the_layout_names_every_folder_and_every_floor_of_pipeline() -> None:
    layout = TOP[TOP.index("## Layout"):]
    for folder in ("pipeline", "models", "data", "reports", "experiments", "tests", "benchmarks",
                   "docs"):
        assert (ROOT / folder).is_dir()
        assert re.search(rf"`{folder}/[^`]*`", layout), f"the layout does not name {folder}/"
    rooms = sorted(p.parent.name for p in (ROOT / "pipeline").glob("*/__init__.py"))
    assert len(rooms) > 5
    for room in rooms:
        assert f"`{room}/`" in layout, f"the layout does not name pipeline/{room}/"
    assert "(CONTRIBUTING.md" in layout, "the layout does not link CONTRIBUTING.md's table"


def test_the_readme_holds_no_result_numbers() -> None:
    assert result_numbers(README) == [], \
        "result numbers belong in the report and docs/results/, not in the README"
    assert "(docs/results/" in README, "the README does not link docs/results/"


# Lines of the README before its measured results moved to docs/results/, one a rule.
EARLIER_README = [
    "| 5-gram, interpolated modified Kneser-Ney | 3.999 | 4.319 | 39.03 |",
    "- **The transformer beats the n-gram (INCONCLUSIVE):** NLL per note is 10.4% lower",
    "default experiment takes about 13 minutes: 12 min 40 s and 13 min 24 s measured",
    "- **No test piece has a near copy in train (PASS):** 0 of 51, comparing every test piece",
    "compresses the chorales only 2.2× (the source 5.5×), and the arms that freeze the embeddings",
    "| `scratch` | 954.1 k | 4.52 [4.37, 4.72] | – | 3.91 [3.71, 4.10] | 72.5 / 72.3 MB | 221 s |",
]


@pytest.mark.parametrize("line", EARLIER_README)
def test_the_rule_finds_the_numbers_the_readme_used_to_hold(line: str) -> None:
    assert result_numbers(line)


def test_the_rule_spares_versions_commands_and_code() -> None:
    assert result_numbers("Needs Python 3.11 and `make`; no GPU.") == []
    assert result_numbers("```bash\nmake bench --files 4000   # 12.5 s, 10%\n```\n") == []
    assert result_numbers("The report says it: 3.5% lower.") == ["a percentage: '3.5%'",
                                                                "a decimal: '3.5'"]
