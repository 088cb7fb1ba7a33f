"""Conversations kept across calls, one per NPC, keyed by the game's session id."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from sidecar.errors import InvalidArgument, NotFound, ResourceExhausted

MAX_SESSION_ID_LENGTH = 128


@dataclass
class Session:
    """A conversation so far: chat messages, or raw text for prompt-mode sessions (never both).

    Its KV cache lives either in a sequence of the context (`seq` set) or, once evicted, in host
    memory (`saved_state` with the tokens it holds in `saved_tokens`), or nowhere (new, or its
    cache was dropped) and is then rebuilt from the text on its next turn.
    """

    session_id: str
    messages: list[tuple[str, str]] = field(default_factory=list)
    text: str = ""
    tokens: int = 0
    last_used: float = field(default_factory=time.time)
    seq: int | None = None
    saved_state: bytes | None = None
    saved_tokens: list[int] = field(default_factory=list)
    # Images of the conversation in the order their markers appear in `messages` (their
    # embeddings, so a dropped cache is rebuilt without running the encoder again).
    images: list = field(default_factory=list)
    # Reply text -> the tokens of each time it was said, oldest first (reply_tokens.py).
    reply_tokens: dict = field(default_factory=dict)
    # The conversation as its client sent it, with the replies, when its turns resend the whole
    # conversation (OpenAI clients): what resent_turns compares a resent turn with. `messages` is
    # the history as laid out for the model (context and tools in the system message, trimmed).
    sent: list[tuple[str, str]] | None = None
    # Bumped by the owning backend whenever the history changes, so a decision taken against it
    # can tell it is still current.
    version: int = 0
    # Imported from a save and not resumed yet: "kv" (saved_state holds its cache) or "text".
    imported: str = ""
    # User turns dropped from the history so far (they became memories): numbers the next ones.
    turns_dropped: int = 0

    def restart(self) -> None:
        """Forget the conversation (its KV cache is dropped or overwritten by the owner)."""
        self.messages = []
        self.text = ""
        self.images = []
        self.reply_tokens = {}
        self.saved_state, self.saved_tokens = None, []
        self.sent = None
        self.tokens = 0
        self.version += 1

    @property
    def is_empty(self) -> bool:
        return not self.messages and not self.text


@dataclass(frozen=True)
class SessionView:
    """A session as the status RPC shows it."""

    session_id: str
    tokens: int
    last_used: float
    in_kv_cache: bool
    host_bytes: int
    imported: str = ""


class SessionStore:
    """Sessions by id, at most `max_sessions`. Thread-safe: the engine thread updates sessions while
    the transport lists or ends them."""

    def __init__(self, max_sessions: int, max_saved_bytes: int = 0) -> None:
        self.max_sessions = max_sessions
        # Host memory the evicted sessions' KV states may take (0: no cap; a RAM budget sets one).
        self.max_saved_bytes = max_saved_bytes
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def keep_saved_within(self) -> int:
        """Drop the saved KV states of the sessions least recently used until the rest fit in
        max_saved_bytes; those rebuild their cache from their text when they speak again.
        Returns the bytes dropped."""
        if not self.max_saved_bytes:
            return 0
        with self._lock:
            saved = sorted((s for s in self._sessions.values() if s.saved_state), key=lambda s: s.last_used)
        total = sum(len(s.saved_state) for s in saved)
        dropped = 0
        for session in saved:
            if total - dropped <= self.max_saved_bytes:
                break
            dropped += len(session.saved_state)
            session.saved_state, session.saved_tokens = None, []
        return dropped

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

    def get(self, session_id: str) -> Session | None:
        with self._lock:
            return self._sessions.get(session_id)

    def end(self, session_id: str) -> Session:
        """Forget a session and return it (its tokens, its sequence). NotFound if unknown."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            raise NotFound(f"no session {session_id!r}")
        return session

    def all(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    def put_all(self, sessions: list[Session], *, replace: bool) -> None:
        """Add `sessions` (a save's), all or none: InvalidArgument naming the ids that exist unless
        `replace`, ResourceExhausted when they do not fit beside the others."""
        with self._lock:
            existing = [s.session_id for s in sessions if s.session_id in self._sessions]
            if existing and not replace:
                shown = ", ".join(repr(i) for i in existing[:8]) + (f" and {len(existing) - 8} more" if len(existing) > 8 else "")
                raise InvalidArgument(f"sessions {shown} exist already: end them first, or import with replace")
            after = len(self._sessions) + len(sessions) - len(existing)
            if after > self.max_sessions:
                raise ResourceExhausted(
                    f"importing {len(sessions)} sessions makes {after}; the limit is {self.max_sessions} "
                    "(end some, or raise --max-sessions)")
            for session in sessions:
                self._sessions[session.session_id] = session

    def views(self) -> list[SessionView]:
        with self._lock:
            return [
                SessionView(s.session_id, s.tokens, s.last_used, s.seq is not None, len(s.saved_state or b""), s.imported)
                for s in self._sessions.values()
            ]
