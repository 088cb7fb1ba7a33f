"""The request bodies the OpenAI-compatible API accepts, as pydantic models.

They validate every body (strictly: a string where a number belongs is a 400, not a guess) and
are the source of the OpenAPI document's request schemas, so what is documented is what is
checked. Fields OpenAI defines that the daemon cannot honour are declared too, so that they are
refused with a message naming them (see translate) instead of being silently ignored; fields no
OpenAI API defines are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from sidecar.backend.requests import MAX_TOP_LOGPROBS
from sidecar.backend.sessions import MAX_SESSION_ID_LENGTH
from sidecar.service.token_controls import MAX_CANDIDATES

# OpenAI's own ranges where ours are wider. Seeds take any uint64, as gRPC's do (folded into
# llama.cpp's 32 bits the same way, convert.sampling_from_pb).
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Seed = Annotated[int, Field(ge=0, le=2**64 - 1)]
NO_LIMIT = -1  # LM Studio's max_tokens for "as long as the model likes": here, up to the limit


def _whole(value: Any) -> Any:
    # JavaScript clients send 8.0 where they mean 8; 8.5 stays a float, refused as one.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _positive_or_no_limit(value: int) -> int:
    if value < 1 and value != NO_LIMIT:
        raise ValueError("must be at least 1, or -1 for the server's limit")
    return value


# Any count is taken: above --max-tokens-per-request it is clamped to it (translate), as
# llama-server and LM Studio do, not refused.
MaxTokens = Annotated[int, BeforeValidator(_whole), AfterValidator(_positive_or_no_limit), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 1}, {"const": NO_LIMIT}]})]
StopString = Annotated[str, Field(min_length=1, max_length=256)]
Stop = Union[StopString, Annotated[list[StopString], Field(max_length=16)], None]
# Prompts one /v1/completions request may carry; with n, each is a sequence of its own.
MAX_PROMPTS = 16
TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=2**31 - 1)]], Field(min_length=1)]
# Declared so a client's use of it is refused by name; the document says which values pass.
_REFUSED_UNLESS_OFF = {"enum": [False, None]}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ImageUrl(_Body):
    url: str = Field(description="a data: URL, data:image/png;base64,... or data:image/jpeg;base64,...")
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Body):
    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[Union[TextPart, ImagePart], Field(discriminator="type")]
Content = Union[str, list[ContentPart], None]


class FunctionCall(_Body):
    name: str
    arguments: str = Field(description="the call's arguments, JSON text")


class ToolCall(_Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class StreamOptions(_Body):
    include_usage: bool | None = None


class JsonSchemaFormat(_Body):
    name: str = "reply"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextFormat(_Body):
    type: Literal["text"]


class JsonObjectFormat(_Body):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Body):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[Union[TextFormat, JsonObjectFormat, JsonSchemaResponseFormat], Field(discriminator="type")]


class FunctionDefinition(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice, None]


class MemoryOptions(_Body):
    """xlm.v1.MemoryOptions (an extension): what a session's turns remember and recall."""

    model_config = ConfigDict(extra="forbid", strict=True)
    scope: Annotated[str, Field(max_length=128)] = ""
    read_scopes: Annotated[list[Annotated[str, Field(max_length=128)]], Field(max_length=16)] = Field(default_factory=list)
    max_tokens: Annotated[int, Field(ge=0, le=1 << 20)] = 0
    k: Annotated[int, Field(ge=0, le=32)] = 0
    tags: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=16)] = Field(default_factory=list)
    off: bool = False


class _Sampling(_Body):
    """What both endpoints share."""

    model: str | None = None
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: Stop = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    # llama-server's sampling fields, honoured as it does (a client written for it sends them, and
    # ignoring them would sample otherwise than asked): range-checked with the gRPC fields.
    top_k: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    min_p: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    repeat_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = Field(
        None, description="penalty on tokens of the last repeat_last_n; 1 is off (the daemon's default 1.1)")
    repeat_last_n: Annotated[int, Field(ge=-1, le=1 << 20)] | None = Field(
        None, description="the penalties' window in tokens; -1 is the whole reply, 0 off (default 64)")
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = Field(
        None, description="token id (as a string) -> bias, -100 to 100; -100 bans the token (POST /tokenize finds ids)")
    n: Annotated[int, Field(ge=1, le=MAX_CANDIDATES)] | None = Field(
        None, description="candidate replies computed from one prefill of the prompt; one-offs (no session)")
    # llama-server's own constraints, honoured rather than ignored: a GBNF grammar, a JSON schema.
    grammar: Annotated[str, Field(min_length=1)] | None = None
    json_schema: dict[str, Any] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: Annotated[str, Field(max_length=MAX_SESSION_ID_LENGTH)] | None = Field(
        None, description="names the conversation's session (an NPC) unless the X-Session-Id header does"
    )
    memory: MemoryOptions | None = Field(
        None, description="NPC memory (an extension): the session's scope, the scopes it reads, its budget")


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: MaxTokens | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None


class CompletionRequest(_Sampling):
    # A text, texts (one choice each, or n each), token ids, or lists of token ids.
    prompt: Union[str, Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)], TokenIds,
                  Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]]
    echo: bool | None = Field(None, json_schema_extra=_REFUSED_UNLESS_OFF)
    suffix: str | None = Field(None, json_schema_extra={"maxLength": 0})
    best_of: Annotated[int, Field(ge=1, le=128)] | None = Field(None, json_schema_extra={"maximum": 1})
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
