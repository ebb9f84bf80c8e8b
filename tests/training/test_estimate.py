"""symkit estimate: exact parameter counts, memory terms, FLOPs, and activations vs measured."""

from __future__ import annotations

import pytest
import torch

from models.transformer import GPT, TransformerConfig
from pipeline.training.estimate import count_params, estimate, peak_tflops, saved_activation_bytes


@pytest.mark.parametrize(("vocab", "seq", "layers", "embd", "ratio", "bias"), [
    (64, 32, 2, 32, 4, True), (300, 256, 4, 128, 4, True), (1000, 512, 3, 96, 2, False)],
    ids=str)
def test_param_count_is_exact(vocab, seq, layers, embd, ratio, bias):
    model = GPT(TransformerConfig(vocab_size=vocab, max_seq_len=seq, n_layer=layers, n_head=4,
                                  n_embd=embd, mlp_ratio=ratio, bias=bias))
    assert count_params(vocab, seq, layers, embd, ratio, bias)["total"] == model.num_params()


def test_memory_terms_and_flops():
    kw = {"vocab_size": 300, "seq_len": 256, "n_layer": 4, "n_head": 4, "n_embd": 128,
          "micro_batch": 16}
    fp32 = estimate(**kw)
    assert fp32.grads_bytes == 4 * fp32.params and fp32.optimizer_bytes == 8 * fp32.params
    assert fp32.weights_bytes == 4 * fp32.params
    bf16 = estimate(**kw, precision="bf16")
    assert bf16.activations_bytes < fp32.activations_bytes
    assert bf16.weights_bytes > fp32.weights_bytes  # autocast keeps a half copy
    assert estimate(**kw, attention="math").activations_bytes > fp32.activations_bytes
    lora = estimate(**kw, lora_rank=4, lora_targets=["attn.qkv"])
    assert lora.optimizer_bytes < fp32.optimizer_bytes / 5
    assert lora.params == fp32.params + lora.params_trainable  # adapters add to the weights
    assert fp32.flops_per_token_train == 3 * fp32.flops_per_token_forward
    assert fp32.flops_per_token_forward == 2 * fp32.params_matmul + 2 * 4 * 256 * 128
    assert fp32.total_bytes == (fp32.weights_bytes + fp32.best_bytes + fp32.grads_bytes
                                + fp32.optimizer_bytes + fp32.activations_bytes
                                + fp32.backward_bytes + fp32.data_bytes)
    # the loop's CPU copy of the best weights and the stream's tokens live on the host
    assert fp32.best_bytes == 4 * fp32.params and fp32.data_bytes == 0
    assert estimate(**kw, train_tokens=1000).data_bytes == 8000
    cuda = estimate(**kw, device="cuda", train_tokens=1000)
    assert cuda.best_bytes == cuda.data_bytes == 0
    assert fp32.backward_bytes == 2 * 16 * 256 * 300 * 4  # log-softmax and logits gradients
    assert peak_tflops("NVIDIA H200") == 989.0 and peak_tflops("cpu") is None


def test_parallel_cpu_scratch_is_counted_once_above_one_thread():
    """Measured: RSS grows by about 4 MiB from 1 to 2 CPU threads and little more after, so
    the term is one fixed amount above one thread, on the host only."""
    kw = {"vocab_size": 300, "seq_len": 256, "n_layer": 4, "n_head": 4, "n_embd": 128,
          "micro_batch": 4}
    one, two, eight = (estimate(**kw, threads=t) for t in (1, 2, 8))
    assert one.threads_bytes == 0 and two.threads_bytes == eight.threads_bytes == 4 * 2**20
    assert two.total_bytes - one.total_bytes == 4 * 2**20 == two.threads_bytes
    assert estimate(**kw, threads=2, device="cuda").threads_bytes == 0
    assert two.total_bytes == (two.weights_bytes + two.best_bytes + two.grads_bytes
                               + two.optimizer_bytes + two.activations_bytes
                               + two.backward_bytes + two.data_bytes + two.threads_bytes)


