"""Checks on player-supplied request fields that must run before the engine sees them: cheap,
pure, and each answering INVALID_ARGUMENT with the field it is about.

They stand between untrusted text and work that grows with it: a prompt is refused by its size in
bytes before anything tokenizes it, a JSON schema by its bounds (schema_bounds.py) before it is
compiled to a grammar, a session id by its characters before it reaches logs and `xlm-sidecar status`.
"""

from __future__ import annotations

import unicodedata

from sidecar.errors import ContextLengthExceeded, InvalidArgument
from sidecar.service.schema_bounds import parse_schema

# No tokenizer llama.cpp loads makes a token of more than a few dozen bytes out of ordinary text
# (SmolLM2's longest merges are whitespace runs of 16 characters); a prompt with more bytes than
# this many per allowed token cannot be within the token limit, whatever it says.
MAX_BYTES_PER_TOKEN = 32


def check_prompt_size(n_bytes: int, max_prompt_tokens: int | None, what: str = "") -> None:
    """Refuse a prompt that is too long by its bytes alone, before it is tokenized (tokenizing
    megabytes takes seconds). 0 tokens means no local limit (remote mode). `what` names the
    fields the bytes came from, for the message."""
    if not max_prompt_tokens:
        return
    limit = max_prompt_tokens * MAX_BYTES_PER_TOKEN
    if n_bytes > limit:
        raise ContextLengthExceeded(
            f"the prompt is {n_bytes} bytes{f' ({what})' if what else ''}, far more than {max_prompt_tokens} tokens "
            f"(--max-prompt-tokens) can hold; at most {limit} bytes are read"
        )


def check_session_id(session_id: str) -> str:
    """A session id the daemon can log and print: no control characters (NUL, newlines, escape
    sequences a terminal would obey). Length is checked by the session store."""
    for ch in session_id:
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
            raise InvalidArgument(f"session_id may not contain control characters (found U+{ord(ch):04X})")
    return session_id


def normalized_schema(text: str) -> str | None:
    """The JSON schema as the grammar converter takes it, or None when it admits any JSON value.

    `true` and `{}` admit everything (JSON Schema's boolean schemas); `false` admits nothing, so
    no reply could satisfy it. Anything but an object or a boolean is not a schema. Every bound of
    schema_bounds holds for it (size, nesting, repetition counts, enums)."""
    schema = parse_schema(text)
    if schema is True:
        return None
    if schema is False:
        raise InvalidArgument("json_schema is false: no reply can satisfy it")
    if not isinstance(schema, dict):
        raise InvalidArgument("json_schema must be a JSON object (or true)")
    return text
