"""``symkit compare A B [C ...]``: is the difference between evaluated runs real?

Each argument is an *arm*: the evaluation results of one run, read from a directory (or
``workspace``, the current directory) or from a git revision of the repository in the current
directory (a commit, branch, tag or DVC experiment name). The first arm is the baseline; every
other arm is compared with it on the pieces both scored (:mod:`pipeline.scoring.compare`), and
the command says which parameters differ, whether the difference is significant after Holm's
correction, and whether the arms are equivalent within a margin. See ``docs/compare.md``.

An arm's files, relative to its root: ``params.yaml``, ``reports/eval.json``,
``reports/eval/per_piece.parquet`` and, optionally, ``reports/train.json``. Outputs:
``compare.json``, ``compare.md`` and ``compare.html`` in ``--out``; no timestamps or absolute
paths (sources appear as the user gave them).

A tool, not a DVC stage: no stage runs it and nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from ruamel.yaml import YAMLError

from pipeline.core import artifacts
from pipeline.core.artifacts import ArtifactError
from pipeline.core.config import ParamsError, parse_yaml, read_params
from pipeline.report.document import Document, Heading, Para, Table, render_html, render_markdown
from pipeline.scoring import compare as stats
from pipeline.scoring.compare import Refusal

PARAMS, EVAL, PER_PIECE, TRAIN = ("params.yaml", "reports/eval.json",
                                  "reports/eval/per_piece.parquet", "reports/train.json")
"""An arm's files, relative to its root (a directory or a commit's tree)."""
COLUMNS = ["sha256", "split", "model", "group_id", "nll_nats", "n_tokens", "n_notes",
           "duration_s"]
"""per_piece.parquet columns an arm needs; ``seed`` too when present (results written before
training seeds existed lack it: one model per name, as a null seed)."""
METRIC_NAMES = {"nats_per_note": "NLL per note", "nats_per_second": "NLL per second",
                "nats_per_token": "NLL per token"}
TEST_WARNING = ("compared on test: test results must not be used to pick a winner among arms "
                "(a sweep picks on val, then scores its one choice on test)")
SCHEMA_VERSION = 1


class SourceError(ValueError):
    """An arm's source is neither a directory nor a git revision; the message lists what was
    tried."""


# ---- where an arm comes from ----------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """An arm's source: ``name`` as the user gave it; ``kind`` ``directory`` (``root``) or
    ``git`` (``commit``, and ``ref`` when the name was a DVC experiment under ``refs/exps``)."""

    name: str
    kind: Literal["directory", "git"]
    root: Path | None = None
    commit: str | None = None
    ref: str | None = None

    def where(self, rel: str) -> str:
        """How a file of this arm is named in messages."""
        if self.kind == "directory":
            return (Path(self.name) / rel).as_posix()
        return f"{self.name}:{rel} (commit {self.commit[:12] if self.commit else '?'})"

    def read(self, rel: str) -> bytes | None:
        """The file's bytes, or None when the arm has no such file."""
        if self.kind == "directory":
            path = self.root / rel  # type: ignore[operator]
            return path.read_bytes() if path.is_file() else None
        done = _git("show", f"{self.commit}:{rel}")
        return done.stdout if done.returncode == 0 else None


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    """``git args`` in the current directory, without a shell; output as bytes."""
    try:
        return subprocess.run(["git", *args], capture_output=True, check=False)
    except FileNotFoundError:  # git not installed: every lookup fails the same way
        return subprocess.CompletedProcess(["git", *args], 127, b"", b"git: command not found")


