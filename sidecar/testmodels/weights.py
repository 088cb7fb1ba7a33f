"""Deterministic random weights for generated test models."""

from __future__ import annotations

import zlib

import numpy as np

# The two element types a generated model may store its matrices in.
FLOAT_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16)}


def float_dtype(name: str) -> np.dtype:
    """Return the numpy dtype for "f32" or "f16"; raise ValueError for anything else."""
    try:
        return FLOAT_DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(FLOAT_DTYPES)}, got {name!r}") from None


def tensor_rng(seed: int, name: str) -> np.random.Generator:
    """A generator seeded by (seed, tensor name).

    Each tensor gets its own stream so that adding, removing or reordering tensors never
    changes the values of the others, and the same (seed, name) always gives the same values.
    """
    return np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])


def random_matrix(seed: int, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Normal weights scaled by 1/sqrt(fan_in) (the last axis), in `dtype`.

    The scaling keeps activations near unit size through the layers, so random models neither
    overflow in f16 nor collapse to a constant token.
    """
    fan_in = shape[-1]
    values = tensor_rng(seed, name).standard_normal(shape, dtype=np.float32)
    values *= np.float32(1.0 / np.sqrt(fan_in))
    return values.astype(dtype, copy=False)


def ones(shape: tuple[int, ...]) -> np.ndarray:
    """Float32 ones: the identity scale of a norm layer (norms stay f32, as llama.cpp expects)."""
    return np.ones(shape, dtype=np.float32)


def zeros(shape: tuple[int, ...]) -> np.ndarray:
    """Float32 zeros, for biases."""
    return np.zeros(shape, dtype=np.float32)
