"""Generated GGUF test models: deterministic, offline, written in milliseconds to seconds.

- `write_tiny_llama`, `write_tiny_llama_moe`, `write_tiny_qwen3moe`: random-weight text models
  with a byte-level vocabulary and ChatML template (load and decode with llama.cpp, emit garbage).
- `write_tiny_projector`, `write_smollm2_projector`, `write_siglip_projector`: gemma3-type
  vision projectors (mmproj) for mtmd, tiny or SigLIP-class.
- `write_smollm2_moe`: SmolLM2-135M-Instruct turned into a mixture of identical experts; writes
  real text.
- `ensure_test_models`: one shared fixture directory of all tiny models.

Every writer takes an output path (and a seed), returns the path, and gives byte-identical files
for identical arguments.
"""

from .dense import write_tiny_llama
from .moe import write_tiny_llama_moe, write_tiny_qwen3moe
from .projector import (
    VisionShape,
    siglip_vision_shape,
    tiny_vision_shape,
    write_projector,
    write_siglip_projector,
    write_smollm2_projector,
    write_tiny_projector,
)
from .registry import ALL_MODELS, LARGE_MODELS, TINY_MODELS, ensure_test_models, write_models
from .smollm2_moe import smollm2_source_path, write_smollm2_moe
from .vocab import CHATML_TEMPLATE, byte_vocab

__all__ = [
    "ALL_MODELS",
    "CHATML_TEMPLATE",
    "LARGE_MODELS",
    "TINY_MODELS",
    "VisionShape",
    "byte_vocab",
    "ensure_test_models",
    "siglip_vision_shape",
    "smollm2_source_path",
    "tiny_vision_shape",
    "write_models",
    "write_projector",
    "write_siglip_projector",
    "write_smollm2_moe",
    "write_smollm2_projector",
    "write_tiny_llama",
    "write_tiny_llama_moe",
    "write_tiny_qwen3moe",
    "write_tiny_projector",
]
