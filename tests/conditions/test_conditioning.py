"""The conditioned pipeline end to end, across the packages that take conditions: the model's
condition embedding, condition dropout and windows, training with conditions and the
shuffled-condition diagnostic of the trained model, and the training and evaluate stages."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from models.transformer import GPT, TransformerConfig
from pipeline.conditions.assign import piece_conditions
from pipeline.conditions.diagnostics import condition_gap, verdict
from pipeline.inference.scorer import TransformerScorer
from pipeline.tokens.contract import TokenInfo
from pipeline.training.data import Corpus
from pipeline.training.loop import train
from tests._transformer_data import BOS, EOS, PAD, tiny_config
from tests.conditions._planted import planted_metadata


# ---------------------------------------------------------------------------------- model
def _cfg(**kw) -> TransformerConfig:
    return TransformerConfig(vocab_size=16, max_seq_len=16, n_layer=1, n_head=2, n_embd=16, **kw)


def test_unconditioned_weights_and_model_json_are_unchanged_by_conditions():
    plain = GPT(_cfg(), torch.Generator().manual_seed(3))
    cond = GPT(_cfg(cond_slot_sizes=(3, 4)), torch.Generator().manual_seed(3))
    for name, p in plain.state_dict().items():
        assert torch.equal(p, cond.state_dict()[name]), name
    assert "cond_slot_sizes" not in _cfg().to_dict()
    assert _cfg(cond_slot_sizes=(3, 4)).to_dict()["cond_slot_sizes"] == [3, 4]
    assert TransformerConfig.from_dict(_cfg(cond_slot_sizes=(3, 4)).to_dict()).cond_slot_sizes \
        == (3, 4)
    # the condition embedding starts at zero: before training, the conditioned model's
    # predictions are the unconditioned one's, whatever the condition
    assert torch.count_nonzero(cond.wce.weight) == 0
    idx = torch.tensor([[1, 5, 6]])
    assert torch.equal(plain.eval()(idx)[0], cond.eval()(idx, cond=torch.tensor([[2, 5]]))[0])


def test_conditions_are_inputs_never_targets():
    model = GPT(_cfg(cond_slot_sizes=(3,)), torch.Generator().manual_seed(0)).eval()
    with torch.no_grad():
        model.wce.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(1))
    idx = torch.tensor([[1, 5, 6, 7]])
    targets = torch.tensor([[5, 6, 7, 2]])
    logits, loss = model(idx, targets, cond=torch.tensor([[2]]))
    assert logits.shape == (1, 4, 16)  # the output space is the token vocabulary alone
    # the loss is the cross-entropy of the token targets only, whatever the condition
    manual = torch.nn.functional.cross_entropy(logits[0], targets[0])
    assert torch.allclose(loss, manual)
    # a condition changes the prediction (it is an input) ...
    other, _ = model(idx, cond=torch.tensor([[1]]))
    assert not torch.allclose(logits, other)
    # ... and cond=None is every slot's "none"
    a, _ = model(idx)
    b, _ = model(idx, cond=torch.tensor([[0]]))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="outside their slots"):
        model(idx, cond=torch.tensor([[3]]))
    with pytest.raises(ValueError, match="without conditions"):
        GPT(_cfg(), torch.Generator().manual_seed(0))(idx, cond=torch.tensor([[1]]))


# ------------------------------------------------------------------- training and diagnostic
INFO = TokenInfo(vocab_size=12, pad_id=PAD, bos_id=BOS, eos_id=EOS, tokenizer_hash="t",
                 split_hash="s")


def _pieces(n: int, seed: int, planted: bool) -> tuple[list[np.ndarray], list[str]]:
    """Short pieces of ids 3..10. Planted: label "a" pieces draw from 3..6 and "b" from 7..10,
    so the condition tells the first tokens; otherwise the labels are coin flips."""
    rng = np.random.default_rng(seed)
    pieces, labels = [], []
    for _ in range(n):
        label = "a" if rng.random() < 0.5 else "b"
        lo = 3 if label == "a" or not planted else 7
        hi = 11 if not planted else lo + 4
        if not planted:
            lo = 3
        pieces.append(rng.integers(lo, hi, size=4))
        labels.append(label)
    return pieces, labels


def _trained(tmp_path, planted: bool):
    train_p, train_l = _pieces(200, 1, planted)
    val_p, val_l = _pieces(60, 2, planted)
    table = pd.DataFrame({
        "sha256": [f"t{i:03d}" for i in range(200)] + [f"v{i:03d}" for i in range(60)],
        "split": ["train"] * 200 + ["val"] * 60, "mode": train_l + val_l})
    pc = piece_conditions(table, ["mode"])
    wrap = [np.concatenate([[BOS], p, [EOS]]) for p in train_p + val_p]
    corpus = Corpus(train=wrap[:200], val=wrap[200:], conditions=pc,
                    train_cond=[pc.of(f"t{i:03d}") for i in range(200)],
                    val_cond=[pc.of(f"v{i:03d}") for i in range(60)])
    cfg = tiny_config(model={"max_seq_len": 8, "dropout": 0.0},
                      optim={"lr": 0.01, "min_lr": 0.001},
                      train={"max_steps": 150, "micro_batch": 16, "grad_accum": 1,
                             "eval_every": 50})
    r = train(cfg, INFO, corpus, tmp_path / "ck", threads=1, echo=lambda _: None,
              cond_dropout=0.2)
    model = r.model
    model.load_state_dict(r.best)
    scorer = TransformerScorer(model, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    cond = pc.many([f"v{i:03d}" for i in range(60)])
    return condition_gap(scorer, val_p, cond, pc.vocab.none_ids(),
                         groups=[f"g{i}" for i in range(60)], notes=[4] * 60, seed=0, n_boot=500)


def test_diagnostic_shows_a_gap_where_the_condition_matters(tmp_path):
    gap = _trained(tmp_path, planted=True)
    assert verdict(gap["shuffled_minus_correct"]) == "follows"
    assert verdict(gap["removed_minus_correct"]) == "follows"
    assert gap["nll_per_note"]["correct"]["value"] < gap["nll_per_note"]["removed"]["value"]


def test_diagnostic_shows_no_gap_where_the_condition_carries_nothing(tmp_path):
    gap = _trained(tmp_path, planted=False)
    assert verdict(gap["shuffled_minus_correct"]) == "no gap shown"
    assert abs(gap["shuffled_minus_correct"]["value"]) < 0.05




# ------------------------------------------------------------------ the stages, conditioned
def _condition_table(splits_path, path):
    from pipeline.conditions.table import conditions_schema
    from pipeline.core.artifacts import write_parquet

    splits = pd.read_parquet(splits_path).sort_values("sha256")
    rows = [{"sha256": sha, "split": split, "density": ("low", "high")[i % 2],
             "key": "C major" if i % 3 else None}
            for i, (sha, split) in enumerate(zip(splits["sha256"], splits["split"],
                                                 strict=True))]
    import pyarrow as pa
    write_parquet(path, pa.Table.from_pylist(rows, conditions_schema()))
    return path


def _train_stage(paths, root, use, dropout=0.1, name="model"):
    from pipeline.conditions.config import ConditionConfig
    from pipeline.core.config import RuntimeConfig
    from pipeline.stages.train_transformer import run

    return run(tiny_config(), RuntimeConfig(torch_threads=1), tokens=paths["tokens"],
               info=paths["info"], augmented=None, out_dir=root / name,
               summary=root / f"{name}.json", log_dir=root / f"{name}-log",
               env=root / f"{name}.env.json",
               condition=ConditionConfig(use=use, dropout=dropout),
               conditions=paths.get("conditions"))


def test_training_and_evaluate_stages_with_conditions(tmp_path):
    from pipeline.core.artifacts import read_json
    from pipeline.core.config import RuntimeConfig
    from pipeline.inference.loading import default_specs
    from pipeline.stages.evaluate import EvaluateConfig
    from pipeline.stages.evaluate import run as evaluate
    from tests.stages.test_train_ngram import write_corpus

    paths = write_corpus(tmp_path / "data")
    paths["conditions"] = _condition_table(paths["splits"], tmp_path / "data" / "cond.parquet")
    summary = _train_stage(paths, tmp_path, ["density", "key"])
    meta = read_json(tmp_path / "model" / "model.json")
    assert meta["config"]["cond_slot_sizes"] == [3, 2]  # high, low, none; C major, none
    assert meta["condition"]["names"] == ["density", "key"]
    assert meta["condition"]["vocab"]["labels"] == [["high", "low"], ["C major"]]
    assert meta["condition"]["dropout"] == 0.1
    assert summary["condition"]["names"] == ["density", "key"]  # reports/train.json
    assert summary["condition"]["labels"] == {"density": ["high", "low"], "key": ["C major"]}
    weights = (tmp_path / "model" / "model.safetensors").read_bytes()
    # a re-run resumes the finished run: the same weights
    _train_stage(paths, tmp_path, ["density", "key"])
    assert (tmp_path / "model" / "model.safetensors").read_bytes() == weights
    # other conditions are another run, not a resume of this one
    _train_stage(paths, tmp_path, ["density"], name="model")
    assert len(list((tmp_path / "model" / "checkpoints").glob("run-*"))) == 2
    _train_stage(paths, tmp_path, ["density", "key"])  # back to the first: its own weights
    assert (tmp_path / "model" / "model.safetensors").read_bytes() == weights
    cfg = EvaluateConfig(n_boot=200, splits=["val"], stride=16)
    specs = default_specs(tmp_path / "no-ngram", tmp_path / "model", stride=cfg.stride)
    evaluate(cfg, RuntimeConfig(torch_threads=1), tokens=paths["tokens"], info=paths["info"],
             manifest=paths["manifest"], splits=paths["splits"], specs=specs,
             per_piece=tmp_path / "eval" / "pp.parquet", report=tmp_path / "eval.json",
             conditions=paths["conditions"])
    report = read_json(tmp_path / "eval.json")
    block = report["conditioning"]["transformer"]
    assert block["conditions"] == ["density", "key"] and block["split"] == "val"
    assert set(block["nll_per_note"]) == {"correct", "shuffled", "removed"}
    # the scored NLL is the "correct" variant's: the pieces with their own conditions
    assert block["nll_per_note"]["correct"]["value"] == pytest.approx(
        report["models"]["transformer"]["val"]["nats_per_note"]["value"])
    assert block["shuffled_minus_correct"]["verdict"] in ("follows", "no gap shown", "hurt")


def test_unconditioned_stage_reads_no_condition_table(tmp_path):
    from pipeline.core.artifacts import read_json
    from tests.stages.test_train_ngram import write_corpus

    paths = write_corpus(tmp_path / "data")
    paths["conditions"] = tmp_path / "missing.parquet"  # never read
    _train_stage(paths, tmp_path, [])
    meta = read_json(tmp_path / "model" / "model.json")
    assert "condition" not in meta and "cond_slot_sizes" not in meta["config"]


def test_conditions_without_table_or_with_packing_are_refused(tmp_path):
    from pipeline.core.artifacts import ArtifactError
    from pipeline.core.config import ParamsError
    from tests.stages.test_train_ngram import write_corpus

    paths = write_corpus(tmp_path / "data")
    paths["conditions"] = tmp_path / "missing.parquet"
    with pytest.raises(ArtifactError, match=r"missing\.parquet"):
        _train_stage(paths, tmp_path, ["density"])
    paths["conditions"] = _condition_table(paths["splits"], tmp_path / "cond.parquet")
    with pytest.raises(ParamsError, match=r"condition\.use .*'tempo'"):
        _train_stage(paths, tmp_path, ["tempo"])  # no train piece has a tempo label
    from pipeline.conditions.config import ConditionConfig
    from pipeline.core.config import RuntimeConfig
    from pipeline.stages.train_transformer import run
    with pytest.raises(ParamsError, match="pack"):
        run(tiny_config(data={"pack": True}), RuntimeConfig(torch_threads=1),
            tokens=paths["tokens"], info=paths["info"], augmented=None,
            out_dir=tmp_path / "m", summary=tmp_path / "s.json", log_dir=tmp_path / "l",
            env=tmp_path / "e.json", condition=ConditionConfig(use=["density"]),
            conditions=paths["conditions"])


# ------------------------------------------------------------------------ doctor's checks
def test_doctor_runs_the_target_check_for_metadata_conditions_in_use(tmp_path):
    from pipeline.conditions.config import ConditionConfig
    from pipeline.conditions.table import conditions_schema
    from pipeline.core.artifacts import write_parquet
    from pipeline.tools.doctor import condition_checks

    table, splits, notes = planted_metadata(tmp_path)
    schema = conditions_schema(["collection", "composer", "ending"])
    write_parquet(tmp_path / "conditions.parquet",
                  pa.Table.from_pylist(table.astype(object).where(table.notna(), None)
                                        .to_dict("records"), schema=schema))
    write_parquet(tmp_path / "splits.parquet", pa.Table.from_pandas(splits, preserve_index=False))
    paths = {"conditions": tmp_path / "conditions.parquet", "notes": notes,
             "splits": tmp_path / "splits.parquet", "tokens": tmp_path / "none.parquet",
             "info": tmp_path / "none.json", "transformer_dir": tmp_path / "none"}
    unconditioned = condition_checks(ConditionConfig(), **paths)
    assert [r.name for r in unconditioned] == ["cond_align"]
    results = {r.name: r for r in condition_checks(ConditionConfig(use=["key", "ending"]),
                                                   **paths)}
    assert set(results) == {"cond_align", "cond_combo", "cond_target"}
    assert results["cond_target"].failed and "ending" in results["cond_target"].detail
