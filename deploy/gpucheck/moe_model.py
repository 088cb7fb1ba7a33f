"""A mixture-of-experts model of real size and shape, written straight in Q4_K, for timing.

No MoE model ships on a package registry, and quantizing a random f16 model of 10 GB would need
40 GB of f16 first. Quantized blocks can be written directly instead: a Q4_K block is two f16
scales, twelve bytes of 6-bit sub-block scales and mins, and 128 bytes of 4-bit weights; any bytes
there are a valid block. The scales are set so each weight has a spread near 1/sqrt(fan-in), which
keeps activations finite through every layer. Only the routers are fully random (f32), so tokens
spread over the experts as in a trained model; the expert blocks repeat a random pattern, which
costs the kernels exactly what distinct weights cost. The text it writes is noise: it is for
measuring speed and memory, never quality.

The default shape is Qwen3-30B-A3B's (2048 wide, 128 experts of 768, 8 active, 32/4 heads of
128) with fewer layers: 28 layers make about 9.8 GB, more than the largest budget checked (8 GB).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
from gguf import MODEL_TENSOR, GGMLQuantizationType, GGUFWriter, LlamaFileType

from sidecar.testmodels.gguf_out import PlannedTensor, tensor_name, write_gguf
from sidecar.testmodels.vocab import add_byte_vocab, byte_vocab

ARCH = "qwen3moe"
Q4_K = GGMLQuantizationType.Q4_K
Q4_K_WEIGHTS, Q4_K_BYTES = 256, 144
# Distinct random blocks per tensor before the pattern repeats (about 9 MB).
PATTERN_BLOCKS = 1 << 16


@dataclass(frozen=True)
class MoeShape:
    """A qwen3moe model's hyperparameters."""

    n_layer: int = 28
    n_embd: int = 2048
    n_head: int = 32
    n_head_kv: int = 4
    head_dim: int = 128
    n_expert: int = 128
    n_expert_used: int = 8
    n_ff_exp: int = 768
    ctx: int = 40960

    def validate(self) -> None:
        """ValueError for shapes Q4_K cannot hold (rows must be whole 256-weight blocks)."""
        for width in (self.n_embd, self.n_ff_exp, self.n_head * self.head_dim):
            if width % Q4_K_WEIGHTS:
                raise ValueError(f"{width} is not a multiple of {Q4_K_WEIGHTS}: Q4_K rows need whole blocks")
        if self.n_ff_exp == self.n_embd:
            raise ValueError("the expert width must differ from n_embd (a transposed layout would load unnoticed)")
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ValueError("need 0 < n_expert_used <= n_expert")
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head must be a multiple of n_head_kv")

    def file_bytes(self) -> int:
        """About what the file will take: the quantized matrices (norms and routers are small)."""
        q, kv = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        attention = 2 * q * self.n_embd + 2 * kv * self.n_embd
        experts = 3 * self.n_expert * self.n_ff_exp * self.n_embd
        routers_and_norms = 4 * (self.n_expert * self.n_embd + 2 * self.n_embd + 2 * self.head_dim)
        per_layer = (attention + experts) * Q4_K_BYTES // Q4_K_WEIGHTS + routers_and_norms
        embedding = byte_vocab().size * self.n_embd * Q4_K_BYTES // Q4_K_WEIGHTS
        return self.n_layer * per_layer + embedding


