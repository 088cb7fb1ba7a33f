"""A grammar tried out in a process of its own before any request runs it (issue 36, P1 and P2).

llama.cpp's grammar code has no time or memory bound and no way to be stopped: a JSON schema
pattern `^(a{0,1000}){0,1000}$`, inside every written bound, compiled and then took minutes for
its second token on the engine thread, holding every NPC; a grammar no token of the vocabulary can
start ended the process. So the service hands each new grammar to this child first. It loads the
model's vocabulary only (no weights: milliseconds), compiles the grammar, checks that its token ids
exist and that some token (the request's banned ones removed) can start it, then walks it: a few
dozen steps, each applying the grammar to the whole vocabulary as a real pass does and accepting a
token it allows, chosen at random (seeded by the grammar, so a verdict is reproducible), half the
time among the longest allowed. Tokens
drawn from everything the grammar allows are where nested repetitions multiply its stacks, so a
grammar whose work grows is caught within those steps. Compile and step times are the child's CPU
time, so a busy PC does not make a grammar look costly.

The kernel bounds the child: its address space (a grammar whose stacks grow without end fails an
allocation here, not in the daemon) and its CPU time per check (RLIMIT_CPU, soft limit raised
before each check). The parent (sidecar.service.grammar_checks) also kills it past a wall-clock
limit, and reads any death as a refusal.

Protocol: one JSON object a line each way. Request {"model": path, "grammar": text, "banned":
[ids]}; reply {"ok": true, "compile_ms", "step_ms", "steps"} or {"ok": false, "reason"}.

    python -m sidecar.native.grammar_probe     (frozen builds: `xlm-sidecar _grammar-probe`)
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import select
import sys
import time
import zlib

from sidecar.native.grammar_accept import TokenRefs, accept_throws

WORKER_COMMAND = "_grammar-probe"
# Steps of the walk: a tool call's fixed text is a few dozen tokens, and a repetition that
# multiplies shows within a handful.
WALK_TOKENS = 32
# The share of steps that take one of the longest tokens allowed, the rest any allowed token. A
# uniform choice often closes early (a string's closing quote is one of a handful of tokens a
# pattern of repeated letters allows), and a short walk never reaches the depth where a nested
# repetition's work explodes: `(a{0,30}){0,30}` passed the walk and then cost 322 ms a token on
# the engine (issue 36, CI at 120a01e). Long tokens go deep within the same 32 steps.
LONGEST_SHARE = 0.5
# CPU time allowed to compile, and to one step (apply over the vocabulary and accept). Measured on
# a 2-core Xeon with SmolLM2's 49k vocabulary: a tool call's JSON grammar costs up to 21 ms a step
# inside a free-text string, a nested repetition (`(a{0,1000}){0,1000}`) 1,032 ms at its first
# token. The bounds leave a slower CPU five times room, and stay below the engine's per-token
# limit (sampler_chain.py) so that a grammar passing here may grow a little on the way.
COMPILE_LIMIT_MS = 500.0
STEP_LIMIT_MS = 100.0
# CPU seconds one check may use in all before the kernel ends the child (SIGXCPU; whole seconds,
# so 1 to 2 s in effect).
CHECK_CPU_S = 1
# Address space the child may add to what it holds after loading the vocabulary.
MEMORY_HEADROOM_BYTES = 1 << 30
# The child exits after this long without a check: it holds the vocabulary (tens of MB).
IDLE_EXIT_S = 60.0
_TOKEN_REF = re.compile(r"<\[(\d+)\]>")


def token_ids_outside(grammar: str, n_vocab: int) -> list[int]:
    """Token ids the grammar names (`<[id]>`) that the vocabulary does not have. llama.cpp parses
    them without a check, and no token can ever match one."""
    # A `<[` inside a literal or character class matches too: a false alarm there only refuses a
    # grammar that spells a huge number in angle brackets, never lets a bad one through.
    return sorted({int(i) for i in _TOKEN_REF.findall(grammar) if int(i) >= n_vocab})


class _Probe:
    def __init__(self) -> None:
        import llama_cpp

        self.llama = llama_cpp
        self.model_path: str | None = None
        self.model = None
        self.log_lines: list[str] = []

        @llama_cpp.llama_log_callback
        def keep(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
            if level >= 4 or level == 5:  # errors (a parse error's message) and their continuations
                self.log_lines.append(text.decode("utf-8", errors="replace"))

        self._log_callback = keep
        llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()

    def load(self, path: str) -> None:
        if self.model_path == path:
            return
        llama = self.llama
        if self.model is not None:
            llama.llama_model_free(self.model)
        params = llama.llama_model_default_params()
        params.vocab_only = True
        self.model = llama.llama_model_load_from_file(os.fsencode(path), params)
        if not self.model:
            raise RuntimeError(f"could not read the vocabulary of {path}")
        self.model_path = path
        import numpy as np

        from sidecar.native.token_candidates import TokenCandidates

        self.vocab = llama.llama_model_get_vocab(self.model)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
        self.eog = np.array([llama.llama_vocab_is_eog(self.vocab, t) for t in range(self.n_vocab)], dtype=bool)
        self.piece_bytes = np.array([len(self._piece_raw(t)) for t in range(self.n_vocab)], dtype=np.int32)
        self.candidates = TokenCandidates(self.n_vocab)
        _limit_memory()

    def check(self, request: dict) -> dict:
        import numpy as np

        self.load(request["model"])
        grammar: str = request["grammar"]
        outside = token_ids_outside(grammar, self.n_vocab)
        if outside:
            return _refused(f"the grammar names token id {outside[0]}, and this model's vocabulary has "
                            f"{self.n_vocab} tokens (ids 0 to {self.n_vocab - 1})")
        banned = np.array([t for t in request.get("banned", ()) if 0 <= t < self.n_vocab], dtype=np.int64)
        llama = self.llama
        self.log_lines.clear()
        started = time.thread_time()
        sampler = llama.llama_sampler_init_grammar(self.vocab, grammar.encode("utf-8"), b"root")
        compile_ms = (time.thread_time() - started) * 1000.0
        if not sampler:
            said = " ".join(line.strip() for line in self.log_lines if line.strip())[:300]
            return _refused("the grammar could not be parsed by llama.cpp (GBNF with a `root` rule; see llama.cpp's "
                            "grammars/README.md)" + (f": {said}" if said else ""))
        try:
            if compile_ms > COMPILE_LIMIT_MS:
                return _refused(f"the grammar took {compile_ms:.0f} ms of CPU to compile; at most "
                                f"{COMPILE_LIMIT_MS:.0f} (a repetition count or alternation too large)")
            return self._walk(sampler, banned, grammar, compile_ms, TokenRefs.of(grammar))
        finally:
            llama.llama_sampler_free(sampler)

    def _walk(self, sampler: object, banned, grammar: str, compile_ms: float, refs: TokenRefs) -> dict:
        import numpy as np

        rng = np.random.default_rng(zlib.crc32(grammar.encode("utf-8")))
        candidates, text = self.candidates, []
        worst = 0.0
        steps = 0
        for steps in range(WALK_TOKENS):
            candidates.fill_flat(banned)
            started = time.thread_time()
            candidates.apply(sampler)
            allowed = candidates.allowed_ids()
            if allowed.size == 0:
                where = "at its start" if not text else f"after {''.join(text)[-80:]!r}"
                return _refused(f"the grammar, with the request's banned tokens (logit_bias -100), admits no token of "
                                f"this model's vocabulary {where}")
            going_on = allowed[~self.eog[allowed]]
            if going_on.size == 0:  # only an end token: the walk reached a complete reply
                break
            if rng.random() < LONGEST_SHARE:
                lengths = self.piece_bytes[going_on]
                going_on = going_on[lengths == lengths.max()]
            token = int(going_on[rng.integers(going_on.size)])
            if refs.present and refs.could_disagree(token, self._piece_raw(token)) and accept_throws(sampler, token):
                where = "at its start" if not text else f"after {''.join(text)[-80:]!r}"
                return _refused(f"the grammar allows token {token} ({self._piece(token)!r}) {where}, but llama.cpp "
                                f"cannot accept it there: a token reference (<[id]>) matched part-way through a "
                                f"token, after characters. Put token references where a token starts")
            self.llama.llama_sampler_accept(sampler, token)
            spent = (time.thread_time() - started) * 1000.0
            worst = max(worst, spent)
            if spent > STEP_LIMIT_MS:
                return _refused(f"the grammar's work on one token took {spent:.0f} ms of CPU at token {steps + 1}; "
                                f"at most {STEP_LIMIT_MS:.0f} (nested repetitions multiply its work: bound them)")
            text.append(self._piece(token))
        return {"ok": True, "compile_ms": round(compile_ms, 2), "step_ms": round(worst, 2), "steps": steps + 1}

    def _piece_raw(self, token: int) -> bytes:
        buffer = ctypes.create_string_buffer(256)
        n = self.llama.llama_token_to_piece(self.vocab, token, buffer, len(buffer), 0, True)
        return buffer.raw[: max(n, 0)]

    def _piece(self, token: int) -> str:
        return self._piece_raw(token).decode("utf-8", errors="replace")


def _refused(reason: str) -> dict:
    return {"ok": False, "reason": reason}


def _limit_memory() -> None:
    with open("/proc/self/statm") as f:
        held = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (held + MEMORY_HEADROOM_BYTES, resource.RLIM_INFINITY))


def _limit_cpu_for_one_check() -> None:
    used = resource.getrusage(resource.RUSAGE_SELF)
    seconds = int(used.ru_utime + used.ru_stime) + 1 + CHECK_CPU_S
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, resource.RLIM_INFINITY))


def serve(requests, replies) -> int:
    os.nice(10)  # beside the engine on a game's PC: the request waiting for it is the one to pay
    probe = _Probe()
    while True:
        ready, _, _ = select.select([requests], [], [], IDLE_EXIT_S)
        if not ready:
            return 0
        line = requests.readline()
        if not line:
            return 0
        try:
            request = json.loads(line)
            # The vocabulary is read (once per model) before the check's CPU time starts: it is the
            # child's cost, not the grammar's.
            probe.load(request["model"])
            _limit_cpu_for_one_check()
            reply = probe.check(request)
        except Exception as e:  # reported to the request; the child goes on
            reply = _refused(f"the grammar checker failed: {type(e).__name__}: {e}")
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main() -> int:
    # Replies own stdout; llama.cpp and anything else print to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return serve(sys.stdin, replies)


if __name__ == "__main__":
    sys.exit(main())
