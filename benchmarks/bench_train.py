"""Training throughput and memory of the transformer, with the estimator's prediction beside it.

Run: ``python benchmarks/bench_train.py [--steps 20] [--repeats 3] [--device cpu|cuda]
[--threads 2] [--pack]``; tokenizers compared: ``... --tokenizers [REMI,REMI+BPE,Octuple]
[--pieces 40]`` (below).

Data: synthetic pieces the size of the default corpus (370 pieces × ~1,400 tokens, vocab 300).
Model and batch: the ``transformer`` defaults of ``TransformerStageConfig`` (``--pack`` packs).

The two sides of the speed ratio do the same work per optimiser step: the same model
(``setup.build_model``, dropout on), the same ``micro_batch × max_seq_len`` batch of real windows,
the same precision (autocast), optimiser (``setup.make_optimizer``: AdamW, its parameter groups
and kernels) and schedule (``setup.make_scheduler``).

- ``bare step`` (baseline): one fixed batch already on the device; forward with the masked loss
  summed and divided by the batch's target count, backward, ``clip_grad_norm_`` at
  ``optim.grad_clip``, AdamW step, ``zero_grad(set_to_none=True)``, schedule step. Nothing is
  read from the device (on CUDA one synchronise ends each timed block).
- ``training loop``: ``pipeline.training.loop.train``, which adds per step: gathering the batch
  from the window stream and moving it to the device, counting targets, the log row, the stop
  rules, and at reading steps (here step 1 and the last) reading the losses and norms; per call:
  set-up (model, optimiser, data plan, resume check), the final evaluation and checkpoint.

Warm-up: before anything is timed, each side runs once (a 2-step ``train`` call, 3 bare steps) in
this process, so one-off costs (the ``torch._dynamo`` import at the first optimiser, the
allocator, kernel selection) are charged to neither. Then ``--repeats`` rounds each time both
sides, alternating which goes first.

Printed ratios (1.0 = no overhead):
- ``per step``: bare seconds per step / loop seconds per step, the loop's measured from the end
  of step 1 to the end of step N-1 (``on_step`` timestamps), so set-up, the first step and the
  final evaluation and checkpoint are outside. Given as the min and median of the ratios of
  each repeat's pair, and as fastest bare step / fastest loop step over the repeats; in wall
  time and in process CPU time (all threads; less sensitive to other processes on a shared
  machine, where wall time counts waiting for a core);
- ``whole call``: bare seconds for N steps / the ``train()`` call's wall time (everything in),
  min and median over the repeats.

Memory: measured in a fresh process (``--memory-child``) after a warm-up on a tiny model (which
pays the one-off imports, about 90 MiB of RSS on CPU, without growing the heap): on CUDA
``max_memory_allocated``; on CPU the process RSS increase while ``train`` runs (sampled every
5 ms), once with glibc's default allocator and once with :data:`FIXED_MMAP`, under which freed
tensors leave RSS, so RSS follows the tensors alive. The estimate (``pipeline.training.estimate``,
whose docstring lists what it covers) is compared with the latter; the difference between the
two is memory the allocator keeps. Autograd's saved activations are compared with the
estimate's activation term. The load average is printed before and after: the machine may be shared.

Tokenizers compared (``--tokenizers``, a comma list of :data:`ARMS`; alone it means
``REMI,REMI+BPE,Octuple``): instead of the above, the training loop on real pieces tokenised by
each arm. Data: the first ``--pieces`` Bach chorales bundled with music21 (local, nothing is
downloaded; ``pipeline.stages.corpus.chorale_midi``), every 10th piece val, the rest train,
tokenised once per arm by ``symkit tokenize``'s ``run`` with the ``tokenize`` defaults
(``use_programs: true``, ``program: 0``, BPE ``vocab_size`` 1000) but the arm's tokenizer and
model and no transpositions. Every arm trains the same model and batch (the ``transformer``
defaults, unpacked; final evaluation on 4 val windows) through ``pipeline.training.loop.train``,
which trains a compound table (CPWord, Octuple) as ``models.compound.CompoundGPT``. After one
untimed 2-step call per arm, ``--repeats`` rounds each time every arm once, the first arm
rotating. Printed per arm (medians over the rounds, wall time):

- ``steps/s``: 1 / the call's steady seconds per step (steps 2..N-1, as above);
- ``tokens/s``: targets trained per second (padding excluded; a compound step is one token
  position) = the call's targets per step × steps/s;
- ``notes/s``: tokens/s / the arm's tokens per note, measured on its train pieces (``n_tokens``
  summed / ``n_notes`` summed; a compound step counts once);
- ratios against the first arm (REMI by default): the median of the rounds' paired ratios, in
  wall time and in process CPU time (less sensitive to other processes on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from models.transformer import GPT, TransformerConfig
from pipeline.core.artifacts import read_table, sha256_bytes, write_parquet
from pipeline.core.config import RuntimeConfig
from pipeline.core.memory import FIXED_MMAP, PeakRSS
from pipeline.stages.tokenize import TokenizeConfig
from pipeline.stages.tokenize import run as tokenize
from pipeline.tokens.contract import TokenInfo
from pipeline.training.config import TransformerStageConfig
from pipeline.training.data import Corpus, WindowStream, load_corpus, make_batch
from pipeline.training.device import DistInfo, make_device
from pipeline.training.estimate import estimate, peak_tflops, saved_activation_bytes
from pipeline.training.loop import train
from pipeline.training.setup import build_model, make_optimizer, make_scheduler
from pipeline.training.synthetic import write_token_data

VOCAB = 300
ARMS: dict[str, tuple[str, str]] = {  # --tokenizers arm -> (tokenize.tokenizer, tokenize.model)
    "REMI": ("REMI", "none"), "REMI+BPE": ("REMI", "BPE"), "CPWord": ("CPWord", "none"),
    "Octuple": ("Octuple", "none")}
DEFAULT_ARMS = "REMI,REMI+BPE,Octuple"


def make_cfg(device: str, precision: str, steps: int, pack: bool,
             val_windows: int = 0) -> TransformerStageConfig:
    """The ``transformer`` defaults trained for ``steps`` steps; ``val_windows`` > 0 caps the
    final evaluation (``data.val_max_windows``)."""
    data = {**({"pack": True} if pack else {}),
            **({"val_max_windows": val_windows} if val_windows else {})}
    return TransformerStageConfig.model_validate({
        "device": device, "precision": precision, "data": data,
        "train": {"max_steps": steps, "eval_every": 10**6, "log_every": 10**6},
        "optim": {"warmup_steps": 1}, "checkpoint": {"every": 10**6}})


def bare_steps(cfg: TransformerStageConfig, corpus: Corpus, pad_id: int,
               steps: int) -> tuple[float, float]:
    """(wall, CPU) seconds for ``steps`` bare steps (see the module docstring), after 3 untimed
    ones."""
    dev = make_device(cfg.device, cfg.precision, DistInfo())
    torch.manual_seed(cfg.seed)
    model, _ = build_model(cfg.model, cfg.finetune, VOCAB, torch.Generator().manual_seed(cfg.seed))
    model.to(dev.device).train()
    opt = make_optimizer(model, cfg.optim, dev.device_type)
    sched = make_scheduler(opt, cfg.optim, cfg.train.max_steps + 3)
    stream = WindowStream(corpus.train, cfg.model.max_seq_len, cfg.seed)
    b = make_batch([stream.window(k) for k in range(cfg.train.micro_batch)],
                   cfg.model.max_seq_len, pad_id)
    x, y, mask = b.x.to(dev.device), b.y.to(dev.device), b.mask.to(dev.device)
    n = b.n_valid
    params = [p for p in model.parameters() if p.requires_grad]
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")

    def step() -> None:
        with dev.autocast():
            _, nll = model(x, y, mask, reduction="sum")
        (nll * (1 / n)).backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()

    for _ in range(3):
        step()
    _sync(dev.device)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    _sync(dev.device)
    return time.perf_counter() - t0, time.process_time() - c0


def loop_call(cfg: TransformerStageConfig, info: TokenInfo,
              corpus: Corpus) -> tuple[float, float, float, int]:
    """-> (wall seconds of ``train``, steady wall and CPU seconds per step, tokens trained)."""
    marks: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = train(cfg, info, corpus, Path(tmp), threads=torch.get_num_threads(),
                       echo=lambda _: None,
                       on_step=lambda _: marks.append((time.perf_counter(), time.process_time())))
        seconds = time.perf_counter() - t0
    n = max(1, len(marks) - 2)
    wall = (marks[-2][0] - marks[0][0]) / n
    cpu = (marks[-2][1] - marks[0][1]) / n
    return seconds, wall, cpu, result.tokens_this_run


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def training_parser(steps: int) -> argparse.ArgumentParser:
    """The options every training benchmark takes (``--steps`` defaulting to ``steps``), the
    hidden ``--memory-child`` among them; a benchmark adds its own."""
    ap = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    return ap


def start(ap: argparse.ArgumentParser, child) -> argparse.Namespace | None:
    """Parse the options; in a memory child run ``child(args)`` and return None; otherwise set
    the threads, print the load line and return the options."""
    args = ap.parse_args()
    if args.steps < 4:
        ap.error("--steps must be at least 4 (the steady part is steps 2..N-1)")
    if args.memory_child:
        child(args)
        return None
    torch.set_num_threads(args.threads)
    print(load_average())
    return args


def load_average() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def synthetic_data(tmp: Path) -> tuple[TokenInfo, Corpus]:
    paths = write_token_data(tmp, n_pieces=370, vocab_size=VOCAB, mean_len=1400)
    info = TokenInfo.read(paths["info"])
    return info, load_corpus(paths["tokens"], info)


def speed(args: argparse.Namespace, precision: str, info: TokenInfo,
          corpus: Corpus) -> dict[str, float]:
    cfg = make_cfg(args.device, precision, args.steps, args.pack)
    loop_call(make_cfg(args.device, precision, 2, args.pack), info, corpus)  # warm-up
    bare_steps(cfg, corpus, info.pad_id, 1)
    per_step, per_step_cpu, whole, tps = [], [], [], []
    loop_wall, loop_cpu, bare_wall, bare_cpu = [], [], [], []
    for r in range(args.repeats):
        for side in (("loop", "bare") if r % 2 == 0 else ("bare", "loop")):
            if side == "loop":
                seconds, steady, steady_cpu, tokens = loop_call(cfg, info, corpus)
            else:
                bare, bare_c = bare_steps(cfg, corpus, info.pad_id, args.steps)
        per_step.append((bare / args.steps) / steady)
        per_step_cpu.append((bare_c / args.steps) / steady_cpu)
        whole.append(bare / seconds)
        tps.append(tokens / seconds)
        loop_wall.append(steady)
        loop_cpu.append(steady_cpu)
        bare_wall.append(bare / args.steps)
        bare_cpu.append(bare_c / args.steps)
    return {"per_step_min": min(per_step), "per_step_median": statistics.median(per_step),
            "per_step_cpu_median": statistics.median(per_step_cpu),
            "per_step_of_fastest": min(bare_wall) / min(loop_wall),
            "per_step_cpu_of_fastest": min(bare_cpu) / min(loop_cpu),
            "whole_min": min(whole), "whole_median": statistics.median(whole),
            "loop_tokens_per_s": statistics.median(tps),
            "bare_positions_per_s": (cfg.train.micro_batch * cfg.model.max_seq_len
                                     / statistics.median(bare_wall)),
            "loop_step_s": statistics.median(loop_wall),
            "bare_step_s": statistics.median(bare_wall)}


def arm_names(text: str) -> list[str]:
    """``--tokenizers``: two or more distinct :data:`ARMS`, comma-separated, the first the
    baseline."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if len(names) < 2 or len(set(names)) < len(names) or not set(names) <= set(ARMS):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give two or more distinct arms, comma-separated, the first the "
            f"baseline, from {', '.join(ARMS)}")
    return names


