"""Jump-forward decoding: text a grammar leaves no choice about goes into the KV in one pass.

In a tool call `{"name": "give_item", "arguments": {"item": "sword", "count": 1}}` the grammar
lets the model choose only the values; every other token is forced, yet plain constrained decoding
spends a full pass on each. SGLang showed that appending forced text at once ("jump-forward" over
its compressed state machine) roughly halves JSON latency. llama.cpp's grammar exposes no state
machine, only "which of these tokens do you allow", so the forced text is found by asking that of
a copy of the grammar one byte at a time: the candidates are the vocabulary's single-byte tokens
and its end tokens (a few hundred, microseconds an ask), and while exactly one byte is allowed, it
is forced and the copy accepts it.

The forced bytes are then tokenized as the model's tokenizer writes that text. Its last token is
left out when the model's next free choice could extend it: when some longer token of the
vocabulary starts with it and the grammar would allow that token there (`":"` against `":"1`);
then the model writes that boundary itself. Otherwise (`,"count":` before a number, where no
token continues `":` into a digit in this vocabulary, or the grammar ends) every token goes. The
text is exactly what plain constrained decoding produces there (it is forced), but its tokens
can differ from the ones the model would have picked one at a time (the tokenizer's canonical
split instead of the model's), and so can what the model writes next, conditioned on them: the
values it chooses are its own, and valid under the grammar either way. So under greedy sampling
tests/test_jump_forward.py compares the keys and structure with plain constrained decoding, not
the values (they may differ: a name or a number the model writes after a
differently split key).
"""

from __future__ import annotations

import bisect

import llama_cpp
import numpy as np

from sidecar.native.model import NativeModel
from sidecar.native.token_candidates import TokenCandidates

# Bytes one jump may carry: a tool call's fixed text between two values is rarely longer.
MAX_JUMP_BYTES = 128
# Longer tokens starting with a jump's last one that are checked against the grammar; past this
# the last token is left to the model.
MAX_EXTENSIONS = 2048


class ForcedText:
    """What a grammar forces next, for one model's vocabulary (built once: one pass over it)."""

    def __init__(self, model: NativeModel) -> None:
        self.model = model
        byte_token: dict[int, int] = {}
        ends: list[int] = []
        for token in range(model.n_vocab):
            if model.is_end_of_generation(token):
                ends.append(token)
                continue
            piece = model.piece(token)
            if len(piece) == 1 and piece[0] not in byte_token:
                byte_token[piece[0]] = token
        self._byte_of = {token: byte for byte, token in byte_token.items()}
        # Every token's bytes, sorted: the tokens that extend a given one are a contiguous run.
        pieces = sorted((model.piece(t), t) for t in range(model.n_vocab) if not model.is_end_of_generation(t))
        self._pieces = [p for p, _ in pieces]
        self._piece_tokens = np.array([t for _, t in pieces], dtype=np.int32)
        self._extensions = TokenCandidates(MAX_EXTENSIONS)
        self._probe = np.array([*byte_token.values(), *ends], dtype=np.int32)
        self._candidates = TokenCandidates(len(self._probe))

    def forced_bytes(self, grammar: object) -> tuple[bytes, bool]:
        """The bytes the grammar forces from its state now, and whether it then must end. The
        grammar itself is not advanced (a copy is)."""
        probe = llama_cpp.llama_sampler_clone(grammar)
        forced = bytearray()
        must_end = False
        try:
            while len(forced) < MAX_JUMP_BYTES:
                self._candidates.fill_ids(self._probe)
                self._candidates.apply(probe)
                allowed = self._candidates.allowed_ids()
                if len(allowed) != 1:
                    break
                token = int(allowed[0])
                if token not in self._byte_of:  # only an end token is left
                    must_end = True
                    break
                forced.append(self._byte_of[token])
                llama_cpp.llama_sampler_accept(probe, token)
        finally:
            llama_cpp.llama_sampler_free(probe)
        return bytes(forced), must_end

    def forced_tokens(self, grammar: object) -> tuple[list[int], bool]:
        """Tokens for what the grammar forces next (module docstring: where the jump stops), and
        whether the grammar must end after them."""
        forced, must_end = self.forced_bytes(grammar)
        whole = forced
        while whole:  # whole characters only: a cut one would be tokenized as a replacement
            try:
                text = whole.decode("utf-8")
                break
            except UnicodeDecodeError:
                whole = whole[:-1]
        else:
            return [], must_end and not forced
        tokens = self.model.tokenize(text, add_bos=False, parse_special=False)
        ends = must_end and whole == forced
        if not ends and tokens and self._could_extend(grammar, tokens):
            tokens = tokens[:-1]
        return tokens, ends

    def _could_extend(self, grammar: object, tokens: list[int]) -> bool:
        """Whether a longer token that starts with tokens[-1]'s bytes is one the grammar allows in
        its place (then the model, not the jump, should choose there)."""
        last = self.model.piece(tokens[-1])
        lo = bisect.bisect_right(self._pieces, last)  # past `last` itself: the longer ones follow
        hi = bisect.bisect_left(self._pieces, last + b"\xff" * 8, lo)
        while hi > lo and not self._pieces[hi - 1].startswith(last):
            hi -= 1
        if hi <= lo:
            return False
        if hi - lo > MAX_EXTENSIONS:
            return True  # too many to ask about: leave the boundary to the model
        probe = llama_cpp.llama_sampler_clone(grammar)
        try:
            for token in tokens[:-1]:
                llama_cpp.llama_sampler_accept(probe, token)
            self._extensions.fill_ids(self._piece_tokens[lo:hi])
            self._extensions.apply(probe)
            return self._extensions.allowed_ids().size > 0
        finally:
            llama_cpp.llama_sampler_free(probe)