def resolve_source(name: str) -> Source:
    """A directory that exists wins (``workspace`` is the current directory); then a git
    revision (``git rev-parse --verify --quiet <name>^{commit}``); then a DVC experiment: a ref
    under ``refs/exps`` whose last component is ``name``. :class:`SourceError` lists the tries."""
    if name == "workspace":
        return Source(name, "directory", root=Path("."))
    if Path(name).is_dir():
        return Source(name, "directory", root=Path(name))
    tried = [f"no directory {name!r}"]
    rev = _git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
    if rev.returncode == 0:
        return Source(name, "git", commit=rev.stdout.decode().strip())
    err = rev.stderr.decode(errors="replace").strip()
    tried.append(f"not a git revision (`git rev-parse --verify {name}^{{commit}}`"
                 + (f": {err.splitlines()[0]})" if err else ")"))
    refs = _git("for-each-ref", "--format=%(refname)", "refs/exps")
    matches = sorted(r for r in refs.stdout.decode().split()
                     if r.rsplit("/", 1)[-1] == name and not r.startswith("refs/exps/exec/"))
    if len(matches) > 1:
        raise SourceError(f"arm {name!r} is ambiguous: DVC experiments {', '.join(matches)}; "
                          "give one of their commits instead")
    if len(matches) == 1:
        commit = _git("rev-parse", "--verify", "--quiet", f"{matches[0]}^{{commit}}")
        if commit.returncode == 0:
            return Source(name, "git", commit=commit.stdout.decode().strip(), ref=matches[0])
    tried.append(f"no DVC experiment named {name!r} under refs/exps")
    raise SourceError(f"cannot find arm {name!r}: {'; '.join(tried)}. Give a directory holding "
                      f"{PARAMS} and {EVAL}, `workspace`, a commit, branch, tag or experiment name")


def unique_labels(names: Sequence[str]) -> list[str]:
    """The names as given, a repeated one suffixed ``#2``, ``#3``, ... (``HEAD``, ``HEAD#2``)."""
    labels: list[str] = []
    for n in names:
        label, k = n, 1
        while label in labels:
            k += 1
            label = f"{n}#{k}"
        labels.append(label)
    return labels


# ---- what an arm holds ----------------------------------------------------------------------
@dataclass(frozen=True)
class Arm:
    """One evaluated run: its label, source, params, eval.json, per-piece rows and, when it has
    one, the training summary."""

    label: str
    source: Source
    params: dict[str, Any]
    eval: dict[str, Any]
    per_piece: pd.DataFrame
    train: dict[str, Any] | None

    @property
    def protocol(self) -> dict[str, Any]:
        return self.eval.get("protocol") or {}


def _required(src: Source, rel: str) -> bytes:
    data = src.read(rel)
    if data is None:
        raise ArtifactError(f"{src.where(rel)} does not exist: an arm needs {PARAMS}, {EVAL} and "
                            f"{PER_PIECE} (run `dvc repro evaluate` for it)")
    return data


