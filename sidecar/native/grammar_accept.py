"""A token llama.cpp's grammar allows but cannot accept, found before it ends the process.

llama.cpp's grammar asks two questions with two different pieces of code: `apply` (which tokens
may come next) and `accept` (advance past this one). They disagree on token references
(`<[id]>`, `!<[id]>`) that follow characters. `apply` lets characters consume the start of a
token and then matches a reference on that same token's id, so `root ::= "!" <[10095]>` allows
token 10095 ("!!") first; `accept` matches a reference only at the start of a token, finds no way
through, and throws "Unexpected empty grammar stack after accepting piece". The exception crosses
the C API and std::terminate ends the daemon with SIGABRT, every NPC with it, and takes its message
with it (stderr is a pipe the dying process no longer reads). A grammar fuzzed in CI drew
`root ::= <[17]>{5}`: jump-forward wrote its forced "!!!!!" as the tokenizer splits it, "!!"
first, and asked whether a longer token could follow by accepting that on a copy of the grammar.

Only a grammar with a token reference can disagree, and only on a token longer than one byte
(a single byte cannot be split between characters and a reference) that a reference could match:
its id when references name ids, any id when one excludes ids (`!<[id]>`). Those few tokens are
accepted first in a forked copy of the process: an exception ends the copy, and the token is
reported as one the grammar cannot take. Forking costs about a millisecond and no other token
pays it.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import time
from dataclasses import dataclass

# `<[id]>` and `!<[id]>` in GBNF. One spelled inside a literal or a character class counts too:
# that only makes a token checked that needed no check.
_TOKEN_REF = re.compile(r"(!?)<\[(\d+)\]>")
# A copy that takes longer than this to accept one token is taken as one that cannot.
CHILD_LIMIT_S = 2.0


@dataclass(frozen=True)
class TokenRefs:
    """The token references of one grammar's text."""

    named: frozenset[int]
    excludes: bool  # some reference is `!<[id]>`: it matches every other id

    @classmethod
    def of(cls, grammar: str) -> TokenRefs:
        found = _TOKEN_REF.findall(grammar)
        return cls(frozenset(int(i) for neg, i in found if not neg), any(neg for neg, _ in found))

    @property
    def present(self) -> bool:
        return bool(self.named) or self.excludes

    def could_disagree(self, token: int, piece: bytes) -> bool:
        """Whether `apply` may allow `token` where `accept` throws (module docstring)."""
        return len(piece) > 1 and (self.excludes or token in self.named)


NO_REFS = TokenRefs(frozenset(), False)


def accept_throws(grammar: object, token: int) -> bool:
    """Whether llama_sampler_accept(grammar, token) would throw, tried in a forked copy of this
    process (the grammar here is left as it was)."""
    import llama_cpp  # here: the service reads TokenRefs without loading llama.cpp

    if not hasattr(os, "fork"):
        # Windows has no fork: the token is taken as llama.cpp's apply allowed it, as before this
        # check existed. A grammar that puts a token reference after characters can still end the
        # daemon there; jump-forward's own case (_taken) is checked everywhere.
        return False
    pid = os.fork()
    if pid == 0:  # the copy: one thread, this one; it must never return into the daemon's code
        try:
            faulthandler.disable()  # its dump of this expected abort would read as a crash
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)  # std::terminate's message would land in the parent's log pipe
            llama_cpp.llama_sampler_accept(grammar, token)
        finally:
            os._exit(0)
    deadline = time.monotonic() + CHILD_LIMIT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return True
        time.sleep(0.0005)
