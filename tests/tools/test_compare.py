"""``symkit compare`` (pipeline.tools.compare) and what it writes; the statistics alone
(pipeline.stats.paired) are tested in tests/stats/test_paired.py, and
pipeline.report.compare_document's own functions in tests/report/test_compare_document.py.

Arms are built in ``tmp_path`` from synthetic per-piece scores (tests/stats/test_paired.py's):
never from the repository's own ``reports/``, which a pipeline run may be rewriting.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.cli import main
from pipeline.tools.runs import RunSource, read_curves, resolve_source
from tests.stats.test_paired import PARAMS, pieces, scored, simulate

ROOT = Path(__file__).resolve().parents[2]

SPLIT_HASH = "5" * 64
TOKENIZER_HASH = "7" * 64


# ---- synthetic arms ---------------------------------------------------------------------------
def write_arm(root: Path, rows: pd.DataFrame, params: dict | None = None, *,
              split_hash: str = SPLIT_HASH, tokenizer_hash: str = TOKENIZER_HASH,
              stride: int = 64) -> Path:
    """An arm folder: params.yaml, reports/eval.json (protocol only), per_piece.parquet."""
    (root / "reports" / "eval").mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params or PARAMS, sort_keys=False))
    protocol = {"split_hash": split_hash, "tokenizer_hash": tokenizer_hash,
                "transformer_stride": stride,
                "bootstrap": {"n_boot": 2000, "ci_level": 0.95, "seed": 0}}
    (root / "reports" / "eval.json").write_text(json.dumps({"protocol": protocol}))
    table = pa.table({
        "sha256": rows["sha256"].astype(str), "split": rows["split"], "model": rows["model"],
        "seed": pa.array([None if pd.isna(s) else int(s) for s in rows["seed"]], pa.int64()),
        "group_id": rows["group_id"], "nll_nats": rows["nll_nats"].astype(float),
        "n_tokens": rows["n_tokens"].astype(np.int64), "n_notes": rows["n_notes"].astype(np.int64),
        "duration_s": rows["duration_s"].astype(float)})
    pq.write_table(table, root / "reports" / "eval" / "per_piece.parquet")
    return root


def run_cli(tmp_path: Path, monkeypatch, *args: str) -> int:
    monkeypatch.chdir(tmp_path)
    return main(["compare", "--n-boot", "300", *args])


def result(tmp_path: Path, out: str = "reports/compare") -> dict:
    return json.loads((tmp_path / out / "compare.json").read_text())


@pytest.fixture
def two_arms(tmp_path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Baseline and an arm 3% better, 3 training seeds each, written as folders a/ and b/."""
    a, b = simulate(np.random.default_rng(1), 0.03, seeds=(1, 2, 3), seed_sd=0.005)
    write_arm(tmp_path / "a", a)
    write_arm(tmp_path / "b", b)
    return a, b


# ---- 1. a run against itself ---------------------------------------------------------------
@pytest.mark.parametrize("seeds", [(), (1, 2, 3)], ids=["no seeds", "3 seeds"])
def test_a_run_compared_with_itself_differs_by_exactly_zero(tmp_path, monkeypatch, capsys,
                                                            seeds):
    a, _ = simulate(np.random.default_rng(2), 0.0, seeds=seeds, seed_sd=0.02)
    write_arm(tmp_path / "run", a)
    assert run_cli(tmp_path, monkeypatch, "run", "run") == 0
    c = result(tmp_path)["comparisons"][0]
    assert c["arm"] == "run#2" and c["design"] == "identical"
    assert set(c["metrics"]) == {"nats_per_note", "nats_per_second", "nats_per_token"}
    for m in c["metrics"].values():
        assert m["diff"] == {"value": 0.0, "ci_low": 0.0, "ci_high": 0.0, "share_a_lower": 0.0}
        assert m["rel_improvement"] == {"value": 0.0, "ci_low": 0.0, "ci_high": 0.0}
        assert m["equivalent"] is True and m["p_value"] == 1.0 and m["conclusion"] == "equivalent"
    assert "run#2 vs run (identical)" in capsys.readouterr().out


