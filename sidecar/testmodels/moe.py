"""Tiny mixture-of-experts models: mixtral-style llama and qwen3moe.

Both exist because llama.cpp reaches MoE through different code paths per architecture
(qwen3moe adds per-head q/k norms and its own expert FFN size), and the sidecar must place
expert tensors (MUL_MAT_ID) correctly for both.
"""

from __future__ import annotations

import os
from pathlib import Path

from .transformer import DecoderShape, write_decoder


def write_tiny_llama_moe(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_layer: int = 2,
    n_embd: int = 64,
    n_ff: int = 128,
    n_head: int = 4,
    n_head_kv: int = 2,
    ctx: int = 2048,
    n_expert: int = 4,
    n_expert_used: int = 2,
    dtype: str = "f32",
) -> Path:
    """Write a random llama-architecture MoE (mixtral layout) and return its path.

    Each block has `ffn_gate_inp` (f32 router) and 3-D `ffn_{gate,up,down}_exps` with
    `n_expert` experts of hidden size `n_ff`; `llama.expert_count` / `expert_used_count` are
    set. Same arguments give a byte-identical file.
    """
    shape = DecoderShape(
        arch="llama",
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        ctx=ctx,
        dtype=dtype,
        n_expert=n_expert,
        n_expert_used=n_expert_used,
        name="tiny llama moe (random test model)",
    )
    return write_decoder(path, shape, seed)


def write_tiny_qwen3moe(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_layer: int = 2,
    n_embd: int = 64,
    n_ff: int = 128,
    n_ff_exp: int = 32,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int = 16,
    ctx: int = 2048,
    n_expert: int = 8,
    n_expert_used: int = 2,
    dtype: str = "f32",
) -> Path:
    """Write a random qwen3moe model and return its path.

    Blocks carry `attn_q_norm` / `attn_k_norm` (per head) and `n_expert` experts of hidden
    size `n_ff_exp` (`qwen3moe.expert_feed_forward_length`). `head_dim` is written as
    `qwen3moe.attention.key_length` / `value_length` because Qwen3 heads need not be
    n_embd / n_head wide. Same arguments give a byte-identical file.
    """
    shape = DecoderShape(
        arch="qwen3moe",
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        ctx=ctx,
        dtype=dtype,
        qk_norm=True,
        head_dim=head_dim,
        write_head_dim=True,
        n_expert=n_expert,
        n_expert_used=n_expert_used,
        n_ff_exp=n_ff_exp,
        write_n_ff_exp=True,
        name="tiny qwen3moe (random test model)",
    )
    return write_decoder(path, shape, seed)
