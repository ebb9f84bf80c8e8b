"""``symkit plots-template``: the page template that lets ``dvc plots show`` and ``dvc plots diff``
draw with no network.

DVC's own page loads Vega, Vega-Lite and vega-embed from a CDN, so offline (a cluster node, a
train) it stays blank. DVC fills an HTML template of ours instead when ``.dvc/config`` names one
(``plots.html_template``, relative to ``.dvc/``) or ``--html-template`` does. This template holds
the three libraries inline, taken from the pinned ``vl-convert-python`` package
(``vl_convert.javascript_bundle``, which sets ``window.vegaEmbed``, ``window.vega`` and
``window.vegaLite``), so each page DVC writes is one self-contained file: the ``vegaEmbed(...)``
calls DVC writes for each plot find the library already loaded, and the page can be copied
anywhere.

The template is about 0.9 MB of generated JavaScript, so it is not committed: this command
writes it where ``.dvc/config`` points (``make repro`` and ``make plots`` run it). It has no
``{scripts}`` placeholder, which is where DVC would put its CDN ``<script src>`` tags. The same
package version writes the same bytes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pipeline.core.artifacts import write_text

HELP = "write the dvc plots page template with Vega inlined (pages that draw offline)"

VEGA_LITE = "5.21"
"""The Vega-Lite release inlined: the newest 5.x, the major version DVC's plot templates are
written for (their ``$schema`` is Vega-Lite v5); a 6.x would warn on every plot."""
KEY = "html_template"
"""The key of ``.dvc/config``'s ``plots`` section that names the template, relative to ``.dvc/``."""
PLOTS_PLACEHOLDER = "{plot_divs}"
"""Where DVC puts each plot's ``<div>`` and its ``vegaEmbed`` call."""
# Strings DVC replaces anywhere in a template, and what would end an inline script early.
_FORBIDDEN_IN_BUNDLE = ("{plot_divs}", "{scripts}", "{refresh_tag}", "</script", "<!--")

PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
{refresh_tag}
<title>DVC plots</title>
<!-- {libraries}, inlined by `symkit plots-template` so the page draws with no network. -->
<script>
(() => {
%BUNDLE%
})();
</script>
<style>
table {
    border-spacing: 15px;
}
</style>
</head>
<body>
{plot_divs}
</body>
</html>
"""


def page_template() -> str:
    """The HTML template: DVC's ``{plot_divs}`` and ``{refresh_tag}`` placeholders around the
    inlined libraries.

    The bundle runs inside a function, so its many top-level names stay out of the page's global
    scope (where they could clash with the ``var spec`` of DVC's plot scripts); only the three
    globals it assigns to ``window`` leave it. A bundle holding a placeholder DVC would replace,
    or a sequence that ends an inline script, is refused rather than written broken.
    """
    import vl_convert  # a compiled package, needed by this command only

    bundle = vl_convert.javascript_bundle(vl_version=VEGA_LITE)
    found = [s for s in _FORBIDDEN_IN_BUNDLE if s in bundle.lower()]
    if found:
        raise ValueError(f"vl_convert.javascript_bundle() holds {found}, which would break the "
                         f"page when inlined; this command needs a change for this vl-convert "
                         f"version")
    libraries = (f"Vega {vl_convert.get_vega_version()}, Vega-Lite {VEGA_LITE} and vega-embed "
                 f"{vl_convert.get_vega_embed_version()}")
    return PAGE.replace("{libraries}", libraries).replace("%BUNDLE%", bundle.strip())


def configured_path(dvc_dir: Path) -> Path | None:
    """Where DVC reads the template from: the ``plots.html_template`` value of the DVC config
    (the repository's, merged with the user's and the system's, as DVC reads it) resolved
    against ``dvc_dir`` when relative, as ``dvc plots`` resolves it; None when it is not set."""
    from dvc.config import Config  # DVC's own reader; imported only by this command

    value = Config(dvc_dir=str(dvc_dir)).get("plots", {}).get(KEY)
    return None if not value else Path(os.path.normpath(dvc_dir / value))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write it (default: where .dvc/config's "
                             f"plots.{KEY} points)")
    parser.add_argument("--dvc-dir", type=Path, default=Path(".dvc"),
                        help="the DVC folder whose config names the template (default: .dvc)")


def main(args: argparse.Namespace) -> int:
    out = args.out or configured_path(args.dvc_dir)
    if out is None:
        print(f"symkit plots-template: {args.dvc_dir}/config sets no plots.{KEY}; set it "
              f"(`dvc config plots.{KEY} ../.cache/plots/offline.html`) or pass --out",
              file=sys.stderr)
        return 1
    write_text(out, page_template())
    print(f"{out}: dvc plots show and dvc plots diff now write pages that draw offline "
          f"({out.stat().st_size / 2**20:.1f} MiB)")
    return 0
