"""Bytes of ggml weight types, from gguf-py's block table (GGML_QUANT_SIZES).

A quantized row is stored in blocks of `block_size` weights taking `type_size` bytes each, so a
tensor's bytes follow from its element count alone (rows are whole blocks in valid files).
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_BLOCKS: dict[str, tuple[int, int]] = {t.name: size for t, size in GGML_QUANT_SIZES.items()}


def known_type(type_name: str) -> bool:
    """True when `type_name` is a ggml type gguf-py knows ("Q4_K", "F16", ...)."""
    return type_name.upper() in _BLOCKS


def block_layout(type_name: str) -> tuple[int, int]:
    """(weights per block, bytes per block) of a ggml type; ValueError for an unknown name."""
    try:
        return _BLOCKS[type_name.upper()]
    except KeyError:
        raise ValueError(f"unknown ggml type {type_name!r}; known: {', '.join(sorted(_BLOCKS))}") from None


def tensor_bytes(type_name: str, n_elements: int) -> int:
    """Bytes a tensor of `n_elements` weights occupies in `type_name`.

    Partial blocks round up: a file never has them, but a synthesized shape might.
    """
    block, size = block_layout(type_name)
    return -(-n_elements // block) * size


def bits_per_weight(type_name: str) -> float:
    """Average storage bits per weight, scales included (Q4_0: 4.5, Q4_K: 4.5, F16: 16)."""
    block, size = block_layout(type_name)
    return 8.0 * size / block


def type_name_of(type_id: int | GGMLQuantizationType) -> str:
    """The ggml type's name for a numeric id as stored in a GGUF file."""
    return GGMLQuantizationType(int(type_id)).name
