"""What the API answers, as pydantic models: the OpenAPI document's response schemas (replies
builds the same objects as plain dicts, on the hot path; the schemathesis test checks that every
answer fits these)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptTokensDetails(_Reply):
    cached_tokens: int


class Usage(_Reply):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    # An extension: of completion_tokens, those a grammar forced (jump-forward decoding).
    forced_tokens: int = 0


FinishReason = Literal["stop", "length", "tool_calls"]


class FunctionCallOut(_Reply):
    name: str
    arguments: str


class ToolCallOut(_Reply):
    id: str
    type: Literal["function"]
    function: FunctionCallOut


class AssistantMessage(_Reply):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class TopLogprob(_Reply):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Reply):
    content: list[TokenLogprob]
    refusal: None


class CompletionLogprobs(_Reply):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class ChatChoice(_Reply):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChatLogprobs | None


class ChatCompletion(_Reply):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: None


class TextChoice(_Reply):
    index: int
    text: str
    finish_reason: FinishReason | None
    logprobs: CompletionLogprobs | None


class TextCompletion(_Reply):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage


class Model(_Reply):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Reply):
    object: Literal["list"]
    data: list[Model]


class SessionDeleted(_Reply):
    id: str
    object: Literal["session.deleted"]
    deleted: bool
    tokens_freed: int


class Health(_Reply):
    status: Literal["ok", "draining"]


class ErrorDetail(_Reply):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(_Reply):
    error: ErrorDetail


class Embedding(_Reply):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str  # str: base64 of little-endian float32s (encoding_format "base64")


class EmbeddingUsage(_Reply):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(_Reply):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class Tokens(_Reply):
    tokens: list[int] | list[dict[str, int | str | list[int]]]


class Text(_Reply):
    content: str