def write_chorales(root: Path, n: int) -> int:
    """The first ``n`` distinct chorales music21 resolves (Riemenschneider order) as
    ``raw/``, ``manifest.parquet`` and ``splits.parquet`` under ``root``: every 10th piece val,
    the rest train. Returns the number of train pieces."""
    from pipeline.stages.corpus import chorale_list, chorale_midi

    (root / "raw").mkdir(parents=True)
    rows: list[dict[str, str]] = []
    for entry in chorale_list():
        if len(rows) == n:
            break
        data, _ = chorale_midi(entry)
        if not data or (sha := sha256_bytes(data)) in {r["sha256"] for r in rows}:
            continue
        path = f"{len(rows):03d}.mid"
        (root / "raw" / path).write_bytes(data)
        rows.append({"path": path, "sha256": sha, "status": "ok"})
    if len(rows) < n:
        raise SystemExit(f"--pieces {n}: music21 resolves only {len(rows)} distinct chorales")
    split = ["val" if i % 10 == 0 else "train" for i in range(n)]
    write_parquet(root / "manifest.parquet", pd.DataFrame(rows))
    write_parquet(root / "splits.parquet", pd.DataFrame({
        "sha256": [r["sha256"] for r in rows], "group_id": [r["path"] for r in rows],
        "split": split, "fold": 0}))
    return split.count("train")


