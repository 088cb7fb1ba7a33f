"""The dense tiny llama: the smallest model every text test can load."""

from __future__ import annotations

import os
from pathlib import Path

from .transformer import DecoderShape, write_decoder


def write_tiny_llama(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_layer: int = 2,
    n_embd: int = 64,
    n_ff: int = 128,
    n_head: int = 4,
    n_head_kv: int = 2,
    ctx: int = 2048,
    dtype: str = "f32",
) -> Path:
    """Write a random-weight llama-architecture model and return its path.

    Byte-level gpt2 vocabulary (see `vocab.py`), ChatML template, grouped-query attention
    (n_head_kv < n_head by default). Weights are random: the model loads and decodes at full
    speed but produces byte garbage. `n_ff` must differ from `n_embd`; `dtype` is "f32" or "f16".
    Same arguments give a byte-identical file.
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
        name="tiny llama (random test model)",
    )
    return write_decoder(path, shape, seed)
