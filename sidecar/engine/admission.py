"""Admission: waiting requests bound to free sequences, on the engine thread.

A part of Engine (a mixin, like Reloading): requests in turn (fair_turns.py: one that brings many
generations does not go wholly ahead of a later one), else in arrival order, each waiting request
gets a sequence (slot_choice.py) unless its session is mid-turn, its image is still encoding, or
another request is computing the prompt prefix it will share (prefix_sharing.py). When requests
wait only because every sequence is busy, the KV grows (kv_resizing.py).
"""

from __future__ import annotations

from collections import deque

import structlog

from sidecar.backend.requests import Job
from sidecar.engine.finish_report import cancelled_before_start
from sidecar.engine.prefix.prefix_sharing import shareable_tokens
from sidecar.engine.scheduling.fair_turns import fair_order
from sidecar.engine.scheduling.resent_admission import resolve_waiting, still_resolved
from sidecar.engine.scheduling.slot_choice import choose_slot, evict
from sidecar.errors import EngineFailure, SidecarError

log = structlog.get_logger("engine")


class Admitting:
    """Engine's admission; only the engine thread calls these."""

    def _waiting_admissible(self) -> bool:
        return any(not self._images.pending(j) for j in self._waiting) and any(not s.busy for s in self._slots)

    def _admit(self) -> None:
        """Bind waiting requests to free sequences, requests in turn; a request whose session is
        mid-turn elsewhere waits for that turn to end."""
        self._shrink_to_ceiling()
        for job, error in resolve_waiting(self._waiting, self._slots, self.sessions):
            job.sink(error)
        self._plan_sharing()
        self._images.poll(self._waiting, max(t for _, t in self.config.tier_threads), self.config.threads_decode,
                          decoding=any(s.busy for s in self._slots))
        arrived = list(self._waiting)
        still_waiting: list[Job] = []
        encoding_sessions: set[str] = set()  # a session's later turns wait for its image's turn
        blocked = 0  # requests that wait only because every sequence is busy
        for job in fair_order(arrived, self._slots):
            if job.cancelled:
                job.sink(cancelled_before_start(job))
                continue
            if not still_resolved(job, self.sessions, self._images.pending):
                still_waiting.append(job)  # its session is mid-turn: decided when that turn ends
                continue
            if self._images.pending(job) or job.spec.session_id in encoding_sessions:
                if job.spec.session_id:
                    encoding_sessions.add(job.spec.session_id)
                still_waiting.append(job)
                continue
            if self.sharing.must_wait(job):
                still_waiting.append(job)  # another request is computing its prefix right now
                continue
            choice = choose_slot(job, self.pool.admissible(self._slots), self.sessions, self._one_off_prompt_tokens)
            if choice is None:
                still_waiting.append(job)
                blocked += all(s.busy for s in self._slots)
                continue
            slot = choice.slot
            if choice.evict:
                evict(slot, self._ctx, self.sessions)
            try:
                self._start(job, slot)
            except SidecarError as e:
                job.sink(e)
            except Exception as e:  # one bad request must not take the engine down
                log.exception("request failed to start", request_id=job.spec.request_id)
                job.sink(EngineFailure(f"internal error: {type(e).__name__}: {e}"))
        kept = {id(j) for j in still_waiting}
        self._waiting = deque(j for j in arrived if id(j) in kept)  # arrival order, for the next turns
        if self._grow_for(blocked):
            self._admit()  # the new sequences are free: the waiting start now

    def _one_off_prompt_tokens(self, job: Job) -> list[int] | None:
        """A one-off request's prompt tokens, kept on the job for _start; None if it cannot be
        built (_start reports why)."""
        if job.prompt_tokens is None:
            try:
                # Inside the try: text holding the image marker is refused here, and this runs
                # while choosing a sequence, where an exception would stop the engine thread.
                job.prompt_tokens = self._build(job.spec, None, []).tokens
            except SidecarError:
                return None
        return job.prompt_tokens

    def _plan_sharing(self) -> None:
        new = [j for j in self._waiting if j.share_cut is None]
        if not new:
            return
        known = [j.prompt_tokens for j in self._waiting if j.prompt_tokens]
        known += [s.active.prompt_tokens if s.active is not None else s.cached for s in self._slots]
        try:
            self.sharing.plan(
                new,
                known,
                lambda job: shareable_tokens(job, self.sessions, self._one_off_prompt_tokens),
                self.prep.contexts,  # kept from the prompt thread, which computed them first
            )
        except Exception:  # sharing is an optimisation: never let it stop admission
            log.exception("planning shared prefixes failed")
            for job in new:
                job.share_cut = job.share_cut or 0
