from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionArchive(_message.Message):
    __slots__ = ("format_version", "created_unix_ms", "daemon_version", "fingerprint", "sessions", "memories", "memory_embedder", "memory_options")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DAEMON_VERSION_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_EMBEDDER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    created_unix_ms: int
    daemon_version: str
    fingerprint: KvFingerprint
    sessions: _containers.RepeatedCompositeFieldContainer[SavedSession]
    memories: _containers.RepeatedCompositeFieldContainer[SavedMemory]
    memory_embedder: str
    memory_options: _containers.RepeatedCompositeFieldContainer[SavedMemoryOptions]
    def __init__(self, format_version: _Optional[int] = ..., created_unix_ms: _Optional[int] = ..., daemon_version: _Optional[str] = ..., fingerprint: _Optional[_Union[KvFingerprint, _Mapping]] = ..., sessions: _Optional[_Iterable[_Union[SavedSession, _Mapping]]] = ..., memories: _Optional[_Iterable[_Union[SavedMemory, _Mapping]]] = ..., memory_embedder: _Optional[str] = ..., memory_options: _Optional[_Iterable[_Union[SavedMemoryOptions, _Mapping]]] = ...) -> None: ...

class SavedMemory(_message.Message):
    __slots__ = ("scope", "text", "tags", "created_unix_ms", "source", "session_id", "turn", "uses", "last_used_unix_ms", "vector")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    USES_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    scope: str
    text: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    created_unix_ms: int
    source: str
    session_id: str
    turn: int
    uses: int
    last_used_unix_ms: int
    vector: bytes
    def __init__(self, scope: _Optional[str] = ..., text: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., created_unix_ms: _Optional[int] = ..., source: _Optional[str] = ..., session_id: _Optional[str] = ..., turn: _Optional[int] = ..., uses: _Optional[int] = ..., last_used_unix_ms: _Optional[int] = ..., vector: _Optional[bytes] = ...) -> None: ...

class SavedMemoryOptions(_message.Message):
    __slots__ = ("session_id", "scope", "read_scopes", "max_tokens", "k", "tags", "off")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    READ_SCOPES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    OFF_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    scope: str
    read_scopes: _containers.RepeatedScalarFieldContainer[str]
    max_tokens: int
    k: int
    tags: _containers.RepeatedScalarFieldContainer[str]
    off: bool
    def __init__(self, session_id: _Optional[str] = ..., scope: _Optional[str] = ..., read_scopes: _Optional[_Iterable[str]] = ..., max_tokens: _Optional[int] = ..., k: _Optional[int] = ..., tags: _Optional[_Iterable[str]] = ..., off: _Optional[bool] = ...) -> None: ...

class KvFingerprint(_message.Message):
    __slots__ = ("model_digest", "model_bytes", "model_name", "context_per_session", "kv_type_k", "kv_type_v", "prompt_layout_version", "llama_build", "layers")
    MODEL_DIGEST_FIELD_NUMBER: _ClassVar[int]
    MODEL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_PER_SESSION_FIELD_NUMBER: _ClassVar[int]
    KV_TYPE_K_FIELD_NUMBER: _ClassVar[int]
    KV_TYPE_V_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LAYOUT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LLAMA_BUILD_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    model_digest: bytes
    model_bytes: int
    model_name: str
    context_per_session: int
    kv_type_k: str
    kv_type_v: str
    prompt_layout_version: int
    llama_build: str
    layers: int
    def __init__(self, model_digest: _Optional[bytes] = ..., model_bytes: _Optional[int] = ..., model_name: _Optional[str] = ..., context_per_session: _Optional[int] = ..., kv_type_k: _Optional[str] = ..., kv_type_v: _Optional[str] = ..., prompt_layout_version: _Optional[int] = ..., llama_build: _Optional[str] = ..., layers: _Optional[int] = ...) -> None: ...

class SavedMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class SavedReply(_message.Message):
    __slots__ = ("text", "tokens")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    text: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, text: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class SavedSession(_message.Message):
    __slots__ = ("session_id", "messages", "text", "has_sent", "sent", "replies", "tokens", "last_used_unix_ms", "kv")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    HAS_SENT_FIELD_NUMBER: _ClassVar[int]
    SENT_FIELD_NUMBER: _ClassVar[int]
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    messages: _containers.RepeatedCompositeFieldContainer[SavedMessage]
    text: str
    has_sent: bool
    sent: _containers.RepeatedCompositeFieldContainer[SavedMessage]
    replies: _containers.RepeatedCompositeFieldContainer[SavedReply]
    tokens: int
    last_used_unix_ms: int
    kv: SavedKv
    def __init__(self, session_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[SavedMessage, _Mapping]]] = ..., text: _Optional[str] = ..., has_sent: _Optional[bool] = ..., sent: _Optional[_Iterable[_Union[SavedMessage, _Mapping]]] = ..., replies: _Optional[_Iterable[_Union[SavedReply, _Mapping]]] = ..., tokens: _Optional[int] = ..., last_used_unix_ms: _Optional[int] = ..., kv: _Optional[_Union[SavedKv, _Mapping]] = ...) -> None: ...

class SavedKv(_message.Message):
    __slots__ = ("tokens", "state")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    state: bytes
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., state: _Optional[bytes] = ...) -> None: ...