# ---- 2, 3. refusals --------------------------------------------------------------------------
def test_different_split_hashes_are_refused_naming_both(tmp_path, monkeypatch, capsys,
                                                        two_arms):
    write_arm(tmp_path / "b", two_arms[1], split_hash="9" * 64)
    assert run_cli(tmp_path, monkeypatch, "a", "b") == 2
    err = capsys.readouterr().err
    assert SPLIT_HASH in err and "9" * 64 in err and "different splits" in err
    assert not (tmp_path / "reports" / "compare").exists()


def test_different_scored_pieces_are_refused_with_counts_and_examples(tmp_path, monkeypatch,
                                                                      capsys, two_arms):
    b = two_arms[1]
    dropped = sorted(set(b["sha256"]))[:2]
    write_arm(tmp_path / "b", b[~b["sha256"].isin(dropped)])
    assert run_cli(tmp_path, monkeypatch, "a", "b") == 2
    err = capsys.readouterr().err
    assert "different val pieces" in err and "'a' 90, 'b' 88" in err
    assert "2 only in 'a'" in err and "0 only in 'b'" in err
    assert all(s[:12] in err for s in dropped)


def _add_to_eval(root: Path, **blocks) -> None:
    path = root / "reports" / "eval.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **blocks}))


def test_lossy_or_unscored_pieces_of_any_arm_are_left_out_of_every_comparison(
        tmp_path, monkeypatch, capsys, two_arms):
    """A tokenizer that drops notes, or fails on some pieces, must not look better for it: the
    pieces an arm's evaluate lists as lossy or not scored (with a reason) leave every arm."""
    b = two_arms[1]
    shas = sorted(set(b["sha256"]))
    lossy, failed = shas[0], shas[1]
    # arm b encodes `lossy` lossily (still scored) and could not encode `failed` (not scored)
    write_arm(tmp_path / "b", b[b["sha256"] != failed])
    _add_to_eval(tmp_path / "b",
                 fidelity={"pieces": [{"sha256": lossy, "split": "val",
                                       "flags": ["notes_dropped"]}]},
                 excluded={"pieces": [{"sha256": failed, "reason": "not_encoded"}]})
    assert run_cli(tmp_path, monkeypatch, "a", "b") == 0
    r = result(tmp_path)
    assert r["excluded"]["n_pieces"] == 2
    assert r["excluded"]["by_arm"] == {
        "a": [], "b": sorted([{"sha256": lossy, "reason": "lossy: notes_dropped"},
                              {"sha256": failed, "reason": "not scored: not_encoded"}],
                             key=lambda p: p["sha256"])}
    assert [arm["n_pieces"] for arm in r["arms"]] == [len(shas) - 2] * 2
    assert r["comparisons"][0]["n_pieces"] == len(shas) - 2
    assert any("2 val pieces left out of every comparison" in w for w in r["warnings"])
    md = (tmp_path / "reports" / "compare" / "compare.md").read_text()
    assert "left out of every comparison" in md
    # the same missing piece without a recorded reason is still refused
    write_arm(tmp_path / "b", b[b["sha256"] != failed])
    assert run_cli(tmp_path, monkeypatch, "a", "b") == 2
    assert "different val pieces" in capsys.readouterr().err


def test_a_lossy_piece_on_another_split_changes_nothing(tmp_path, monkeypatch, two_arms):
    a, b = two_arms
    _add_to_eval(tmp_path / "b", fidelity={"pieces": [
        {"sha256": sorted(set(b["sha256"]))[0], "split": "test", "flags": ["roundtrip_lossy"]}]})
    assert run_cli(tmp_path, monkeypatch, "a", "b") == 0
    r = result(tmp_path)
    assert r["excluded"]["n_pieces"] == 0 and r["arms"][0]["n_pieces"] == len(set(a["sha256"]))
    assert not r["warnings"]


def test_a_piece_in_different_groups_is_refused(tmp_path, monkeypatch, capsys, two_arms):
    b = two_arms[1].copy()
    b.loc[b["sha256"] == b["sha256"].iloc[0], "group_id"] = "elsewhere"
    write_arm(tmp_path / "b", b)
    assert run_cli(tmp_path, monkeypatch, "a", "b") == 2
    assert "in different groups" in capsys.readouterr().err


def test_an_arm_without_the_model_is_refused(tmp_path, monkeypatch, capsys, two_arms):
    assert run_cli(tmp_path, monkeypatch, "a", "b", "--model", "ngram") == 2
    err = capsys.readouterr().err
    assert "no 'ngram' scores on val" in err and "transformer" in err


