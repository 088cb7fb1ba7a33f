"""A fast reader of a GGUF file's header: metadata values and tensor infos, in one pass.

gguf-py's GGUFReader builds numpy views of every field, which for a 49k-token vocabulary (and
its merges) takes seconds in Python, all of it in front of the daemon's first reply. The planner
needs only the scalars, small arrays and the tensor table; the tokenizer's arrays are stepped
over (their lengths read, their strings not decoded). Little-endian GGUF v2/v3 only: anything
else raises ValueError and the caller falls back to GGUFReader.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from sidecar.model_info.ggml_types import type_name_of
from sidecar.model_info.model import TensorInfo

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32  # GGUF's, when general.alignment is absent


class _Cursor:
    def __init__(self, buf) -> None:
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str):
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def skip_strings(self, count: int) -> None:
        buf, pos = self.buf, self.pos
        for _ in range(count):
            pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
        self.pos = pos

    def value(self, kind: int, keep: bool) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        elem, count = self.unpack("<I"), self.unpack("<Q")
        if not keep:
            if elem == _STRING:
                self.skip_strings(count)
            elif elem in _SCALARS:
                self.pos += struct.calcsize(_SCALARS[elem]) * count
            else:
                for _ in range(count):
                    self.value(elem, False)
            return count
        return [self.value(elem, True) for _ in range(count)]


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], tuple[TensorInfo, ...]]:
    """(metadata, tensors) as gguf_reader's _fields and _tensors give them: tokenizer arrays are
    left out, but for "__n_tokens", the vocabulary's length."""
    meta, tensors, _ = _read(path)
    return meta, tensors


def tensor_spans(path: str | os.PathLike[str]) -> dict[str, tuple[int, int]]:
    """{tensor name: (offset in the file, bytes)}: where each weight lies, for giving back the pages
    of those llama.cpp copies out of its mapping (native/mapped_weights.py)."""
    _, tensors, offsets = _read(path)
    return {t.name: (offset, t.n_bytes) for t, offset in zip(tensors, offsets)}


def _read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], tuple[TensorInfo, ...], tuple[int, ...]]:
    """The metadata, the tensor infos and each tensor's offset in the file."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        c = _Cursor(buf)
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError("not a GGUF file (bad magic)")
        c.pos = 4
        version = c.unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (big-endian or unknown)")
        n_tensors, n_kv = c.unpack("<Q"), c.unpack("<Q")
        # The pseudo-fields GGUFReader adds, so both readers give the same dict.
        meta: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_kv}
        for _ in range(n_kv):
            key = c.string()
            kind = c.unpack("<I")
            skip = key.startswith("tokenizer.ggml.") and key != "tokenizer.ggml.model"
            value = c.value(kind, keep=not skip)
            if key == "tokenizer.ggml.tokens":
                meta["__n_tokens"] = value
            elif not skip:
                meta[key] = value
        tensors, relative = [], []
        for _ in range(n_tensors):
            name = c.string()
            dims = tuple(c.unpack("<Q") for _ in range(c.unpack("<I")))
            type_id = c.unpack("<I")
            relative.append(c.unpack("<Q"))  # from the start of the data section
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
            n = 1
            for d in dims:
                n *= d
            tensors.append(TensorInfo(name=name, ggml_type=type_name_of(type_id), shape=dims, n_bytes=n * size // block))
        # The data section starts at the next multiple of general.alignment after the tensor infos.
        alignment = int(meta.get("general.alignment", DEFAULT_ALIGNMENT))
        data = -(-c.pos // alignment) * alignment
        return meta, tuple(tensors), tuple(data + r for r in relative)
