"""How the executor asks the vision encoder to run: plain data, no native code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EncoderSettings:
    """How the executor runs the encoder (from the VisionPlan)."""

    projector_path: Path
    use_gpu: bool = False
    flash_attention: bool = True
    image_max_tokens: int = 0  # 0: the projector's own limit
    max_image_side: int = 0  # scale larger images down in Python before libmtmd sees them
    resident: bool = False  # False = VLMOpt: load for each image, free after
    threads: int = 1
    # From the projector's header: fixed-grid encoders resize every image to `fixed_image_size`;
    # dynamic ones cover `patch_px` pixels per side with one output token.
    fixed_image_size: int = 0
    patch_px: int = 0

    @property
    def placement(self) -> str:
        """"gpu_streamed" (VLMOpt on a GPU), "gpu_resident", "cpu" (VLMOpt) or "cpu_resident"."""
        if self.resident:
            return "gpu_resident" if self.use_gpu else "cpu_resident"
        return "gpu_streamed" if self.use_gpu else "cpu"