@pytest.mark.parametrize(("dropout", "attn_dropout"), [(0.0, 0.0), (0.1, 0.0), (0.1, 0.1)],
                         ids=str)
def test_activation_estimate_is_close_to_what_autograd_saves(dropout, attn_dropout):
    cfg = TransformerConfig(vocab_size=200, max_seq_len=64, n_layer=2, n_head=4, n_embd=64,
                            dropout=dropout, attn_dropout=attn_dropout)
    model = GPT(cfg).train()
    x = torch.randint(0, 200, (8, 64))
    measured = saved_activation_bytes(model, x, x)
    est = estimate(vocab_size=200, seq_len=64, n_layer=2, n_head=4, n_embd=64, micro_batch=8,
                   dropout=dropout, attn_dropout=attn_dropout, device="cpu")
    assert 0.8 < est.activations_bytes / measured < 1.25, (est.activations_bytes, measured)


@pytest.mark.parametrize(("vocab", "block_peak"), [(300, True), (4000, False)], ids=str)
def test_activation_checkpointing_keeps_the_block_inputs_and_one_block(vocab, block_peak):
    """With checkpointing the activations are every block's input (L·B·T·C fp32) plus either one
    block's recomputed activations (with the gradients of its MLP hidden layer and its output as
    the backward term) or, when the vocabulary makes it larger, the head's tensors at the start
    of backward (backward term unchanged). The other terms do not move."""
    B, T, C, L, r = 4, 256, 128, 4, 4
    kw = {"vocab_size": vocab, "seq_len": T, "n_layer": L, "n_head": 4, "n_embd": C,
          "micro_batch": B, "dropout": 0.1}
    off, on = estimate(**kw), estimate(**kw, activation_checkpointing=True)
    head = 2 * B * T * C * 4 + 2 * B * T * vocab * 4
    per_block = (off.activations_bytes - head) // L
    inputs = L * B * T * C * 4
    if block_peak:
        assert (on.activations_bytes, on.backward_bytes) == (inputs + per_block,
                                                             (r + 1) * B * T * C * 4)
    else:
        assert (on.activations_bytes, on.backward_bytes) == (inputs + head, off.backward_bytes)
    assert on.activations_bytes < off.activations_bytes
    assert on.total_bytes - off.total_bytes == (on.activations_bytes + on.backward_bytes
                                                - off.activations_bytes - off.backward_bytes)


@pytest.mark.parametrize("finetune", [
    {},
    {"freeze": ["wte", "wpe", "blocks.0."]},
    {"freeze": ["blocks.1.mlp", "ln_f"]},
    {"lora_rank": 2, "lora_targets": ["attn.qkv", "mlp.fc"]},
    {"lora_rank": 3, "lora_targets": ["attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"]},
])
@pytest.mark.parametrize("bias", [True, False])
def test_trainable_counts_match_a_frozen_or_adapted_model(finetune, bias):
    """What freeze and LoRA leave trainable, counted from the architecture alone, equals the
    count on the real model set up as fine-tuning sets it up."""
    import torch

    from models.lora import apply_lora, freeze, param_counts
    from models.transformer import GPT, TransformerConfig

    model = GPT(TransformerConfig(vocab_size=50, max_seq_len=16, n_layer=2, n_head=2, n_embd=8,
                                  bias=bias), torch.Generator().manual_seed(0))
    if finetune.get("freeze"):
        freeze(model, finetune["freeze"])
    if finetune.get("lora_rank"):
        apply_lora(model, finetune["lora_rank"], 16.0, finetune["lora_targets"])
    real = param_counts(model)
    est = estimate(vocab_size=50, seq_len=16, n_layer=2, n_head=2, n_embd=8, micro_batch=1,
                   bias=bias, **finetune)
    assert (est.params, est.params_trainable) == (real["total"], real["trainable"])
    assert est.optimizer_bytes == 8 * real["trainable"]