def _json(src: Source, rel: str, data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ArtifactError(f"{src.where(rel)} is not a readable JSON file") from None


def load_arm(src: Source, label: str) -> Arm:
    """Read an arm's files (a directory through the project's readers, a commit through
    ``git show``); missing or unreadable files raise ArtifactError or ParamsError naming them."""
    if src.kind == "directory":
        root = src.root
        params = read_params(root / PARAMS)  # type: ignore[operator]
        evaluation = artifacts.read_json(root / EVAL)  # type: ignore[operator]
        table = artifacts.read_table(root / PER_PIECE)  # type: ignore[operator]
    else:
        try:
            params = parse_yaml(_required(src, PARAMS).decode("utf-8")) or {}
        except (YAMLError, UnicodeDecodeError) as e:
            raise ParamsError(f"{src.where(PARAMS)}: not valid YAML: {e}") from e
        evaluation = _json(src, EVAL, _required(src, EVAL))
        try:
            table = pq.read_table(pa.BufferReader(_required(src, PER_PIECE)))
        except (pa.ArrowException, OSError):
            raise ArtifactError(f"{src.where(PER_PIECE)} is not a readable Parquet file") from None
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise ArtifactError(f"{src.where(PER_PIECE)} has no column "
                            f"{', '.join(map(repr, missing))}: re-run `dvc repro evaluate`")
    per_piece = table.select([c for c in [*COLUMNS, "seed"] if c in table.column_names]
                             ).to_pandas()
    if "seed" not in per_piece:
        per_piece["seed"] = pd.Series(pd.NA, index=per_piece.index, dtype="Int64")
    if not isinstance(params, dict):
        raise ParamsError(f"{src.where(PARAMS)}: top level must be a mapping of sections")
    if not isinstance(evaluation, dict):
        raise ArtifactError(f"{src.where(EVAL)} is not a JSON object")
    train_bytes = src.read(TRAIN)
    train = _json(src, TRAIN, train_bytes) if train_bytes is not None else None
    return Arm(label, src, params, evaluation, per_piece,
               train if isinstance(train, dict) else None)


def check_split_hashes(arms: Sequence[Arm]) -> None:
    """:class:`Refusal` unless every arm's ``protocol.split_hash`` is present and the same."""
    hashes = {a.label: a.protocol.get("split_hash") for a in arms}
    listed = "; ".join(f"{label!r}: {h}" for label, h in hashes.items())
    if any(not h for h in hashes.values()):
        raise Refusal(f"no protocol.split_hash in {EVAL} of some arms ({listed}); re-run "
                      "`dvc repro evaluate` for them")
    if len(set(hashes.values())) > 1:
        raise Refusal(f"the arms were scored on different splits (protocol.split_hash): {listed}. "
                      "Scores on different pieces cannot be paired; compare runs of one split")


def model_rows(arm: Arm, model: str, split: str) -> pd.DataFrame:
    """The arm's rows of ``model`` on ``split``; :class:`Refusal` when there are none."""
    pp = arm.per_piece
    rows = pp[(pp["model"] == model) & (pp["split"] == split)]
    if rows.empty:
        have = sorted(set(pp.loc[pp["split"] == split, "model"]))
        raise Refusal(f"arm {arm.label!r} has no {model!r} scores on {split} (models scored "
                      f"there: {', '.join(have) or 'none'}); choose another --model or --split")
    return rows


# ---- the comparison -------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """The command's options (recorded in compare.json)."""

    split: str = "val"
    model: str = "transformer"
    n_boot: int = 2000
    ci_level: float = 0.95
    seed: int = 0
    equivalence_margin: float = 0.005

    @property
    def alpha(self) -> float:
        return round(1.0 - self.ci_level, 12)


def _arm_record(arm: Arm, scores: stats.ArmScores) -> dict[str, Any]:
    p = arm.protocol
    return {"label": arm.label, "source": arm.source.name, "kind": arm.source.kind,
            "commit": arm.source.commit, "ref": arm.source.ref,
            "split_hash": p.get("split_hash"), "tokenizer_hash": p.get("tokenizer_hash"),
            "transformer_stride": p.get("transformer_stride"),
            "seeds": scores.seeds, "n_seeds": scores.n_seeds, "n_pieces": len(scores.shas),
            "train_config_hash": (arm.train or {}).get("config_hash")}


def compare(arms: Sequence[Arm], cfg: Settings) -> dict[str, Any]:
    """compare.json's content for ``arms`` (the first is the baseline). Refusals first: split
    hashes, the model's rows, the pieces and groups of every pair; then the statistics, one
    Generator ``default_rng([seed, k])`` for the comparison with arm ``k`` (1-based), so adding
    an arm changes no other comparison's draws."""
    check_split_hashes(arms)
    scores = [stats.arm_scores(model_rows(a, cfg.model, cfg.split), a.label) for a in arms]
    base, base_scores = arms[0], scores[0]
    pairs = [stats.pair(base_scores, s, base.label, a.label, cfg.split)
             for a, s in zip(arms[1:], scores[1:], strict=True)]
    flat_base = stats.flatten_params(base.params)
    comparisons = []
    for k, (arm, p) in enumerate(zip(arms[1:], pairs, strict=True), start=1):
        tok_a, tok_b = base.protocol.get("tokenizer_hash"), arm.protocol.get("tokenizer_hash")
        omitted = {}
        metrics = [m for m in stats.METRICS if m[0] != "nats_per_token"]
        if tok_a and tok_a == tok_b:
            metrics.append(("nats_per_token", "n_tokens"))
        else:
            omitted["nats_per_token"] = (
                f"tokenizer_hash differs ({str(tok_a)[:12]} vs {str(tok_b)[:12]}): token "
                "counts are not comparable across tokenizers; per note and per second are")
        diff = stats.params_diff(flat_base, stats.flatten_params(arm.params))
        comparisons.append({
            "arm": arm.label, "baseline": base.label, "rng": [cfg.seed, k],
            "design": stats.design_label(len(diff)), "params_diff": diff,
            "protocol_diff": stats.protocol_diff(base.protocol, arm.protocol),
            **stats.pair_summary(p),
            "metrics": stats.compare_pair(p, metrics, n_boot=cfg.n_boot, level=cfg.ci_level,
                                          rng=np.random.default_rng([cfg.seed, k]),
                                          margin=cfg.equivalence_margin),
            "omitted_metrics": omitted})
    stats.apply_holm([c["metrics"] for c in comparisons], cfg.alpha)
    for c in comparisons:
        for key, block in c["metrics"].items():
            block["conclusion"] = _conclusion(block)
            block["verdict"] = verdict(c, key, cfg, n_comparisons=len(comparisons))
    warnings = [TEST_WARNING] if cfg.split == "test" else []
    warnings += [f"{c['arm']!r}: the scoring protocol differs from {c['baseline']!r}'s but no "
                 "parameter does: one arm's eval.json may be stale (re-run `dvc repro evaluate`)"
                 for c in comparisons if c["protocol_diff"] and not c["params_diff"]]
    return {
        "schema_version": SCHEMA_VERSION, "split": cfg.split, "model": cfg.model,
        "baseline": base.label, "warnings": warnings,
        "settings": {"n_boot": cfg.n_boot, "ci_level": cfg.ci_level, "alpha": cfg.alpha,
                     "seed": cfg.seed, "equivalence_margin": cfg.equivalence_margin,
                     "p_value": "two-sided bootstrap: min(1, 2 * min(1 + #(d <= 0), "
                                "1 + #(d >= 0)) / (n_boot + 1)) over the replicate differences",
                     "multiple_comparisons": "holm, per metric, across the comparisons"},
        "arms": [_arm_record(a, s) for a, s in zip(arms, scores, strict=True)],
        "comparisons": comparisons,
    }


def _conclusion(block: dict[str, Any]) -> str:
    """``arm_lower`` / ``arm_higher`` (significant after Holm), else ``equivalent`` or
    ``inconclusive``."""
    if block["significant"]:
        return "arm_lower" if block["diff"]["value"] > 0 else "arm_higher"
    return "equivalent" if block["equivalent"] else "inconclusive"


# ---- words ----------------------------------------------------------------------------------
def _value(v: Any, limit: int = 40) -> str:
    """A parameter value as text, cut to ``limit`` characters in prose and tables (compare.json
    keeps it whole)."""
    text = v if isinstance(v, str) else stats.canonical(v)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _side(row: dict[str, Any], side: str) -> str:
    """One side of a params-diff row as text (``(absent)`` where the key is missing)."""
    return "(absent)" if row["absent"] == side else _value(row[side])


def _change(row: dict[str, Any]) -> str:
    return f"{row['key']} {_side(row, 'baseline')} → {_side(row, 'arm')}"


def design_words(c: dict[str, Any]) -> str:
    """``controlled: one param differs (transformer.train.max_steps 400 → 800)``; for a
    confounded comparison the keys only (their values are in the table)."""
    diff = c["params_diff"]
    if not diff:
        text = "identical: no param differs"
    elif len(diff) == 1:
        text = f"controlled: one param differs ({_change(diff[0])})"
    else:
        text = f"confounded: {len(diff)} params differ ({', '.join(r['key'] for r in diff)})"
    if c["protocol_diff"]:
        text += f"; scoring protocol differs ({'; '.join(map(_change, c['protocol_diff']))})"
    return text


def _pct(x: float) -> str:
    return f"{abs(x) * 100:.1f}%"


def _interval_words(lo: float, hi: float) -> str:
    if lo >= 0:
        return f"{_pct(lo)}–{_pct(hi)} lower"
    if hi <= 0:
        return f"{_pct(hi)}–{_pct(lo)} higher"
    return f"{_pct(lo)} higher to {_pct(hi)} lower"


def _p_words(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"= {p:.2g}"


def finding(c: dict[str, Any], key: str, cfg: Settings, *, n_comparisons: int) -> str:
    """What a comparison shows for one metric: the effect, its interval, p and the conclusion."""
    m, a, b = c["metrics"][key], c["baseline"], c["arm"]
    name, rel = METRIC_NAMES[key], m["rel_improvement"]
    if n_comparisons > 1:
        p_text = f"Holm p {_p_words(m['p_holm'])}, raw p {_p_words(m['p_value'])}"
    else:
        p_text = f"p {_p_words(m['p_value'])}"
    if m["diff"]["value"] == 0 and m["diff"]["ci_low"] == 0 and m["diff"]["ci_high"] == 0:
        head = f"{b}'s {name} equals {a}'s on every piece (difference 0, {p_text})"
    else:
        v = rel["value"]
        direction = "lower" if v > 0 else "higher" if v < 0 else "the same as"
        head = (f"{b}'s {name} is {_pct(v)} {direction} than {a}'s ({cfg.ci_level * 100:g}% CI "
                f"{_interval_words(rel['ci_low'], rel['ci_high'])}, {p_text})")
    alpha = f"alpha = {cfg.alpha:g}" + (" after Holm" if n_comparisons > 1 else "")
    margin = f"±{cfg.equivalence_margin * 100:g}%"
    return (f"{head}: " + (f"a real difference at {alpha}" if m["significant"]
                           else f"no difference shown at {alpha}")
            + (f", equivalent within {margin}" if m["equivalent"]
               else f", not shown equivalent within {margin}"))


def context(c: dict[str, Any], split: str) -> str:
    """On which pieces, groups and seeds a comparison stands, and its design."""
    a, b = c["baseline"], c["arm"]
    sa, sb = c["n_seeds_baseline"], c["n_seeds_arm"]
    if sa == sb:
        seeds = "" if sa == 1 else f", {sa} training seeds each" + (
            " (paired by seed)" if c["seed_pairing"] == "paired" else "")
    else:
        seeds = f", {a} {sa} training seed{'s' * (sa > 1)} and {b} {sb}"
    return (f"on {c['n_pieces']} {split} pieces in {c['n_groups']} groups{seeds}; "
            f"{design_words(c)}")


def verdict(c: dict[str, Any], key: str, cfg: Settings, *, n_comparisons: int) -> str:
    """One self-contained sentence on a comparison's metric, in plain words."""
    return (f"{finding(c, key, cfg, n_comparisons=n_comparisons)}; "
            f"{context(c, cfg.split)}.")


def _ci(block: dict[str, Any], scale: float = 1.0, digits: int = 4) -> str:
    f = f"{{:.{digits}g}}"
    return (f"{f.format(block['value'] * scale)} [{f.format(block['ci_low'] * scale)}, "
            f"{f.format(block['ci_high'] * scale)}]")


def build_document(result: dict[str, Any], cfg: Settings) -> Document:
    """compare.md / compare.html's blocks from compare.json's content."""
    split, model, level = result["split"], result["model"], result["settings"]["ci_level"]
    doc = Document(f"symkit compare: {model} on {split}")
    arms = result["arms"]
    doc.add(Para(f"{len(arms) - 1} arm{'s' * (len(arms) > 2)} compared with the baseline "
                 f"{result['baseline']} on the {split} pieces both scored; NLL in nats, lower is "
                 f"better; intervals are {level * 100:g}% bootstrap intervals over groups and "
                 "training seeds."))
    doc.add(*(Para(w, kind="warn") for w in result["warnings"]))
    for c in result["comparisons"]:
        doc.add(Heading(f"{c['arm']} against {c['baseline']}"))
        here = context(c, split)
        doc.add(Para(here[0].upper() + here[1:] + "."))
        doc.add(*(Para(finding(c, k, cfg, n_comparisons=len(result["comparisons"])) + ".")
                  for k in c["metrics"]))
        doc.add(*(Para(f"{METRIC_NAMES[k]} not compared: {why}", kind="note")
                  for k, why in c["omitted_metrics"].items()))
    doc.add(Heading("Statistics"),
            Table(["arm", "metric", "baseline", "arm value", "A − B", "relative improvement %",
                   "p", "Holm p", "significant", "equivalent", "median piece effect %"],
                  [[c["arm"], k, _ci(m["baseline"]), _ci(m["arm"]), _ci(m["diff"], digits=3),
                    _ci(m["rel_improvement"], 100, 3), f"{m['p_value']:.3g}",
                    f"{m['p_holm']:.3g}", str(m["significant"]).lower(),
                    str(m["equivalent"]).lower(), f"{c['median_piece_effect'] * 100:.3g}"]
                   for c in result["comparisons"] for k, m in c["metrics"].items()]))
    doc.add(Heading("Arms"),
            Table(["arm", "source", "commit", "split hash", "tokenizer hash", "seeds", "pieces"],
                  [[a["label"], a["source"], (a["commit"] or "")[:12], a["split_hash"][:12],
                    str(a["tokenizer_hash"] or "")[:12],
                    ", ".join(map(str, a["seeds"])) or "none", str(a["n_pieces"])]
                   for a in arms]))
    rows = [[c["arm"], c["design"], r["key"], _side(r, "baseline"), _side(r, "arm")]
            for c in result["comparisons"] for r in c["params_diff"] + c["protocol_diff"]]
    doc.add(Heading("What differs from the baseline"),
            Para("params.yaml keys, flattened, with the runtime and report sections left out "
                 "(they never change results), then the scoring protocol's transformer_stride "
                 "and bootstrap settings from eval.json; long values are cut here and whole in "
                 "compare.json.", kind="note"),
            Table(["arm", "design", "key", "baseline", "arm value"], rows) if rows
            else Para("No parameter or protocol setting differs from the baseline."))
    doc.add(Heading("Method"), Para(
        f"Each comparison pairs the baseline (A) and the arm (B) on the same pieces. Replicate "
        f"b of {result['settings']['n_boot']} draws the groups with replacement, then each "
        "arm's training seeds (one draw for both when the arms list the same seeds); NLL per "
        "note, second or token is a ratio of sums over the drawn groups of the NLL averaged "
        "over the drawn seeds. The relative improvement (A − B) / A is formed inside each "
        "replicate. p is the two-sided bootstrap p-value of A − B "
        f"({result['settings']['p_value']}); with several arms, Holm's correction per metric. "
        f"Equivalent: the whole relative-improvement interval lies within "
        f"±{result['settings']['equivalence_margin'] * 100:g}%. See docs/compare.md.",
        kind="note"))
    return doc


# ---- command line ---------------------------------------------------------------------------
def run(sources: Sequence[str], cfg: Settings, out: Path) -> dict[str, Any]:
    """Resolve, load and compare the arms; write compare.json, .md and .html into ``out``."""
    labels = unique_labels(sources)
    arms = [load_arm(resolve_source(name), label) for name, label in zip(sources, labels,
                                                                           strict=True)]
    result = compare(arms, cfg)
    doc = build_document(result, cfg)
    artifacts.write_json(out / "compare.json", result)
    artifacts.write_text(out / "compare.md", render_markdown(doc))
    artifacts.write_text(out / "compare.html", render_html(doc))
    return result


def summary_line(c: dict[str, Any]) -> str:
    """One line per comparison for stdout (NLL per note)."""
    m = c["metrics"]["nats_per_note"]
    rel = m["rel_improvement"]
    return (f"compare: {c['arm']} vs {c['baseline']} ({c['design']}): nats/note "
            f"{m['baseline']['value']:.4f} -> {m['arm']['value']:.4f}, improvement "
            f"{rel['value']:+.2%} [{rel['ci_low']:+.2%}, {rel['ci_high']:+.2%}], p = "
            f"{m['p_value']:.3g}, Holm p = {m['p_holm']:.3g}: {m['conclusion']}")


def _fraction(text: str) -> float:
    v = float(text)
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"{text}: must lie strictly between 0 and 1")
    return v


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be an integer >= 1")
    return v


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("arms", nargs="+", metavar="ARM",
                        help="two or more runs, the first is the baseline: a directory with "
                             f"{PARAMS} and {EVAL}, `workspace`, or a git commit, branch, tag "
                             "or DVC experiment name")
    parser.add_argument("--split", choices=["val", "test"], default="val",
                        help="split compared (default val; test only to report a choice "
                             "already made on val)")
    parser.add_argument("--model", default="transformer",
                        help="model whose scores are compared across arms (default transformer)")
    parser.add_argument("--n-boot", type=_positive, default=2000,
                        help="bootstrap replicates (default 2000)")
    parser.add_argument("--ci-level", type=_fraction, default=0.95,
                        help="interval coverage; alpha = 1 - ci-level (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--equivalence-margin", type=_fraction, default=0.005,
                        help="relative margin for `equivalent` (default 0.005 = 0.5%%)")
    parser.add_argument("--out", type=Path, default=Path("reports/compare"),
                        help="output folder (default reports/compare)")


def main(args: argparse.Namespace) -> int:
    if len(args.arms) < 2:
        print("symkit compare: give at least two arms (the first is the baseline)",
              file=sys.stderr)
        return 2
    cfg = Settings(split=args.split, model=args.model, n_boot=args.n_boot,
                   ci_level=args.ci_level, seed=args.seed,
                   equivalence_margin=args.equivalence_margin)
    if cfg.split == "test":
        print(f"symkit compare: warning: {TEST_WARNING}", file=sys.stderr)
    try:
        result = run(args.arms, cfg, args.out)
    except (Refusal, SourceError) as e:
        print(f"symkit compare: {e}", file=sys.stderr)
        return 2
    for c in result["comparisons"]:
        print(summary_line(c))
    print(f"compare: wrote {(args.out / 'compare.json').as_posix()}, compare.md, compare.html")
    return 0
