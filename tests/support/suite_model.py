"""The model the suite's daemons and engines serve: the bundled SmolLM2-135M, requantized to Q4_0.

The bundled file is Q4_1, which llama.cpp's CPU backend computes token by token; Q4_0 it repacks
(on AVX2 and AVX-512; not in test-other-kernels' AVX build) into kernels that compute several
tokens at once (README, "Your own model"). Most of the suite's CPU time is the model's passes
(prompts, crowds, embeddings), so the suite serves Q4_0. Measured on the 2-core Xeon, one thread:
a 400-token prompt 2,951 ms in Q4_1, 1,249 ms in Q4_0; a decoded token 19.8 against 17.2 ms;
tests/engine/test_prefix_sharing.py 104-125 s against 72-78 s. The whole first part of
./scripts/test, 502-533 s before and 455-458 s after in two runs each, varies more than that
from run to run on a shared machine (603 s once after; CI 511 s before, then 532 s and 475 s).

It is the same network, vocabulary and chat template, so what the tests check (the mechanism,
never the words) holds for both. Tests about the bundled file itself (its header, the frozen
build, the size a RAM budget is cut to) name `default_model_path()`. The RAM-budget tests serve
the Q4_0 copy: llama.cpp keeps its repacked weights twice unless the daemon gives the mapped copy
back (native/mapped_weights.py), so they check that too. The quantization is
llama.cpp's own (`llama_model_quantize`, 1 s), done once per test process into the run's cache
folder (conftest's XDG_CACHE_HOME), written beside and renamed so a reader never sees half a file.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from sidecar.model_info.default_model import default_model_path


@functools.cache
def suite_model_path() -> Path:
    """XLM_SUITE_MODEL=bundled runs the suite on the bundled file itself (the Q4_1 kernels)."""
    source = default_model_path()
    if os.environ.get("XLM_SUITE_MODEL") == "bundled":
        return source
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xlm-tests"
    target = folder / source.name.replace(".Q4_1.", ".Q4_0.")
    if target.is_file():
        return target
    import llama_cpp

    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True  # the source is Q4_1: a little quality lost, which no test reads
    params.nthread = 1
    if llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), params) != 0:
        raise RuntimeError(f"llama_model_quantize could not requantize {source} to Q4_0")
    os.replace(partial, target)
    return target


def bundled_model_flags() -> tuple[str, str]:
    """`--model` the bundled Q4_1 file, for a test daemon whose subject is that file's size: a RAM
    budget that holds it beside one conversation and not an embedding model too."""
    return ("--model", str(default_model_path()))
