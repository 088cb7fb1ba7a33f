from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP_STRING: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_CONTEXT_FULL: _ClassVar[FinishReason]
    FINISH_REASON_TOOL_CALL: _ClassVar[FinishReason]

class PixelFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PIXEL_FORMAT_UNSPECIFIED: _ClassVar[PixelFormat]
    PIXEL_FORMAT_RGBA8: _ClassVar[PixelFormat]
    PIXEL_FORMAT_BGRA8: _ClassVar[PixelFormat]
    PIXEL_FORMAT_RGB8: _ClassVar[PixelFormat]

class EnginePhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENGINE_PHASE_UNSPECIFIED: _ClassVar[EnginePhase]
    ENGINE_PHASE_LOADING: _ClassVar[EnginePhase]
    ENGINE_PHASE_READY: _ClassVar[EnginePhase]
    ENGINE_PHASE_RELOADING: _ClassVar[EnginePhase]
    ENGINE_PHASE_DRAINING: _ClassVar[EnginePhase]
    ENGINE_PHASE_STARTING: _ClassVar[EnginePhase]

class ProfileState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROFILE_STATE_UNSPECIFIED: _ClassVar[ProfileState]
    PROFILE_STATE_MEASURED: _ClassVar[ProfileState]
    PROFILE_STATE_DEFAULTS: _ClassVar[ProfileState]
    PROFILE_STATE_REFRESHING: _ClassVar[ProfileState]
    PROFILE_STATE_OFF: _ClassVar[ProfileState]