@dataclass(frozen=True)
class Arm:
    """One tokenizer's tables of the same pieces, ready to train on."""

    name: str
    info: TokenInfo
    corpus: Corpus
    tokens_per_note: float  # train pieces: tokens (compound: steps) / notes


def tokenize_arm(root: Path, name: str) -> Arm:
    """Tokenise the pieces :func:`write_chorales` wrote with arm ``name`` into ``root/name``."""
    tokenizer, model = ARMS[name]
    out = root / name
    tokenize(TokenizeConfig(tokenizer=tokenizer, model=model, transpose=[]),
             RuntimeConfig(workers=1, progress=False), raw_dir=root / "raw",
             manifest=root / "manifest.parquet", splits=root / "splits.parquet",
             split_report=None, tokenizer_out=out / "tokenizer.json", tokens_dir=out / "tokens",
             cache_dir=None, report=out / "tokenize.json")
    info = TokenInfo.read(out / "tokens" / "info.json")
    table = read_table(out / "tokens" / "tokens.parquet",
                       columns=["split", "n_tokens", "n_notes"]).to_pandas()
    train = table[table["split"] == "train"]
    return Arm(name, info, load_corpus(out / "tokens" / "tokens.parquet", info),
               float(train["n_tokens"].sum() / train["n_notes"].sum()))


