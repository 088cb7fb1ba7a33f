"""OpenAI request bodies -> the service core's requests (xlm.v1 GenerateRequest), so the HTTP API
refuses and accepts exactly what gRPC does: the same stop-string limits, the same JSON-schema
grammar, the same sampler ranges, and the same session behaviour.

What OpenAI defines and the daemon cannot do is refused with a 400 that names the field: `echo`,
`suffix`, `best_of` other than n, remote image URLs. llama-server's own `grammar` (GBNF) and
top-level `json_schema` are honoured, never ignored.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from dataclasses import dataclass

from sidecar.api import pb
from sidecar.backend.requests import DEFAULT_MAX_TOKENS, IMAGE_MARKER, refuse_image_marker
from sidecar.errors import InvalidArgument
from sidecar.service.convert import MAX_REPEAT_LAST_N
from sidecar.service.openai_http import tools as tool_calls
from sidecar.service.openai_http.request_models import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ImagePart,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
    NO_LIMIT,
    _Sampling,
)
from sidecar.service.token_controls import MAX_CANDIDATES, token_id_key
from sidecar.service.turn import Turn

_DATA_URL = re.compile(r"data:image/(png|jpeg|jpg);base64,(.*)", re.DOTALL)


@dataclass(frozen=True)
class Asked:
    """What an OpenAI request asks of the core: its turns (turn.py; several prompts run side by
    side as one request's group), each carrying the whole conversation (the backend decides what
    its session already holds) and its last image; and the limit max_tokens was lowered to
    (--max-tokens-per-request), for the reply to say so."""

    turns: tuple[Turn, ...]
    max_tokens_clamped: int | None = None

    @property
    def first(self) -> Turn:
        return self.turns[0]


def session_id_of(header: str | None, body: _Sampling) -> str:
    """The session: X-Session-Id, else `user`. HTTP hands header values over as latin-1; a game
    sends UTF-8 there as everywhere, so "drachen-über" is one NPC over the header, `user` and gRPC."""
    if header:
        try:
            header = header.encode("latin-1").decode("utf-8")
        except UnicodeError:
            raise InvalidArgument("X-Session-Id is not UTF-8") from None
    return (header or body.user or "").strip()


def _memory(body: _Sampling) -> pb.MemoryOptions | None:
    m = body.memory
    if m is None:
        return None
    return pb.MemoryOptions(scope=m.scope, read_scopes=m.read_scopes, max_tokens=m.max_tokens, k=m.k, tags=m.tags,
                            off=m.off)


def chat_request(body: ChatCompletionRequest, session_id: str, max_tokens_limit: int) -> Asked:
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidArgument("top_logprobs needs logprobs: true")
    # Several calls only when asked for in so many words: one call is what small models do well.
    parallel = body.parallel_tool_calls is True and body.tool_choice in (None, "auto", "required")
    reads_calls = tool_calls.reads_calls(body.tools, body.tool_choice)
    conversation: list[tuple[str, str]] = []
    images: list[bytes] = []
    call_names: dict[str, str] = {}  # tool call id -> function name, for the results that follow
    for message in body.messages:
        conversation.append(_message_text(message, images, call_names))
    max_tokens, clamped = _max_tokens(body.max_completion_tokens or body.max_tokens, max_tokens_limit)
    # Tools go as xlm.v1 tools, as over gRPC: the backend tells a session them once, and again
    # in a system message of their own when they change, without restarting the session.
    request = pb.GenerateRequest(
        messages=pb.ChatMessages(messages=[pb.ChatMessage(role=r, content=c) for r, c in conversation]),
        sampling=_sampling(body),
        max_tokens=max_tokens,
        stop=_stops(body.stop),
        json_schema=_json_schema(body),
        session_id=_session(body, session_id),
        tools=tool_calls.pb_tools(body.tools) if reads_calls else [],
        tool_choice=tool_calls.pb_tool_choice(body.tool_choice) if reads_calls else "",
        parallel_tool_calls=reads_calls and parallel,
        n=body.n or 1,
        grammar=body.grammar or "",
        memory=_memory(body),
    )
    if body.logprobs:
        request.logprobs = body.top_logprobs or 0
    # Only the last image can be new (the backend refuses more than one new one).
    image = pb.Image(encoded=images[-1]) if images else None
    return Asked((Turn(request, image=image, resends_history=True),), clamped)


def completion_session(body: CompletionRequest, session_id: str, prompts: int) -> str:
    """The session a completion continues: several prompts are one-offs, as several candidates are,
    so no one of them is the session's turn."""
    return _session(body, session_id) if prompts == 1 else ""


def completion_requests(body: CompletionRequest, session_id: str, max_tokens_limit: int,
                        prompts: list[str | list[int]]) -> Asked:
    """One turn per prompt (`prompts`: the body's text or token ids), each with the body's n;
    choice i * n + j is prompt i's candidate j, as OpenAI orders them. Token ids go on as ids
    (GenerateRequest.prompt_tokens), except in a session, which keeps text: routes.py turns them to
    text there."""
    if body.echo:
        raise InvalidArgument("echo is not supported by this server")
    if body.suffix:
        raise InvalidArgument("suffix (fill-in-the-middle) is not supported by this server")
    if body.best_of is not None and body.best_of != (body.n or 1):
        raise InvalidArgument("best_of must equal n: this server returns every completion it makes")
    max_tokens, clamped = _max_tokens(body.max_tokens, max_tokens_limit)
    session = completion_session(body, session_id, len(prompts))
    # Several prompts run side by side, as one request's generations, which the engine admits in
    # turn with other requests' (GenerationSpec.group).
    group = uuid.uuid4().hex if len(prompts) > 1 else ""
    turns = []
    for prompt in prompts:
        request = pb.GenerateRequest(
            sampling=_sampling(body),
            max_tokens=max_tokens,
            stop=_stops(body.stop),
            session_id=session,
            memory=_memory(body) if session else None,
            n=body.n or 1,
            grammar=body.grammar or "",
            json_schema=json.dumps(body.json_schema) if body.json_schema is not None else "",
        )
        if isinstance(prompt, str):
            refuse_image_marker(prompt, "prompt")
            request.prompt = prompt
        else:
            request.prompt_tokens.ids.extend(prompt)
        if body.logprobs is not None:
            request.logprobs = body.logprobs
        turns.append(Turn(request, resends_history=True, group=group))
    return Asked(tuple(turns), clamped)


