"""One generation as the core takes it from every transport, built once where the request arrives:
the GenerateRequest, the image its conversation's last marker stands for, whether its messages
resend the whole conversation, and the request it is one of. `turn_spec` checks it, once and by
one set of rules, into the engine's GenerationSpec.

Before, HTTP handed the image and the resend flag to the core beside the request, and AskImage had
a spec builder of its own; now an image question is a Turn like any other (`image_turn`), and goes
the same way as a chat turn: the size and backend checks, the session's memory, the stream.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sidecar.api import pb
from sidecar.backend.contract import RequestLimits
from sidecar.backend.requests import IMAGE_MARKER, GenerationSpec, refuse_image_marker
from sidecar.errors import InvalidArgument
from sidecar.service import token_controls
from sidecar.service.convert import generation_spec_from_pb
from sidecar.service.request_checks import check_session_id
from sidecar.vision.image_input import RgbImage, decode_encoded, decode_raw

MAX_QUESTION_CHARS = 8192
_RAW_LAYOUT = {pb.PIXEL_FORMAT_RGBA8: "rgba8", pb.PIXEL_FORMAT_BGRA8: "bgra8", pb.PIXEL_FORMAT_RGB8: "rgb8"}


@dataclass(frozen=True)
class Turn:
    request: pb.GenerateRequest
    # The image the conversation's last marker stands for (PNG or JPEG bytes, or raw pixels). Kept
    # as it came: turn_spec decodes it in a worker thread, before any native code sees it.
    image: pb.Image | None = None
    # The messages are the whole conversation (an OpenAI chat): the backend matches them against
    # its session (resent_turns.py) instead of appending them to it.
    resends_history: bool = False
    # AskImage: the reply is about an image, this turn's or (a follow-up) the session's last.
    asks_about_image: bool = False
    # The request it is one of, when one request runs several prompts (GenerationSpec.group).
    group: str = ""

    @property
    def reads_calls(self) -> bool:
        """Whether the reply is read as tool calls (into final.tool_calls) once whole."""
        return bool(self.request.tools) and self.request.tool_choice != "none"

    @property
    def needs_vision(self) -> bool:
        return self.image is not None or self.asks_about_image


def turn_spec(turn: Turn, limits: RequestLimits, max_image_bytes: int) -> GenerationSpec:
    """The turn as the backend takes it: every field by convert's one rule, then the backend's
    limits (token_controls), then its image. A resent turn's image is asked about only if its
    message is new, which the backend decides (resent_turns.py)."""
    spec = generation_spec_from_pb(turn.request, limits.max_prompt_tokens, compile_grammar=limits.compiles_grammar)
    token_controls.check_against_backend(spec, turn.request, limits)
    image = decode_image(turn.image, max_image_bytes) if turn.image is not None else None
    return replace(spec, image=image, asks_about_image=turn.asks_about_image,
                   resends_history=turn.resends_history, group=turn.group)


def decode_image(image: pb.Image, max_image_bytes: int) -> RgbImage:
    which = image.WhichOneof("source")
    if which == "encoded":
        return decode_encoded(image.encoded, max_image_bytes)
    if which == "raw":
        raw = image.raw
        if raw.format not in _RAW_LAYOUT:
            raise InvalidArgument("raw.format must be PIXEL_FORMAT_RGBA8, PIXEL_FORMAT_BGRA8 or PIXEL_FORMAT_RGB8")
        return decode_raw(raw.pixels, raw.width, raw.height, raw.stride, _RAW_LAYOUT[raw.format], raw.bottom_up,
                          max_image_bytes)
    raise InvalidArgument("image has no source: send encoded (PNG or JPEG) or raw pixels")


def image_turn(r: pb.AskImageRequest) -> Turn:
    """The chat turn an image question amounts to: the marker before the question where an image
    comes with it; without one, a follow-up about the session's last image."""
    check_session_id(r.session_id)
    question = r.question.strip()
    if not question:
        raise InvalidArgument("question is empty")
    if len(question) > MAX_QUESTION_CHARS:
        raise InvalidArgument(f"question is longer than {MAX_QUESTION_CHARS} characters")
    refuse_image_marker(question, "question")
    image = r.image if r.HasField("image") and r.image.WhichOneof("source") else None
    if image is None and not r.session_id:
        raise InvalidArgument("no image: send one (encoded or raw), or ask a follow-up with the session_id of an earlier image")
    content = f"{IMAGE_MARKER}\n{question}" if image is not None else question
    request = pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=content)]),
                                 sampling=r.sampling, max_tokens=r.max_tokens, stop=r.stop, json_schema=r.json_schema,
                                 session_id=r.session_id, request_id=r.request_id)
    return Turn(request, image=image, asks_about_image=True)