def test_an_unknown_source_lists_what_was_tried(tmp_path, monkeypatch, capsys, two_arms):
    assert run_cli(tmp_path, monkeypatch, "a", "no-such-run") == 2
    err = capsys.readouterr().err
    assert "no directory 'no-such-run'" in err and "not a git revision" in err
    assert "no DVC experiment named 'no-such-run'" in err


# ---- 5. Holm ---------------------------------------------------------------------------------


def test_holm_over_three_arms_in_the_outputs(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(4)
    p = pieces(rng, 30, 3)
    g = p["group_id"].str[1:].astype(int).to_numpy()
    write_arm(tmp_path / "base", scored(p, np.ones(len(p)), [], rng))
    for name, effect in [("b", 0.004), ("c", 0.008), ("d", 0.0)]:
        factor = 1 - effect + rng.normal(0, 0.01, 30)[g]
        write_arm(tmp_path / name, scored(p, factor, [], rng))
    assert run_cli(tmp_path, monkeypatch, "base", "b", "c", "d") == 0
    comps = result(tmp_path)["comparisons"]
    for key in ("nats_per_note", "nats_per_second", "nats_per_token"):
        raw = [c["metrics"][key]["p_value"] for c in comps]
        adj = [c["metrics"][key]["p_holm"] for c in comps]
        order = np.argsort(raw, kind="stable")
        expected, running = [0.0] * 3, 0.0
        for rank, i in enumerate(order):  # (m − rank) · p, running maximum, capped at 1
            running = max(running, min(1.0, (3 - rank) * raw[i]))
            expected[i] = running
        assert adj == pytest.approx(expected)
        assert all(x >= r for x, r in zip(adj, raw, strict=True))
        assert [c["metrics"][key]["significant"] for c in comps] == [x <= 0.05 for x in adj]
    assert any(a > r for c in comps for a, r in [(c["metrics"]["nats_per_note"]["p_holm"],
                                                  c["metrics"]["nats_per_note"]["p_value"])])
    assert "Holm p" in (tmp_path / "reports" / "compare" / "compare.md").read_text()


def test_with_two_arms_the_adjusted_p_is_the_raw_p(tmp_path, monkeypatch, two_arms):
    assert run_cli(tmp_path, monkeypatch, "a", "b") == 0
    for m in result(tmp_path)["comparisons"][0]["metrics"].values():
        assert m["p_holm"] == m["p_value"]


# ---- 6. which params differ ------------------------------------------------------------------


def test_designs_are_labelled_and_runtime_and_report_are_ignored(tmp_path, monkeypatch,
                                                                 two_arms):
    b = two_arms[1]
    tr = PARAMS["transformer"]
    one = {**PARAMS, "transformer": {**tr, "train": {**tr["train"], "max_steps": 800}}}
    two = {**one, "tokenize": {**PARAMS["tokenize"], "vocab_size": 2000}}
    cosmetic = {**PARAMS, "runtime": {"workers": 1}, "report": {"title": "other"}}
    for name, params in [("one", one), ("two", two), ("cosmetic", cosmetic)]:
        write_arm(tmp_path / name, b, params)
    assert run_cli(tmp_path, monkeypatch, "a", "one", "two", "cosmetic") == 0
    comps = {c["arm"]: c for c in result(tmp_path)["comparisons"]}
    assert comps["one"]["design"] == "controlled"
    assert comps["one"]["params_diff"] == [{"key": "transformer.train.max_steps",
                                            "baseline": 400, "arm": 800, "absent": None}]
    assert comps["two"]["design"] == "confounded"
    assert [r["key"] for r in comps["two"]["params_diff"]] == ["tokenize.vocab_size",
                                                               "transformer.train.max_steps"]
    assert comps["cosmetic"]["design"] == "identical" and comps["cosmetic"]["params_diff"] == []
    md = (tmp_path / "reports" / "compare" / "compare.md").read_text()
    assert "controlled: one param differs (transformer.train.max_steps 400 → 800)" in md
    assert "confounded: 2 params differ (tokenize.vocab_size, transformer.train.max_steps)" in md


def test_a_scoring_protocol_difference_is_listed(tmp_path, monkeypatch, two_arms):
    write_arm(tmp_path / "b", two_arms[1], stride=32)
    assert run_cli(tmp_path, monkeypatch, "a", "b") == 0
    out = result(tmp_path)
    assert out["comparisons"][0]["protocol_diff"] == [
        {"key": "transformer_stride", "baseline": 64, "arm": 32, "absent": None}]
    assert any("may be stale" in w for w in out["warnings"])  # params say nothing changed


# ---- 7. per token only under one tokenizer ---------------------------------------------------
def test_per_token_is_omitted_across_tokenizers(tmp_path, monkeypatch, two_arms):
    write_arm(tmp_path / "c", two_arms[1], tokenizer_hash="8" * 64)
    assert run_cli(tmp_path, monkeypatch, "a", "b", "c") == 0
    comps = {c["arm"]: c for c in result(tmp_path)["comparisons"]}
    assert "nats_per_token" in comps["b"]["metrics"] and comps["b"]["omitted_metrics"] == {}
    assert set(comps["c"]["metrics"]) == {"nats_per_note", "nats_per_second"}
    assert "not comparable across tokenizers" in comps["c"]["omitted_metrics"]["nats_per_token"]
    # Holm per token runs over the one comparison that has it
    assert comps["b"]["metrics"]["nats_per_token"]["p_holm"] == \
        comps["b"]["metrics"]["nats_per_token"]["p_value"]
    md = (tmp_path / "reports" / "compare" / "compare.md").read_text()
    assert "NLL per token not compared: tokenizer_hash differs" in md


# ---- 8. training seeds ---------------------------------------------------------------------


def test_adding_an_arm_changes_no_other_comparison(tmp_path, monkeypatch, two_arms):
    write_arm(tmp_path / "c", two_arms[1].assign(nll_nats=two_arms[1]["nll_nats"] * 1.01))
    assert run_cli(tmp_path, monkeypatch, "a", "b", "--out", "one") == 0
    assert run_cli(tmp_path, monkeypatch, "a", "b", "c", "--out", "two") == 0
    one, two = result(tmp_path, "one")["comparisons"][0], result(tmp_path, "two")["comparisons"][0]
    for key in one["metrics"]:
        for part in ("baseline", "arm", "diff", "rel_improvement"):
            assert one["metrics"][key][part] == two["metrics"][key][part]


# ---- 9. git revisions ----------------------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=x", "-c", "user.email=x@y",
                           "-c", "commit.gpgsign=false", *args], cwd=repo, check=True,
                          capture_output=True, text=True)
    return done.stdout.strip()


