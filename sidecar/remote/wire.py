"""The OpenAI-compatible wire format, as vLLM and llama.cpp's server speak it: request bodies built
from a GenerationSpec, streamed chunks read back, and HTTP failures turned into our typed errors.

Pure functions of plain data (no sockets), so each rule here is tested on its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sidecar.backend.requests import FinishReason, GenerationSpec
from sidecar.errors import (
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    SidecarError,
    Unavailable,
)

# Longest piece of a server's error text we pass on to the game.
MAX_ERROR_TEXT = 500


def chat_body(model: str | None, messages: list[tuple[str, str]], spec: GenerationSpec) -> dict:
    """A streaming /chat/completions request for the whole conversation (history included: the
    server keeps no state between calls, and its prefix cache makes resending it cheap)."""
    body = {"messages": [{"role": role, "content": content} for role, content in messages]}
    return _common(body, model, spec)


def completion_body(model: str | None, prompt: str | list[int], spec: GenerationSpec) -> dict:
    """A streaming /completions request for a raw prompt (the session's text so far included), or
    for token ids, which the OpenAI API takes as a list of integers."""
    return _common({"prompt": prompt}, model, spec)


def _common(body: dict, model: str | None, spec: GenerationSpec) -> dict:
    s = spec.sampling
    if model:
        body["model"] = model
    body.update(
        stream=True,
        # Ask for a last chunk with token counts (OpenAI, vLLM, llama.cpp); servers that do not
        # know the option ignore it, and we count streamed chunks instead.
        stream_options={"include_usage": True},
        max_tokens=spec.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        min_p=s.min_p,
        # The repetition penalty has two names: llama.cpp's server reads repeat_penalty, vLLM reads
        # repetition_penalty; each ignores the other's.
        repeat_penalty=s.repeat_penalty,
        repetition_penalty=s.repeat_penalty,
        repeat_last_n=s.repeat_last_n,
    )
    if s.top_k > 0:  # 0 means "off" here; servers disagree on how to say that, so say nothing
        body["top_k"] = s.top_k
    if s.seed is not None:
        body["seed"] = s.seed
    if s.logit_bias:  # OpenAI's shape; the ids are the remote model's, as the caller's were
        body["logit_bias"] = {str(token): bias for token, bias in s.logit_bias}
    if spec.json_schema:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "reply", "schema": json.loads(spec.json_schema), "strict": True},
        }
    # Stop strings are not sent: the daemon cuts them itself, so it can tell a stop string from the
    # model's end of turn (OpenAI's API reports both as "stop") and cut strings spanning chunks.
    return body


@dataclass(frozen=True)
class ChunkUsage:
    """Token counts a server reported; cached_prompt_tokens is 0 where it does not say."""

    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int


@dataclass(frozen=True)
class ServerTimings:
    """llama.cpp's server adds its own measured rates to the last chunk; other servers do not."""

    prefill_tokens_per_s: float
    decode_tokens_per_s: float


@dataclass(frozen=True)
class StreamChunk:
    """What one server-sent event carried: text, and on the last ones the finish reason, usage, timings."""

    text: str = ""
    finish_reason: str | None = None
    usage: ChunkUsage | None = None
    timings: ServerTimings | None = None


def parse_sse_line(line: str) -> str | None:
    """The data of one server-sent-event line; None for comments, blank lines and other fields.
    Servers send one `data:` line per event, so events are never split across lines here."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def parse_chunk(data: str) -> StreamChunk:
    """Read one event's JSON (a chat or a completion chunk). A server's in-stream error becomes our
    typed error; a chunk that is not the expected JSON becomes Unavailable."""
    try:
        event = json.loads(data)
    except ValueError:
        raise Unavailable(f"the remote server sent a chunk that is not JSON: {data[:100]!r}") from None
    if not isinstance(event, dict):
        raise Unavailable(f"the remote server sent an unexpected chunk: {data[:100]!r}")
    if "error" in event:
        error = event["error"]
        code = error.get("code") if isinstance(error, dict) else None
        raise error_for_status(code if isinstance(code, int) else 500, _message(event))
    text, finish = "", None
    choices = event.get("choices") or []
    if choices and isinstance(choices[0], dict):
        choice = choices[0]
        delta = choice.get("delta")
        # Chat chunks carry text in delta.content, completion chunks in text.
        piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        text = piece if isinstance(piece, str) else ""
        finish = choice.get("finish_reason") or None
    return StreamChunk(text=text, finish_reason=finish, usage=_usage(event.get("usage")), timings=_timings(event.get("timings")))


def _usage(usage: object) -> ChunkUsage | None:
    if not isinstance(usage, dict) or "completion_tokens" not in usage:
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return ChunkUsage(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        cached_prompt_tokens=int(cached or 0),
    )


def _timings(timings: object) -> ServerTimings | None:
    if not isinstance(timings, dict):
        return None
    try:
        return ServerTimings(float(timings["prompt_per_second"]), float(timings["predicted_per_second"]))
    except (KeyError, TypeError, ValueError):
        return None


def finish_reason(reason: str | None) -> FinishReason:
    """OpenAI's finish reason as ours: "length" is LENGTH; every other end (stop, content filter,
    tool call) is the model ending its turn."""
    return FinishReason.LENGTH if reason == "length" else FinishReason.STOP


def error_for_status(status: int, message: str) -> SidecarError:
    """A remote HTTP failure as the status code the game sees.

    The request's fault (400, 413, 422 ...) is INVALID_ARGUMENT with the server's words. The
    daemon's configuration (a refused key, a wrong URL or model name) is FAILED_PRECONDITION, which
    no retry fixes. A busy server (429) is RESOURCE_EXHAUSTED; a failing or absent one (5xx, 408)
    is UNAVAILABLE, which a retry may fix.
    """
    said = f"the remote server answered {status}: {message}" if message else f"the remote server answered {status}"
    if status in (401, 403):
        return FailedPrecondition(f"{said} (check --remote-api-key-env)")
    if status == 404:
        return FailedPrecondition(f"{said} (check --remote-url and --remote-model)")
    if status == 429:
        return ResourceExhausted(said)
    if status == 408 or status >= 500:
        return Unavailable(said)
    if 400 <= status < 500:
        return InvalidArgument(said)
    return Unavailable(said)


def error_message(body: bytes) -> str:
    """The human part of an error response: OpenAI's error.message, FastAPI's detail, or the text."""
    text = body.decode("utf-8", "replace").strip()
    try:
        return _message(json.loads(text))
    except ValueError:
        return text[:MAX_ERROR_TEXT]


def _message(payload: object) -> str:
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"][:MAX_ERROR_TEXT]
        if isinstance(error, str):
            return error[:MAX_ERROR_TEXT]
        if "detail" in payload:  # FastAPI validation errors (llama-cpp-python's server)
            return json.dumps(payload["detail"])[:MAX_ERROR_TEXT]
        if isinstance(payload.get("message"), str):
            return payload["message"][:MAX_ERROR_TEXT]
    return json.dumps(payload)[:MAX_ERROR_TEXT]
