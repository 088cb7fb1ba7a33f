"""How conversations share prompt prefixes: where a shared beginning is cut, who computes it,
who waits for it, and copying it into a sequence.

Where prefixes are cut: before the prompt's last token for candidates of one prompt (n > 1: they
were submitted together), at the end of the shared world context when the request names one (the
`context` field: every NPC's prompt then has the very same tokens up to there), else at the
longest run of whole blocks of BLOCK tokens the prompt shares with another prompt the engine
knows of (waiting, running, or held by a sequence). Both keep the number of distinct prefixes
small, so a lookup tries few lengths, and the cache is keyed by the exact tokens.

Who computes it: the first request to need a prefix nobody holds prefills it, stopping its pass
at the cut so that its sequence then holds exactly the prefix, which is saved into the cache;
requests that need the same prefix meanwhile wait for that (one prefill, not one each), then copy
it. A prefix held by another sequence (say an idle NPC's session) is copied from there.

Copies use sequence state get/set (NativeContext.save/restore), as the engine does to move a
sequence: llama_memory_seq_cp between sequences of different streams (kv_unified off, one stream
per sequence here) copies a whole stream and refuses a partial range.
"""

from __future__ import annotations

from typing import Callable

from sidecar.native.context import NativeContext
from sidecar.engine.prefix.prefix_cache import PrefixCache
from sidecar.backend.requests import Job, Prompt
from sidecar.backend.sessions import SessionStore
from sidecar.engine.scheduling.slot import ActiveRequest, Slot
from sidecar.errors import SidecarError

BLOCK = 32
# Shared beginnings shorter than this are computed, not copied: the copy and the wait cost more.
MIN_SHARED = 64


def shared_blocks(a: list[int], b: list[int]) -> int:
    """Tokens in the whole BLOCK-sized blocks `a` and `b` begin with alike (list slices compare
    in C, so a 1,000-token prompt costs some thirty comparisons)."""
    n = 0
    end = min(len(a), len(b))
    while n + BLOCK <= end and a[n : n + BLOCK] == b[n : n + BLOCK]:
        n += BLOCK
    return n


def exact_shared(a: list[int], b: list[int]) -> int:
    """Tokens `a` and `b` begin with alike."""
    n = 0
    end = min(len(a), len(b))
    while n < end and a[n] == b[n]:
        n += 1
    return n


def share_cut(tokens: list[int], others: list[list[int]], explicit: int) -> int:
    """Where `tokens`' shared prefix ends: `explicit` (the end of the request's shared context)
    when given, else its longest block run shared with one of `others`; 0 when not worth it. At
    least one prompt token stays after the cut, for the first reply token's logits."""
    cut = explicit if explicit else max((shared_blocks(tokens, o) for o in others), default=0)
    cut = min(cut, len(tokens) - 1)
    return cut if cut >= MIN_SHARED else 0


def shareable_tokens(job: Job, sessions: SessionStore, prompt_tokens: Callable[[Job], "list[int] | None"]) -> list[int] | None:
    """The prompt tokens of a request that may start from a shared prefix: a one-off, or a
    session's first turn (later turns start from the session's own cache); never images."""
    spec = job.spec
    if spec.asks_about_image or spec.resends_history:  # a resent turn waits for its session decision
        return None
    if spec.session_id and not spec.reset_session:
        session = sessions.get(spec.session_id)
        if session is not None and not session.is_empty:
            return None
    try:
        return prompt_tokens(job)
    except SidecarError:
        return None  # starting the request reports it


