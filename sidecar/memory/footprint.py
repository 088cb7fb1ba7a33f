"""What NPC memory holds in host memory, so a RAM budget counts it (local/crowd.py, settings.py).

Two parts. The embedding model, loaded at memory's first use: all-MiniLM-L6-v2 (a 43 MiB GGUF)
in its llama.cpp context of EMBED_CONTEXT tokens took 90 MiB resident after embedding a long
text (measured in this process: load +81 MiB, first embed +9; at 512 tokens it was 115 MiB, so
the context is 256). The store: 27.5 MB at 10,000 memories with 384-float vectors
(bench/run.py memory), ~2.8 KB a memory, its vector 1.5 KB of it.

Under a RAM budget the store may take STORE_SHARE of it (the bound on memories follows), and the
embedding model is set aside whole when at least one conversation still fits beside it; where it
does not, memories are found by words (no model), and the log says how much more budget the model
needs. Without a budget nothing is set aside: the store keeps its fixed bounds.
"""

from __future__ import annotations

import os
from pathlib import Path

# Resident for the packaged all-MiniLM-L6-v2 (measured, see above), and for another GGUF
# embedding model its file plus the context the MiniLM took beside its file (47 MiB).
MINILM_HOST_BYTES = 90 << 20
CONTEXT_HOST_BYTES = 47 << 20
BYTES_PER_MEMORY = 2_800
STORE_SHARE = 1 / 32
MAX_MEMORIES = 20_000


def embedder_host_bytes(choice: str) -> int:
    """Host memory the embedder `choice` ("auto", "words" or a GGUF path) holds once loaded; 0 for
    words, and for auto where the packaged model is not installed (it falls back to words)."""
    if choice == "words":
        return 0
    if choice == "auto":
        from sidecar.errors import ModelLoadError
        from sidecar.memory.minilm_gguf import package_zip

        try:
            package_zip()
        except ModelLoadError:
            return 0
        return MINILM_HOST_BYTES
    try:
        return Path(os.path.expanduser(choice)).stat().st_size + CONTEXT_HOST_BYTES
    except OSError:
        return 0  # loading it says what is wrong with it


def store_bytes(ram_budget: int) -> int:
    """The store's share of a RAM budget."""
    return int(ram_budget * STORE_SHARE)


def memories_within(ram_budget: int) -> int:
    """The most memories in all: the fixed bound, or what the store's share of a budget holds."""
    if not ram_budget:
        return MAX_MEMORIES
    return max(1, min(MAX_MEMORIES, store_bytes(ram_budget) // BYTES_PER_MEMORY))
