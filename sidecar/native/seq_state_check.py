"""Reading a saved sequence state's layout without llama.cpp: what a save-game archive's KV state
holds, checked before any of it reaches llama_state_seq_set_data.

The bytes are llama_state_seq_get_data's for one sequence (llama.cpp at the version we pin):
an 8-byte header (a magic number, the sequence saved), then the memory's own state. For a KV cache that is
its stream count and, per stream, a cell count and, for a stream with cells, each cell's position,
sequence ids (and an extension for M-RoPE models), then the data: whether V is transposed, the
layer count, and per layer the K type, row size and rows, then V the same way (or element-wise
when transposed). A sliding-window model writes two such caches one after the other.

llama.cpp checks much of this itself while reading, but an archive comes from a file the player
can edit: so every count is held to what the archive says it holds (its tokens, the context, the
fingerprint's KV types and layers) and the walk must end exactly at the last byte.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# llama_state_seq_get_data's header: llama-context.cpp's io_magic, then the sequence id saved.
SEQ_MAGIC = 0xAF143CD8
# sizeof(llama_kv_cell_ext) where a model keeps one per cell (M-RoPE positions, a token id).
_CELL_EXT_SIZES = (0, 12)
_MAX_STREAMS = 4096
_MAX_LAYERS = 4096


class StateLayoutError(ValueError):
    """The bytes are not a sequence state as this build writes one; the message says where."""


@dataclass(frozen=True)
class StateLayout:
    cells: int  # KV cells of the sequence (one per token fed)
    streams: int
    layers: int  # over every cache of the state (two for sliding-window models)
    k_types: frozenset[int]  # ggml type ids
    v_types: frozenset[int]
    v_trans: bool
    max_pos: int  # the highest position of a cell (-1 when empty)


class _Reader:
    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def take(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise StateLayoutError(f"the KV state ends inside {what} (byte {self.pos} of {len(self.data)})")
        value = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value[0]

    def skip(self, n: int, what: str) -> None:
        if self.pos + n > len(self.data):
            raise StateLayoutError(f"the KV state ends inside {what}: {n} bytes declared, {len(self.data) - self.pos} left")
        self.pos += n


def read_layout(state: bytes | memoryview, *, max_cells: int) -> StateLayout:
    """The layout of one sequence's saved state; StateLayoutError when it is not one this build
    reads, or holds more than `max_cells` cells or a position past them.

    What cannot be told from the bytes alone (a per-cell extension; V blocks absent in models
    that derive V from K) is tried both ways, the same for every cache of the state: the reading
    that ends exactly at the last byte is the layout."""
    first: StateLayoutError | None = None
    for ext in _CELL_EXT_SIZES:
        for with_v in (True, False):
            try:
                return _read(state, max_cells, ext, with_v)
            except StateLayoutError as e:
                first = first or e
    raise first


def _read(state: bytes | memoryview, max_cells: int, ext: int, with_v: bool) -> StateLayout:
    r = _Reader(state)
    if r.take("<I", "the header") != SEQ_MAGIC:
        raise StateLayoutError("the KV state does not start as llama.cpp writes a sequence state")
    r.take("<i", "the header")  # the sequence it was saved from: any
    parts = []
    while r.pos < len(r.data) or not parts:
        if len(parts) == 2:
            raise StateLayoutError(f"the KV state has {len(r.data) - r.pos} bytes past its caches")
        parts.append(_cache(r, max_cells, ext, with_v))
    cells = {p.cells for p in parts}
    if len(cells) != 1:
        raise StateLayoutError(f"the KV state's caches hold different cell counts: {sorted(cells)}")
    return StateLayout(
        cells=cells.pop(), streams=parts[0].streams, layers=sum(p.layers for p in parts),
        k_types=frozenset().union(*(p.k_types for p in parts)), v_types=frozenset().union(*(p.v_types for p in parts)),
        v_trans=parts[0].v_trans, max_pos=max(p.max_pos for p in parts),
    )


def _cache(r: _Reader, max_cells: int, ext: int, with_v: bool) -> StateLayout:
    streams = r.take("<I", "the stream count")
    if not 1 <= streams <= _MAX_STREAMS:
        raise StateLayoutError(f"the KV state declares {streams} streams")
    found: StateLayout | None = None
    for _ in range(streams):
        n = r.take("<I", "a cell count")
        if n == 0:
            continue
        if found is not None:
            raise StateLayoutError("the KV state has cells in more than one stream: it is not one sequence's")
        if n > max_cells:
            raise StateLayoutError(f"the KV state holds {n} cells; the context holds {max_cells}")
        max_pos = _meta(r, n, ext, max_cells)
        found = _data(r, n, streams, max_pos, with_v)
    return found or StateLayout(0, streams, 0, frozenset(), frozenset(), False, -1)


def _meta(r: _Reader, n: int, ext: int, max_cells: int) -> int:
    last = -1
    for _ in range(n):
        pos = r.take("<i", "a cell's position")
        n_seq = r.take("<I", "a cell's sequence count")
        r.skip(ext, "a cell's extension")
        if n_seq != 1:
            raise StateLayoutError(f"a cell of the KV state belongs to {n_seq} sequences, not one")
        r.skip(4, "a cell's sequence id")
        if not last < pos < max_cells:
            raise StateLayoutError(f"a cell of the KV state is at position {pos} (after {last}, context {max_cells})")
        last = pos
    return last


def _data(r: _Reader, n: int, streams: int, max_pos: int, with_v: bool) -> StateLayout:
    v_trans = r.take("<I", "the V layout flag")
    layers = r.take("<I", "the layer count")
    if v_trans > 1 or not 1 <= layers <= _MAX_LAYERS:
        raise StateLayoutError(f"the KV state declares V layout {v_trans} and {layers} layers")
    k_types, v_types = set(), set()
    for _ in range(layers):
        k_types.add(r.take("<i", "a K type"))
        r.skip(r.take("<Q", "a K row size") * n, "K rows")
    for _ in range(layers if with_v else 0):
        v_types.add(r.take("<i", "a V type"))
        if v_trans:
            element, width = r.take("<I", "a V element size"), r.take("<I", "a V width")
            r.skip(element * width * n, "V elements")
        else:
            r.skip(r.take("<Q", "a V row size") * n, "V rows")
    return StateLayout(n, streams, layers, frozenset(k_types), frozenset(v_types), bool(v_trans), max_pos)
