"""Admission: waiting requests bound to free sequences, on the engine thread.

Requests in turn (fair_turns.py: one that brings many generations does not go wholly ahead of a
later one), else in arrival order, each waiting request gets a sequence (slot_choice.py) unless
its session is mid-turn, its image is still encoding, or another request is computing the prompt
prefix it will share (prefix_sharing.py); each that waits says why (Job.state). When requests wait
only because every sequence is busy, the engine may grow the KV (kv_resizing.py).

Admission holds no llama.cpp object: what it does to a sequence's cells (saving an evicted
session's KV to host memory) goes through the `KvCells` it is handed, and starting a request in a
sequence is the engine's `start`. Its tests run it with a fake of both (tests/unit/test_admission.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from sidecar.backend.engine_config import EngineConfig
from sidecar.backend.request_state import RequestState
from sidecar.backend.requests import Job, Prompt
from sidecar.backend.sessions import SessionStore
from sidecar.engine.finish_report import cancelled_before_start
from sidecar.engine.image_encodes import ImageEncodes
from sidecar.engine.kv_demand import SequencePool
from sidecar.engine.prefix.prefix_sharing import PrefixSharing, shareable_tokens
from sidecar.engine.scheduling.fair_turns import fair_order
from sidecar.engine.scheduling.resent_admission import resolve_waiting, still_resolved
from sidecar.engine.scheduling.slot import Slot
from sidecar.engine.scheduling.slot_choice import KvCells, choose_slot, evict, session_mid_turn
from sidecar.errors import EngineFailure, SidecarError

log = structlog.get_logger("engine")


@dataclass
class Admitted:
    """What one round of admission left: the requests still waiting (in arrival order) and how
    many of them wait only because every sequence is busy (what a bigger KV would start)."""

    waiting: deque[Job]
    blocked: int


class Admission:
    """The engine's admission; only the engine thread calls it."""

    def __init__(self, sessions: SessionStore, sharing: PrefixSharing, images: ImageEncodes, pool: SequencePool,
                 context_tokens: Callable[[Prompt], list[int]]) -> None:
        self.sessions = sessions
        self.sharing = sharing
        self.images = images
        self.pool = pool
        self.context_tokens = context_tokens  # a shared context's tokens (prompt_prep.py computed them first)

    def admissible(self, waiting: deque[Job], slots: list[Slot]) -> bool:
        """Something waiting could start now (the loop must not block on its inbox)."""
        return any(not self.images.pending(j) for j in waiting) and any(not s.busy for s in slots)

    def admit(self, waiting: deque[Job], slots: list[Slot], kv: KvCells, config: EngineConfig,
              start: Callable[[Job, Slot], None], prompt_tokens: Callable[[Job], list[int] | None]) -> Admitted:
        """Bind waiting requests to free sequences, requests in turn. `start` begins a request in
        the sequence chosen for it (raising SidecarError to refuse it); `prompt_tokens` gives a
        one-off request's tokens (None when it cannot be built: `start` then says why)."""
        for job, error in resolve_waiting(waiting, slots, self.sessions):
            job.end(error)
        self._plan_sharing(waiting, slots, prompt_tokens)
        self.images.poll(waiting, max(t for _, t in config.tier_threads), config.threads_decode,
                         decoding=any(s.busy for s in slots))
        arrived = list(waiting)
        still_waiting: list[Job] = []
        encoding_sessions: set[str] = set()  # a session's later turns wait for its image's turn
        blocked = 0
        for job in fair_order(arrived, slots):
            if job.cancelled:
                job.end(cancelled_before_start(job))
                continue
            reason = self._wait_reason(job, slots, encoding_sessions)
            choice = choose_slot(job, self.pool.admissible(slots), self.sessions, prompt_tokens) if reason is None else None
            if choice is None:
                job.state = reason or (RequestState.WAITING_FOR_TURN if session_mid_turn(job, slots)
                                       else RequestState.WAITING_FOR_SEQUENCE)
                still_waiting.append(job)
                # A new sequence would not start sooner a turn that waits for its session's last one.
                blocked += job.state is RequestState.WAITING_FOR_SEQUENCE and all(s.busy for s in slots)
                continue
            if choice.evict:
                evict(choice.slot, kv, self.sessions)
            try:
                start(job, choice.slot)
            except SidecarError as e:
                job.end(e)
            except Exception as e:  # one bad request must not take the engine down
                log.exception("request failed to start", request_id=job.spec.request_id)
                job.end(EngineFailure(f"internal error: {type(e).__name__}: {e}"))
        kept = {id(j) for j in still_waiting}
        return Admitted(deque(j for j in arrived if id(j) in kept), blocked)  # arrival order, for the next turns

    def _wait_reason(self, job: Job, slots: list[Slot], encoding_sessions: set[str]) -> RequestState | None:
        """Why `job` cannot be given a sequence yet, before looking for one; None if it may."""
        if not still_resolved(job, self.sessions, self.images.pending):
            return RequestState.WAITING_FOR_TURN  # a resent turn whose session is mid-turn
        if self.images.pending(job) or job.spec.session_id in encoding_sessions:
            if job.spec.session_id:
                encoding_sessions.add(job.spec.session_id)
            return RequestState.WAITING_FOR_IMAGE
        if self.sharing.must_wait(job):
            return RequestState.WAITING_FOR_PREFIX  # another request is computing its prefix right now
        return None

    def _plan_sharing(self, waiting: deque[Job], slots: list[Slot], prompt_tokens: Callable[[Job], list[int] | None]) -> None:
        new = [j for j in waiting if j.share_cut is None]
        if not new:
            return
        known = [j.prompt_tokens for j in waiting if j.prompt_tokens]
        known += [s.active.prompt_tokens if s.active is not None else s.cached for s in slots]
        try:
            self.sharing.plan(new, known, lambda job: shareable_tokens(job, self.sessions, prompt_tokens),
                              self.context_tokens)
        except Exception:  # sharing is an optimisation: never let it stop admission
            log.exception("planning shared prefixes failed")
            for job in new:
                job.share_cut = job.share_cut or 0
