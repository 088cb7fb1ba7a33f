"""The vocabulary as llama.cpp's candidate array, so a sampler's choice is checked before it is
accepted.

`llama_sampler_sample` applies the chain, asserts that something was selected and accepts it, in
one native call. When a grammar (with the request's banned tokens) leaves no candidate, the greedy
or distribution sampler still "selects" a token whose logit is -inf, and the grammar's accept then
throws a C++ exception through the C API, or GGML_ABORTs on an end-of-generation token: the
process ends, and every NPC with it (issue 36, P1). Here the same steps run one at a time, and a
choice the grammar rejected becomes that request's error.

The array is filled with numpy from the pass's logits (tens of microseconds for a 50k vocabulary);
only requests with a grammar take this path, where the grammar's own work is milliseconds.
"""

from __future__ import annotations

import ctypes
import math

import llama_cpp
import numpy as np


class TokenCandidates:
    """A reusable candidate array of `n_vocab` entries: the whole vocabulary, or a few of its tokens
    (fill_ids). One per user: a request samples on one thread."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self._buffer = (llama_cpp.llama_token_data * n_vocab)()
        self._view = np.ctypeslib.as_array(self._buffer)  # structured: id, logit, p
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self.array = llama_cpp.llama_token_data_array()

    def _reset(self) -> None:
        # Samplers sort and truncate in place (top-k): every fill starts from the whole vocabulary.
        self._view["id"] = self._ids
        self._view["p"] = 0.0
        self.array.data = ctypes.cast(self._buffer, llama_cpp.llama_token_data_p)
        self.array.size = self.n_vocab
        self.array.selected = -1
        self.array.sorted = False

    def fill_from_logits(self, ctx: object, index: int) -> None:
        """The logits of output `index` of the last decode."""
        self._reset()
        self._view["logit"] = self.logits(ctx, index)

    def logits(self, ctx: object, index: int) -> np.ndarray:
        """A view (not a copy) of the logits of output `index` of the last decode."""
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(self.n_vocab,))

    def fill_some(self, ids: np.ndarray, logits: np.ndarray) -> None:
        """Only these tokens (at most the array's size), with these logits."""
        self.fill_ids(ids)
        self._view["logit"][: len(ids)] = logits

    def fill_flat(self, banned: np.ndarray | None = None) -> None:
        """Every token equally likely, but `banned` ones (-inf, as a logit bias of -100 makes them)."""
        self._reset()
        self._view["logit"] = 0.0
        if banned is not None and banned.size:
            self._view["logit"][banned] = -np.inf

    def fill_ids(self, ids: np.ndarray) -> None:
        """Only these tokens (at most the array's size), equally likely: which does a grammar allow?"""
        n = len(ids)
        self._view["id"][:n] = ids
        self._view["logit"][:n] = 0.0
        self._view["p"][:n] = 0.0
        self.array.data = ctypes.cast(self._buffer, llama_cpp.llama_token_data_p)
        self.array.size = n
        self.array.selected = -1
        self.array.sorted = False

    def apply(self, sampler: object) -> None:
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(self.array))

    def selected_token(self) -> int | None:
        """The token the chain selected, or None when it selected nothing a grammar allows (every
        candidate at -inf: the sampler's pick is arbitrary and its accept would abort)."""
        index = self.array.selected
        if not 0 <= index < self.array.size:
            return None
        chosen = self.array.data[index]
        return int(chosen.id) if math.isfinite(chosen.logit) else None

    def selected_logit(self) -> float:
        """The logit of the selected candidate as the samplers left it (biased, penalized)."""
        return float(self.array.data[self.array.selected].logit)

    def allowed_ids(self) -> np.ndarray:
        """Ids of the tokens still possible (finite logit) after a grammar's apply on fill_flat."""
        size = self.array.size
        view = self._view[:size]
        return view["id"][np.isfinite(view["logit"])]