def compare(args: argparse.Namespace, arms: list[Arm]) -> dict[str, dict[str, float]]:
    """Per arm: steps/s, tokens/s, notes/s, padded share and the ratios against the first arm
    (module docstring)."""
    cfg = make_cfg(args.device, args.precision, args.steps, False, val_windows=4)
    for arm in arms:  # warm-up
        loop_call(make_cfg(args.device, args.precision, 2, False, val_windows=4), arm.info,
                  arm.corpus)
    runs: dict[str, list[tuple[float, float, float]]] = {a.name: [] for a in arms}
    for r in range(args.repeats):
        for k in range(len(arms)):
            arm = arms[(r + k) % len(arms)]
            _, wall, cpu, tokens = loop_call(cfg, arm.info, arm.corpus)
            runs[arm.name].append((wall, cpu, tokens / args.steps))
    base = runs[arms[0].name]
    positions = cfg.train.micro_batch * cfg.model.max_seq_len
    out = {}
    for arm in arms:
        own = runs[arm.name]
        tps = [t / w for w, _, t in own]
        ratio = [(t / w) / (bt / bw) for (w, _, t), (bw, _, bt) in zip(own, base, strict=True)]
        ratio_cpu = [(t / c) / (bt / bc) for (_, c, t), (_, bc, bt) in zip(own, base, strict=True)]
        note_scale = arms[0].tokens_per_note / arm.tokens_per_note
        out[arm.name] = {
            "steps_per_s": 1 / statistics.median(w for w, _, _ in own),
            "tokens_per_s": statistics.median(tps),
            "notes_per_s": statistics.median(tps) / arm.tokens_per_note,
            "padded_share": 1 - own[0][2] / positions,
            "tokens_ratio": statistics.median(ratio),
            "tokens_ratio_cpu": statistics.median(ratio_cpu),
            "notes_ratio": statistics.median(ratio) * note_scale,
            "notes_ratio_cpu": statistics.median(ratio_cpu) * note_scale}
    return out


