"""What the game may name and say to NPC memory: texts, scopes and tags, checked alike for a
request (service/memories.py) and a save game's memories (service/memory_saves.py).

Player text is untrusted: no control, surrogate, private-use or unassigned characters (newlines
and tabs pass), bounded sizes. Scopes and tags are names a game prints and logs: no control or
separator characters but the plain space.
"""

from __future__ import annotations

import unicodedata

from sidecar.backend.requests import refuse_image_marker
from sidecar.errors import InvalidArgument

MAX_TEXT_BYTES = 4096
MAX_TAGS = 16
MAX_TAG_CHARS = 64
MAX_SCOPE_CHARS = 128
MAX_SCOPES = 16


def check_text(text: str, what: str) -> str:
    if not text.strip():
        raise InvalidArgument(f"{what} is empty")
    if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
        raise InvalidArgument(f"{what} is {len(text.encode('utf-8'))} bytes; at most {MAX_TEXT_BYTES}")
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn") and ch not in "\n\t":
            raise InvalidArgument(f"{what} may not contain control or unassigned characters (found U+{ord(ch):04X})")
    refuse_image_marker(text, what)  # a recalled memory is prompt text, where the marker stands for an image
    return text


def check_name(name: str, what: str, limit: int) -> str:
    if not name or len(name) > limit:
        raise InvalidArgument(f"{what} must be 1 to {limit} characters")
    for ch in name:
        if unicodedata.category(ch)[0] in "CZ" and ch != " ":
            raise InvalidArgument(f"{what} may not contain control or separator characters (found U+{ord(ch):04X})")
    return name


def check_tags(tags) -> tuple[str, ...]:
    if len(tags) > MAX_TAGS:
        raise InvalidArgument(f"{len(tags)} tags; at most {MAX_TAGS}")
    return tuple(dict.fromkeys(check_name(t, "a tag", MAX_TAG_CHARS) for t in tags))


def check_scopes(scopes) -> tuple[str, ...]:
    if len(scopes) > MAX_SCOPES:
        raise InvalidArgument(f"{len(scopes)} scopes; at most {MAX_SCOPES}")
    return tuple(dict.fromkeys(check_name(s, "a scope", MAX_SCOPE_CHARS) for s in scopes))
