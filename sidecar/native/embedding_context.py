"""Sentence embeddings from the served model itself, through a small context of its own.

An NPC's memory (what did the player say an hour ago?) needs a vector per line. The served model
gives one without a second model on disk or in memory: a llama.context with `embeddings` on over
the same weights, created when the first embedding is asked for. It is small: EMBED_CONTEXT cells
shared by its sequences (its KV cache and compute buffer are a few MB for SmolLM2).

It hands back every token's final hidden state, and the caller takes their mean (mean pooling).
llama.cpp's own pooling would do that only within one micro-batch, so an input would have to go
in one pass; summing here lets a long input go in chunks, its earlier chunks kept in the KV cache
(a causal model's states of a token depend only on the tokens before it: the same vector to 1e-7),
and several short inputs share one pass as sequences of their own. The engine runs those passes
between its generation passes (engine/embedding_slices.py), so they never fight it for cores.

A causal language model's mean-pooled hidden states are weaker embeddings than a trained embedding
model's, but they rank paraphrases above unrelated lines (tested), which is what recall needs;
a dedicated embedding GGUF can be served by a second daemon.
"""

from __future__ import annotations

import llama_cpp
import numpy as np

from sidecar.errors import EngineFailure, ModelLoadError
from sidecar.native.log_capture import capture_native_log
from sidecar.native.model import NativeModel

# Longest input in tokens: a line of dialogue or a memory note, not a document.
EMBED_CONTEXT = 512
# Most tokens one pass carries: a stream waits for one such pass at most. Measured on 2 cores with
# SmolLM2 (510 tokens): 128-token chunks took 1.05x the time of one 512-token pass, 64-token ones
# 1.15x, and a 128-token pass took 0.5 s where the whole input took 1.9 s.
EMBED_SLICE_TOKENS = 128
# Short inputs one pass may carry side by side (one sequence each; 64 one-token lines took 0.23 s
# in one pass against 0.65 s one by one).
EMBED_SEQUENCES = 64


class EmbeddingContext:
    """Owns an embedding llama_context on `model`; one pass at a time."""

    def __init__(self, model: NativeModel, threads: int) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = EMBED_CONTEXT
        params.n_batch = params.n_ubatch = EMBED_SLICE_TOKENS
        params.n_seq_max = EMBED_SEQUENCES
        params.kv_unified = True  # the sequences share the cells: one long input or many short ones
        params.n_threads = params.n_threads_batch = threads
        params.embeddings = True
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
        params.no_perf = True
        with capture_native_log():
            self.ptr = llama_cpp.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise ModelLoadError("llama.cpp could not create an embedding context for this model")
        self.width = int(llama_cpp.llama_model_n_embd(model.ptr))
        self._memory = llama_cpp.llama_get_memory(self.ptr)
        self._batch = llama_cpp.llama_batch_init(EMBED_SLICE_TOKENS, 0, 1)

    def set_threads(self, threads: int) -> None:
        llama_cpp.llama_set_n_threads(self.ptr, threads, threads)

    def clear(self) -> None:
        """Forget every sequence: the next pass starts new inputs."""
        llama_cpp.llama_memory_clear(self._memory, True)

    def sums(self, pieces: list[tuple[int, list[int], int]]) -> list[np.ndarray]:
        """Run one pass over `pieces`, each (sequence, tokens, position of its first token), at
        most EMBED_SLICE_TOKENS tokens in all; for each piece, the sum of its tokens' hidden states
        (float64). A piece continues what its sequence holds from earlier passes."""
        b = self._batch
        n = 0
        for seq, tokens, first in pieces:
            for i, token in enumerate(tokens):
                b.token[n] = token
                b.pos[n] = first + i
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = seq
                b.logits[n] = True  # every token's state is wanted
                n += 1
        if not 0 < n <= EMBED_SLICE_TOKENS:
            raise EngineFailure(f"an embedding pass of {n} tokens (1 .. {EMBED_SLICE_TOKENS})")
        b.n_tokens = n
        rc = llama_cpp.llama_decode(self.ptr, b)
        if rc != 0:
            raise EngineFailure(f"llama_decode of embedding inputs returned {rc}")
        states = llama_cpp.llama_get_embeddings(self.ptr)
        if not states:
            raise EngineFailure("llama.cpp returned no embeddings")
        # In batch order: llama.cpp sorts its outputs back before handing them out.
        rows = np.ctypeslib.as_array(states, shape=(n, self.width))
        out, at = [], 0
        for _, tokens, _ in pieces:
            out.append(rows[at : at + len(tokens)].sum(axis=0, dtype=np.float64))
            at += len(tokens)
        return out

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ptr)
            self.ptr = None
