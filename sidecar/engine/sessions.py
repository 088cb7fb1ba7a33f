"""Conversations kept across calls, one per NPC, keyed by the game's session id."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from sidecar.errors import InvalidArgument, NotFound, ResourceExhausted

MAX_SESSION_ID_LENGTH = 128


@dataclass
class Session:
    """A conversation so far: chat messages, or raw text for prompt-mode sessions (never both)."""

    session_id: str
    messages: list[tuple[str, str]] = field(default_factory=list)
    text: str = ""
    tokens: int = 0
    last_used: float = field(default_factory=time.time)

    @property
    def is_empty(self) -> bool:
        return not self.messages and not self.text


class SessionStore:
    """Sessions by id, at most `max_sessions`. Thread-safe: the engine thread updates sessions while
    the transport lists or ends them."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, session_id: str) -> Session:
        """The session with this id, created if new; ResourceExhausted when the store is full."""
        if len(session_id) > MAX_SESSION_ID_LENGTH:
            raise InvalidArgument(f"session_id is longer than {MAX_SESSION_ID_LENGTH} characters")
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                if len(self._sessions) >= self.max_sessions:
                    raise ResourceExhausted(
                        f"{self.max_sessions} sessions are open, the limit; end one (EndSession) or raise --max-sessions"
                    )
                session = self._sessions[session_id] = Session(session_id)
            session.last_used = time.time()
            return session

    def end(self, session_id: str) -> int:
        """Forget a session; returns the tokens of conversation it held. NotFound if unknown."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            raise NotFound(f"no session {session_id!r}")
        return session.tokens

    def snapshot(self) -> list[Session]:
        with self._lock:
            return [Session(s.session_id, list(s.messages), s.text, s.tokens, s.last_used) for s in self._sessions.values()]
