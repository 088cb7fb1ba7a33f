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
tests/engine/test_jump_forward.py compares the keys and structure with plain constrained decoding, not
the values (they may differ: a name or a number the model writes after a
differently split key). Forced tokens enter the grammar but not the repetition penalties
(SamplerChain.accept_forced), which plain constrained decoding counts: a penalty is for the model's
own choices, and the split's `","` and `":"` repeat in every reply.

Where the jumps happen: after each sampled token (replies.sample_next), and once before the first
(replies.opening_tokens): what the grammar forces before the model has chosen anything (`{"name":"`
of every tool call) is fed after the prompt in its last chunk, so the first pass samples the first
value. A jump stops before a token the request's logit_bias bans (SamplerChain.allows): the
sampler then says the grammar needs a banned token, as it does token by token.
"""

from __future__ import annotations

import bisect
import ctypes

import llama_cpp
import numpy as np

from sidecar.native.grammar_accept import NO_REFS, TokenRefs, accept_throws
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
        # Built when the model loads (engine.py, reload.py), not at the first grammar request:
        # one pass over a 49k vocabulary took 460 ms, and on the engine thread every NPC waited.
        # Each piece read once, as ctypes calls: about 200 ms.
        self.model = model
        vocab, n_vocab = model.vocab, model.n_vocab
        buffer = ctypes.create_string_buffer(256)
        to_piece, is_eog = llama_cpp.llama_token_to_piece, llama_cpp.llama_vocab_is_eog
        byte_token: dict[int, int] = {}
        ends: list[int] = []
        pieces: list[tuple[bytes, int]] = []
        for token in range(n_vocab):
            if is_eog(vocab, token):
                ends.append(token)
                continue
            n = to_piece(vocab, token, buffer, 256, 0, False)
            piece = ctypes.string_at(buffer, n) if n >= 0 else model.piece(token)
            pieces.append((piece, token))
            if n == 1 and piece[0] not in byte_token:
                byte_token[piece[0]] = token
        self._byte_of = {token: byte for byte, token in byte_token.items()}
        # Every token's bytes, sorted: the tokens that extend a given one are a contiguous run.
        pieces.sort()
        self._pieces = [p for p, _ in pieces]
        self._piece_tokens = np.array([t for _, t in pieces], dtype=np.int32)
        self._extensions = TokenCandidates(MAX_EXTENSIONS)
        self._probe = np.array([*byte_token.values(), *ends], dtype=np.int32)
        self._candidates = TokenCandidates(len(self._probe))
        self._one = TokenCandidates(1)

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

    def forced_tokens(self, grammar: object, refs: TokenRefs = NO_REFS) -> tuple[list[int], bool]:
        """Tokens for what the grammar forces next (module docstring: where the jump stops), and
        whether the grammar must end after them. `refs`: the grammar's token references."""
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
        split = self.model.tokenize(text, add_bos=False, parse_special=False)
        # The tokenizer's split need not be one the grammar takes: a token reference forces a token
        # by id (`<[17]>{5}` forces "!!!!!", split "!!" "!!" "!"; only "!" is token 17).
        tokens = self._taken(grammar, split, refs)
        ends = must_end and whole == forced and len(tokens) == len(split)
        if not ends and tokens and self._could_extend(grammar, tokens):
            tokens = tokens[:-1]
        return tokens, ends

    def _taken(self, grammar: object, tokens: list[int], refs: TokenRefs) -> list[int]:
        """The longest start of `tokens` the grammar accepts, one token after another. Accepting
        a token the grammar refuses throws inside llama.cpp and ends the process, so each is asked
        about first (and, where llama.cpp's answer can be wrong, tried: grammar_accept.py)."""
        probe = llama_cpp.llama_sampler_clone(grammar)
        one = self._one
        try:
            for i, token in enumerate(tokens):
                one.fill_ids(np.array([token], dtype=np.int32))
                one.apply(probe)
                if one.allowed_ids().size != 1 or (refs.present and refs.could_disagree(token, self.model.piece(token, True))
                                                   and accept_throws(probe, token)):
                    return tokens[:i]
                llama_cpp.llama_sampler_accept(probe, token)
            return tokens
        finally:
            llama_cpp.llama_sampler_free(probe)

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
            for token in tokens[:-1]:  # each one taken by the grammar (_taken)
                llama_cpp.llama_sampler_accept(probe, token)
            self._extensions.fill_ids(self._piece_tokens[lo:hi])
            self._extensions.apply(probe)
            return self._extensions.allowed_ids().size > 0
        finally:
            llama_cpp.llama_sampler_free(probe)
