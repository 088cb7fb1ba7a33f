"""Writing GGUF files: tensor names, and streaming output that makes tensors one at a time.

gguf's GGUFWriter.add_tensor keeps every array in memory until the file is written; a
SigLIP-class projector (about 850 MB) or a stacked-expert SmolLM2 would hold all of it at once.
Declaring tensor infos first and then writing each array as it is made avoids that.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import MODEL_TENSOR, TENSOR_NAMES, GGMLQuantizationType, GGUFWriter


def tensor_name(kind: MODEL_TENSOR, layer: int | None = None, suffix: str = "weight") -> str:
    """The GGUF name llama.cpp expects, taken from gguf's own table rather than spelled here."""
    base = TENSOR_NAMES[kind]
    if layer is not None:
        base = base.format(bid=layer)
    return f"{base}.{suffix}"


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor to write.

    `shape` is numpy order (outermost axis first; llama.cpp's ne[] is the reverse). For raw
    quantized data, `dtype` is uint8, `shape` is the byte shape (rows..., bytes per row) and
    `raw_dtype` names the ggml type. `make()` must return exactly that shape and dtype.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    make: Callable[[], np.ndarray]
    raw_dtype: GGMLQuantizationType | None = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def write_gguf(
    path: str | os.PathLike[str],
    arch: str,
    add_metadata: Callable[[GGUFWriter], None],
    tensors: Sequence[PlannedTensor],
) -> Path:
    """Write a GGUF file at `path` and return it as a Path.

    The file appears atomically: it is written beside the target under a temporary name and
    renamed at the end, so a crash or a concurrent reader never sees half a model.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = GGUFWriter(tmp, arch)
    try:
        add_metadata(writer)
        for t in tensors:
            writer.add_tensor_info(t.name, t.shape, np.dtype(t.dtype), t.nbytes, raw_dtype=t.raw_dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in tensors:
            data = np.ascontiguousarray(t.make())
            if data.shape != tuple(t.shape) or data.dtype != np.dtype(t.dtype):
                raise AssertionError(
                    f"{t.name}: made {data.shape} {data.dtype}, planned {t.shape} {t.dtype}"
                )
            writer.write_tensor_data(data)
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return path