def test_git_revisions_branches_and_experiments_are_arms(tmp_path, monkeypatch, capsys):
    a, b = simulate(np.random.default_rng(8), 0.03, seeds=(1, 2, 3), seed_sd=0.005)
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    write_arm(repo, a)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "baseline")
    first = _git(repo, "rev-parse", "HEAD")
    _git(repo, "branch", "baseline-branch")
    _git(repo, "update-ref", "refs/exps/ab/cdef0123/my-exp", first)
    tr = PARAMS["transformer"]
    write_arm(repo, b, {**PARAMS, "transformer": {**tr, "train": {**tr["train"],
                                                                  "max_steps": 800}}})
    _git(repo, "commit", "-q", "-am", "longer training")
    (repo / "params.yaml").write_text("not: [valid")  # the working tree is not read
    monkeypatch.chdir(repo)
    assert main(["compare", "--n-boot", "200", "--out", "../out", first[:10], "HEAD",
                 "baseline-branch", "my-exp"]) == 0
    out = json.loads((tmp_path / "out" / "compare.json").read_text())
    arms = out["arms"]
    assert [x["label"] for x in arms] == [first[:10], "HEAD", "baseline-branch", "my-exp"]
    assert [x["kind"] for x in arms] == ["git"] * 4
    assert arms[0]["commit"] == first and arms[2]["commit"] == first
    assert arms[1]["commit"] == _git(repo, "rev-parse", "HEAD")
    assert arms[3]["ref"] == "refs/exps/ab/cdef0123/my-exp"
    head, branch, exp = out["comparisons"]
    assert head["design"] == "controlled" and head["metrics"]["nats_per_note"]["significant"]
    assert head["params_diff"][0]["key"] == "transformer.train.max_steps"
    assert branch["design"] == exp["design"] == "identical"
    assert exp["metrics"]["nats_per_note"]["diff"]["value"] == 0.0
    text = (tmp_path / "out" / "compare.json").read_text()
    assert str(tmp_path) not in text and "HEAD's NLL per note is" in text
    # a directory that exists wins over a git name
    write_arm(repo / "HEAD", a)
    assert main(["compare", "--n-boot", "200", "--out", "../out2", first, "HEAD"]) == 0
    assert json.loads((tmp_path / "out2" / "compare.json").read_text())["arms"][1]["kind"] == \
        "directory"
    # two experiments of one name are ambiguous
    _git(repo, "update-ref", "refs/exps/12/3456789a/my-exp", first)
    capsys.readouterr()
    assert main(["compare", "HEAD", "my-exp"]) == 2
    assert "ambiguous" in capsys.readouterr().err


