"""``symkit plots-template`` (pipeline.tools.plots_template): the pages ``dvc plots show`` and
``dvc plots diff`` write from it load no script from the network and draw in a browser that has
none.

A small DVC repository (one training log, committed, then changed) names the template in its
``.dvc/config`` as the project does; both commands run as a user runs them, and headless
Chromium (``tests/browser.py``) renders their pages with networking off. The control is DVC's own
page: the same page with DVC's CDN scripts in place of the inlined ones, which draws nothing in
that browser (so the browser really is offline, and the drawing comes from the inlined libraries).
The browser checks are skipped, saying why, where no Chromium is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.tools import plots_template
from tests.browser import CHROMIUM, OFFLINE, chromium

ROOT = Path(__file__).resolve().parents[2]
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install "
                             "chromium; .ci/run installs it): dvc plots pages not drawn offline")
LOG = "step\ttrain_loss\tval_loss\n1\t3.0\t\n2\t2.6\t2.8\n3\t2.2\t2.5\n"
PLOTS = "plots:\n  - logs:\n      x: step\n      y: [train_loss, val_loss]\n"
EXTERNAL_SCRIPT = re.compile(r"<script\b[^>]*\bsrc\s*=\s*[\"']?\s*(?:https?:)?//", re.I)


@pytest.fixture(scope="module")
def template() -> str:
    return plots_template.page_template()


def run(cwd: Path, *argv: str) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL":
           "t@example.org", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    cmd = [sys.executable, "-m", "dvc", *argv[1:]] if argv[0] == "dvc" else list(argv)
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{' '.join(argv)} failed: {done.stdout}{done.stderr}"
    return done.stdout


def drawn(page: Path, tmp_path: Path) -> dict[str, int]:
    """What headless Chromium, offline, drew of ``page``: the Vega charts (an ``<svg
    class="marks">`` each) and their line marks, counted in the DOM without its scripts (the
    inlined libraries' source names the same things)."""
    done = chromium(page, tmp_path / f"chromium-{page.parent.name}", *OFFLINE, "--dump-dom")
    assert "</html>" in done.stdout, f"no DOM from Chromium (exit {done.returncode}): " \
                                     f"{done.stderr[-800:]}"
    dom = re.sub(r"<script\b.*?</script>", "", done.stdout, flags=re.S | re.I)
    return {"charts": len(re.findall(r"<svg\b[^>]*\bclass=\"marks\"", dom)),
            "lines": dom.count('aria-roledescription="line mark"'),
            "workspace": dom.count(">workspace<"), "HEAD": dom.count(">HEAD<")}


def test_the_template_inlines_the_libraries_around_dvcs_placeholder(template):
    assert template.count(plots_template.PLOTS_PLACEHOLDER) == 1
    assert "{scripts}" not in template  # where DVC would put its CDN <script src> tags
    assert not EXTERNAL_SCRIPT.search(template)
    assert "window.vegaEmbed=" in template.replace(" ", "")
    assert template == plots_template.page_template()  # the same bytes every time


def test_a_bundle_that_would_break_the_page_is_refused(monkeypatch):
    import vl_convert

    monkeypatch.setattr(vl_convert, "javascript_bundle",
                        lambda vl_version: 'let s = "</script>";')
    with pytest.raises(ValueError, match="</script"):
        plots_template.page_template()


def test_it_writes_where_the_dvc_config_points_or_says_how_to_set_it(tmp_path, capsys,
                                                                      monkeypatch):
    dvc_dir = tmp_path / ".dvc"
    dvc_dir.mkdir()
    (dvc_dir / "config").write_text("[core]\n    analytics = false\n")
    monkeypatch.setattr(plots_template, "page_template", lambda: "<html>{plot_divs}</html>")
    args = argparse.Namespace(out=None, dvc_dir=dvc_dir)
    assert plots_template.main(args) == 1
    assert "sets no plots.html_template" in capsys.readouterr().err
    (dvc_dir / "config").write_text("[plots]\n    html_template = ../cache/page.html\n")
    assert plots_template.main(args) == 0
    assert (tmp_path / "cache" / "page.html").read_text() == "<html>{plot_divs}</html>"


def test_the_makefile_writes_the_template_where_the_projects_dvc_config_points():
    made = re.search(r"^PLOTS_TEMPLATE := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert made, "the Makefile defines no PLOTS_TEMPLATE"
    assert plots_template.configured_path(ROOT / ".dvc") == ROOT / made.group(1)


@needs_chromium
def test_plots_show_and_diff_pages_draw_with_no_network(template, tmp_path):
    repo = tmp_path / "repo"
    (repo / "logs").mkdir(parents=True)
    run(repo, "git", "init", "-q")
    run(repo, "dvc", "init", "-q")
    (repo / "cache").mkdir()
    (repo / "cache" / "offline.html").write_text(template, encoding="utf-8")
    with (repo / ".dvc" / "config").open("a") as config:  # as the project's .dvc/config has it
        config.write("[plots]\n    html_template = ../cache/offline.html\n")
    (repo / "dvc.yaml").write_text(PLOTS)
    (repo / "logs" / "seed-1.tsv").write_text(LOG)
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "log")
    (repo / "logs" / "seed-1.tsv").write_text(LOG + "4\t1.9\t2.3\n")

    run(repo, "dvc", "plots", "show", "-o", "show")
    run(repo, "dvc", "plots", "diff", "HEAD", "-o", "diff")
    pages = {name: repo / name / "index.html" for name in ("show", "diff")}
    for name, page in pages.items():
        assert not EXTERNAL_SCRIPT.search(page.read_text(encoding="utf-8")), \
            f"dvc plots {name}'s page loads a script from the network"
    show, diff = (drawn(page, tmp_path) for page in pages.values())
    assert show["charts"] == 1 and show["lines"] >= 1, f"dvc plots show drew {show}"
    assert diff["charts"] == 1 and diff["lines"] >= 1, f"dvc plots diff drew {diff}"
    assert diff["HEAD"] and diff["workspace"], f"the diff's legend lacks a revision: {diff}"

    # The control: DVC's own CDN scripts in place of the inlined libraries draw nothing here.
    from dvc_render.vega import VegaRenderer

    page = pages["show"].read_text(encoding="utf-8")
    start, end = page.index("<script>\n(() => {"), page.index("})();\n</script>")
    control = repo / "control" / "index.html"
    control.parent.mkdir()
    control.write_text(page[:start] + VegaRenderer.SCRIPTS + page[end + len("})();\n</script>"):],
                       encoding="utf-8")
    assert EXTERNAL_SCRIPT.search(control.read_text(encoding="utf-8"))
    assert drawn(control, tmp_path)["charts"] == 0, "DVC's CDN page drew: the browser is online"


def test_the_projects_loss_plot_drops_the_blank_validation_cells(tmp_path):
    """val_loss is blank between evaluations; DVC's own templates draw a blank as 0, so the
    project's plot names .dvc/plots/loss.json, whose filter keeps only numbers: the spec DVC
    writes carries it, over data that holds the blank cells."""
    import json

    import yaml

    plots = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    logs = next(p["reports/plots/train_log"] for p in plots if "reports/plots/train_log" in p)
    assert logs["template"] == "loss"
    repo = tmp_path / "repo"
    (repo / "reports" / "plots" / "train_log").mkdir(parents=True)
    run(repo, "git", "init", "-q")
    run(repo, "dvc", "init", "-q")
    (repo / ".dvc" / "plots").mkdir(exist_ok=True)
    (repo / ".dvc" / "plots" / "loss.json").write_text(
        (ROOT / ".dvc" / "plots" / "loss.json").read_text())
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"plots": plots}))
    (repo / "reports" / "plots" / "train_log" / "seed-1.tsv").write_text(
        "step\ttrain_loss\tval_loss\n1\t3.0\t\n2\t2.5\t2.9\n3\t2.2\t\n")
    got = json.loads(run(repo, "dvc", "plots", "show", "--json"))
    spec = got["data"]["reports/plots/train_log/seed-1.tsv"][0]["content"]
    blank = [v for v in spec["data"]["values"] if v["dvc_inferred_y_value"] == ""]
    assert len(blank) == 2  # the two steps without an evaluation
    assert spec["transform"][0] == {"filter": "isValid(datum['dvc_inferred_y_value']) && "
                                              "datum['dvc_inferred_y_value'] !== ''"}
