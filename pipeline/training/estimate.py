"""Memory and compute of a transformer configuration, before training it (``symkit estimate``
prints them; the adaptation stage records them beside each arm's measured peak).

Counts (all from the architecture; no torch needed):
- parameters: exact, matching ``models.transformer.GPT`` (tied output projection counted once);
  with ``transformer.finetune``, the trainable ones exact too: ``freeze`` leaves every parameter
  whose name starts with none of its prefixes, LoRA leaves only its adapters (``r·(in + out)``
  per wrapped linear layer, added to the total), as ``pipeline.training.setup.build_model``
  arranges them (:func:`trainable_params`);
- training memory of one process at its peak, the start of a backward pass, as the sum of the
  tensors alive then, each term for a stated reason:
  - ``weights``: the fp32 master copy, plus the half-precision copy autocast caches of every
    matmul weight (bf16/fp16);
  - ``best``: the loop keeps the best (at first the initial) weights as a CPU fp32 copy
    (``export_state``), so on CPU it is one more 4·P; on CUDA it lives in host memory (0 here);
  - ``grads``: fp32, trainable parameters only (allocated during backward, freed by
    ``zero_grad(set_to_none=True)``);
  - ``optimizer``: AdamW's two fp32 moments per trainable parameter;
  - ``activations``: saved for backward per micro-batch: per block about 16·B·T·C values
    (LayerNorm inputs/outputs, q/k/v, attention output, MLP input, GELU input and output), the
    attention matrix B·H·T² only when the kernel materialises it (the math kernel, used on CPU
    with attention dropout; flash and memory-efficient kernels keep O(B·H·T)), dropout masks, and
    the logits with their log-softmax (2·B·T·V fp32);
  - ``backward``: the first tensors backward makes while all activations are still alive: the
    gradient of the log-softmax output and of the logits (2·B·T·V fp32);
  - with activation checkpointing (``transformer.activation_checkpointing``), the forward keeps
    only each block's input (L·B·T·C fp32: the residual stream stays fp32 under autocast) and
    the head's tensors; each block's activations exist again only while its backward runs. The
    peak is then the larger of two moments: the start of backward (the inputs, the head's
    activations, the logits' two gradients, as above) or a block's backward (the inputs, one
    block's recomputed activations, and the gradients of its MLP hidden layer and its output,
    (mlp_ratio + 1)·B·T·C fp32, which are alive together there); ``activations`` and
    ``backward`` are those of the larger moment. As backward moves down, the inputs of the
    blocks done are freed while their gradients appear; counting both whole over-counts by at
    most the smaller of the two (measured: 1 % on the default model, 15 % of the step's
    activations and gradients with 8 blocks × 256);
  - ``data``: the window stream's flat int64 copy of the training tokens (8 bytes a token, on the
    host, so counted on CPU only), when ``train_tokens`` is given;
  - ``threads``: on CPU with more than one intra-op thread, :data:`CPU_PARALLEL_BYTES` of
    scratch the parallel kernels keep beside the tensors. Measured, not derived: with
    ``benchmarks/bench_checkpointing.py --repeats 0`` (torch 2.13's CPU build, x86_64) the peak
    RSS grew by 3.4-5.1 MiB from 1 to 2 threads on both of its settings, and little more at 3
    and 4 threads (default setting, checkpointing on: 33.4 MiB at 1 thread, 37.1 at 2, 38.5 at
    3, 38.3 at 4, means of 2-4 runs), so one fixed amount, not one per thread.
- FLOPs per token: forward = 2·(matmul parameters) + 2·n_layer·T·C for causal attention (each
  query sees T/2 keys on average); training = 3 × forward (backward ≈ 2 × forward).

Not covered, so a measured peak is higher: memory the allocator holds free but resident (glibc
keeps freed heap pages; CUDA's caching allocator keeps freed blocks), fragmentation, library
workspaces beyond the parallel scratch above, the Python objects of the run, and short-lived
buffers outside the training step (evaluation batches, the bytes of a checkpoint being written).
Without checkpointing the gradient term is not yet alive at the start of backward and hides some
of this; with it, the gradients are alive at the peak, so the uncovered part shows.
``benchmarks/bench_train.py`` and ``benchmarks/bench_checkpointing.py`` print estimate vs
measured peak.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
CPU_PARALLEL_BYTES = 4 * 2**20
"""Scratch of torch's parallel CPU kernels with more than one thread (measured, module
docstring): counted once, whatever the number of threads above one."""

PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0,
               "A10": 125.0, "RTX 4090": 165.0, "V100": 125.0, "T4": 65.0}
"""Dense bf16/fp16 tensor-core peak (TFLOP/s) by device-name fragment, for MFU."""


@dataclass(frozen=True)
class Estimate:
    params: int
    params_trainable: int
    params_matmul: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    total_bytes: int  # the sum of the terms: weights, best, grads, optimizer, activations,
    # backward, data, threads
    flops_per_token_forward: float
    flops_per_token_train: float
    best_bytes: int = 0
    backward_bytes: int = 0
    data_bytes: int = 0
    threads_bytes: int = 0


def count_params(vocab_size: int, seq_len: int, n_layer: int, n_embd: int, mlp_ratio: int = 4,
                 bias: bool = True) -> dict[str, int]:
    """Exact parameter counts of ``GPT``: ``total`` and ``matmul`` (weights used in matmuls,
    including the tied output projection once; position embeddings excluded)."""
    C, r, b = n_embd, mlp_ratio, int(bias)
    ln = C + C * b  # LayerNorm weight (+ bias)
    # ln_1, ln_2; qkv + attention proj (4C² + 4C biases); MLP fc + proj (2rC² + (r+1)C biases)
    per_layer = 2 * ln + 4 * C * C + 4 * C * b + 2 * r * C * C + (r + 1) * C * b
    total = vocab_size * C + seq_len * C + n_layer * per_layer + ln
    matmul = n_layer * (4 * C * C + 2 * r * C * C) + vocab_size * C
    return {"total": total, "matmul": matmul}


def param_numels(vocab_size: int, seq_len: int, n_layer: int, n_embd: int, mlp_ratio: int = 4,
                 bias: bool = True) -> dict[str, int]:
    """Every parameter of ``GPT`` by its ``named_parameters`` name, with its element count (the
    tied output projection is ``wte.weight``). Sums to ``count_params(...)["total"]``."""
    C = n_embd
    out = {"wte.weight": vocab_size * C, "wpe.weight": seq_len * C}
    linears = linear_shapes(n_layer, n_embd, mlp_ratio)
    for i in range(n_layer):
        pre = f"blocks.{i}."
        for ln in ("ln_1", "ln_2"):
            out[f"{pre}{ln}.weight"] = C
            if bias:
                out[f"{pre}{ln}.bias"] = C
        for name in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"):
            n_in, n_out = linears[pre + name]
            out[f"{pre}{name}.weight"] = n_in * n_out
            if bias:
                out[f"{pre}{name}.bias"] = n_out
    out["ln_f.weight"] = C
    if bias:
        out["ln_f.bias"] = C
    return out


def linear_shapes(n_layer: int, n_embd: int, mlp_ratio: int = 4) -> dict[str, tuple[int, int]]:
    """``GPT``'s linear layers by module name, as (in, out) features: what LoRA can wrap."""
    C, H = n_embd, mlp_ratio * n_embd
    per = {"attn.qkv": (C, 3 * C), "attn.proj": (C, C), "mlp.fc": (C, H), "mlp.proj": (H, C)}
    return {f"blocks.{i}.{k}": v for i in range(n_layer) for k, v in per.items()}