def compare_tokenizers(args: argparse.Namespace) -> None:
    """Tokenise the chorales with each arm, time the training loop on each and print the
    table (module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        n_train = write_chorales(Path(tmp), args.pieces)
        arms = [tokenize_arm(Path(tmp), name) for name in args.tokenizers]
        prepared = time.perf_counter() - t0
        res = compare(args, arms)
    cfg = make_cfg(args.device, args.precision, args.steps, False)
    m, base = cfg.model, arms[0].name
    print(f"== {args.device} {args.precision}, {m.n_layer} layers × {m.n_embd}, batch "
          f"{cfg.train.micro_batch}×{m.max_seq_len}, {args.steps} steps, {args.repeats} "
          f"repeats, {args.threads} threads; {args.pieces} chorales ({n_train} train), "
          f"written and tokenised in {prepared:.0f} s")
    print(f"{'arm':<10} {'vocabulary':>16} {'tokens/note':>11} {'padded':>6} {'steps/s':>7} "
          f"{'tokens/s':>8} {'notes/s':>7}   vs {base}: tokens/s, notes/s (wall; CPU time)")
    for arm in arms:
        r = res[arm.name]
        books = arm.info.codebooks or []
        vocab = f"{arm.info.vocab_size}" + (f" ({len(books)} books)" if books else "")
        print(f"{arm.name:<10} {vocab:>16} {arm.tokens_per_note:11.2f} "
              f"{r['padded_share']:6.1%} {r['steps_per_s']:7.2f} {r['tokens_per_s']:8,.0f} "
              f"{r['notes_per_s']:7,.0f}   {r['tokens_ratio']:.2f}, {r['notes_ratio']:.2f} "
              f"({r['tokens_ratio_cpu']:.2f}, {r['notes_ratio_cpu']:.2f})")


def memory_child(args: argparse.Namespace) -> None:
    """Runs in a fresh process: warm up, then measure one ``train`` call; prints JSON."""
    torch.set_num_threads(args.threads)
    precision = args.precision
    with tempfile.TemporaryDirectory() as tmp:
        info, corpus = synthetic_data(Path(tmp))
        # warm-up on a tiny model: pays the one-off imports without growing the heap much
        tiny = TransformerStageConfig.model_validate({
            "device": args.device, "precision": precision,
            "model": {"max_seq_len": 8, "n_layer": 1, "n_head": 1, "n_embd": 8},
            "train": {"max_steps": 2, "micro_batch": 1, "eval_every": 10**6, "log_every": 10**6},
            "optim": {"warmup_steps": 1}, "checkpoint": {"every": 10**6}})
        loop_call(tiny, info, corpus)
        cfg = make_cfg(args.device, precision, args.steps, args.pack)
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        with PeakRSS() as rss:
            loop_call(cfg, info, corpus)
        peak = (torch.cuda.max_memory_allocated() if args.device.startswith("cuda")
                else rss.delta)
        n_tokens = int(sum(len(e) for e in corpus.train))
    m = cfg.model
    arch = TransformerConfig(vocab_size=VOCAB, max_seq_len=m.max_seq_len, n_layer=m.n_layer,
                             n_head=m.n_head, n_embd=m.n_embd, dropout=m.dropout,
                             attn_dropout=m.attn_dropout)
    model = GPT(arch, torch.Generator().manual_seed(0)).to(args.device).train()
    x = torch.randint(0, VOCAB, (cfg.train.micro_batch, m.max_seq_len)).to(args.device)
    amp = torch.bfloat16 if precision == "bf16" else None
    with torch.autocast(args.device.split(":")[0], dtype=amp, enabled=amp is not None):
        saved = saved_activation_bytes(model, x, x)
    print(json.dumps({"peak": peak, "saved": saved, "train_tokens": n_tokens}))


def memory(args: argparse.Namespace, precision: str, fixed_mmap: bool) -> dict[str, int]:
    """Run :func:`memory_child` in a fresh process; ``fixed_mmap`` sets :data:`FIXED_MMAP`."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    if fixed_mmap:
        key, value = FIXED_MMAP.split("=")
        env[key] = value
    child = subprocess.run(
        [sys.executable, __file__, "--memory-child", "--device", args.device, "--precision",
         precision, "--steps", str(args.steps), "--threads", str(args.threads),
         *(["--pack"] if args.pack else [])],
        check=True, capture_output=True, text=True, env=env)
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = training_parser(steps=20)
    ap.add_argument("--pack", action="store_true", help="transformer.data.pack: true")
    ap.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--tokenizers", type=arm_names, nargs="?", const=arm_names(DEFAULT_ARMS),
                    help=f"compare these tokenizers on Bach chorales instead (alone: "
                         f"{DEFAULT_ARMS}; from {', '.join(ARMS)})")
    ap.add_argument("--pieces", type=int, default=40, help="chorales for --tokenizers")
    args = start(ap, memory_child)
    if args is None:
        return
    if args.tokenizers:
        if args.pack:
            ap.error("--pack with --tokenizers: the arms are compared unpacked "
                     "(transformer.data.pack refuses compound tokens)")
        if args.pieces < 10:
            ap.error(f"--pieces {args.pieces}: at least 10 (every 10th piece is val)")
        compare_tokenizers(args)
        print(load_average())
        return
    precisions = ["fp32", "bf16"] if args.device.startswith("cuda") else ["fp32"]
    with tempfile.TemporaryDirectory() as tmp:
        info, corpus = synthetic_data(Path(tmp))
        base_tps = None
        for precision in precisions:
            cfg = make_cfg(args.device, precision, args.steps, args.pack)
            sp = speed(args, precision, info, corpus)
            mem = memory(args, precision, fixed_mmap=False)
            live = memory(args, precision, fixed_mmap=True)
            m = cfg.model
            est = estimate(vocab_size=VOCAB, seq_len=m.max_seq_len, n_layer=m.n_layer,
                           n_head=m.n_head, n_embd=m.n_embd, micro_batch=cfg.train.micro_batch,
                           precision=precision, dropout=m.dropout, attn_dropout=m.attn_dropout,
                           device="cuda" if args.device.startswith("cuda") else "cpu",
                           train_tokens=mem["train_tokens"], threads=args.threads)
            print(f"== {args.device} {precision}, batch {cfg.train.micro_batch}×{m.max_seq_len}, "
                  f"{args.steps} steps, {args.repeats} repeats, {args.threads} threads"
                  f"{', packed' if args.pack else ''}")
            print(f"bare step      {sp['bare_positions_per_s']:10,.0f} positions/s (baseline)")
            print(f"training loop  {sp['loop_tokens_per_s']:10,.0f} tokens/s (whole call)")
            print(f"step time      loop {sp['loop_step_s']:.3f} s, bare {sp['bare_step_s']:.3f} s"
                  " (medians, wall)")
            print(f"loop / bare    per step (wall): paired {sp['per_step_min']:.3f} min, "
                  f"{sp['per_step_median']:.3f} median; fastest vs fastest "
                  f"{sp['per_step_of_fastest']:.3f}")
            print(f"               per step (process CPU time): paired "
                  f"{sp['per_step_cpu_median']:.3f} median; fastest vs fastest "
                  f"{sp['per_step_cpu_of_fastest']:.3f}")
            print(f"               whole call (wall): {sp['whole_min']:.3f} min, "
                  f"{sp['whole_median']:.3f} median")
            if args.device.startswith("cuda"):
                print(f"peak memory    {mem['peak'] / 2**20:10,.1f} MiB (CUDA max allocated); "
                      f"estimate {est.total_bytes / 2**20:,.1f} MiB; estimate/measured "
                      f"{est.total_bytes / max(mem['peak'], 1):.2f}")
            else:
                print(f"peak memory    {live['peak'] / 2**20:10,.1f} MiB (RSS increase, freed "
                      f"tensors returned: {FIXED_MMAP}); estimate "
                      f"{est.total_bytes / 2**20:,.1f} MiB; estimate/measured "
                      f"{est.total_bytes / max(live['peak'], 1):.2f}")
                print(f"               {mem['peak'] / 2**20:,.1f} MiB with glibc's default "
                      f"allocator: +{(mem['peak'] - live['peak']) / 2**20:,.1f} MiB of freed "
                      "pages kept resident, which the estimate does not cover")
            print(f"activations    {mem['saved'] / 2**20:10,.1f} MiB saved by autograd; estimate "
                  f"{est.activations_bytes / 2**20:,.1f} MiB; estimate/measured "
                  f"{est.activations_bytes / mem['saved']:.2f}")
            tps = sp["loop_tokens_per_s"]
            if args.device.startswith("cuda"):
                base_tps = base_tps or tps
                name = torch.cuda.get_device_name()
                peak_tf = peak_tflops(name)
                mfu = (tps * est.flops_per_token_train / (peak_tf * 1e12)) if peak_tf else None
                print(f"vs fp32 loop   ratio {tps / base_tps:.2f}; MFU "
                      f"{'n/a' if mfu is None else f'{100 * mfu:.2f}%'} ({name})")
            else:
                steps_default = TransformerStageConfig().train.max_steps
                tok = steps_default * cfg.train.micro_batch * m.max_seq_len
                print(f"default run    ~{tok / tps / 60:.1f} min of training for "
                      f"{steps_default} steps (evaluations extra)")
    print(load_average())


if __name__ == "__main__":
    main()