class Placement(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLACEMENT_UNSPECIFIED: _ClassVar[Placement]
    PLACEMENT_FULL_GPU: _ClassVar[Placement]
    PLACEMENT_STATIC: _ClassVar[Placement]
    PLACEMENT_DYNAMIC: _ClassVar[Placement]
    PLACEMENT_GPU_STREAMING: _ClassVar[Placement]
    PLACEMENT_CPU_ONLY: _ClassVar[Placement]

class TierPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_PHASE_UNSPECIFIED: _ClassVar[TierPhase]
    TIER_PHASE_DECODE: _ClassVar[TierPhase]
    TIER_PHASE_PREFILL: _ClassVar[TierPhase]

class RequestState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUEST_STATE_UNSPECIFIED: _ClassVar[RequestState]
    REQUEST_STATE_PREPARING: _ClassVar[RequestState]
    REQUEST_STATE_WAITING_FOR_SEQUENCE: _ClassVar[RequestState]
    REQUEST_STATE_WAITING_FOR_TURN: _ClassVar[RequestState]
    REQUEST_STATE_WAITING_FOR_IMAGE: _ClassVar[RequestState]
    REQUEST_STATE_WAITING_FOR_PREFIX: _ClassVar[RequestState]
    REQUEST_STATE_PREFILLING: _ClassVar[RequestState]
    REQUEST_STATE_DECODING: _ClassVar[RequestState]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP_STRING: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_CONTEXT_FULL: FinishReason
FINISH_REASON_TOOL_CALL: FinishReason
PIXEL_FORMAT_UNSPECIFIED: PixelFormat
PIXEL_FORMAT_RGBA8: PixelFormat
PIXEL_FORMAT_BGRA8: PixelFormat
PIXEL_FORMAT_RGB8: PixelFormat
ENGINE_PHASE_UNSPECIFIED: EnginePhase
ENGINE_PHASE_LOADING: EnginePhase
ENGINE_PHASE_READY: EnginePhase
ENGINE_PHASE_RELOADING: EnginePhase
ENGINE_PHASE_DRAINING: EnginePhase
ENGINE_PHASE_STARTING: EnginePhase
PROFILE_STATE_UNSPECIFIED: ProfileState
PROFILE_STATE_MEASURED: ProfileState
PROFILE_STATE_DEFAULTS: ProfileState
PROFILE_STATE_REFRESHING: ProfileState
PROFILE_STATE_OFF: ProfileState
PLACEMENT_UNSPECIFIED: Placement
PLACEMENT_FULL_GPU: Placement
PLACEMENT_STATIC: Placement
PLACEMENT_DYNAMIC: Placement
PLACEMENT_GPU_STREAMING: Placement
PLACEMENT_CPU_ONLY: Placement
TIER_PHASE_UNSPECIFIED: TierPhase
TIER_PHASE_DECODE: TierPhase
TIER_PHASE_PREFILL: TierPhase
REQUEST_STATE_UNSPECIFIED: RequestState
REQUEST_STATE_PREPARING: RequestState
REQUEST_STATE_WAITING_FOR_SEQUENCE: RequestState
REQUEST_STATE_WAITING_FOR_TURN: RequestState
REQUEST_STATE_WAITING_FOR_IMAGE: RequestState
REQUEST_STATE_WAITING_FOR_PREFIX: RequestState
REQUEST_STATE_PREFILLING: RequestState
REQUEST_STATE_DECODING: RequestState

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed", "frequency_penalty", "presence_penalty", "logit_bias")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPEAT_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPEAT_LAST_N_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    repeat_last_n: int
    seed: int
    frequency_penalty: float
    presence_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., repeat_penalty: _Optional[float] = ..., repeat_last_n: _Optional[int] = ..., seed: _Optional[int] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("messages", "prompt", "prompt_tokens", "sampling", "max_tokens", "stop", "json_schema", "session_id", "reset_session", "request_id", "context", "tools", "tool_choice", "logprobs", "n", "grammar", "parallel_tool_calls", "memory")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RESET_SESSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    messages: ChatMessages
    prompt: str
    prompt_tokens: TokenIds
    sampling: SamplingParams
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    json_schema: str
    session_id: str
    reset_session: bool
    request_id: str
    context: str
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    tool_choice: str
    logprobs: int
    n: int
    grammar: str
    parallel_tool_calls: bool
    memory: MemoryOptions
    def __init__(self, messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., prompt: _Optional[str] = ..., prompt_tokens: _Optional[_Union[TokenIds, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., json_schema: _Optional[str] = ..., session_id: _Optional[str] = ..., reset_session: _Optional[bool] = ..., request_id: _Optional[str] = ..., context: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., tool_choice: _Optional[str] = ..., logprobs: _Optional[int] = ..., n: _Optional[int] = ..., grammar: _Optional[str] = ..., parallel_tool_calls: _Optional[bool] = ..., memory: _Optional[_Union[MemoryOptions, _Mapping]] = ...) -> None: ...

class MemoryOptions(_message.Message):
    __slots__ = ("scope", "read_scopes", "max_tokens", "k", "tags", "off")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    READ_SCOPES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    OFF_FIELD_NUMBER: _ClassVar[int]
    scope: str
    read_scopes: _containers.RepeatedScalarFieldContainer[str]
    max_tokens: int
    k: int
    tags: _containers.RepeatedScalarFieldContainer[str]
    off: bool
    def __init__(self, scope: _Optional[str] = ..., read_scopes: _Optional[_Iterable[str]] = ..., max_tokens: _Optional[int] = ..., k: _Optional[int] = ..., tags: _Optional[_Iterable[str]] = ..., off: _Optional[bool] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters_json_schema")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json_schema: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json_schema: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("name", "arguments_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    arguments_json: str
    def __init__(self, name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "forced_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORCED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    forced_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., forced_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("time_to_first_token_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "total_ms", "queued_ms")
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_MS_FIELD_NUMBER: _ClassVar[int]
    time_to_first_token_ms: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    total_ms: float
    queued_ms: float
    def __init__(self, time_to_first_token_ms: _Optional[float] = ..., prefill_tokens_per_s: _Optional[float] = ..., decode_tokens_per_s: _Optional[float] = ..., total_ms: _Optional[float] = ..., queued_ms: _Optional[float] = ...) -> None: ...

class ImageInfo(_message.Message):
    __slots__ = ("original_width", "original_height", "encoded_width", "encoded_height", "downscaled", "image_tokens", "encode_ms")
    ORIGINAL_WIDTH_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    ENCODED_WIDTH_FIELD_NUMBER: _ClassVar[int]
    ENCODED_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    DOWNSCALED_FIELD_NUMBER: _ClassVar[int]
    IMAGE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ENCODE_MS_FIELD_NUMBER: _ClassVar[int]
    original_width: int
    original_height: int
    encoded_width: int
    encoded_height: int
    downscaled: bool
    image_tokens: int
    encode_ms: float
    def __init__(self, original_width: _Optional[int] = ..., original_height: _Optional[int] = ..., encoded_width: _Optional[int] = ..., encoded_height: _Optional[int] = ..., downscaled: _Optional[bool] = ..., image_tokens: _Optional[int] = ..., encode_ms: _Optional[float] = ...) -> None: ...

class GenerationFinal(_message.Message):
    __slots__ = ("finish_reason", "usage", "timings", "session_id", "image", "history_turns_dropped", "history_tokens_kept", "tool_call", "tool_calls", "memories_used", "memories_added")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_TURNS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    HISTORY_TOKENS_KEPT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_USED_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_ADDED_FIELD_NUMBER: _ClassVar[int]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    session_id: str
    image: ImageInfo
    history_turns_dropped: int
    history_tokens_kept: int
    tool_call: ToolCall
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    memories_used: _containers.RepeatedScalarFieldContainer[int]
    memories_added: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., session_id: _Optional[str] = ..., image: _Optional[_Union[ImageInfo, _Mapping]] = ..., history_turns_dropped: _Optional[int] = ..., history_tokens_kept: _Optional[int] = ..., tool_call: _Optional[_Union[ToolCall, _Mapping]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., memories_used: _Optional[_Iterable[int]] = ..., memories_added: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("text", "token_ids", "final", "logprobs", "index")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    final: GenerationFinal
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    index: int
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., final: _Optional[_Union[GenerationFinal, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., index: _Optional[int] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "piece", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PIECE_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    piece: bytes
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TokenAlternative]
    def __init__(self, token_id: _Optional[int] = ..., piece: _Optional[bytes] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TokenAlternative, _Mapping]]] = ...) -> None: ...

class TokenAlternative(_message.Message):
    __slots__ = ("token_id", "piece", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PIECE_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    piece: bytes
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., piece: _Optional[bytes] = ..., logprob: _Optional[float] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("input",)
    INPUT_FIELD_NUMBER: _ClassVar[int]
    input: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, input: _Optional[_Iterable[str]] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "prompt_tokens")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    prompt_tokens: int
    def __init__(self, embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("text", "add_special", "parse_special")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_FIELD_NUMBER: _ClassVar[int]
    PARSE_SPECIAL_FIELD_NUMBER: _ClassVar[int]
    text: str
    add_special: bool
    parse_special: bool
    def __init__(self, text: _Optional[str] = ..., add_special: _Optional[bool] = ..., parse_special: _Optional[bool] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class RawImage(_message.Message):
    __slots__ = ("pixels", "width", "height", "stride", "format", "bottom_up")
    PIXELS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    BOTTOM_UP_FIELD_NUMBER: _ClassVar[int]
    pixels: bytes
    width: int
    height: int
    stride: int
    format: PixelFormat
    bottom_up: bool
    def __init__(self, pixels: _Optional[bytes] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., stride: _Optional[int] = ..., format: _Optional[_Union[PixelFormat, str]] = ..., bottom_up: _Optional[bool] = ...) -> None: ...

class Image(_message.Message):
    __slots__ = ("encoded", "raw")
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    encoded: bytes
    raw: RawImage
    def __init__(self, encoded: _Optional[bytes] = ..., raw: _Optional[_Union[RawImage, _Mapping]] = ...) -> None: ...

class AskImageRequest(_message.Message):
    __slots__ = ("image", "question", "sampling", "max_tokens", "stop", "json_schema", "session_id", "request_id")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    image: Image
    question: str
    sampling: SamplingParams
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    json_schema: str
    session_id: str
    request_id: str
    def __init__(self, image: _Optional[_Union[Image, _Mapping]] = ..., question: _Optional[str] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., json_schema: _Optional[str] = ..., session_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class Budget(_message.Message):
    __slots__ = ("vram_bytes", "max_cpu_threads", "auto_vram", "auto_reserve_bytes", "ram_bytes")
    VRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CPU_THREADS_FIELD_NUMBER: _ClassVar[int]
    AUTO_VRAM_FIELD_NUMBER: _ClassVar[int]
    AUTO_RESERVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    vram_bytes: int
    max_cpu_threads: int
    auto_vram: bool
    auto_reserve_bytes: int
    ram_bytes: int
    def __init__(self, vram_bytes: _Optional[int] = ..., max_cpu_threads: _Optional[int] = ..., auto_vram: _Optional[bool] = ..., auto_reserve_bytes: _Optional[int] = ..., ram_bytes: _Optional[int] = ...) -> None: ...

class SetBudgetRequest(_message.Message):
    __slots__ = ("vram_bytes", "vram_size", "auto_reserve_bytes", "max_cpu_threads", "ram_size")
    VRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    VRAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    AUTO_RESERVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CPU_THREADS_FIELD_NUMBER: _ClassVar[int]
    RAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    vram_bytes: int
    vram_size: str
    auto_reserve_bytes: int
    max_cpu_threads: int
    ram_size: str
    def __init__(self, vram_bytes: _Optional[int] = ..., vram_size: _Optional[str] = ..., auto_reserve_bytes: _Optional[int] = ..., max_cpu_threads: _Optional[int] = ..., ram_size: _Optional[str] = ...) -> None: ...

class SetBudgetResponse(_message.Message):
    __slots__ = ("budget", "schedule", "reloaded", "pause_ms")
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    RELOADED_FIELD_NUMBER: _ClassVar[int]
    PAUSE_MS_FIELD_NUMBER: _ClassVar[int]
    budget: Budget
    schedule: Schedule
    reloaded: bool
    pause_ms: float
    def __init__(self, budget: _Optional[_Union[Budget, _Mapping]] = ..., schedule: _Optional[_Union[Schedule, _Mapping]] = ..., reloaded: _Optional[bool] = ..., pause_ms: _Optional[float] = ...) -> None: ...

class ProfileProgress(_message.Message):
    __slots__ = ("state", "steps_done", "steps_total", "step", "slices_discarded", "source")
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEPS_DONE_FIELD_NUMBER: _ClassVar[int]
    STEPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SLICES_DISCARDED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    state: ProfileState
    steps_done: int
    steps_total: int
    step: str
    slices_discarded: int
    source: str
    def __init__(self, state: _Optional[_Union[ProfileState, str]] = ..., steps_done: _Optional[int] = ..., steps_total: _Optional[int] = ..., step: _Optional[str] = ..., slices_discarded: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class WatchStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StateEvent(_message.Message):
    __slots__ = ("unix_ms", "phase", "budget", "schedule", "reason", "profile", "memories_added")
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_ADDED_FIELD_NUMBER: _ClassVar[int]
    unix_ms: int
    phase: EnginePhase
    budget: Budget
    schedule: Schedule
    reason: str
    profile: ProfileProgress
    memories_added: MemoriesAdded
    def __init__(self, unix_ms: _Optional[int] = ..., phase: _Optional[_Union[EnginePhase, str]] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., schedule: _Optional[_Union[Schedule, _Mapping]] = ..., reason: _Optional[str] = ..., profile: _Optional[_Union[ProfileProgress, _Mapping]] = ..., memories_added: _Optional[_Union[MemoriesAdded, _Mapping]] = ...) -> None: ...

class MemoriesAdded(_message.Message):
    __slots__ = ("session_id", "scope", "memory_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    scope: str
    memory_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., scope: _Optional[str] = ..., memory_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TierPlan(_message.Message):
    __slots__ = ("max_tokens", "phase", "placement", "threads", "predicted_tokens_per_s", "predicted_ms_per_pass")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_MS_PER_PASS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    phase: TierPhase
    placement: Placement
    threads: int
    predicted_tokens_per_s: float
    predicted_ms_per_pass: float
    def __init__(self, max_tokens: _Optional[int] = ..., phase: _Optional[_Union[TierPhase, str]] = ..., placement: _Optional[_Union[Placement, str]] = ..., threads: _Optional[int] = ..., predicted_tokens_per_s: _Optional[float] = ..., predicted_ms_per_pass: _Optional[float] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("tiers", "vram_bytes_by_component", "kv_type", "flash_attention", "micro_batch", "op_offload_min_batch", "tensor_overrides")
    class VramBytesByComponentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TIERS_FIELD_NUMBER: _ClassVar[int]
    VRAM_BYTES_BY_COMPONENT_FIELD_NUMBER: _ClassVar[int]
    KV_TYPE_FIELD_NUMBER: _ClassVar[int]
    FLASH_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    OP_OFFLOAD_MIN_BATCH_FIELD_NUMBER: _ClassVar[int]
    TENSOR_OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedCompositeFieldContainer[TierPlan]
    vram_bytes_by_component: _containers.ScalarMap[str, int]
    kv_type: str
    flash_attention: bool
    micro_batch: int
    op_offload_min_batch: int
    tensor_overrides: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tiers: _Optional[_Iterable[_Union[TierPlan, _Mapping]]] = ..., vram_bytes_by_component: _Optional[_Mapping[str, int]] = ..., kv_type: _Optional[str] = ..., flash_attention: _Optional[bool] = ..., micro_batch: _Optional[int] = ..., op_offload_min_batch: _Optional[int] = ..., tensor_overrides: _Optional[_Iterable[str]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("path", "name", "architecture", "parameters", "file_bytes", "trained_context", "layers", "experts", "chat_template", "vision_available", "projector_path")
    PATH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRAINED_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    VISION_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    PROJECTOR_PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    name: str
    architecture: str
    parameters: int
    file_bytes: int
    trained_context: int
    layers: int
    experts: int
    chat_template: str
    vision_available: bool
    projector_path: str
    def __init__(self, path: _Optional[str] = ..., name: _Optional[str] = ..., architecture: _Optional[str] = ..., parameters: _Optional[int] = ..., file_bytes: _Optional[int] = ..., trained_context: _Optional[int] = ..., layers: _Optional[int] = ..., experts: _Optional[int] = ..., chat_template: _Optional[str] = ..., vision_available: _Optional[bool] = ..., projector_path: _Optional[str] = ...) -> None: ...

class MemoryUse(_message.Message):
    __slots__ = ("host_resident_bytes", "vram_used_bytes", "model_host_bytes", "model_vram_bytes", "kv_cache_bytes", "planned_vram_bytes", "devices", "placement_device", "kv_cache_held_bytes", "kv_sequences", "kv_sequences_max", "saved_sessions_bytes", "prefix_cache_bytes", "ram_budget_bytes", "vision_worker_bytes", "vision_reserved_bytes")
    HOST_RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    VRAM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODEL_HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODEL_VRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PLANNED_VRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_DEVICE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_HELD_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    KV_SEQUENCES_MAX_FIELD_NUMBER: _ClassVar[int]
    SAVED_SESSIONS_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RAM_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    VISION_WORKER_BYTES_FIELD_NUMBER: _ClassVar[int]
    VISION_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    host_resident_bytes: int
    vram_used_bytes: int
    model_host_bytes: int
    model_vram_bytes: int
    kv_cache_bytes: int
    planned_vram_bytes: int
    devices: _containers.RepeatedCompositeFieldContainer[DeviceMemory]
    placement_device: str
    kv_cache_held_bytes: int
    kv_sequences: int
    kv_sequences_max: int
    saved_sessions_bytes: int
    prefix_cache_bytes: int
    ram_budget_bytes: int
    vision_worker_bytes: int
    vision_reserved_bytes: int
    def __init__(self, host_resident_bytes: _Optional[int] = ..., vram_used_bytes: _Optional[int] = ..., model_host_bytes: _Optional[int] = ..., model_vram_bytes: _Optional[int] = ..., kv_cache_bytes: _Optional[int] = ..., planned_vram_bytes: _Optional[int] = ..., devices: _Optional[_Iterable[_Union[DeviceMemory, _Mapping]]] = ..., placement_device: _Optional[str] = ..., kv_cache_held_bytes: _Optional[int] = ..., kv_sequences: _Optional[int] = ..., kv_sequences_max: _Optional[int] = ..., saved_sessions_bytes: _Optional[int] = ..., prefix_cache_bytes: _Optional[int] = ..., ram_budget_bytes: _Optional[int] = ..., vision_worker_bytes: _Optional[int] = ..., vision_reserved_bytes: _Optional[int] = ...) -> None: ...

class DeviceMemory(_message.Message):
    __slots__ = ("device", "model_bytes", "kv_cache_bytes", "compute_bytes", "output_bytes", "free_bytes", "total_bytes")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MODEL_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_BYTES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    device: str
    model_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    output_bytes: int
    free_bytes: int
    total_bytes: int
    def __init__(self, device: _Optional[str] = ..., model_bytes: _Optional[int] = ..., kv_cache_bytes: _Optional[int] = ..., compute_bytes: _Optional[int] = ..., output_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class Throughput(_message.Message):
    __slots__ = ("tokens_generated", "prompt_tokens_processed", "decode_tokens_per_s", "prefill_tokens_per_s", "requests_served", "requests_active", "requests_queued")
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_PROCESSED_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_SERVED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_QUEUED_FIELD_NUMBER: _ClassVar[int]
    tokens_generated: int
    prompt_tokens_processed: int
    decode_tokens_per_s: float
    prefill_tokens_per_s: float
    requests_served: int
    requests_active: int
    requests_queued: int
    def __init__(self, tokens_generated: _Optional[int] = ..., prompt_tokens_processed: _Optional[int] = ..., decode_tokens_per_s: _Optional[float] = ..., prefill_tokens_per_s: _Optional[float] = ..., requests_served: _Optional[int] = ..., requests_active: _Optional[int] = ..., requests_queued: _Optional[int] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "tokens", "last_used_unix_ms", "in_kv_cache", "saved_kv_bytes", "imported")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    IN_KV_CACHE_FIELD_NUMBER: _ClassVar[int]
    SAVED_KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    IMPORTED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tokens: int
    last_used_unix_ms: int
    in_kv_cache: bool
    saved_kv_bytes: int
    imported: str
    def __init__(self, session_id: _Optional[str] = ..., tokens: _Optional[int] = ..., last_used_unix_ms: _Optional[int] = ..., in_kv_cache: _Optional[bool] = ..., saved_kv_bytes: _Optional[int] = ..., imported: _Optional[str] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_sessions", "context_per_session", "max_prompt_tokens", "max_tokens_per_request", "max_message_bytes", "max_image_bytes")
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_PER_SESSION_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_IMAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_sessions: int
    context_per_session: int
    max_prompt_tokens: int
    max_tokens_per_request: int
    max_message_bytes: int
    max_image_bytes: int
    def __init__(self, max_sessions: _Optional[int] = ..., context_per_session: _Optional[int] = ..., max_prompt_tokens: _Optional[int] = ..., max_tokens_per_request: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., max_image_bytes: _Optional[int] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("version", "phase", "model", "budget", "schedule", "memory", "throughput", "sessions", "limits", "uptime_s", "listen_addresses", "vision", "prefix_cache", "profile", "frame_guard", "saves", "memories", "requests")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    LISTEN_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    VISION_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    FRAME_GUARD_FIELD_NUMBER: _ClassVar[int]
    SAVES_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    version: str
    phase: EnginePhase
    model: ModelInfo
    budget: Budget
    schedule: Schedule
    memory: MemoryUse
    throughput: Throughput
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    limits: Limits
    uptime_s: float
    listen_addresses: _containers.RepeatedScalarFieldContainer[str]
    vision: VisionStatus
    prefix_cache: PrefixCacheStatus
    profile: ProfileProgress
    frame_guard: FrameGuardState
    saves: SaveActivity
    memories: MemoryStatus
    requests: _containers.RepeatedCompositeFieldContainer[RequestInfo]
    def __init__(self, version: _Optional[str] = ..., phase: _Optional[_Union[EnginePhase, str]] = ..., model: _Optional[_Union[ModelInfo, _Mapping]] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., schedule: _Optional[_Union[Schedule, _Mapping]] = ..., memory: _Optional[_Union[MemoryUse, _Mapping]] = ..., throughput: _Optional[_Union[Throughput, _Mapping]] = ..., sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., uptime_s: _Optional[float] = ..., listen_addresses: _Optional[_Iterable[str]] = ..., vision: _Optional[_Union[VisionStatus, _Mapping]] = ..., prefix_cache: _Optional[_Union[PrefixCacheStatus, _Mapping]] = ..., profile: _Optional[_Union[ProfileProgress, _Mapping]] = ..., frame_guard: _Optional[_Union[FrameGuardState, _Mapping]] = ..., saves: _Optional[_Union[SaveActivity, _Mapping]] = ..., memories: _Optional[_Union[MemoryStatus, _Mapping]] = ..., requests: _Optional[_Iterable[_Union[RequestInfo, _Mapping]]] = ...) -> None: ...

class RequestInfo(_message.Message):
    __slots__ = ("request_id", "session_id", "state", "prompt_tokens", "prompt_tokens_done", "tokens_generated", "age_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_DONE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    session_id: str
    state: RequestState
    prompt_tokens: int
    prompt_tokens_done: int
    tokens_generated: int
    age_ms: float
    def __init__(self, request_id: _Optional[str] = ..., session_id: _Optional[str] = ..., state: _Optional[_Union[RequestState, str]] = ..., prompt_tokens: _Optional[int] = ..., prompt_tokens_done: _Optional[int] = ..., tokens_generated: _Optional[int] = ..., age_ms: _Optional[float] = ...) -> None: ...

class Memory(_message.Message):
    __slots__ = ("id", "scope", "text", "tags", "created_unix_ms", "source", "session_id", "turn", "uses")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    USES_FIELD_NUMBER: _ClassVar[int]
    id: int
    scope: str
    text: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    created_unix_ms: int
    source: str
    session_id: str
    turn: int
    uses: int
    def __init__(self, id: _Optional[int] = ..., scope: _Optional[str] = ..., text: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., created_unix_ms: _Optional[int] = ..., source: _Optional[str] = ..., session_id: _Optional[str] = ..., turn: _Optional[int] = ..., uses: _Optional[int] = ...) -> None: ...

class RememberRequest(_message.Message):
    __slots__ = ("scope", "session_id", "texts", "tags")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    scope: str
    session_id: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, scope: _Optional[str] = ..., session_id: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class RememberResponse(_message.Message):
    __slots__ = ("memories",)
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[Memory]
    def __init__(self, memories: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ...) -> None: ...

class RecallRequest(_message.Message):
    __slots__ = ("scopes", "query", "k", "tags")
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    scopes: _containers.RepeatedScalarFieldContainer[str]
    query: str
    k: int
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, scopes: _Optional[_Iterable[str]] = ..., query: _Optional[str] = ..., k: _Optional[int] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class RecalledMemory(_message.Message):
    __slots__ = ("memory", "score")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    score: float
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ..., score: _Optional[float] = ...) -> None: ...

class RecallResponse(_message.Message):
    __slots__ = ("memories",)
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[RecalledMemory]
    def __init__(self, memories: _Optional[_Iterable[_Union[RecalledMemory, _Mapping]]] = ...) -> None: ...

class ForgetRequest(_message.Message):
    __slots__ = ("ids", "tags", "scope")
    IDS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    tags: _containers.RepeatedScalarFieldContainer[str]
    scope: str
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., tags: _Optional[_Iterable[str]] = ..., scope: _Optional[str] = ...) -> None: ...

class ForgetResponse(_message.Message):
    __slots__ = ("forgotten",)
    FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    forgotten: int
    def __init__(self, forgotten: _Optional[int] = ...) -> None: ...

class ListMemoriesRequest(_message.Message):
    __slots__ = ("scope", "tags", "offset", "limit")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    scope: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    offset: int
    limit: int
    def __init__(self, scope: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListMemoriesResponse(_message.Message):
    __slots__ = ("memories", "total")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[Memory]
    total: int
    def __init__(self, memories: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class MemoryStatus(_message.Message):
    __slots__ = ("enabled", "embedder", "memories", "scopes", "bytes", "model_bytes", "recalls", "recalls_late", "evicted")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    EMBEDDER_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    MODEL_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECALLS_FIELD_NUMBER: _ClassVar[int]
    RECALLS_LATE_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    embedder: str
    memories: int
    scopes: int
    bytes: int
    model_bytes: int
    recalls: int
    recalls_late: int
    evicted: int
    def __init__(self, enabled: _Optional[bool] = ..., embedder: _Optional[str] = ..., memories: _Optional[int] = ..., scopes: _Optional[int] = ..., bytes: _Optional[int] = ..., model_bytes: _Optional[int] = ..., recalls: _Optional[int] = ..., recalls_late: _Optional[int] = ..., evicted: _Optional[int] = ...) -> None: ...

class PrefixCacheStatus(_message.Message):
    __slots__ = ("max_bytes", "bytes_held", "entries", "hits", "tokens_saved", "misses", "waits")
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_HELD_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_SAVED_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    WAITS_FIELD_NUMBER: _ClassVar[int]
    max_bytes: int
    bytes_held: int
    entries: int
    hits: int
    tokens_saved: int
    misses: int
    waits: int
    def __init__(self, max_bytes: _Optional[int] = ..., bytes_held: _Optional[int] = ..., entries: _Optional[int] = ..., hits: _Optional[int] = ..., tokens_saved: _Optional[int] = ..., misses: _Optional[int] = ..., waits: _Optional[int] = ...) -> None: ...

class VisionStatus(_message.Message):
    __slots__ = ("available", "projector_path", "placement", "vlmopt", "flash_attention", "image_max_tokens", "images_encoded", "last_encode_ms", "last_load_ms", "compute_buffer_bytes", "loaded")
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    PROJECTOR_PATH_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    VLMOPT_FIELD_NUMBER: _ClassVar[int]
    FLASH_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    IMAGE_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IMAGES_ENCODED_FIELD_NUMBER: _ClassVar[int]
    LAST_ENCODE_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_LOAD_MS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_BUFFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    available: bool
    projector_path: str
    placement: str
    vlmopt: bool
    flash_attention: bool
    image_max_tokens: int
    images_encoded: int
    last_encode_ms: float
    last_load_ms: float
    compute_buffer_bytes: int
    loaded: bool
    def __init__(self, available: _Optional[bool] = ..., projector_path: _Optional[str] = ..., placement: _Optional[str] = ..., vlmopt: _Optional[bool] = ..., flash_attention: _Optional[bool] = ..., image_max_tokens: _Optional[int] = ..., images_encoded: _Optional[int] = ..., last_encode_ms: _Optional[float] = ..., last_load_ms: _Optional[float] = ..., compute_buffer_bytes: _Optional[int] = ..., loaded: _Optional[bool] = ...) -> None: ...

class EndSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class EndSessionResponse(_message.Message):
    __slots__ = ("tokens_freed",)
    TOKENS_FREED_FIELD_NUMBER: _ClassVar[int]
    tokens_freed: int
    def __init__(self, tokens_freed: _Optional[int] = ...) -> None: ...

class ExportSessionsRequest(_message.Message):
    __slots__ = ("session_ids", "include_kv", "chunk_bytes")
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_KV_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    include_kv: bool
    chunk_bytes: int
    def __init__(self, session_ids: _Optional[_Iterable[str]] = ..., include_kv: _Optional[bool] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class SavedSessionInfo(_message.Message):
    __slots__ = ("session_id", "tokens", "kv_bytes", "restored", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tokens: int
    kv_bytes: int
    restored: str
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., tokens: _Optional[int] = ..., kv_bytes: _Optional[int] = ..., restored: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ExportSessionsChunk(_message.Message):
    __slots__ = ("data", "sessions", "archive_bytes", "last")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    sessions: _containers.RepeatedCompositeFieldContainer[SavedSessionInfo]
    archive_bytes: int
    last: bool
    def __init__(self, data: _Optional[bytes] = ..., sessions: _Optional[_Iterable[_Union[SavedSessionInfo, _Mapping]]] = ..., archive_bytes: _Optional[int] = ..., last: _Optional[bool] = ...) -> None: ...

class ImportSessionsRequest(_message.Message):
    __slots__ = ("archive", "replace", "upload_id", "more")
    ARCHIVE_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    archive: bytes
    replace: bool
    upload_id: str
    more: bool
    def __init__(self, archive: _Optional[bytes] = ..., replace: _Optional[bool] = ..., upload_id: _Optional[str] = ..., more: _Optional[bool] = ...) -> None: ...

class ImportSessionsResponse(_message.Message):
    __slots__ = ("sessions", "received_bytes")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SavedSessionInfo]
    received_bytes: int
    def __init__(self, sessions: _Optional[_Iterable[_Union[SavedSessionInfo, _Mapping]]] = ..., received_bytes: _Optional[int] = ...) -> None: ...

class SaveActivity(_message.Message):
    __slots__ = ("exports", "imports", "last_export_bytes", "last_export_sessions", "last_import_bytes", "last_import_sessions", "last_import_kv", "last_import_text")
    EXPORTS_FIELD_NUMBER: _ClassVar[int]
    IMPORTS_FIELD_NUMBER: _ClassVar[int]
    LAST_EXPORT_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_EXPORT_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_IMPORT_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_IMPORT_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_IMPORT_KV_FIELD_NUMBER: _ClassVar[int]
    LAST_IMPORT_TEXT_FIELD_NUMBER: _ClassVar[int]
    exports: int
    imports: int
    last_export_bytes: int
    last_export_sessions: int
    last_import_bytes: int
    last_import_sessions: int
    last_import_kv: int
    last_import_text: int
    def __init__(self, exports: _Optional[int] = ..., imports: _Optional[int] = ..., last_export_bytes: _Optional[int] = ..., last_export_sessions: _Optional[int] = ..., last_import_bytes: _Optional[int] = ..., last_import_sessions: _Optional[int] = ..., last_import_kv: _Optional[int] = ..., last_import_text: _Optional[int] = ...) -> None: ...

class FrameReport(_message.Message):
    __slots__ = ("frames", "window_ms", "frame_ms_p50", "frame_ms_p99", "frame_ms_max", "frames_over_budget", "frame_budget_ms", "gpu_frame_ms_p99")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    FRAME_MS_P50_FIELD_NUMBER: _ClassVar[int]
    FRAME_MS_P99_FIELD_NUMBER: _ClassVar[int]
    FRAME_MS_MAX_FIELD_NUMBER: _ClassVar[int]
    FRAMES_OVER_BUDGET_FIELD_NUMBER: _ClassVar[int]
    FRAME_BUDGET_MS_FIELD_NUMBER: _ClassVar[int]
    GPU_FRAME_MS_P99_FIELD_NUMBER: _ClassVar[int]
    frames: int
    window_ms: float
    frame_ms_p50: float
    frame_ms_p99: float
    frame_ms_max: float
    frames_over_budget: int
    frame_budget_ms: float
    gpu_frame_ms_p99: float
    def __init__(self, frames: _Optional[int] = ..., window_ms: _Optional[float] = ..., frame_ms_p50: _Optional[float] = ..., frame_ms_p99: _Optional[float] = ..., frame_ms_max: _Optional[float] = ..., frames_over_budget: _Optional[int] = ..., frame_budget_ms: _Optional[float] = ..., gpu_frame_ms_p99: _Optional[float] = ...) -> None: ...

class FrameGuardState(_message.Message):
    __slots__ = ("enabled", "source", "frame_budget_ms", "max_threads", "max_pass_tokens", "pause_ms", "low_priority", "reason", "game_frame_ms_p99", "game_over_budget_share", "game_busy_cores", "game_busy_threads", "changes", "reports", "idle_class")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FRAME_BUDGET_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_THREADS_FIELD_NUMBER: _ClassVar[int]
    MAX_PASS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PAUSE_MS_FIELD_NUMBER: _ClassVar[int]
    LOW_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GAME_FRAME_MS_P99_FIELD_NUMBER: _ClassVar[int]
    GAME_OVER_BUDGET_SHARE_FIELD_NUMBER: _ClassVar[int]
    GAME_BUSY_CORES_FIELD_NUMBER: _ClassVar[int]
    GAME_BUSY_THREADS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    IDLE_CLASS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    source: str
    frame_budget_ms: float
    max_threads: int
    max_pass_tokens: int
    pause_ms: float
    low_priority: bool
    reason: str
    game_frame_ms_p99: float
    game_over_budget_share: float
    game_busy_cores: float
    game_busy_threads: int
    changes: int
    reports: int
    idle_class: bool
    def __init__(self, enabled: _Optional[bool] = ..., source: _Optional[str] = ..., frame_budget_ms: _Optional[float] = ..., max_threads: _Optional[int] = ..., max_pass_tokens: _Optional[int] = ..., pause_ms: _Optional[float] = ..., low_priority: _Optional[bool] = ..., reason: _Optional[str] = ..., game_frame_ms_p99: _Optional[float] = ..., game_over_budget_share: _Optional[float] = ..., game_busy_cores: _Optional[float] = ..., game_busy_threads: _Optional[int] = ..., changes: _Optional[int] = ..., reports: _Optional[int] = ..., idle_class: _Optional[bool] = ...) -> None: ...
