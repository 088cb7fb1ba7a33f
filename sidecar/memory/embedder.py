"""What turns a memory or a question into a vector.

Measured on the memory benchmark's evening (20 planted facts, paraphrased questions, 120 turns
of small talk; bench/run.py memory): the served SmolLM2-135M's own mean-pooled embeddings found
the fact among the best 4 for 10% of the questions, hashed words for 25%, all-MiniLM-L6-v2 for
100%. A chat model's hidden states are not trained to retrieve, so a separate embedding model is
the default: 22M parameters beside the chat model, one thread, about 10 ms a memory on this
machine's CPU, never on the engine thread.

    auto     all-MiniLM-L6-v2 from its PyPI package (minilm_gguf.py) if installed, else words
    words    hashed words (lexical.py): no model at all, for machines without the package
    PATH     any GGUF embedding model (--embedding-model), e.g. a multilingual one

Only the memory worker thread calls embed(): one llama.cpp context, used by one thread.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import numpy as np
import structlog

from sidecar.errors import ModelLoadError
from sidecar.memory.lexical import LEXICAL_DIMS, lexical_vector
from sidecar.memory.minilm_gguf import minilm_gguf, package_zip

log = structlog.get_logger("memory")

# Tokens an embedding model sees of one text: memories are a turn or a fact, a few dozen tokens.
# 256 holds the turn and its reply; 512 took 25 MiB more resident (footprint.py).
EMBED_CONTEXT = 256


class Embedder(Protocol):
    name: str
    dims: int
    model_bytes: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """One unit vector (float32) per text, as rows."""
        ...


class WordEmbedder:
    name = "words"
    dims = LEXICAL_DIMS
    model_bytes = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack([lexical_vector(t) for t in texts]) if texts else np.zeros((0, self.dims), np.float32)


class GgufEmbedder:
    """A GGUF embedding model in a llama.cpp context of its own, on one thread."""

    def __init__(self, path: Path, name: str) -> None:
        import llama_cpp

        try:
            self._llm = llama_cpp.Llama(str(path), embedding=True, n_ctx=EMBED_CONTEXT, n_batch=EMBED_CONTEXT,
                                        n_ubatch=EMBED_CONTEXT, n_threads=1, n_threads_batch=1, n_gpu_layers=0,
                                        verbose=False)
        except (ValueError, RuntimeError, OSError) as e:
            raise ModelLoadError(f"the embedding model {path} could not be loaded: {e}") from e
        self.name = name
        self.dims = int(self._llm.n_embd())
        self.model_bytes = path.stat().st_size

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            # Truncated to the context: a memory's first 256 tokens say what it is about.
            vector = np.asarray(self._llm.embed(text, truncate=True), dtype=np.float32)
            if vector.ndim == 2:  # a model without pooling: one row per token
                vector = vector.mean(axis=0)
            norm = float(np.linalg.norm(vector))
            rows.append(vector / norm if norm > 0 else vector)
        return np.stack(rows) if rows else np.zeros((0, self.dims), np.float32)


def open_embedder(choice: str, cache_dir: Path) -> Embedder:
    """The embedder `choice` names ("auto", "words" or a GGUF path). ModelLoadError for a path that
    does not load; "auto" without the package falls back to words, and says so."""
    if choice == "words":
        return WordEmbedder()
    if choice != "auto":
        path = Path(os.path.expanduser(choice))
        if not path.is_file():
            raise ModelLoadError(f"--embedding-model {choice}: no such file")
        return GgufEmbedder(path, path.name)
    try:
        package_zip()
    except ModelLoadError as e:
        log.warning("memory embeddings by words only: recall of paraphrased questions is poor", reason=str(e))
        return WordEmbedder()
    return GgufEmbedder(minilm_gguf(cache_dir), "all-MiniLM-L6-v2")
