"""``symkit adapt-audit``: an adaptation arm's samples audited against target train *and* source
train, each corpus with its own human baseline.

Two corpora of random REMI scores share one tokenizer (as an adaptation experiment's do). Planted
arms: one replays source train (a model that copies its pretraining data), one replays target
train, one writes new music. Each must be caught against the corpus it copies, and only that
one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.audit.judging import AuditConfig
from pipeline.core import artifacts
from pipeline.core.config import ParamsError
from pipeline.inference.generation import GenerateConfig
from pipeline.stages import adapt_audit, adapt_evaluate
from tests.stages.test_generate import CountLM, make_world, random_score, train_seqs


def _models(source: dict[str, Path], target: dict[str, Path]) -> dict[str, Any]:
    import numpy as np

    from pipeline.tokens.tokenizer import load_tokenizer

    vocab = artifacts.read_json(target["info"])["vocab_size"]
    tok = load_tokenizer(target["tokenizer"])
    rng = np.random.default_rng(7)
    fresh = [np.asarray(tok.encode(random_score(rng))[0].ids) for _ in range(24)]
    return {"copies_source": CountLM(12, vocab, alpha=1e-6).fit(train_seqs(source)),
            "copies_target": CountLM(12, vocab, alpha=1e-6).fit(train_seqs(target)),
            "fresh": CountLM(12, vocab, alpha=1e-6).fit(fresh)}


OUTPUTS = ("samples.parquet", "adapt_audit.json", "audit/target.json", "audit/source.json",
           "audit/target_per_sample.parquet", "audit/source_per_sample.parquet",
           "audit/target_spans.parquet", "audit/source_spans.parquet")


def _run(root: Path, out: Path) -> dict[str, Any]:
    target, source = make_world(root / "target", seed=0), make_world(root / "source", seed=1)
    assert target["tokenizer"].read_bytes() == source["tokenizer"].read_bytes()
    return adapt_audit.run(
        GenerateConfig(n_samples=24, n_continuations=0, max_new_tokens=64, files_per_kind=1),
        AuditConfig(human_window=64, human_stride=32, human_windows=4, extraction_pieces=8,
                    membership_pieces=10, n_boot=500),
        _models(source, target), {},
        references={"target": {"tokens": target["tokens"]},
                    "source": {"tokens": source["tokens"]}},
        info=target["info"], tokenizer=target["tokenizer"], fingerprint=None,
        samples_out=out / "samples.parquet", samples_dir=out / "samples",
        audit_dir=out / "audit", report=out / "adapt_audit.json",
        ledger_path=out / "ledger.jsonl", registration=out / "preregistration.json")


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("adapt_audit")
    return {"root": root, "out": _run(root, root)}


def test_a_second_run_writes_the_same_bytes(audited, tmp_path):
    _run(tmp_path, tmp_path)
    for rel in OUTPUTS:
        assert (tmp_path / rel).read_bytes() == (audited["root"] / rel).read_bytes(), rel


def _excess(out: dict[str, Any], ref: str, arm: str) -> dict[str, float]:
    return out["references"][ref]["judged"][arm]["flag_rate"]["excess"]


def test_each_copier_is_caught_against_the_corpus_it_copies_only(audited):
    out = audited["out"]
    assert _excess(out, "source", "copies_source")["ci_low"] > 0.05
    assert _excess(out, "target", "copies_target")["ci_low"] > 0.05
    assert _excess(out, "target", "copies_source")["ci_low"] <= 0
    assert _excess(out, "source", "copies_target")["ci_low"] <= 0
    for ref in ("target", "source"):
        e = _excess(out, ref, "fresh")
        assert e["ci_low"] <= 0 <= e["ci_high"], ref
    # extraction and membership are judged per corpus too
    src = out["references"]["source"]["judged"]
    assert src["copies_source"]["membership_auc"]["ci_low"] > 0.5
    assert src["copies_source"]["extraction_rate"]["excess"]["ci_low"] > 0


def test_the_samples_are_drawn_once_and_audited_against_both(audited):
    root, out = audited["root"], audited["out"]
    samples = artifacts.read_parquet(root / "samples.parquet")
    assert sorted(set(samples["model"])) == sorted(out["arms"])
    assert set(samples["kind"]) == {"unconditional"} and len(samples) == 3 * 24
    for ref in ("target", "source"):
        table = artifacts.read_parquet(root / "audit" / f"{ref}_per_sample.parquet")
        assert (table["source"] == "sample").sum() == len(samples)
    assert len(list((root / "samples").glob("*.mid"))) == 3  # files_per_kind per arm


def test_each_reference_s_test_pieces_are_a_look_with_its_judgements(audited):
    """Each reference's test rows are read through the gate: a look (command adapt_audit) at
    that corpus's test pieces in the experiment's ledger, then the digest of its judged
    block."""
    from pipeline.decision import ledger, looks

    root = audited["root"]
    records = ledger.read(root / "ledger.jsonl")
    assert [(r["command"], r["kind"]) for r in records] == [("adapt_audit", "look"),
                                                            ("adapt_audit", "audit")] * 2
    for ref, (look, judged) in zip(("target", "source"), (records[:2], records[2:]),
                                   strict=True):
        tokens = artifacts.read_parquet(root / ref / "tokens.parquet")
        assert look["pieces"] == sorted(tokens.loc[tokens["split"] == "test", "sha256"])
        assert judged["look"] == look["look"] and look["registration"] is None
        assert judged["results_sha256"] == looks.digest_of(
            artifacts.read_json(root / "audit" / f"{ref}.json")["judged"])


def test_the_adaptation_report_shows_both_corpora(audited):
    mem = adapt_evaluate.memorisation(audited["out"], ["copies_source", "fresh"])
    assert set(mem) == {"target", "source"}
    assert set(mem["source"]["arms"]) == {"copies_source", "fresh"}
    lines = "\n".join(adapt_evaluate._memorisation_lines(mem, "95%"))
    assert "## Memorisation" in lines and "target train" in lines and "source train" in lines
    row = next(x for x in lines.splitlines() if x.startswith("| `copies_source`"))
    assert len(row.split("|")) - 2 == 1 + 2 * 4  # arm, then four measures per corpus


@pytest.mark.parametrize(("params", "key"), [
    ("generate:\n  models: [transformer]\n  n_continuations: 0\n", "generate.models"),
    ("generate:\n  n_continuations: 4\n", "generate.n_continuations: 4"),
    ("generate: {}\n", "generate.n_continuations: 16"),
    ("generate:\n  n_continuations: 0\naudit:\n  models: [ngram]\n", "audit.models"),
])
def test_settings_it_cannot_honour_fail_fast_naming_the_key(tmp_path, params, key):
    (tmp_path / "params.yaml").write_text(params)
    with pytest.raises(ParamsError, match=key.replace(".", r"\.").replace("[", r"\[")):
        adapt_audit.check_sections(tmp_path / "params.yaml")


def test_compound_tokens_are_refused_before_the_test_rows_are_read(compound_tokens, tmp_path):
    with pytest.raises(ParamsError,
                       match=r"tokenize\.tokenizer: CPWord — symkit adapt-audit reads"):
        adapt_audit.run(GenerateConfig(n_continuations=0), AuditConfig(), {}, {},
                        references={"target": {"tokens": compound_tokens["tokens"]}},
                        info=compound_tokens["info"], tokenizer=tmp_path / "tokenizer.json",
                        fingerprint=None, samples_out=tmp_path / "samples.parquet",
                        samples_dir=tmp_path / "samples", audit_dir=tmp_path / "audit",
                        report=tmp_path / "r.json", ledger_path=tmp_path / "ledger.jsonl")
    assert not (tmp_path / "ledger.jsonl").exists() and not (tmp_path / "samples").exists()