def trainable_params(numels: dict[str, int], linears: dict[str, tuple[int, int]], *,
                     freeze: Sequence[str] = (), lora_rank: int = 0,
                     lora_targets: Sequence[str] = ()) -> tuple[int, int]:
    """(trainable, adapter) parameter counts of a fine-tuning set-up: with ``lora_rank`` only
    the adapters train (``A``: r × in, ``B``: out × r per linear whose name ends with a target,
    as :func:`models.lora.apply_lora` wraps them); otherwise every parameter whose name starts
    with none of ``freeze``'s prefixes (:func:`models.lora.freeze`)."""
    if lora_rank:
        targets = tuple(lora_targets)
        adapter = sum(lora_rank * (n_in + n_out) for name, (n_in, n_out) in linears.items()
                      if name.endswith(targets))
        return adapter, adapter
    prefixes = tuple(freeze)
    return sum(n for name, n in numels.items() if not name.startswith(prefixes)), 0


def estimate(*, vocab_size: int, seq_len: int, n_layer: int, n_head: int, n_embd: int,
             micro_batch: int, mlp_ratio: int = 4, bias: bool = True, precision: str = "fp32",
             dropout: float = 0.0, attn_dropout: float = 0.0, freeze: Sequence[str] = (),
             lora_rank: int = 0, lora_targets: Sequence[str] = (),
             attention: str = "auto", device: str = "cpu",
             train_tokens: int = 0, activation_checkpointing: bool = False,
             threads: int = 1) -> Estimate:
    """Training-time memory (bytes) and FLOPs per token for one process.

    ``freeze`` / ``lora_rank`` + ``lora_targets``: ``transformer.finetune``'s, so gradients and
    AdamW's moments count the parameters that train (:func:`trainable_params`); LoRA's adapters
    add to the weights (their matmuls to the FLOPs are left out: ``r / C`` of a layer's).
    ``attention="auto"``: torch's CPU flash kernel has no dropout, so with attention dropout on
    CPU the math kernel runs and stores the attention matrix; elsewhere a fused kernel is assumed.
    ``activation_checkpointing``: the activations of the peak moment of a recomputing backward
    (module docstring), not of every block. ``threads``: torch's CPU threads
    (``runtime.torch_threads``); above one, the parallel kernels' scratch is counted on CPU.
    """
    if attention == "auto":
        attention = "math" if attn_dropout > 0 and device == "cpu" else "flash"
    p = count_params(vocab_size, seq_len, n_layer, n_embd, mlp_ratio, bias)
    B, T, C, H, V, L = micro_batch, seq_len, n_embd, n_head, vocab_size, n_layer
    a = BYTES[precision]
    trainable, adapter = trainable_params(
        param_numels(vocab_size, seq_len, n_layer, n_embd, mlp_ratio, bias),
        linear_shapes(n_layer, n_embd, mlp_ratio), freeze=freeze, lora_rank=lora_rank,
        lora_targets=lora_targets)
    p = {**p, "total": p["total"] + adapter}
    weights = 4 * p["total"] + (a * p["matmul"] if precision != "fp32" else 0)
    grads = 4 * trainable
    optim = 8 * trainable
    per_block = 16 * B * T * C * a + 4 * B * H * T  # + softmax log-sum-exp (fp32)
    if attention == "math":
        # scores and probabilities; with dropout also its mask (1 byte) and the dropped copy
        per_block += B * H * T * T * (2 * a + (a + 1 if attn_dropout > 0 else 0))
    if dropout > 0:
        per_block += 2 * B * T * C  # bool masks (attention and MLP residual branches)
    head = 2 * B * T * C * 4 + 2 * B * T * V * 4  # final LayerNorm in/out; logits, log-softmax
    backward = 2 * B * T * V * 4
    acts = L * per_block + head
    if activation_checkpointing:
        inputs = L * B * T * C * 4  # the one tensor kept per block
        block_backward = (mlp_ratio + 1) * B * T * C * 4
        if per_block + block_backward > head + backward:  # a block's backward is the peak
            acts, backward = inputs + per_block, block_backward
        else:  # the start of backward still is
            acts = inputs + head
    on_host = device == "cpu"
    best = 4 * p["total"] if on_host else 0
    data = 8 * train_tokens if on_host else 0
    parallel = CPU_PARALLEL_BYTES if on_host and threads > 1 else 0
    fwd = 2 * p["matmul"] + 2 * L * T * C
    return Estimate(params=p["total"], params_trainable=trainable, params_matmul=p["matmul"],
                    weights_bytes=weights, grads_bytes=grads, optimizer_bytes=optim,
                    activations_bytes=acts,
                    total_bytes=weights + best + grads + optim + acts + backward + data
                    + parallel,
                    flops_per_token_forward=float(fwd), flops_per_token_train=3.0 * fwd,
                    best_bytes=best, backward_bytes=backward, data_bytes=data,
                    threads_bytes=parallel)


def saved_activation_bytes(model, x, y) -> int:
    """Measured counterpart of ``activations_bytes`` minus logits bookkeeping: bytes of the
    distinct non-parameter tensors autograd saves for backward in one ``model(x, y)`` pass."""
    import torch

    seen: dict[tuple[int, int], int] = {}
    params = {p.data_ptr() for p in model.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in params:
            seen[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, y)
    return sum(seen.values())


def peak_tflops(device_name: str) -> float | None:
    for frag, tf in PEAK_TFLOPS.items():
        if frag.lower() in device_name.lower():
            return tf
    return None
