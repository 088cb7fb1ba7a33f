"""Vision projectors (mmproj files) for llama.cpp's mtmd: a SigLIP-style ViT with the Gemma 3
projector head, at any size from tiny to SigLIP-class.

One code path makes both: the tiny projector proves the multimodal plumbing in milliseconds,
the SigLIP-class one (same function, bigger shape) costs what a real encoder costs in time and
memory. Neither sees the image: weights are random.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
from gguf import MODEL_TENSOR, GGUFWriter, LlamaFileType

from .gguf_out import PlannedTensor, tensor_name, write_gguf
from .weights import float_dtype, ones, random_matrix, zeros

PROJECTOR_TYPE = "gemma3"
LAYER_NORM_EPS = 1e-6
# SigLIP normalizes pixels to [-1, 1].
IMAGE_MEAN = (0.5, 0.5, 0.5)
IMAGE_STD = (0.5, 0.5, 0.5)
SMOLLM2_N_EMBD = 576


@dataclass(frozen=True)
class VisionShape:
    """Hyperparameters of a generated projector.

    `text_n_embd` is the width of the language model it feeds (llama.cpp refuses a projector
    whose output width differs). The encoder sees `image_size` square pictures cut into
    `patch_size` patches; the Gemma 3 head average-pools `scale_factor` x `scale_factor`
    patches into one image token.
    """

    text_n_embd: int
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    patch_size: int
    image_size: int
    scale_factor: int
    dtype: str

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_image_tokens(self) -> int:
        """Tokens one image becomes in the text model's context."""
        return (self.patches_per_side // self.scale_factor) ** 2

    def param_count(self) -> int:
        """Number of weights the file will hold (what decides its memory cost)."""
        return sum(int(np.prod(t.shape)) for t in _plan(self, seed=0))

    def validate(self) -> None:
        """Raise ValueError for shapes mtmd would reject or misread."""
        float_dtype(self.dtype)
        for field in ("text_n_embd", "n_layer", "n_embd", "n_ff", "n_head", "patch_size",
                      "image_size", "scale_factor"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive")
        # mtmd guesses that old files named ffn_up/ffn_down the wrong way round when ffn_down's
        # input width equals n_embd, and would swap them; a square FFN is thus ambiguous.
        if self.n_ff == self.n_embd:
            raise ValueError("vision n_ff must differ from vision n_embd")
        if self.n_embd % self.n_head:
            raise ValueError("vision n_embd must be divisible by n_head")
        if self.image_size % self.patch_size:
            raise ValueError("image_size must be a multiple of patch_size")
        if self.patches_per_side % self.scale_factor:
            raise ValueError("image_size / patch_size must be divisible by scale_factor")


def _metadata(shape: VisionShape, writer: GGUFWriter) -> None:
    writer.add_name("random gemma3-style vision projector (test model)")
    writer.add_file_type(LlamaFileType.ALL_F32 if shape.dtype == "f32" else LlamaFileType.MOSTLY_F16)
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type(PROJECTOR_TYPE)
    writer.add_vision_use_gelu(True)
    writer.add_vision_embedding_length(shape.n_embd)
    writer.add_vision_feed_forward_length(shape.n_ff)
    writer.add_vision_block_count(shape.n_layer)
    writer.add_vision_head_count(shape.n_head)
    writer.add_vision_attention_layernorm_eps(LAYER_NORM_EPS)
    writer.add_vision_projection_dim(shape.text_n_embd)
    writer.add_vision_image_size(shape.image_size)
    writer.add_vision_patch_size(shape.patch_size)
    writer.add_vision_image_mean(list(IMAGE_MEAN))
    writer.add_vision_image_std(list(IMAGE_STD))
    writer.add_vision_projector_scale_factor(shape.scale_factor)


def _plan(shape: VisionShape, seed: int) -> list[PlannedTensor]:
    dtype = float_dtype(shape.dtype)
    f32 = np.dtype(np.float32)
    plan: list[PlannedTensor] = []

    def matrix(name: str, dims: tuple[int, ...], dt: np.dtype = dtype) -> None:
        plan.append(PlannedTensor(name, dims, dt, partial(random_matrix, seed, name, dims, dt)))

    def const(name: str, size: int, make) -> None:
        plan.append(PlannedTensor(name, (size,), f32, partial(make, (size,))))

    def linear(kind: MODEL_TENSOR, layer: int, n_out: int, n_in: int) -> None:
        matrix(tensor_name(kind, layer), (n_out, n_in))
        const(tensor_name(kind, layer, "bias"), n_out, zeros)

    def layer_norm(kind: MODEL_TENSOR, layer: int | None) -> None:
        const(tensor_name(kind, layer), shape.n_embd, ones)
        const(tensor_name(kind, layer, "bias"), shape.n_embd, zeros)

    d, p = shape.n_embd, shape.patch_size
    # Conv kernel (out channels, RGB, patch, patch); its fan-in is the whole 3*p*p window.
    patch = tensor_name(MODEL_TENSOR.V_ENC_EMBD_PATCH)
    plan.append(PlannedTensor(
        patch, (d, 3, p, p), dtype,
        lambda: random_matrix(seed, patch, (d, 3 * p * p), dtype).reshape(d, 3, p, p),
    ))
    const(tensor_name(MODEL_TENSOR.V_ENC_EMBD_PATCH, suffix="bias"), d, zeros)
    # Kept f32: it is added to f32 activations, and real converters store it that way.
    matrix(tensor_name(MODEL_TENSOR.V_ENC_EMBD_POS), (shape.patches_per_side**2, d), f32)
    for i in range(shape.n_layer):
        layer_norm(MODEL_TENSOR.V_ENC_INPUT_NORM, i)
        linear(MODEL_TENSOR.V_ENC_ATTN_Q, i, d, d)
        linear(MODEL_TENSOR.V_ENC_ATTN_K, i, d, d)
        linear(MODEL_TENSOR.V_ENC_ATTN_V, i, d, d)
        linear(MODEL_TENSOR.V_ENC_ATTN_O, i, d, d)
        layer_norm(MODEL_TENSOR.V_ENC_POST_ATTN_NORM, i)
        linear(MODEL_TENSOR.V_ENC_FFN_UP, i, shape.n_ff, d)
        linear(MODEL_TENSOR.V_ENC_FFN_DOWN, i, d, shape.n_ff)
    layer_norm(MODEL_TENSOR.V_POST_NORM, None)
    const(tensor_name(MODEL_TENSOR.V_MM_SOFT_EMB_NORM), d, ones)
    # Gemma 3 stores this one as (vision width, text width) and multiplies x @ W, so in ggml
    # order its first dimension is the text width: that is what mtmd compares to the LLM's.
    matrix(tensor_name(MODEL_TENSOR.V_MM_INP_PROJ), (d, shape.text_n_embd))
    return plan


def write_projector(path: str | os.PathLike[str], shape: VisionShape, *, seed: int = 0) -> Path:
    """Validate `shape`, write the projector to `path` and return the path.

    Same (shape, seed) gives a byte-identical file. Memory use stays at one tensor at a time.
    """
    shape.validate()
    return write_gguf(path, "clip", partial(_metadata, shape), _plan(shape, seed))


def tiny_vision_shape(
    *,
    text_n_embd: int = 64,
    n_layer: int = 2,
    n_embd: int = 32,
    n_ff: int = 64,
    n_head: int = 2,
    patch_size: int = 8,
    image_size: int = 64,
    scale_factor: int = 2,
    dtype: str = "f32",
) -> VisionShape:
    """The tiny projector's shape: 8x8 patches pooled 2x2, so an image is 16 tokens."""
    return VisionShape(text_n_embd, n_layer, n_embd, n_ff, n_head, patch_size, image_size,
                       scale_factor, dtype)


def siglip_vision_shape(
    *,
    text_n_embd: int = SMOLLM2_N_EMBD,
    n_layer: int = 27,
    n_embd: int = 1152,
    n_ff: int = 4304,
    n_head: int = 16,
    patch_size: int = 14,
    image_size: int = 896,
    scale_factor: int = 4,
    dtype: str = "f16",
) -> VisionShape:
    """A SigLIP-So400m-class shape (Gemma 3's encoder): about 400M weights, 256 image tokens."""
    return VisionShape(text_n_embd, n_layer, n_embd, n_ff, n_head, patch_size, image_size,
                       scale_factor, dtype)


def write_tiny_projector(
    path: str | os.PathLike[str], *, text_n_embd: int = 64, seed: int = 0, **sizes: int | str
) -> Path:
    """Write a tiny gemma3 projector (2 blocks, 32 wide, 64 px images -> 16 tokens) for a text
    model `text_n_embd` wide (default 64, the tiny llama's width). `sizes` override the other
    keyword arguments of `tiny_vision_shape`. Returns the path."""
    return write_projector(path, tiny_vision_shape(text_n_embd=text_n_embd, **sizes), seed=seed)


def write_siglip_projector(
    path: str | os.PathLike[str], text_n_embd: int = SMOLLM2_N_EMBD, *, seed: int = 0,
    **sizes: int | str,
) -> Path:
    """Write a SigLIP-class gemma3 projector (about 850 MB in f16, ~6 s to write) feeding a text
    model `text_n_embd` wide. `sizes` override `siglip_vision_shape`. Returns the path."""
    return write_projector(path, siglip_vision_shape(text_n_embd=text_n_embd, **sizes), seed=seed)


def write_smollm2_projector(path: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Write a tiny projector whose output width (576) fits SmolLM2-135M. Returns the path."""
    return write_tiny_projector(path, seed=seed, text_n_embd=SMOLLM2_N_EMBD)
