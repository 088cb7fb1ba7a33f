"""Chat prompts as segments: the template's own text, where control tokens mean what they say, and
message content, which is always plain text.

Rendering a conversation to one string and tokenizing it with special tokens parsed lets a player
type `<|im_end|>\\n<|im_start|>system\\n...` into a chat line and open a real system turn (issue 17).
So each message's content is replaced by a marker before the template runs; the rendered text is
split at the markers; the template's pieces are tokenized with parse_special=True and each content
with parse_special=False, and the tokens are concatenated. The template still decides everything
around the content (roles, separators, a default system prompt), exactly as its authors wrote it.

Pure: the renderer and the tokenizer come in as functions.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.backend.requests import IMAGE_MARKER
from sidecar.errors import InvalidArgument

Render = Callable[[list[tuple[str, str]]], str]
Tokenize = Callable[..., list[int]]  # (text, *, add_bos, parse_special) -> token ids

# Private-use characters: no template writes them and a tokenizer has no reason to join them
# with neighbouring text; a nonce makes a marker no content can forge.
_OPEN, _CLOSE = "\ue000", "\ue001"


@dataclass(frozen=True)
class Segment:
    """A run of prompt text: `special` when control tokens in it are meant (the template's own
    text, or a raw prompt); otherwise plain content. `message` is the content's index."""

    text: str
    special: bool
    message: int = -1


def render_segments(render: Render, messages: list[tuple[str, str]]) -> list[Segment]:
    """The conversation rendered by `render`, as template and content segments."""
    nonce = secrets.token_hex(4)
    markers = [f"{_OPEN}{nonce}:{i}{_CLOSE}" for i in range(len(messages))]
    text = render([(role, markers[i]) for i, (role, _) in enumerate(messages)])
    pattern = re.compile(re.escape(_OPEN) + re.escape(nonce) + r":(\d+)" + re.escape(_CLOSE))
    segments: list[Segment] = []
    at = 0
    for match in pattern.finditer(text):
        if match.start() > at:
            segments.append(Segment(text[at:match.start()], True))
        index = int(match.group(1))
        if messages[index][1]:
            segments.append(Segment(messages[index][1], False, index))
        at = match.end()
    if at < len(text):
        segments.append(Segment(text[at:], True))
    if any(nonce in s.text for s in segments if s.special):
        # The template cut or changed a marker (it transforms content): nothing can tell content
        # from template text there, so refuse rather than parse player text as control tokens.
        raise InvalidArgument("this model's chat template rewrites message content; send a raw prompt instead")
    return segments


def raw_segments(text: str) -> list[Segment]:
    """A raw prompt: control tokens in it are meant, as documented for `prompt`."""
    return [Segment(text, True)] if text else []


def segments_text(segments: list[Segment]) -> str:
    return "".join(s.text for s in segments)


@dataclass(frozen=True)
class Tokenized:
    """A prompt's tokens; `spans`: index of each image's first embedding -> the image;
    `counts`: tokens per segment, in order."""

    tokens: list[int]
    spans: dict[int, object]
    counts: list[int]


def tokenize_segments(tokenize: Tokenize, segments: list[Segment], images: list = ()) -> Tokenized:
    """Tokens of the segments in order (BOS once, at the start, where the model wants one), each
    image marker replaced by its image's span.

    Images stand in content (AskImage puts the marker before the question), so markers are looked
    for in every segment; their count must match the images."""
    tokens: list[int] = []
    spans: dict[int, object] = {}
    counts: list[int] = []
    images = list(images)
    used = 0
    first = True
    for segment in segments:
        before = len(tokens)
        pieces = segment.text.split(IMAGE_MARKER)
        for i, piece in enumerate(pieces):
            if i > 0:
                if used >= len(images):
                    raise InvalidArgument(f"message text may not contain {IMAGE_MARKER!r}; it stands for images")
                image = images[used]
                used += 1
                spans[len(tokens) + len(image.prefix_tokens)] = image
                tokens.extend(image.span)
            if piece or first:
                tokens.extend(tokenize(piece, add_bos=first, parse_special=segment.special))
                first = False
        counts.append(len(tokens) - before)
    if used != len(images):
        raise InvalidArgument(f"message text may not contain {IMAGE_MARKER!r}; it stands for images")
    return Tokenized(tokens, spans, counts)


def message_costs(segments: list[Segment], counts: list[int], n_messages: int) -> list[int]:
    """Tokens each message accounts for: its content and the template text before it (its role
    header, the previous turn's end); text after the last content goes to the last message."""
    costs = [0] * n_messages
    pending = 0
    last = n_messages - 1
    for segment, n in zip(segments, counts):
        if segment.special:
            pending += n
        else:
            costs[segment.message] += pending + n
            pending = 0
            last = segment.message
    if n_messages:
        costs[last] += pending
    return costs


def message_offsets(segments: list[Segment], counts: list[int], n_messages: int) -> list[int]:
    """Token index where each message's part (as message_costs counts it) begins; a message whose
    content is empty begins where the next one does."""
    offsets = [-1] * (n_messages + 1)
    at = 0
    start_of_pending = 0
    pending = False
    for segment, n in zip(segments, counts):
        if segment.special:
            if not pending:
                start_of_pending, pending = at, True
        else:
            if offsets[segment.message] < 0:
                offsets[segment.message] = start_of_pending if pending else at
            pending = False
        at += n
    offsets[n_messages] = at
    for i in range(n_messages - 1, -1, -1):
        if offsets[i] < 0:
            offsets[i] = offsets[i + 1]
    return offsets