class PrefixSharing:
    """The engine's prefix cache and the prefills of prefixes in flight."""

    def __init__(self, cache: PrefixCache, kv_bytes_per_token: int) -> None:
        self.cache = cache
        self.kv_bytes_per_token = kv_bytes_per_token
        self._in_flight: set[tuple[int, ...]] = set()

    def worth_cutting(self, cut: int) -> bool:
        return cut > 0 and self.cache.enabled and self.cache.fits(cut * self.kv_bytes_per_token)

    def plan(
        self,
        jobs: list[Job],
        known: list[list[int]],
        shareable_tokens: Callable[[Job], "list[int] | None"],
        context_tokens: Callable[[Prompt], list[int]],
    ) -> None:
        """Decide once per request where its shared prompt prefix ends (Job.share_cut): at the end
        of its shared context, else where it stops sharing whole blocks with the `known` prompts
        (the other waiting ones, the running ones, what idle sequences hold). `shareable_tokens`
        gives a request's prompt tokens, or None when it may not start from a shared prefix."""
        if not self.cache.enabled:
            for job in jobs:
                job.share_cut = 0
            return
        tokens_of = {id(j): shareable_tokens(j) for j in jobs}
        known = known + [t for t in tokens_of.values() if t is not None]
        for job in jobs:
            tokens = tokens_of[id(job)]
            if tokens is None:
                job.share_cut = 0
                continue
            explicit = 0
            if job.spec.shares_prompt:
                explicit = len(tokens)  # candidates of one prompt: all of it (share_cut keeps one token)
            elif job.spec.prompt.context:
                try:
                    explicit = exact_shared(context_tokens(job.spec.prompt), tokens)
                except SidecarError:
                    pass  # a template that will not render the context alone: cut by blocks instead
            job.share_cut = share_cut(tokens, [k for k in known if k is not tokens], explicit)

    def must_wait(self, job: Job) -> bool:
        """True while another request is prefilling the prefix this one would copy."""
        cut = job.share_cut or 0
        if not cut or job.prompt_tokens is None or tuple(job.prompt_tokens[:cut]) not in self._in_flight:
            return False
        if not job.waited_for_prefix:
            job.waited_for_prefix = True
            self.cache.record_wait()
        return True

    def reuse(self, ctx: NativeContext, slot: Slot, tokens: list[int], held: int, cut: int, slots: list[Slot]) -> int:
        """Put into `slot` the longest shared prefix of `tokens` known (the cache's, else one
        another sequence holds up to `cut`) when it is longer than the `held` tokens the slot
        already has; returns the tokens now held."""
        if not self.cache.enabled:
            return held
        entry = self.cache.longest(tokens)
        if entry is not None and len(entry.tokens) > held:
            ctx.restore(slot.seq, entry.state)
            slot.cached = list(entry.tokens)
            self.cache.record_hit(len(entry.tokens))
            return len(entry.tokens)
        if cut <= held or not self.worth_cutting(cut):
            return held
        source = next((s for s in slots if s is not slot and s.cached[:cut] == tokens[:cut]), None)
        if source is None:
            return held
        ctx.restore(slot.seq, ctx.save(source.seq))
        if not ctx.truncate(slot.seq, cut):
            ctx.clear(slot.seq)
            slot.cached = []
            return 0
        slot.cached = list(tokens[:cut])
        self.cache.put(tuple(slot.cached), ctx.save(slot.seq))  # the next ones copy from host memory
        self.cache.record_hit(cut)
        return cut

    def produce(self, active: ActiveRequest, tokens: list[int], cut: int) -> None:
        """Make `active` the one that prefills `tokens[:cut]` and saves it for the others."""
        if cut <= active.fed or not self.worth_cutting(cut):
            return
        key = tuple(tokens[:cut])
        if key in self._in_flight or self.cache.holds(key):
            return
        active.share_at = cut
        self._in_flight.add(key)
        self.cache.record_miss()

    def after_pass(self, ctx: NativeContext, slot: Slot) -> None:
        """Save the prefix once `slot`'s prefill has reached its cut."""
        a = slot.active
        if a is None or a.share_at is None or a.fed < a.share_at:
            return
        key = tuple(a.prompt_tokens[: a.share_at])
        if a.fed == a.share_at:  # the sequence holds exactly the prefix
            self.cache.put(key, ctx.save(slot.seq))
        self._in_flight.discard(key)
        a.share_at = None

    def abandon(self, active: ActiveRequest) -> None:
        """A producer ended before its cut (cancelled, failed): the waiting ones go on alone."""
        if active.share_at is not None:
            self._in_flight.discard(tuple(active.prompt_tokens[: active.share_at]))
            active.share_at = None