# ---- 10, 11. test split, determinism ------------------------------------------------------------
def test_comparing_on_test_warns_in_every_output(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(9)
    a, b = simulate(rng, 0.02)
    ta, tb = simulate(rng, 0.02, n_groups=10)
    write_arm(tmp_path / "a", pd.concat([a, ta.assign(split="test")]))
    write_arm(tmp_path / "b", pd.concat([b, tb.assign(split="test")]))
    assert run_cli(tmp_path, monkeypatch, "a", "b", "--split", "test") == 0
    assert "must not be used to pick a winner" in capsys.readouterr().err
    out = result(tmp_path)
    assert out["split"] == "test" and out["comparisons"][0]["n_groups"] == 10
    assert any("must not be used to pick a winner" in w for w in out["warnings"])
    for ext in ("md", "html"):
        assert "must not be used to pick a winner" in \
            (tmp_path / "reports" / "compare" / f"compare.{ext}").read_text()
    assert run_cli(tmp_path, monkeypatch, "a", "b", "--out", "val") == 0
    assert result(tmp_path, "val")["warnings"] == []


def test_comparing_on_test_is_a_look_per_arm_and_on_val_none(tmp_path, monkeypatch):
    """Each arm's test rows are read through the gate: --split test appends a look per arm
    (command compare, its test pieces, the registration of the working directory) to the
    working directory's ledger, once; --split val reads no test row and records nothing."""
    from pipeline.decision import ledger

    rng = np.random.default_rng(9)
    a, b = simulate(rng, 0.02)
    ta, tb = simulate(rng, 0.02, n_groups=10)
    write_arm(tmp_path / "a", pd.concat([a, ta.assign(split="test")]))
    write_arm(tmp_path / "b", pd.concat([b, tb.assign(split="test")]))
    path = tmp_path / "reports" / "ledger.jsonl"
    assert run_cli(tmp_path, monkeypatch, "a", "b", "--out", "val") == 0
    assert not path.exists()
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "preregistration.json").write_text(json.dumps(
        {"identity_hash": "r1", "identity": {"params": {}}}))
    assert run_cli(tmp_path, monkeypatch, "a", "b", "--split", "test") == 0
    records = ledger.read(path)
    assert [r["command"] for r in records] == ["compare", "compare"]
    assert [r["inputs"] for r in records] == [
        ledger.results_digest(ledger.test_rows(t.assign(split="test"))) for t in (ta, tb)]
    assert all(r["pieces"] == sorted(set(ta["sha256"])) for r in records)
    assert all(r["registration"]["identity_hash"] == "r1" for r in records)
    before = path.read_bytes()
    assert run_cli(tmp_path, monkeypatch, "a", "b", "--split", "test") == 0
    assert run_cli(tmp_path, monkeypatch, "a", "b", "--out", "val") == 0
    assert path.read_bytes() == before


