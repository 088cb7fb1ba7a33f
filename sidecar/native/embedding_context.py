"""Sentence embeddings from the served model itself, through a small context of its own.

An NPC's memory (what did the player say an hour ago?) needs a vector per line. The served model
gives one without a second model on disk or in memory: a llama.context with `embeddings` on and
mean pooling over the same weights, created when the first embedding is asked for. It is small:
one sequence of EMBED_CONTEXT tokens (its KV cache and compute buffer are a few MB for SmolLM2),
and it runs on the engine thread between passes, so it never fights the generation for cores.

A causal language model's mean-pooled hidden states are weaker embeddings than a trained embedding
model's, but they rank paraphrases above unrelated lines (tested), which is what recall needs;
a dedicated embedding GGUF can be served by a second daemon.
"""

from __future__ import annotations

import llama_cpp
import numpy as np

from sidecar.errors import EngineFailure, InvalidArgument, ModelLoadError
from sidecar.native.log_capture import capture_native_log
from sidecar.native.model import NativeModel

# Longest input in tokens: a line of dialogue or a memory note, not a document.
EMBED_CONTEXT = 512


class EmbeddingContext:
    """Owns a pooled-embedding llama_context on `model`; one input at a time."""

    def __init__(self, model: NativeModel, threads: int) -> None:
        params = llama_cpp.llama_context_default_params()
        # Pooling needs the whole input in one micro-batch.
        params.n_ctx = params.n_batch = params.n_ubatch = EMBED_CONTEXT
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = threads
        params.embeddings = True
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_MEAN
        params.no_perf = True
        with capture_native_log():
            self.ptr = llama_cpp.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise ModelLoadError("llama.cpp could not create an embedding context for this model")
        self.width = int(llama_cpp.llama_model_n_embd(model.ptr))
        self._memory = llama_cpp.llama_get_memory(self.ptr)
        self._batch = llama_cpp.llama_batch_init(EMBED_CONTEXT, 0, 1)

    def set_threads(self, threads: int) -> None:
        llama_cpp.llama_set_n_threads(self.ptr, threads, threads)

    def embed(self, tokens: list[int]) -> np.ndarray:
        """The input's mean-pooled embedding, L2-normalised (as OpenAI's are: cosine = dot)."""
        if not tokens:
            raise InvalidArgument("an embedding input is empty")
        if len(tokens) > EMBED_CONTEXT:
            raise InvalidArgument(f"an embedding input is {len(tokens)} tokens; at most {EMBED_CONTEXT}")
        llama_cpp.llama_memory_clear(self._memory, True)
        b = self._batch
        for i, token in enumerate(tokens):
            b.token[i] = token
            b.pos[i] = i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = i == len(tokens) - 1
        b.n_tokens = len(tokens)
        rc = llama_cpp.llama_decode(self.ptr, b)
        if rc != 0:
            raise EngineFailure(f"llama_decode of an embedding input returned {rc}")
        pooled = llama_cpp.llama_get_embeddings_seq(self.ptr, 0)
        if not pooled:
            raise EngineFailure("llama.cpp returned no pooled embedding")
        vector = np.ctypeslib.as_array(pooled, shape=(self.width,)).astype(np.float32)
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm > 0 else vector

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ptr)
            self.ptr = None