def q4k_blocks(seed: int, n_blocks: int, fan_in: int) -> np.ndarray:
    """`n_blocks` Q4_K blocks (uint8, shape (n_blocks, 144)) whose weights spread about
    1/sqrt(fan_in) around zero: w = d * scale * q - dmin * min with 6-bit scale/min and 4-bit q."""
    rng = np.random.default_rng(seed)
    pattern = rng.integers(0, 256, size=(min(n_blocks, PATTERN_BLOCKS), Q4_K_BYTES), dtype=np.uint8)
    # Random scale ~32 and q ~ uniform 0..15 (spread 4.6): d * 32 * 4.6 = 1/sqrt(fan_in); dmin
    # cancels the mean (d * 32 * 7.5 on average).
    d = np.float16(1.0 / (np.sqrt(fan_in) * 32 * 4.6))
    dmin = np.float16(float(d) * 7.5)
    pattern[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    pattern[:, 2:4] = np.frombuffer(dmin.tobytes(), dtype=np.uint8)
    if n_blocks <= len(pattern):
        return pattern
    return np.resize(pattern, (n_blocks, Q4_K_BYTES))


def _q4k_tensor(name: str, seed: int, dims: tuple[int, ...]) -> PlannedTensor:
    """A Q4_K matrix of element shape `dims` (numpy order: rows..., fan-in last)."""
    fan_in = dims[-1]
    byte_shape = (*dims[:-1], fan_in // Q4_K_WEIGHTS * Q4_K_BYTES)
    n_blocks = int(np.prod(dims, dtype=np.int64)) // Q4_K_WEIGHTS

    def make() -> np.ndarray:
        return q4k_blocks(seed, n_blocks, fan_in).reshape(byte_shape)

    return PlannedTensor(name, byte_shape, np.dtype(np.uint8), make, raw_dtype=Q4_K)


def _f32(name: str, values: np.ndarray) -> PlannedTensor:
    return PlannedTensor(name, values.shape, np.dtype(np.float32), lambda: values)


def _router(seed: int, n_expert: int, n_embd: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n_expert, n_embd)) / np.sqrt(n_embd)).astype(np.float32)


def _plan(shape: MoeShape, seed: int) -> list[PlannedTensor]:
    e, h = shape.n_embd, shape.head_dim
    q, kv = shape.n_head * h, shape.n_head_kv * h
    ones = partial(np.ones, dtype=np.float32)
    # The LM head is tied to token_embd (no output.weight), as in the repo's other test models.
    plan = [
        _q4k_tensor(tensor_name(MODEL_TENSOR.TOKEN_EMBD), seed, (byte_vocab().size, e)),
        _f32(tensor_name(MODEL_TENSOR.OUTPUT_NORM), ones(e)),
    ]
    for i in range(shape.n_layer):
        s = seed * 1000 + i * 10
        plan += [
            _f32(tensor_name(MODEL_TENSOR.ATTN_NORM, i), ones(e)),
            _q4k_tensor(tensor_name(MODEL_TENSOR.ATTN_Q, i), s + 1, (q, e)),
            _q4k_tensor(tensor_name(MODEL_TENSOR.ATTN_K, i), s + 2, (kv, e)),
            _q4k_tensor(tensor_name(MODEL_TENSOR.ATTN_V, i), s + 3, (kv, e)),
            _q4k_tensor(tensor_name(MODEL_TENSOR.ATTN_OUT, i), s + 4, (e, q)),
            _f32(tensor_name(MODEL_TENSOR.ATTN_Q_NORM, i), ones(h)),
            _f32(tensor_name(MODEL_TENSOR.ATTN_K_NORM, i), ones(h)),
            _f32(tensor_name(MODEL_TENSOR.FFN_NORM, i), ones(e)),
            _f32(tensor_name(MODEL_TENSOR.FFN_GATE_INP, i), _router(s + 5, shape.n_expert, e)),
            _q4k_tensor(tensor_name(MODEL_TENSOR.FFN_GATE_EXP, i), s + 6, (shape.n_expert, shape.n_ff_exp, e)),
            _q4k_tensor(tensor_name(MODEL_TENSOR.FFN_UP_EXP, i), s + 7, (shape.n_expert, shape.n_ff_exp, e)),
            _q4k_tensor(tensor_name(MODEL_TENSOR.FFN_DOWN_EXP, i), s + 8, (shape.n_expert, e, shape.n_ff_exp)),
        ]
    return plan


def _metadata(shape: MoeShape, writer: GGUFWriter) -> None:
    writer.add_name(f"qwen3moe {shape.n_layer}x{shape.n_expert} experts (random, Q4_K, for timing)")
    writer.add_file_type(LlamaFileType.MOSTLY_Q4_K_M)
    writer.add_vocab_size(byte_vocab().size)
    writer.add_context_length(shape.ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff_exp * shape.n_expert_used)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_expert_count(shape.n_expert)
    writer.add_expert_used_count(shape.n_expert_used)
    writer.add_expert_feed_forward_length(shape.n_ff_exp)
    add_byte_vocab(writer)


def write_moe_model(path: str | os.PathLike[str], shape: MoeShape = MoeShape(), *, seed: int = 0) -> Path:
    """Write the model to `path` (atomically) and return it. Same arguments, same bytes."""
    shape.validate()
    return write_gguf(path, ARCH, partial(_metadata, shape), _plan(shape, seed))
