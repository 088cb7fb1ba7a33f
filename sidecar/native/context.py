"""A llama.cpp context with several sequences: batched decode, per-sequence KV edits and state.

Only the engine thread may call into one of these; llama.cpp contexts are not thread-safe.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp
import numpy as np

from sidecar.native.seq_state import restream, stream_count
from sidecar.native.log_capture import capture_native_log
from sidecar.native.model import NativeModel
from sidecar.errors import EngineFailure, InvalidArgument, ModelLoadError, ResourceExhausted

_FLASH = {
    None: llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    True: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


@dataclass(frozen=True)
class BatchEntry:
    """One token of a forward pass: which sequence, at which position, and whether its logits are needed."""

    token: int
    pos: int
    seq: int
    logits: bool


def kv_ggml_type(name: str) -> int:
    """The ggml type id of a KV cache type name ("F16", "Q8_0"); InvalidArgument for others."""
    value = getattr(llama_cpp, f"GGML_TYPE_{name.upper()}", None)
    if not isinstance(value, int):
        raise InvalidArgument(f"unknown KV cache type {name!r}")
    return value


class NativeContext:
    """Owns a llama_context and one reusable llama_batch.

    Each sequence gets its own KV stream of `ctx_per_seq` cells (kv_unified off): conversations
    rarely share a prefix, and a unified cache would make every token attend over every
    conversation's cells (64 streams of SmolLM2: 200 tokens/s unified, 384 per-sequence). The
    price: llama.cpp then batches only consecutive sequence ids together, so the engine keeps
    the generating ones packed (Engine._pack) and feeds them in id order (plan_step).
    """

    def __init__(
        self,
        model: NativeModel,
        *,
        n_seq: int,
        ctx_per_seq: int,
        n_batch: int,
        n_ubatch: int,
        threads_decode: int,
        threads_prefill: int,
        flash_attention: bool | None,
        op_offload: bool = True,
        kv_on_gpu: bool = True,
        kv_type: str = "F16",
        n_outputs_max: int = 0,
    ) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = ctx_per_seq * n_seq
        params.n_batch = n_batch
        params.n_ubatch = n_ubatch
        params.n_seq_max = n_seq
        params.n_threads = threads_decode
        params.n_threads_batch = threads_prefill
        params.kv_unified = False
        params.no_perf = True
        params.op_offload = op_offload
        params.offload_kqv = kv_on_gpu
        params.flash_attn_type = _FLASH[flash_attention]
        params.type_k = params.type_v = kv_ggml_type(kv_type)
        # The logits buffer llama.cpp reserves is n_vocab x n_outputs_max floats (n_batch when 0:
        # 100 MB for SmolLM2 at 512), in the compute buffer of the device the output runs on.
        params.n_outputs_max = n_outputs_max
        with capture_native_log() as context_log:
            self.ptr = llama_cpp.llama_init_from_model(model.ptr, params)
        self.load_log = context_log
        if not self.ptr:
            raise ModelLoadError(f"llama.cpp could not create a context of {n_seq} x {ctx_per_seq} tokens")
        self.n_seq = n_seq
        self.ctx_per_seq = int(llama_cpp.llama_n_ctx_seq(self.ptr))
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._memory = llama_cpp.llama_get_memory(self.ptr)
        self._threads = (threads_decode, threads_prefill)

    def set_threads(self, threads: int) -> None:
        """Threads for the next forward passes (both phases: the engine picks per pass by its tier)."""
        if self._threads != (threads, threads):
            llama_cpp.llama_set_n_threads(self.ptr, threads, threads)
            self._threads = (threads, threads)

    def decode(self, entries: list[BatchEntry]) -> None:
        """Run one forward pass. ResourceExhausted when the KV cache has no room, EngineFailure otherwise."""
        b = self._batch
        for i, e in enumerate(entries):
            b.token[i] = e.token
            b.pos[i] = e.pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = e.seq
            b.logits[i] = e.logits
        b.n_tokens = len(entries)
        rc = llama_cpp.llama_decode(self.ptr, b)
        if rc == 1:
            raise ResourceExhausted("the context is full")
        if rc != 0:
            raise EngineFailure(f"llama_decode returned {rc}")

    def decode_embeddings(self, seq: int, pos0: int, embeddings: np.ndarray, non_causal: bool) -> None:
        """Feed an image's embeddings into `seq` at positions pos0.. (no logits: text follows).

        Encoders like Gemma 3's want the image's tokens to attend to each other both ways; llama.cpp
        does that only inside one micro-batch, so such an image must fit one.
        """
        n, width = embeddings.shape
        if non_causal and n > self.n_ubatch:
            raise ResourceExhausted(
                f"an image of {n} tokens needs a micro-batch of at least {n}; this context has {self.n_ubatch}"
            )
        step = n if non_causal else min(n, self.n_batch)
        data = np.ascontiguousarray(embeddings, dtype=np.float32)
        batch = llama_cpp.llama_batch_init(step, width, 1)
        if non_causal:
            llama_cpp.llama_set_causal_attn(self.ptr, False)
        try:
            for start in range(0, n, step):
                m = min(step, n - start)
                ctypes.memmove(batch.embd, data[start : start + m].ctypes.data, m * width * 4)
                for i in range(m):
                    batch.pos[i] = pos0 + start + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = seq
                    batch.logits[i] = False
                batch.n_tokens = m
                rc = llama_cpp.llama_decode(self.ptr, batch)
                if rc == 1:
                    raise ResourceExhausted("the context is full")
                if rc != 0:
                    raise EngineFailure(f"llama_decode of image embeddings returned {rc}")
        finally:
            if non_causal:
                llama_cpp.llama_set_causal_attn(self.ptr, True)
            llama_cpp.llama_batch_free(batch)

    def truncate(self, seq: int, keep: int) -> bool:
        """Drop the sequence's cells from position `keep` on. False if llama.cpp cannot (then clear it)."""
        return bool(llama_cpp.llama_memory_seq_rm(self._memory, seq, keep, -1))

    def clear(self, seq: int) -> None:
        llama_cpp.llama_memory_seq_rm(self._memory, seq, -1, -1)

    def cut_out(self, seq: int, start: int, stop: int) -> bool:
        """Remove positions [start, stop) of the sequence and move everything after them down,
        so the cache holds what a prompt without that range would (up to RoPE shift rounding,
        and with attention once computed over the removed part). False where llama.cpp cannot
        shift this model's cache; the caller then recomputes."""
        if not llama_cpp.llama_memory_can_shift(self._memory):
            return False
        if not llama_cpp.llama_memory_seq_rm(self._memory, seq, start, stop):
            return False
        llama_cpp.llama_memory_seq_add(self._memory, seq, stop, -1, start - stop)
        return True

    def save(self, seq: int) -> bytes:
        """The sequence's KV state as bytes (host memory), for eviction or a reload."""
        size = llama_cpp.llama_state_seq_get_size(self.ptr, seq)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self.ptr, buf, size, seq)
        # string_at is one memcpy; slicing a c_uint8 array builds a list of ints first (30x slower).
        return ctypes.string_at(buf, written)

    def restore(self, seq: int, state: bytes) -> None:
        """Load a state saved by `save` (from this or another context on an equal model) into `seq`."""
        self.clear(seq)
        if stream_count(state) != self.n_seq:  # saved before the KV cache was resized (kv_demand.py)
            state = restream(state, self.n_seq)
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if llama_cpp.llama_state_seq_set_data(self.ptr, buf, len(state), seq) == 0:
            raise EngineFailure("llama.cpp refused a saved sequence state")

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ptr)
            self.ptr = None
