"""``symkit doctor``: fast checks that tell a data bug from a model bug.

Each check prints ``PASS``/``FAIL``/``SKIP`` with its numbers; the exit status is nonzero when
any check fails. Data checks read ``data/tokens/`` (train and val rows: test rows are read only
through the test-access gate, :mod:`pipeline.decision.looks`, by the commands that score them)
and ``data/tokenizer.json``; model checks use
the ``transformer.model`` architecture from params (dropout off) on real windows when token data
exist, else on synthetic ones.

Checks, and what a failure points at:
- ``token_ids``: ids inside the vocabulary, no specials inside pieces -> tokenizer / info.json;
- ``decode``: sample pieces decode back to notes with few token errors -> tokenizer / ids;
- ``data_order``: same seed, same windows; each epoch a permutation; windows are contiguous
  slices; ranks tile each step -> data pipeline;
- ``init_loss``: loss at initialisation ≈ ln(vocab size) -> initialisation, loss, vocab size;
- ``padding``: changing padding token values does not change the loss -> masking;
- ``causal``: changing a later token does not change earlier outputs -> attention mask (a leak
  of the future makes every other number look too good);
- ``overfit``: one fixed batch is memorised (loss near zero) in a few hundred steps -> model /
  optimiser (a model that cannot memorise 100 tokens has a bug, not a data problem).

Conditioning checks (docs/conditioning.md), when ``data/conditions.parquet`` exists:
- ``cond_align``: the note conditions of 50 seeded pieces, re-measured from
  ``data/notes.parquet``, equal the table's -> a table attached to other pieces, or other bands;
- ``cond_combo`` (with ``condition.use``): the conditions together do not identify train groups
  -> drop a condition;
- ``cond_target`` (with ``condition.use``; its metadata columns): the label is not read from the
  piece's own notes (held-out groups) nearly always and beyond what the declared note
  conditions say -> a column computed from the notes the model is scored on: drop it;
- ``cond_gap`` (a conditioned model in ``data/transformer``): val NLL per note with correct,
  shuffled and removed conditions; fails when the model does *better* with shuffled conditions
  than with its own (the interval wholly below 0) -> conditions misaligned in training or scoring.
  No gap is a finding about the model (it ignores its condition), reported, not a failure.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.artifacts import read_parquet
from pipeline.core.config import load_section
from pipeline.tokens.contract import TokenInfo, read_tokens, refuse_compound
from pipeline.tokens.tokenizer import load_tokenizer
from pipeline.training.config import TransformerStageConfig

HELP = "fast checks that tell a data bug from a model bug"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # PASS | FAIL | SKIP
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"


def _result(name: str, ok: bool, detail: str) -> CheckResult:
    return CheckResult(name, "PASS" if ok else "FAIL", detail)


# ------------------------------------------------------------------------------------- data checks
def check_token_ids(rows: list[np.ndarray], info: Any) -> CheckResult:
    """Every id in ``0..vocab_size-1``; BOS/EOS/PAD never inside a piece."""
    ids = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    out = int(((ids < 0) | (ids >= info.vocab_size)).sum())
    special = int(np.isin(ids, info.special_ids()).sum())
    return _result("token_ids", out == 0 and special == 0 and ids.size > 0,
                   f"{ids.size} ids in {len(rows)} rows; out of range {out}, specials inside "
                   f"{special}, vocab_size {info.vocab_size}")


def check_decode(tokenizer_path: Path, rows: list[np.ndarray], n_notes: list[int],
                 info: Any, max_pieces: int = 5) -> CheckResult:
    """Sample pieces decode to notes; token-type error ratio and note counts are reported."""
    if not Path(tokenizer_path).exists():
        return CheckResult("decode", "SKIP", f"{tokenizer_path} not found (run `symkit tokenize`)")
    import miditok

    tok = load_tokenizer(tokenizer_path)
    if len(tok) != info.vocab_size:
        return _result("decode", False, f"tokenizer has {len(tok)} tokens, info.json says "
                                        f"vocab_size {info.vocab_size}")
    decoded, errors = [], []
    for ids in rows[:max_pieces]:
        ids = [int(i) for i in ids]
        score = tok.decode(ids if tok.one_token_stream else [ids])
        decoded.append(sum(len(t.notes) for t in score.tracks))
        seq = miditok.TokSequence(ids=list(ids), are_ids_encoded=tok.is_trained)
        if tok.is_trained:
            tok.decode_token_ids(seq)
        tok.complete_sequence(seq)
        errors.append(float(tok.tokens_errors(seq)))
    ok = bool(decoded) and min(decoded) > 0 and max(errors) < 0.05
    return _result("decode", ok, f"{len(decoded)} pieces -> notes {decoded} (table: "
                                 f"{n_notes[: len(decoded)]}); token error ratio max "
                                 f"{max(errors, default=0):.3f} (limit 0.05)")


def check_data_order(examples: list[np.ndarray], seq_len: int, seed: int) -> CheckResult:
    """The window stream is a pure function of the seed; epochs are permutations; ranks tile."""
    from pipeline.training.data import Shard, WindowStream

    n = len(examples)
    a, b = WindowStream(examples, seq_len, seed), WindowStream(examples, seq_len, seed)
    same = all(np.array_equal(a.window(k), b.window(k)) for k in range(2 * n))
    perm_ok = all(sorted(a.position(e * n + j)[0] for j in range(n)) == list(range(n))
                  for e in range(2))
    contiguous = all(_is_slice(a.window(k), examples[a.position(k)[0]]) for k in range(n))
    single = Shard(0, 1, 2, 4)
    ranks = [Shard(r, 2, 2, 2) for r in range(2)]
    tiled = sorted(k for s in ranks for m in range(2) for k in s.micro_positions(3, m)) == \
        sorted(k for m in range(4) for k in single.micro_positions(3, m))
    other = WindowStream(examples, seq_len, seed + 1)
    differs = n < 2 or any(other.position(k) != a.position(k) for k in range(n))
    ok = same and perm_ok and contiguous and tiled and differs
    return _result("data_order", ok, f"reproducible {same}, epochs are permutations {perm_ok}, "
                                     f"windows are contiguous slices {contiguous}, ranks tile "
                                     f"steps {tiled}, another seed differs {differs}")


def _is_slice(window: np.ndarray, example: np.ndarray) -> bool:
    w = len(window)
    return any(np.array_equal(example[o : o + w], window) for o in range(len(example) - w + 1))


# ------------------------------------------------------------------------------------ model checks
def _model(arch: Any, seed: int):
    import torch

    from models.transformer import GPT

    return GPT(arch, torch.Generator().manual_seed(seed))


def check_init_loss(arch: Any, batch: Any, seed: int, tol: float = 0.25) -> CheckResult:
    import torch

    model = _model(arch, seed).eval()
    with torch.no_grad():
        _, loss = model(batch.x, batch.y, batch.mask)
    expect = math.log(arch.vocab_size)
    return _result("init_loss", abs(float(loss) - expect) < tol,
                   f"loss {float(loss):.4f} vs ln({arch.vocab_size}) = {expect:.4f} "
                   f"(tolerance {tol})")


def check_padding(arch: Any, batch: Any, pad_id: int, seed: int) -> CheckResult:
    """Loss with padding filled by ``pad_id`` equals the loss with random ids there."""
    import torch

    model = _model(arch, seed).eval()
    pad = ~batch.mask  # input position t is padding exactly where target t is
    if not pad.any():
        return CheckResult("padding", "SKIP", "batch has no padding")
    noisy = batch.x.clone()
    g = torch.Generator().manual_seed(seed)
    noisy[pad] = torch.randint(0, arch.vocab_size, (int(pad.sum()),), generator=g)
    with torch.no_grad():
        _, a = model(batch.x, batch.y, batch.mask)
        _, b = model(noisy, batch.y, batch.mask)
    diff = abs(float(a) - float(b))
    return _result("padding", diff < 1e-5, f"|Δloss| = {diff:.2e} after changing "
                                          f"{int(pad.sum())} padded input values (limit 1e-5)")


def check_causal(arch: Any, batch: Any, seed: int) -> CheckResult:
    """Logits before position t are unchanged when token t changes."""
    import torch

    model = _model(arch, seed).eval()
    x = batch.x[:1].clone()
    t = x.shape[1] // 2
    changed = x.clone()
    changed[0, t] = (x[0, t] + 1) % arch.vocab_size
    with torch.no_grad():
        a, b = model(x)[0], model(changed)[0]
    before = float((a[:, :t] - b[:, :t]).abs().max())
    after = float((a[:, t:] - b[:, t:]).abs().max())
    return _result("causal", before < 1e-5 and after > 0,
                   f"max |Δlogit| before the changed position {before:.2e} (limit 1e-5), "
                   f"from it on {after:.2e} (must be > 0)")


def check_overfit(arch: Any, batch: Any, seed: int, steps: int = 300, lr: float = 0.003,
                  target: float = 0.1) -> CheckResult:
    import torch

    model = _model(arch, seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    first = last = math.nan
    done = 0
    for done in range(1, steps + 1):
        _, loss = model(batch.x, batch.y, batch.mask)
        last = float(loss.detach())
        first = last if done == 1 else first
        if last < target:
            break
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return _result("overfit", last < target,
                   f"loss {first:.3f} -> {last:.4f} after {done} steps on one batch of "
                   f"{batch.n_valid} targets (target < {target})")


# ------------------------------------------------------------------------------------------- run
def run_checks(cfg: Any, *, tokens: Path, info: Path, tokenizer: Path,
               overfit_steps: int = 300) -> list[CheckResult]:
    """All checks, on real data when ``tokens``/``info`` exist, else on synthetic data."""
    import tempfile

    from models.transformer import TransformerConfig
    from pipeline.training.data import load_corpus, make_batch
    from pipeline.training.synthetic import write_token_data

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        real = Path(tokens).exists() and Path(info).exists()
        if not real:
            paths = write_token_data(Path(tmp), n_pieces=20, vocab_size=64, mean_len=200)
            tokens, info = paths["tokens"], paths["info"]
            results.append(CheckResult("data", "SKIP", "no token data: model checks use "
                                                       "synthetic pieces"))
        tinfo = TokenInfo.read(info)
        refuse_compound(tinfo, "symkit doctor")
        table = read_tokens(tokens, ["split", "ids", "n_notes"])
        rows = [np.asarray(r, dtype=np.int64) for r in table["ids"]]
        if real:
            results.append(check_token_ids(rows, tinfo))
            results.append(check_decode(tokenizer, rows, [int(n) for n in table["n_notes"]],
                                        tinfo))
        corpus = load_corpus(tokens, tinfo)
    examples = corpus.train or corpus.val
    if not examples:
        return [*results, _result("data_order", False, "no train or val examples")]
    T = min(cfg.model.max_seq_len, 64)
    results.append(check_data_order(examples, T, cfg.seed))
    m = cfg.model
    arch = TransformerConfig(vocab_size=tinfo.vocab_size, max_seq_len=m.max_seq_len,
                             n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd,
                             mlp_ratio=m.mlp_ratio, dropout=0.0, bias=m.bias)
    # A full window and a short one (so the batch has padding).
    short = max(2, min(T // 2, len(examples[0])))
    batch = make_batch([examples[0][: T + 1], examples[-1][:short]], T, tinfo.pad_id)
    results.append(check_init_loss(arch, batch, cfg.seed))
    results.append(check_padding(arch, batch, tinfo.pad_id, cfg.seed))
    results.append(check_causal(arch, batch, cfg.seed))
    results.append(check_overfit(arch, batch, cfg.seed, steps=overfit_steps))
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=Path, default=Path("data/tokens/tokens.parquet"))
    parser.add_argument("--info", type=Path, default=Path("data/tokens/info.json"))
    parser.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer.json"))
    parser.add_argument("--overfit-steps", type=int, default=300)
    parser.add_argument("--conditions", type=Path, default=Path("data/conditions.parquet"))
    parser.add_argument("--notes", type=Path, default=Path("data/notes.parquet"))
    parser.add_argument("--splits", type=Path, default=Path("data/splits.parquet"))
    parser.add_argument("--transformer-dir", type=Path, default=Path("data/transformer"))


def condition_checks(ccfg: Any, *, conditions: Path, notes: Path, splits: Path, tokens: Path,
                     info: Path, transformer_dir: Path) -> list[CheckResult]:
    """The conditioning checks (module docstring); none without a condition table."""
    if not Path(conditions).exists():
        return []
    from pipeline.conditions.checks import (
        check_alignment,
        check_combination,
        check_target_information,
    )
    from pipeline.conditions.table import read_conditions

    table = read_conditions(conditions)
    out = []
    if Path(notes).exists():
        out.append(_result("cond_align", *check_alignment(table, notes, ccfg)))
    if ccfg.use and Path(splits).exists():
        out.append(_result("cond_combo", *check_combination(table, read_parquet(splits),
                                                              ccfg.use)))
    if ccfg.use and Path(splits).exists() and Path(notes).exists():
        out.append(_result("cond_target", *check_target_information(
            table, notes, read_parquet(splits), ccfg.use)))
    model_json = Path(transformer_dir) / "model.json"
    if model_json.exists() and Path(tokens).exists() and Path(info).exists():
        from pipeline.core.artifacts import read_json

        if read_json(model_json).get("condition") is not None:
            out.append(_condition_gap(table, tokens, info, transformer_dir))
    return out


def _condition_gap(table: Any, tokens: Path, info: Path, transformer_dir: Path) -> CheckResult:
    from pipeline.conditions.assign import model_vocab, with_vocab
    from pipeline.conditions.diagnostics import condition_gap
    from pipeline.inference.protocol import clean_sequences
    from pipeline.inference.scorer import load_scorer

    scorer = load_scorer(transformer_dir)
    vocab = model_vocab(scorer.condition)
    rows = read_tokens(tokens, ["sha256", "split", "track", "ids", "n_notes"], splits=["val"])
    rows, _ = clean_sequences(rows.reset_index(drop=True), TokenInfo.read(info))
    if rows.empty:
        return CheckResult("cond_gap", "SKIP", "no val rows to score")
    gap = condition_gap(scorer, list(rows["ids"]), with_vocab(table, vocab).many(rows["sha256"]),
                        vocab.none_ids(), groups=list(rows["sha256"]),
                        notes=[int(n) for n in rows["n_notes"]], n_boot=500)
    s, r = gap["shuffled_minus_correct"], gap["removed_minus_correct"]
    return _result("cond_gap", s["verdict"] != "hurt",
                   f"{len(rows)} val rows, conditions {list(vocab.names)}: shuffled − correct "
                   f"{s['value']:+.4f} [{s['ci_low']:+.4f}, {s['ci_high']:+.4f}] ({s['verdict']}),"
                   f" removed − correct {r['value']:+.4f} ({r['verdict']}) nats per note")


def main(args: argparse.Namespace) -> int:
    from pipeline.conditions.config import ConditionConfig

    cfg = load_section("transformer", args.params, TransformerStageConfig)
    ccfg = load_section("condition", args.params, ConditionConfig)
    results = run_checks(cfg, tokens=args.tokens, info=args.info, tokenizer=args.tokenizer,
                         overfit_steps=args.overfit_steps)
    results += condition_checks(ccfg, conditions=args.conditions, notes=args.notes,
                                splits=args.splits, tokens=args.tokens, info=args.info,
                                transformer_dir=args.transformer_dir)
    for r in results:
        print(f"{r.status:<4}  {r.name:<11} {r.detail}")
    failed = [r.name for r in results if r.failed]
    print(f"doctor: {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0
