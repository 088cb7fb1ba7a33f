"""Save games on the engine thread: sessions out to an archive, and an archive's sessions in.

Both run between two forward passes (Engine.export_sessions / import_sessions queue them as model
calls), so no sequence changes under them. What is heavy and touches nothing of the engine runs
on the caller's thread: sealing the archive (serialising, hashing, compressing), and reading one
(checksum, parsing, every bound: save_format.py).

Export: a session's conversation always; its KV state when asked, read from its sequence with
llama.cpp's sequence-state API (rewritten to one stream: a save does not depend on how many
sequences the context had), or the bytes it was evicted to. Sessions holding images are not
saved (their images' embeddings are not part of the format yet): asked for by id, that is
FAILED_PRECONDITION; in an "all" export they are listed as not saved.

Import is all or nothing. Everything is checked first (the archive, its ids, room for them, no
turn of theirs in flight, token ids in the vocabulary, remembered replies that spell their text),
then the sessions arrive as evicted ones: their KV state waits in host memory and Engine._bind
restores it at their next turn, exactly as for a session this daemon evicted itself; or, when
the fingerprint differs, they hold only their text and the next turn computes it again.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass

import structlog

from sidecar.api.xlm.v1 import session_archive_pb2 as apb
from sidecar.backend.save_fingerprint import fingerprint, mismatch
from sidecar.backend.save_format import FORMAT_VERSION
from sidecar.backend.sessions import Session
from sidecar.errors import FailedPrecondition, InvalidArgument, NotFound
from sidecar.native.seq_state import restream
from sidecar.native.seq_state_check import StateLayoutError, read_layout

log = structlog.get_logger("engine")

KV, TEXT = "kv", "text"
IMAGES_NOT_SAVED = "holds images, which saves do not carry yet: not saved"


@dataclass(frozen=True)
class SavedInfo:
    """What was saved or restored of one session (pb.SavedSessionInfo)."""

    session_id: str
    tokens: int
    kv_bytes: int
    restored: str  # KV, TEXT, or "" (not saved)
    reason: str = ""


def export_on_engine(engine, session_ids: list[str], include_kv: bool) -> tuple[apb.SessionArchive, list[SavedInfo]]:
    """The archive of `session_ids` (every session when empty), unsealed. Engine thread."""
    if session_ids:
        missing = [i for i in session_ids if engine.sessions.get(i) is None]
        if missing:
            raise NotFound(f"no session {', '.join(repr(i) for i in missing[:8])}")
        chosen = [engine.sessions.get(i) for i in dict.fromkeys(session_ids)]
        with_images = [s.session_id for s in chosen if s.images]
        if with_images:
            raise FailedPrecondition(f"session {with_images[0]!r} {IMAGES_NOT_SAVED}")
    else:
        chosen = sorted(engine.sessions.all(), key=lambda s: s.session_id)
    archive = apb.SessionArchive(format_version=FORMAT_VERSION, created_unix_ms=int(time.time() * 1000))
    infos: list[SavedInfo] = []
    layers = 0
    for session in chosen:
        if session.images:
            infos.append(SavedInfo(session.session_id, session.tokens, 0, "", IMAGES_NOT_SAVED))
            continue
        saved = _record(session)
        kv, why = _kv_of(engine, session) if include_kv else (None, "include_kv was not asked for")
        if kv is not None:
            try:
                layout = read_layout(kv.state, max_cells=engine.ctx.ctx_per_seq)
            except StateLayoutError as e:
                # Sliding-window and recurrent models keep other state: not saved as KV (yet).
                kv, why = None, f"this model's state is not one the save format reads: {e}"
            else:
                layers = layers or layout.layers
        if kv is not None:
            saved.kv.CopyFrom(kv)
        archive.sessions.append(saved)
        infos.append(SavedInfo(session.session_id, session.tokens, len(kv.state) if kv else 0,
                               KV if kv is not None else TEXT, "" if kv is not None else why))
    archive.fingerprint.CopyFrom(our_fingerprint(engine, layers))
    return archive, infos


def our_fingerprint(engine, layers: int = 0) -> apb.KvFingerprint:
    return fingerprint(engine.config.model_path, model_name=engine.facts.name,
                       context_per_session=engine.ctx.ctx_per_seq, kv_type=engine.config.kv_type, layers=layers)


def _record(session: Session) -> apb.SavedSession:
    saved = apb.SavedSession(
        session_id=session.session_id,
        messages=[apb.SavedMessage(role=r, content=c) for r, c in session.messages],
        text=session.text,
        has_sent=session.sent is not None,
        sent=[apb.SavedMessage(role=r, content=c) for r, c in session.sent or ()],
        # Each saying of a text in order; one that kept no tokens as none (reply_tokens.py).
        replies=[apb.SavedReply(text=t, tokens=list(tokens or ())) for t, sayings in session.reply_tokens.items()
                 for tokens in sayings],
        tokens=session.tokens,
        last_used_unix_ms=int(session.last_used * 1000),
    )
    return saved


def _kv_of(engine, session: Session) -> tuple[apb.SavedKv | None, str]:
    slot = next((s for s in engine.slots if s.session_id == session.session_id and session.seq == s.seq), None)
    if slot is not None and slot.cached:
        state, tokens = engine.ctx.save(slot.seq), list(slot.cached)
    elif session.saved_state is not None:
        state, tokens = session.saved_state, list(session.saved_tokens)
    else:
        return None, "no KV cache held (a new session, or its cache was dropped)"
    if engine.model.plain_kv:
        state = restream(state, 1)  # a save does not depend on the context's sequence count
    return apb.SavedKv(tokens=tokens, state=state), ""


def import_on_engine(engine, archive: apb.SessionArchive, ours: apb.KvFingerprint, replace: bool) -> list[SavedInfo]:
    """Add the archive's sessions (already read and checked: save_format.open_archive), all or
    none. Engine thread."""
    ids = {s.session_id for s in archive.sessions}
    busy = [s.session_id for s in engine.slots if s.busy and s.session_id in ids]
    if busy:
        raise FailedPrecondition(f"session {busy[0]!r} has a turn in flight; import once it ends")
    same_model = archive.fingerprint.model_digest == ours.model_digest
    why_not = mismatch(archive.fingerprint, ours)
    n_vocab = engine.model.n_vocab
    sessions, infos = [], []
    now = time.time()
    for saved in archive.sessions:
        session = Session(
            saved.session_id,
            messages=[(m.role, m.content) for m in saved.messages],
            text=saved.text,
            tokens=saved.tokens,
            last_used=now,
            sent=[(m.role, m.content) for m in saved.sent] if saved.has_sent else None,
        )
        if same_model:  # the tokens a reply was generated as: valid for the same vocabulary
            session.reply_tokens = {}
            for r in saved.replies:  # a text's sayings in order (a save from before: one each)
                tokens = array("i", _in_vocab(saved.session_id, r.tokens, n_vocab)) if r.tokens else None
                session.reply_tokens.setdefault(r.text, []).append(tokens)
            _check_replies(engine, saved.session_id, session.reply_tokens)
        if saved.HasField("kv") and why_not is None:
            session.saved_state = bytes(saved.kv.state)
            session.saved_tokens = _in_vocab(saved.session_id, saved.kv.tokens, n_vocab)
            session.tokens = max(session.tokens, len(session.saved_tokens))
            session.imported = KV
            infos.append(SavedInfo(saved.session_id, session.tokens, len(saved.kv.state), KV))
        else:
            session.imported = TEXT
            reason = why_not if saved.HasField("kv") else "saved without its KV state"
            infos.append(SavedInfo(saved.session_id, session.tokens, 0, TEXT, reason))
        sessions.append(session)
    engine.sessions.put_all(sessions, replace=replace)  # the last refusal it can meet: nothing changed before
    for slot in engine.slots:
        if slot.session_id in ids:  # the sequence a replaced session had: its next turn binds the import
            engine.ctx.clear(slot.seq)
            slot.cached, slot.session_id = [], None
    engine.sessions.keep_saved_within()
    dropped = {s.session_id for s in sessions if s.imported == KV and s.saved_state is None}
    for s in sessions:
        if s.session_id in dropped:
            s.imported = TEXT
    log.info("sessions imported", sessions=len(sessions), kv=sum(i.restored == KV for i in infos) - len(dropped),
             text=sum(i.restored == TEXT for i in infos) + len(dropped), replaced=replace)
    return [SavedInfo(i.session_id, i.tokens, 0, TEXT, "host memory for saved sessions is full (--ram-budget): its KV state was dropped")
            if i.session_id in dropped else i for i in infos]


def _in_vocab(sid: str, tokens, n_vocab: int) -> list[int]:
    tokens = list(tokens)
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise InvalidArgument(f"session {sid!r} of the save holds token {bad}, outside the model's vocabulary of {n_vocab}")
    return tokens


def _check_replies(engine, sid: str, replies: dict[str, list]) -> None:
    # A remembered reply is fed as its tokens in place of its text (reply_tokens.py): they must
    # spell it, or the model would read something the conversation does not say.
    for text, tokens in ((t, a) for t, sayings in replies.items() for a in sayings if a is not None):
        spelled = b"".join(engine.model.piece(t) for t in tokens)
        if spelled != text.encode("utf-8"):
            raise InvalidArgument(f"session {sid!r} of the save remembers tokens for a reply that do not spell it")
