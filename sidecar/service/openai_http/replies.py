"""The core's stream of xlm.v1 GenerateChunks -> OpenAI response objects and server-sent events.

Streams follow OpenAI's shape: a first chunk with the assistant role, content deltas, a chunk
with the finish reason, with `stream_options.include_usage` one more with empty choices and the
usage, then `data: [DONE]`. An error after the first byte has left (the status is already 200)
comes as one `data: {"error": ...}` event and no [DONE], which the OpenAI SDKs raise as an error.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sidecar.api import pb
from sidecar.service.openai_http import logprobs, tools
from sidecar.service.openai_http.errors import error_body

_FINISH = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_STOP_STRING: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_CONTEXT_FULL: "length",
    pb.FINISH_REASON_CANCELLED: "stop",  # cut by a shutdown: the text so far is all there is
    pb.FINISH_REASON_TOOL_CALL: "tool_calls",
}
DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class ReplyIds:
    model: str
    chat: bool
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12))


def finish_reason(final: pb.GenerationFinal) -> str:
    return _FINISH.get(final.finish_reason, "stop")


def usage(finals: list[pb.GenerationFinal], n: int = 1) -> dict:
    """One request's usage. With several choices (n of each prompt, in order) a prompt counts once,
    as OpenAI counts it, with what of it was cached before this request (its first candidate's
    figure: the others copy the prefill that one computes, so a prompt is computed once)."""
    firsts = finals[::n]
    prompt = sum(f.usage.prompt_tokens for f in firsts)
    completion = sum(f.usage.completion_tokens for f in finals)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(f.usage.cached_prompt_tokens for f in firsts)},
        # Ours: tokens a grammar forced, fed by jump-forward decoding without a pass of their own.
        "forced_tokens": sum(f.usage.forced_tokens for f in finals),
    }


@dataclass
class Choice:
    """One choice of a reply, gathered."""

    text: list[str] = field(default_factory=list)
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    final: pb.GenerationFinal | None = None

    def add(self, chunk: pb.GenerateChunk) -> None:
        self.text.append(chunk.text)
        self.logprobs.extend(chunk.logprobs)
        if chunk.HasField("final"):
            self.final = chunk.final


async def collect(first: pb.GenerateChunk, chunks: AsyncIterator[pb.GenerateChunk]) -> list[Choice]:
    """Every choice, whole, in index order (the stream ends once each has its final chunk)."""
    choices: dict[int, Choice] = {}
    chunk = first
    while True:
        choices.setdefault(chunk.index, Choice()).add(chunk)
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            return [choices[i] for i in sorted(choices)]


def _chat_logprobs(choice: Choice, asked: bool) -> dict | None:
    return logprobs.chat_logprobs(choice.logprobs) if asked else None


def chat_completion(ids: ReplyIds, choices: list[Choice], messages: list[dict | None], asked_logprobs: bool,
                    n: int = 1) -> dict:
    return {
        "id": ids.id,
        "object": "chat.completion",
        "created": ids.created,
        "model": ids.model,
        "choices": [{
            "index": i,
            "message": message or {"role": "assistant", "content": "".join(choice.text)},
            "finish_reason": "tool_calls" if message and message.get("tool_calls") else finish_reason(choice.final),
            "logprobs": _chat_logprobs(choice, asked_logprobs),
        } for i, (choice, message) in enumerate(zip(choices, messages))],
        "usage": usage([c.final for c in choices], n),
        "system_fingerprint": None,
    }


def text_completion(ids: ReplyIds, choices: list[Choice], asked_logprobs: bool, n: int = 1) -> dict:
    return {
        "id": ids.id,
        "object": "text_completion",
        "created": ids.created,
        "model": ids.model,
        "choices": [{"index": i, "text": "".join(c.text), "finish_reason": finish_reason(c.final),
                     "logprobs": logprobs.completion_logprobs(c.logprobs) if asked_logprobs else None}
                    for i, c in enumerate(choices)],
        "usage": usage([c.final for c in choices], n),
    }


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _chat_chunk(ids: ReplyIds, delta: dict, finish: str | None, index: int = 0, lp: dict | None = None) -> dict:
    return {
        "id": ids.id,
        "object": "chat.completion.chunk",
        "created": ids.created,
        "model": ids.model,
        "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": lp}],
        "system_fingerprint": None,
    }


def _text_chunk(ids: ReplyIds, text: str, finish: str | None, index: int = 0, lp: dict | None = None) -> dict:
    return {
        "id": ids.id,
        "object": "text_completion",
        "created": ids.created,
        "model": ids.model,
        "choices": [{"index": index, "text": text, "finish_reason": finish, "logprobs": lp}],
    }


def _usage_tail(ids: ReplyIds, finals: list[pb.GenerationFinal], n: int) -> str:
    tail = _chat_chunk(ids, {}, None) if ids.chat else _text_chunk(ids, "", None)
    tail["choices"] = []
    tail["usage"] = usage(finals, n)
    return _event(tail)


async def events(ids: ReplyIds, first: pb.GenerateChunk, chunks: AsyncIterator[pb.GenerateChunk],
                 include_usage: bool, asked_logprobs: bool = False, n: int = 1) -> AsyncIterator[str]:
    """Server-sent events for a chat or text completion stream, each choice's deltas under its
    index as they come (n > 1 interleaves them)."""
    started: set[int] = set()
    offsets: dict[int, int] = {}  # a completion's text offsets, per choice
    finals: dict[int, pb.GenerationFinal] = {}
    chunk: pb.GenerateChunk | None = first
    try:
        while chunk is not None:
            i = chunk.index
            if ids.chat and i not in started:
                started.add(i)
                yield _event(_chat_chunk(ids, {"role": "assistant", "content": ""}, None, i))
            if chunk.text or chunk.logprobs:
                if ids.chat:
                    lp = logprobs.chat_logprobs(list(chunk.logprobs)) if asked_logprobs else None
                    yield _event(_chat_chunk(ids, {"content": chunk.text}, None, i, lp))
                else:
                    lp = logprobs.completion_logprobs(list(chunk.logprobs), offsets.get(i, 0)) if asked_logprobs else None
                    offsets[i] = offsets.get(i, 0) + len(chunk.text)
                    yield _event(_text_chunk(ids, chunk.text, None, i, lp))
            if chunk.HasField("final"):
                finals[i] = chunk.final
                reason = finish_reason(chunk.final)
                yield _event(_chat_chunk(ids, {}, reason, i) if ids.chat else _text_chunk(ids, "", reason, i))
            chunk = await anext(chunks, None)
    except Exception as e:  # not CancelledError: a client gone gets nothing more
        yield _event(error_body(e)[1])
        return
    if include_usage and finals:
        yield _usage_tail(ids, [finals[i] for i in sorted(finals)], n)
    yield DONE


def tool_message(text: str, final: pb.GenerationFinal | None) -> dict:
    """The assistant message of a reply held to the tools' grammar: the calls the core read from
    it (final.tool_calls), else its words."""
    calls = tools.openai_calls(final) if final is not None else []
    message: dict = {"role": "assistant", "content": None if calls else tools.words(text)}
    if calls:
        message["tool_calls"] = calls
    return message


async def tool_events(ids: ReplyIds, first: pb.GenerateChunk, chunks: AsyncIterator[pb.GenerateChunk],
                      include_usage: bool, n: int = 1) -> AsyncIterator[str]:
    """A tools reply streamed: a call is only known whole once its JSON closes, so each choice is
    gathered, then sent as OpenAI's deltas (the call's id and name, then its arguments)."""
    try:
        choices = await collect(first, chunks)
    except Exception as e:  # not CancelledError: a client gone gets nothing more
        yield _event(_chat_chunk(ids, {"role": "assistant", "content": ""}, None))
        yield _event(error_body(e)[1])
        return
    for c, choice in enumerate(choices):
        yield _event(_chat_chunk(ids, {"role": "assistant", "content": ""}, None, c))
        message = tool_message("".join(choice.text), choice.final)
        reason = finish_reason(choice.final)
        # Each call by its index in the list, as OpenAI streams several: clients gather deltas by it.
        for index, call in enumerate(message.get("tool_calls") or ()):
            function = call["function"]
            head = {"index": index, "id": call["id"], "type": "function",
                    "function": {"name": function["name"], "arguments": ""}}
            yield _event(_chat_chunk(ids, {"tool_calls": [head]}, None, c))
            yield _event(_chat_chunk(ids, {"tool_calls": [{"index": index, "function": {"arguments": function["arguments"]}}]},
                                     None, c))
            reason = "tool_calls"
        if message["content"]:
            yield _event(_chat_chunk(ids, {"content": message["content"]}, None, c))
        yield _event(_chat_chunk(ids, {}, reason, c))
    if include_usage:
        yield _usage_tail(ids, [c.final for c in choices], n)
    yield DONE
