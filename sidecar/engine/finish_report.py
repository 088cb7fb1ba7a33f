"""The last event of a request: its finish reason, token counts and timings."""

from __future__ import annotations

import time

from sidecar.backend.requests import Finished, FinishReason, Job, Timings, Usage
from sidecar.engine.scheduling.slot import ActiveRequest


def cancelled_before_start(job: Job) -> Finished:
    now = time.perf_counter()
    waited = (now - job.submitted_at) * 1000.0
    return Finished(
        reason=FinishReason.CANCELLED,
        usage=Usage(0, 0, 0),
        timings=Timings(0.0, 0.0, 0.0, waited, waited),
        session_id=job.spec.session_id,
    )


def finished(a: ActiveRequest, reason: FinishReason, ended: float) -> Finished:
    submitted = a.job.submitted_at
    prefill_s = (a.prefill_done_at or ended) - a.started_at
    # An exact repeat finds part of its opening in the cache too: that is the reply's, not the prompt's.
    cached = min(a.cached_tokens, a.prompt_length)
    new_prompt = a.prompt_length - cached
    decode_s = ended - a.first_token_at if a.first_token_at is not None else 0.0
    return Finished(
        reason=reason,
        usage=Usage(prompt_tokens=a.prompt_length, cached_prompt_tokens=cached, completion_tokens=a.generated,
                    forced_tokens=a.forced_tokens),
        timings=Timings(
            time_to_first_token_ms=((a.first_token_at or ended) - submitted) * 1000.0,
            prefill_tokens_per_s=new_prompt / prefill_s if prefill_s > 0 and a.prefill_done_at else 0.0,
            decode_tokens_per_s=(a.generated - 1) / decode_s if a.generated > 1 and decode_s > 0 else 0.0,
            total_ms=(ended - submitted) * 1000.0,
            queued_ms=(a.started_at - submitted) * 1000.0,
        ),
        session_id=a.job.spec.session_id,
        image=a.image_report,
        history_turns_dropped=a.built.trim.turns if a.built is not None else 0,
        history_tokens_kept=a.built.kept_history_tokens if a.built is not None else 0,
        memories_told=a.built.memories_told if a.built is not None else (),
        **_dropped(a),
    )


def _dropped(a: ActiveRequest) -> dict:
    """The dropped turns' messages and the number of the first (after remember_turn counted them)."""
    if a.built is None or not a.built.trim.turns or a.session is None:
        return {}
    return {"dropped_messages": a.built.dropped,
            "first_dropped_turn": a.session.turns_dropped - a.built.trim.turns + 1}
