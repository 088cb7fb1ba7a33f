"""A finished turn joins its session: the history as laid out for the model, what the client
sent (for resent conversations), the images, and the tokens the reply was generated as."""

from __future__ import annotations

import time

from sidecar.backend.resent_turns import remember_sent
from sidecar.backend.sessions import Session
from sidecar.engine.prompts import reply_tokens
from sidecar.engine.scheduling.slot import ActiveRequest
from sidecar.native.model import NativeModel


def remember_turn(session: Session, a: ActiveRequest, reply: str, cached: list[int], model: NativeModel) -> None:
    """`cached` is the sequence's tokens after the turn: the prompt's, then the reply's."""
    if a.built is not None and a.built.trim.turns:
        session.turns_dropped += a.built.trim.turns
    if a.built is not None and a.built.images_dropped:
        del session.images[: a.built.images_dropped]  # their turns were dropped
    if a.new_image is not None:
        session.images.append(a.new_image)
    remember_sent(session, a.job.resent, reply)
    session.version += 1  # a decision taken against the old history is stale now
    if a.job.spec.prompt.is_chat:
        session.messages = a.conversation + [("assistant", reply)]
        reply_tokens.remember(session.reply_tokens, reply, cached[a.prompt_length:],
                              model.piece, model.tokenize, session.messages)
    else:
        session.text = a.prompt_text + reply
    session.tokens = len(cached)
    session.last_used = time.time()
