"""A sequence's saved KV state, carried into a context with another number of sequences.

With one KV stream per sequence (kv_unified off), llama.cpp writes a sequence's state as the
stream count, then each stream's cell count and, for the one stream holding the sequence, its
cells (llama_kv_cache::state_write), after llama_state_seq_get_data's own 8-byte header; reading it back refuses another stream count ("n_stream
mismatch") although only that one stream matters, and puts the cells in the stream of the
sequence it is read into whatever their position was. So a state saved with 2 sequences is the
same bytes with a new count and the empty streams' zero counts moved: what kv_demand.py needs to
grow and shrink the KV cache around live conversations, evicted sessions and cached prefixes.

Only for a plain KV cache: a sliding-window model writes two caches one after the other, a
recurrent one other state, and their stream counts never change (NativeModel.plain_kv).
"""

from __future__ import annotations

import struct

from sidecar.errors import EngineFailure

_U32 = struct.Struct("<I")
# llama_state_seq_get_data opens with a magic number and a format version (8 bytes) before the
# memory's own state.
_MAGIC = 0xAF143CD8
_HEADER = 8


def _start(state: bytes) -> int:
    if _U32.unpack_from(state, 0)[0] != _MAGIC:
        raise EngineFailure("a saved sequence state does not start as llama.cpp writes one")
    return _HEADER


def stream_count(state: bytes) -> int:
    return _U32.unpack_from(state, _start(state))[0]


def restream(state: bytes, streams: int) -> bytes:
    """`state` (one sequence's) as a context of `streams` streams reads it."""
    head = _start(state)
    saved = _U32.unpack_from(state, head)[0]
    if saved == streams:
        return state
    offset, empty_before = head + _U32.size, 0
    while empty_before < saved and _U32.unpack_from(state, offset)[0] == 0:
        offset += _U32.size
        empty_before += 1
    if empty_before == saved:  # nothing cached
        return state[:head] + _U32.pack(streams) + bytes(_U32.size * streams)
    empty_after = saved - empty_before - 1
    end = len(state) - _U32.size * empty_after
    if end <= offset or any(state[end:]):
        raise EngineFailure("a saved sequence state is not laid out as one stream's cells")
    return state[:head] + _U32.pack(streams) + state[offset:end] + bytes(_U32.size * (streams - 1))