def prompt_texts(body: CompletionRequest) -> tuple[list[str], list[list[int]]]:
    """(text prompts, token-id prompts): one of the two is empty. Prompts times n is bounded as n
    alone is: each generation holds a sequence, and 16 prompts of n 16 (256) took the whole queue."""
    p = body.prompt
    if isinstance(p, str):
        texts, ids = [p], []
    elif isinstance(p[0], str):
        texts, ids = list(p), []
    elif isinstance(p[0], int):
        texts, ids = [], [list(p)]
    else:
        texts, ids = [], [list(q) for q in p]
    prompts, n = len(texts) + len(ids), body.n or 1
    if prompts * n > MAX_CANDIDATES:
        raise InvalidArgument(f"{prompts} prompts with n {n} ask for {prompts * n} completions; at most "
                              f"{MAX_CANDIDATES} per request (prompts x n, as for n alone): send fewer prompts, "
                              f"or several requests")
    return texts, ids


def _session(body: _Sampling, session_id: str) -> str:
    """Candidates (n > 1) are one-offs: none of them is the session's turn until the game sends the
    one it keeps back as the assistant's message (HTTP resends the whole conversation anyway)."""
    return session_id if (body.n or 1) == 1 else ""


def _logit_bias(body: _Sampling) -> dict[int, float]:
    return {token_id_key(key): bias for key, bias in (body.logit_bias or {}).items()}


def _message_text(message: ChatMessage, images: list[bytes], call_names: dict[str, str]) -> tuple[str, str]:
    """(role, text) with an image part standing as the image marker; images collected in order,
    and the names of the calls made so far by id."""
    role = "system" if message.role == "developer" else message.role
    if role == "tool":
        return tool_calls.tool_result_message(message, call_names)
    if role == "assistant" and message.tool_calls:
        call_names.update((call.id, call.function.name) for call in message.tool_calls)
        return tool_calls.assistant_call_message(message)
    content = message.content
    if content is None:
        if role != "assistant":
            raise InvalidArgument(f"a {role} message needs content")
        return role, ""
    if isinstance(content, str):
        refuse_image_marker(content, "message content")
        return role, content
    pieces: list[str] = []
    for part in content:
        if isinstance(part, ImagePart):
            if role != "user":
                raise InvalidArgument("images may only be in user messages")
            images.append(_image_bytes(part.image_url.url))
            pieces.append(IMAGE_MARKER)
        else:
            refuse_image_marker(part.text, "message text")
            pieces.append(part.text)
    return role, "\n".join(pieces)


def _image_bytes(url: str) -> bytes:
    match = _DATA_URL.fullmatch(url.strip())
    if match is None:
        raise InvalidArgument(
            "image_url must be a data: URL (data:image/png;base64,... or data:image/jpeg;base64,...); "
            "this server does not fetch images"
        )
    try:
        return base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidArgument(f"image_url's base64 data is not valid: {e}") from e


def _sampling(body: _Sampling) -> pb.SamplingParams:
    s = pb.SamplingParams()
    if body.temperature is not None:
        s.temperature = body.temperature
    if body.top_p is not None:
        if body.top_p == 0.0:
            s.temperature = 0.0  # only the most likely token is left: greedy
        else:
            s.top_p = body.top_p
    # Copied as they are when set (range-checked by the request model and again by SamplingConfig).
    for field in ("seed", "frequency_penalty", "presence_penalty", "top_k", "min_p", "repeat_penalty"):
        value = getattr(body, field)
        if value is not None:
            setattr(s, field, value)
    if body.repeat_last_n is not None:
        s.repeat_last_n = MAX_REPEAT_LAST_N if body.repeat_last_n == -1 else body.repeat_last_n
    for token, bias in _logit_bias(body).items():
        s.logit_bias[token] = bias
    return s


def _max_tokens(asked: int | None, limit: int) -> tuple[int, int | None]:
    """(max_tokens, the limit when it was lowered to it). Unset: the daemon's default reply
    length, never above --max-tokens-per-request (OpenAI's "as long as the model likes" would
    let one NPC hold a sequence for the whole context). -1 (LM Studio's "no limit"): the limit.
    More than the limit: the limit, as llama-server and LM Studio do; a client written for them
    asks for 4096 and expects a reply, not a 400."""
    if asked is None:
        return min(DEFAULT_MAX_TOKENS, limit), None
    if asked == NO_LIMIT:
        return limit, None
    return (asked, None) if asked <= limit else (limit, limit)


def _stops(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _json_schema(body: ChatCompletionRequest) -> str:
    if body.json_schema is not None:  # llama-server's top-level field
        if body.response_format is not None:
            raise InvalidArgument("give json_schema or response_format, not both")
        return json.dumps(body.json_schema)
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        return json.dumps({"type": "object"})
    if isinstance(fmt, JsonSchemaResponseFormat):
        return json.dumps(fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else {"type": "object"})
    return ""
