"""The decoder skeleton shared by every generated text model.

Dense and mixture-of-experts models differ only in the feed-forward part of each block, so one
description (`DecoderShape`) and one writer cover llama, llama-with-experts and qwen3moe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
from gguf import MODEL_TENSOR, GGUFWriter, LlamaFileType

from .gguf_out import PlannedTensor, tensor_name, write_gguf
from .vocab import add_byte_vocab, byte_vocab
from .weights import float_dtype, ones, random_matrix

RMS_EPS = 1e-5
ROPE_FREQ_BASE = 10000.0


@dataclass(frozen=True)
class DecoderShape:
    """Hyperparameters of a generated decoder-only model.

    `n_expert == 0` means dense FFNs. `n_ff_exp` (each expert's hidden size) defaults to `n_ff`;
    it is written as `{arch}.expert_feed_forward_length` only when `write_n_ff_exp` is set, since
    only some architectures read it. `head_dim` defaults to n_embd // n_head and is written as
    key/value length when `write_head_dim` is set.
    """

    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    ctx: int
    dtype: str
    qk_norm: bool = False
    head_dim: int | None = None
    write_head_dim: bool = False
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int | None = None
    write_n_ff_exp: bool = False
    name: str = "tiny test model"

    @property
    def d_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.n_embd // self.n_head

    @property
    def d_ff_expert(self) -> int:
        return self.n_ff_exp if self.n_ff_exp is not None else self.n_ff

    def validate(self) -> None:
        """Raise ValueError for shapes llama.cpp would reject or that would hide layout bugs."""
        float_dtype(self.dtype)
        positive = ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv", "ctx")
        for field in positive:
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive")
        # A square FFN would let a transposed up/down layout load without error.
        if self.n_ff == self.n_embd:
            raise ValueError("n_ff must differ from n_embd")
        if self.head_dim is None and self.n_embd % self.n_head:
            raise ValueError("n_embd must be divisible by n_head")
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head must be a multiple of n_head_kv")
        if self.d_head % 2:
            raise ValueError("the head dimension must be even for rotary embeddings")
        if self.n_expert:
            if not 0 < self.n_expert_used <= self.n_expert:
                raise ValueError("need 0 < n_expert_used <= n_expert")
            if self.d_ff_expert == self.n_embd:
                raise ValueError("the expert FFN size must differ from n_embd")
        elif self.n_expert_used:
            raise ValueError("n_expert_used set without experts")


def _metadata(shape: DecoderShape, writer: GGUFWriter) -> None:
    writer.add_name(shape.name)
    writer.add_file_type(LlamaFileType.ALL_F32 if shape.dtype == "f32" else LlamaFileType.MOSTLY_F16)
    writer.add_vocab_size(byte_vocab().size)
    writer.add_context_length(shape.ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_rope_freq_base(ROPE_FREQ_BASE)
    writer.add_rope_dimension_count(shape.d_head)
    if shape.write_head_dim:
        writer.add_key_length(shape.d_head)
        writer.add_value_length(shape.d_head)
    if shape.n_expert:
        writer.add_expert_count(shape.n_expert)
        writer.add_expert_used_count(shape.n_expert_used)
        if shape.write_n_ff_exp:
            writer.add_expert_feed_forward_length(shape.d_ff_expert)
    add_byte_vocab(writer)


def _plan(shape: DecoderShape, seed: int) -> list[PlannedTensor]:
    dtype = float_dtype(shape.dtype)
    f32 = np.dtype(np.float32)
    plan: list[PlannedTensor] = []

    def matrix(name: str, dims: tuple[int, ...], dt: np.dtype = dtype) -> None:
        plan.append(PlannedTensor(name, dims, dt, partial(random_matrix, seed, name, dims, dt)))

    def norm(name: str, size: int) -> None:
        plan.append(PlannedTensor(name, (size,), f32, partial(ones, (size,))))

    n_embd, n_vocab = shape.n_embd, byte_vocab().size
    q_dim, kv_dim = shape.n_head * shape.d_head, shape.n_head_kv * shape.d_head
    # No separate output matrix: llama.cpp then ties the LM head to token_embd, like SmolLM2.
    matrix(tensor_name(MODEL_TENSOR.TOKEN_EMBD), (n_vocab, n_embd))
    norm(tensor_name(MODEL_TENSOR.OUTPUT_NORM), n_embd)
    for i in range(shape.n_layer):
        norm(tensor_name(MODEL_TENSOR.ATTN_NORM, i), n_embd)
        matrix(tensor_name(MODEL_TENSOR.ATTN_Q, i), (q_dim, n_embd))
        matrix(tensor_name(MODEL_TENSOR.ATTN_K, i), (kv_dim, n_embd))
        matrix(tensor_name(MODEL_TENSOR.ATTN_V, i), (kv_dim, n_embd))
        matrix(tensor_name(MODEL_TENSOR.ATTN_OUT, i), (n_embd, q_dim))
        if shape.qk_norm:
            norm(tensor_name(MODEL_TENSOR.ATTN_Q_NORM, i), shape.d_head)
            norm(tensor_name(MODEL_TENSOR.ATTN_K_NORM, i), shape.d_head)
        norm(tensor_name(MODEL_TENSOR.FFN_NORM, i), n_embd)
        if shape.n_expert:
            n_exp, d_ff = shape.n_expert, shape.d_ff_expert
            # Routers stay f32: their logits pick experts, and f16 rounding there changes routing.
            matrix(tensor_name(MODEL_TENSOR.FFN_GATE_INP, i), (n_exp, n_embd), f32)
            matrix(tensor_name(MODEL_TENSOR.FFN_GATE_EXP, i), (n_exp, d_ff, n_embd))
            matrix(tensor_name(MODEL_TENSOR.FFN_UP_EXP, i), (n_exp, d_ff, n_embd))
            matrix(tensor_name(MODEL_TENSOR.FFN_DOWN_EXP, i), (n_exp, n_embd, d_ff))
        else:
            matrix(tensor_name(MODEL_TENSOR.FFN_GATE, i), (shape.n_ff, n_embd))
            matrix(tensor_name(MODEL_TENSOR.FFN_UP, i), (shape.n_ff, n_embd))
            matrix(tensor_name(MODEL_TENSOR.FFN_DOWN, i), (n_embd, shape.n_ff))
    return plan


def write_decoder(path: str | os.PathLike[str], shape: DecoderShape, seed: int) -> Path:
    """Validate `shape` and write a random-weight model with the byte vocabulary to `path`.

    Same (shape, seed) gives a byte-identical file.
    """
    shape.validate()
    return write_gguf(path, shape.arch, partial(_metadata, shape), _plan(shape, seed))
