"""When the engine decides a resent turn (backend/resent_turns.py): on its own thread, once no
earlier turn of the session runs or waits, so the decision holds until the turn starts; and
checked again just before, against the session's version, since EndSession may replace the
session from another thread.

The decision is taken before the turn's image is encoded: an image the session already holds is
not encoded again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from sidecar.backend.requests import Job
from sidecar.backend.resent_turns import resolve
from sidecar.backend.sessions import Session, SessionStore
from sidecar.engine.scheduling.slot import Slot
from sidecar.errors import SidecarError, Unavailable


def _stamp(session: Session | None) -> tuple[Session | None, int]:
    return session, session.version if session is not None else 0


def resolve_waiting(waiting: deque[Job], slots: Iterable[Slot], sessions: SessionStore) -> list[tuple[Job, SidecarError]]:
    """Decide every waiting resent turn whose session is free; returns the turns refused (taken
    out of `waiting`), each with its error."""
    mid_turn = {s.session_id for s in slots if s.busy and s.session_id}
    refused: list[tuple[Job, SidecarError]] = []
    for job in list(waiting):
        sid = job.spec.session_id
        if job.spec.resends_history and not job.cancelled and sid not in mid_turn:
            session = sessions.get(sid) if sid else None
            try:
                job.spec = resolve(job.resent, session)
            except SidecarError as e:
                waiting.remove(job)
                refused.append((job, e))
                continue
            job.resolved_against = _stamp(session)
        if sid:
            mid_turn.add(sid)  # later turns of this session wait for this one
    return refused


def still_resolved(job: Job, sessions: SessionStore, image_pending: Callable[[Job], bool]) -> bool:
    """A resent turn's decision still matches its session; if not, it is decided again. False
    while the turn must still wait: undecided, refused at its next decision, or its new decision
    needs an image encoded first."""
    if job.resent is None:
        return True
    if job.spec.resends_history:
        return False
    session = sessions.get(job.spec.session_id) if job.spec.session_id else None
    if job.resolved_against == _stamp(session):
        return True
    try:
        job.spec = resolve(job.resent, session)
    except SidecarError:
        job.spec = job.resent  # refused by resolve_waiting next time round, through the job's sink
        return False
    job.resolved_against = _stamp(session)
    return not image_pending(job)


def check_not_ended(job: Job, sessions: SessionStore) -> None:
    """Just before the turn starts: its session was not ended since the last check. Only the
    engine thread changes a session otherwise, so this closes the window."""
    kept = job.resolved_against[0] if job.resolved_against is not None else None
    if kept is not None and sessions.get(job.spec.session_id) is not kept:
        raise Unavailable("the session was ended while this turn started; send the turn again")