def test_outputs_are_byte_identical_across_runs(tmp_path, monkeypatch, two_arms):
    assert run_cli(tmp_path, monkeypatch, "a", "b", "--out", "one") == 0
    assert run_cli(tmp_path, monkeypatch, "a", "b", "--out", "two") == 0
    for name in ("compare.json", "compare.md", "compare.html"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    assert str(tmp_path) not in (tmp_path / "one" / "compare.json").read_text()


def test_a_directory_arm_is_recorded_by_its_relative_path(tmp_path, monkeypatch, capsys,
                                                         two_arms):
    """An absolute or untidy path given for a folder is written as the folder's path relative
    to the current directory: no output depends on where the project lies."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "a").rename(tmp_path / "runs" / "a")
    write_logs(tmp_path / "b", {"1": 3.9})
    (tmp_path / "b" / "reports" / "plots" / "train_log" / "seed-2.tsv").write_text("not a log")
    assert run_cli(tmp_path, monkeypatch, str(tmp_path / "runs" / "a"), "./b/", "runs/./a/",
                   "--out", "one") == 0
    out = result(tmp_path, "one")
    assert [(a["label"], a["source"]) for a in out["arms"]] == [
        ("runs/a", "runs/a"), ("b", "b"), ("runs/a#2", "runs/a")]
    assert out["baseline"] == "runs/a"
    assert [(c["baseline"], c["arm"]) for c in out["comparisons"]] == [
        ("runs/a", "b"), ("runs/a", "runs/a#2")]
    assert "b vs runs/a (identical)" in capsys.readouterr().out
    for name in ("compare.json", "compare.md", "compare.html"):
        text = (tmp_path / "one" / name).read_text()
        assert str(tmp_path) not in text
    assert "b/reports/plots/train_log/seed-2.tsv left out" in \
        (tmp_path / "one" / "compare.md").read_text()
    # the same arms from another folder: the paths are relative to it
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert main(["compare", "--n-boot", "300", "--no-figures", "--out", "two",
                 str(tmp_path / "runs" / "a"), "../b"]) == 0
    arms = json.loads((tmp_path / "sub" / "two" / "compare.json").read_text())["arms"]
    assert [a["label"] for a in arms] == ["../runs/a", "../b"]


def test_help_does_not_import_torch():
    code = ("import sys\nfrom pipeline.cli import main\ntry:\n    main(['compare', '--help'])\n"
            "except SystemExit:\n    pass\nassert 'torch' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert "--equivalence-margin" in done.stdout


# ---- 12. figures -----------------------------------------------------------------------------
FIGURE_NAMES = ("forest", "learning_curves", "scatter")
LOG_HEADER = "step\ttrain_loss\tval_loss\tlr\tgrad_norm\n"


def log_text(final: float, steps: int = 200, every: int = 50) -> str:
    """A training log as train_transformer writes it: val loss only every ``every`` steps."""
    rows = [LOG_HEADER]
    for step in range(1, steps + 1):
        loss = final + 3.0 / step ** 0.5
        val = f"{loss + 0.05:.5f}" if step % every == 0 else ""
        rows.append(f"{step}\t{loss:.5f}\t{val}\t0.001\t1.0\n")
    return "".join(rows)


def write_logs(root: Path, finals: dict[str, float]) -> None:
    """``reports/plots/train_log/seed-<s>.tsv`` per seed, or, for the key ``""``, the single
    ``reports/plots/train_log.tsv`` of runs made before training seeds."""
    for seed, final in finals.items():
        path = (root / "reports" / "plots" / "train_log.tsv" if seed == "" else
                root / "reports" / "plots" / "train_log" / f"seed-{seed}.tsv")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(log_text(final))


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, after checking its signature and IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_figures_are_written_linked_embedded_and_byte_identical(tmp_path, monkeypatch, capsys,
                                                                two_arms):
    write_logs(tmp_path / "a", {"1": 3.9, "2": 3.95, "3": 3.92})
    write_logs(tmp_path / "b", {"1": 3.8, "2": 3.85, "3": 3.82})
    assert run_cli(tmp_path, monkeypatch, "a", "b", "--out", "one") == 0
    assert "figures/*.png" in capsys.readouterr().out
    assert run_cli(tmp_path, monkeypatch, "a", "b", "--out", "two") == 0
    md = (tmp_path / "one" / "compare.md").read_text()
    html = (tmp_path / "one" / "compare.html").read_text()
    for name in FIGURE_NAMES:
        data = (tmp_path / "one" / "figures" / f"{name}.png").read_bytes()
        width, height = png_size(data)
        assert 300 < width < 1200 and 150 < height < 1000
        assert data == (tmp_path / "two" / "figures" / f"{name}.png").read_bytes()
        assert f"](figures/{name}.png)" in md
        assert base64.b64encode(data).decode("ascii") in html
    assert "No training logs" not in md and ".tsv left out" not in md
    assert "Points below the diagonal are pieces where the arm is better" in md  # caption shown
    for name in ("compare.json", "compare.md", "compare.html"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_no_figures_writes_none_and_never_loads_matplotlib(tmp_path, two_arms):
    code = ("import sys\nfrom pipeline.cli import main\ntry:\n    main(['compare', '--help'])\n"
            "except SystemExit:\n    pass\nassert 'matplotlib' not in sys.modules\n"
            "assert main(['compare', '--n-boot', '50', '--no-figures', '--out', 'plain', 'a', "
            "'b']) == 0\nassert 'matplotlib' not in sys.modules, 'loaded'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "--no-figures" in done.stdout and "figures/*.png" not in done.stdout
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == [
        "compare.html", "compare.json", "compare.md"]
    assert "Figures" not in (tmp_path / "plain" / "compare.md").read_text()
    assert "data:image/png" not in (tmp_path / "plain" / "compare.html").read_text()


def test_learning_curves_from_directory_and_git_arms(tmp_path, monkeypatch):
    """Folder layout and the single train_log.tsv of older runs, each from a directory and from
    a commit (read with git, never from the working tree); an arm without logs is a note."""
    a, b = simulate(np.random.default_rng(12), 0.02, seeds=(1, 2), seed_sd=0.005)
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    write_arm(repo, a.assign(seed=None).drop_duplicates("sha256"))
    write_logs(repo, {"": 3.9})
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one run, one log file")
    old = _git(repo, "rev-parse", "HEAD")
    (repo / "reports" / "plots" / "train_log.tsv").unlink()
    write_arm(repo, b)
    write_logs(repo, {"10": 3.8, "2": 3.85})
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "two seeds, a folder of logs")
    write_logs(repo, {"10": 9.0})  # the working tree is not read for a commit
    (repo / "reports" / "plots" / "train_log" / "seed-99.tsv").write_text("not a log")
    monkeypatch.chdir(repo)
    from_old = read_curves(resolve_source(old[:10]))
    assert list(from_old.seeds) == ["train_log.tsv"] and from_old.notes == ()
    step, val = from_old.seeds["train_log.tsv"]
    assert step.tolist() == [50, 100, 150, 200] and val[-1] == pytest.approx(3.9 + 3 / 200 ** .5
                                                                               + 0.05, abs=1e-5)
    from_head = read_curves(resolve_source("HEAD"))
    assert list(from_head.seeds) == ["seed 2", "seed 10"]  # in seed order
    assert from_head.seeds["seed 10"][1][-1] < 4.1
    workspace = read_curves(resolve_source("workspace"))  # a directory: the working tree
    assert workspace.seeds["seed 10"][1][-1] > 9.0
    assert any("seed-99.tsv left out" in n for n in workspace.notes)
    none = read_curves(RunSource("x", "directory", root=tmp_path))
    assert not none.seeds and none.missing == ("reports/plots/train_log/seed-<s>.tsv or "
                                               "reports/plots/train_log.tsv")
    write_arm(tmp_path / "nologs", b)
    assert main(["compare", "--n-boot", "50", "--out", "../out", old[:10], "HEAD",
                 str(tmp_path / "nologs")]) == 0
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "](figures/learning_curves.png)" in md
    assert "reports/plots/train_log.tsv) in ../nologs: not drawn" in md  # relative, not absolute
    assert png_size((tmp_path / "out" / "figures" / "learning_curves.png").read_bytes())


def test_run_writes_the_same_result_as_the_command_and_records_its_settings(
        tmp_path, monkeypatch, two_arms):
    """pipeline.tools.compare.run, called directly, writes what ``symkit compare`` writes; its
    Settings are recorded, and a settings change (the bootstrap seed) is seen in the output."""
    from pipeline.tools import compare as tool

    monkeypatch.chdir(tmp_path)
    result = tool.run(["a", "b"], tool.Settings(n_boot=200), Path("direct"), figures=False)
    assert (tmp_path / "direct" / "compare.json").is_file()
    assert [a["kind"] for a in result["arms"]] == ["directory", "directory"]
    assert len(result["comparisons"]) == 1
    assert tool.Settings(ci_level=0.9).alpha == 0.1
    other = tool.run(["a", "b"], tool.Settings(n_boot=200, seed=1), Path("seeded"),
                     figures=False)
    assert (tmp_path / "direct" / "compare.json").read_bytes() != (
        tmp_path / "seeded" / "compare.json").read_bytes()
    assert result["comparisons"][0]["design"] == other["comparisons"][0]["design"]
    assert result["settings"]["seed"] == 0 and other["settings"]["seed"] == 1
