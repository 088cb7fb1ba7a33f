"""What a model is, as the planner needs it: hyperparameters and every tensor's name, type, bytes.

Built from a GGUF header (gguf_reader) or from a Hugging Face config.json (hf_config); both give
the same ModelInfo, so a model can be planned before it is downloaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

_LAYER = re.compile(r"^(?:v\.)?blk\.(\d+)\.")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as llama.cpp names and stores it.

    `shape` is in ggml order (ne0 first: the input width of a weight matrix, then its output
    width, then the expert count for 3-D expert tensors).
    """

    name: str
    ggml_type: str
    shape: tuple[int, ...]
    n_bytes: int

    @property
    def n_elements(self) -> int:
        """Number of weights."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def layer(self) -> int | None:
        """The block index in `blk.N.` / `v.blk.N.` names, None for tensors outside the blocks."""
        match = _LAYER.match(self.name)
        return int(match.group(1)) if match else None

    @property
    def is_matrix(self) -> bool:
        """True for weights that enter a matrix product (2-D or 3-D), False for norms and biases."""
        return len(self.shape) >= 2 and self.shape[0] > 1 and self.shape[1] > 1


@dataclass(frozen=True)
class VisionInfo:
    """The vision encoder of a projector (mmproj) file.

    `tokens_per_image` is what the encoder computes over (patches), `output_tokens` what it hands
    the language model after the projector merges patches.
    """

    projector_type: str
    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    projection_dim: int
    scale_factor: int = 1

    @property
    def tokens_per_image(self) -> int:
        side = self.image_size // max(1, self.patch_size)
        return side * side

    @property
    def output_tokens(self) -> int:
        return self.tokens_per_image // max(1, self.scale_factor) ** 2


@dataclass(frozen=True)
class ModelInfo:
    """A model's shape and tensors; no weights.

    For a mixture of experts, `n_ff_expert` is each routed expert's width and `n_ff_shared` the
    shared experts' total width (0 when there are none). `swa_layers` lists the layers that use
    sliding-window attention over `sliding_window` tokens (their KV cache stays small).
    For a vision projector (`vision` set) the text fields describe nothing and are 0.
    """

    name: str
    arch: str
    source: str
    file_type: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    n_ctx_train: int
    tensors: tuple[TensorInfo, ...]
    n_expert: int = 0
    n_expert_used: int = 0
    n_expert_shared: int = 0
    n_ff_expert: int = 0
    n_ff_shared: int = 0
    sliding_window: int = 0
    swa_layers: tuple[int, ...] = ()
    vision: VisionInfo | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def is_projector(self) -> bool:
        return self.vision is not None

    @property
    def total_bytes(self) -> int:
        """Bytes of all tensors: what the weights occupy wherever they live."""
        return sum(t.n_bytes for t in self.tensors)

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @cached_property
    def _by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}

    def tensor(self, name: str) -> TensorInfo | None:
        """The tensor called `name`, or None."""
        return self._by_name.get(name)

    @property
    def has_output_tensor(self) -> bool:
        """False when the output projection reuses the token embedding (tied weights)."""
        return "output.weight" in self._by_name

    def describe(self) -> str:
        """One line: name, architecture, size, and the MoE shape when there is one."""
        gib = self.total_bytes / (1 << 30)
        text = f"{self.name} ({self.arch}, {self.file_type}, {gib:.2f} GiB"
        if self.vision:
            v = self.vision
            return f"{text}, vision {v.n_layer} blocks x {v.n_embd}, {v.tokens_per_image} patches/image)"
        text += f", {self.n_layer} layers x {self.n_embd}"
        if self.is_moe:
            text += f", {self.n_expert} experts ({self.n_expert_used} used)"
        return text + ")"
