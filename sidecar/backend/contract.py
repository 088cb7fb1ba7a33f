"""What the service core asks of whatever generates: the local llama.cpp engine
(sidecar.engine.Engine) or the remote backend (sidecar.remote.RemoteBackend).

The core and every transport see only Backend: a backend takes a validated request and streams its
events to a sink, ends a session and reports its state. How it keeps sessions (the engine's KV
cache, the remote backend's forwarded history) is its own business, and so are the decisions about
them: a transport never reads a live session (see resent_turns.py).

What only a model loaded in this process allows (a schedule to reload, the frame guard's limits on
its passes, calls on the model itself, save games) is LocalModel, a capability the service asks for
by name (local_model) where it needs it, so a backend that runs its model elsewhere has nothing to
pretend.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, runtime_checkable

from sidecar.backend.engine_config import EngineConfig
from sidecar.backend.load_report import LoadReport
from sidecar.backend.phase import EnginePhase
from sidecar.backend.request_state import RequestView
from sidecar.backend.requests import GenerationSpec, Job, Sink
from sidecar.backend.sessions import SessionView
from sidecar.backend.stats import ThroughputSnapshot
from sidecar.guard.frame_guard import PassLimits

if TYPE_CHECKING:  # annotations only: the status view's types would load llama.cpp
    from sidecar.api.xlm.v1.session_archive_pb2 import KvFingerprint, SessionArchive
    from sidecar.engine.prefix.prefix_cache import PrefixCacheStats
    from sidecar.vision.encoder import EncoderStats


@dataclass(frozen=True)
class ModelFacts:
    """What the status RPC reports about the model being served."""

    path: str
    name: str
    architecture: str
    parameters: int
    file_bytes: int
    trained_context: int
    layers: int
    experts: int
    chat_template: str


@dataclass(frozen=True)
class RequestLimits:
    """What the service core checks a request against before the backend sees it."""

    # Longest prompt in tokens; None where the serving side decides (a remote server's context).
    max_prompt_tokens: int | None
    max_tokens_per_request: int
    # A vision model is loaded: image turns are taken.
    vision: bool
    # JSON schemas are compiled to a llama.cpp grammar here. A remote server compiles its own, so
    # remote mode checks a schema's size but never loads llama.cpp's grammar code.
    compiles_grammar: bool
    # The model's vocabulary size (logit_bias token ids are checked against it); None: unknown here.
    vocabulary: int | None = None
    # KV cells one conversation may fill (what /props reports as n_ctx); None: the server's.
    context_per_sequence: int | None = None
    # The model is loaded here (the backend is a LocalModel): token log probabilities work and
    # caller-written GBNF grammars are taken. Checked with the request, before any backend sees it.
    model_calls: bool = False


@dataclass(frozen=True)
class ServedLimits:
    """The limits the status RPC reports (pb.Limits); 0 for what this daemon does not decide."""

    max_sessions: int
    context_per_session: int  # remote mode: the context the server said it serves, else 0
    max_prompt_tokens: int
    max_tokens_per_request: int


@dataclass(frozen=True)
class BackendSnapshot:
    """A consistent-enough view of a backend for the status RPC."""

    phase: EnginePhase
    model: ModelFacts
    limits: ServedLimits
    # The schedule in force; None where no model is loaded here (remote mode has none to report).
    config: EngineConfig | None
    throughput: ThroughputSnapshot
    sessions: list[SessionView]
    requests_active: int
    requests_queued: int
    kv_tokens: int
    kv_cache_bytes: int
    last_reload_pause_ms: float
    load_report: LoadReport
    vision: EncoderStats | None = None
    prefix_cache: PrefixCacheStats | None = None
    # Held against used (kv_cache_bytes): the KV the allocated sequences hold, how many there are
    # and may be (engine/kv_demand.py), and the evicted sessions' states in host memory.
    kv_held_bytes: int = 0
    kv_sequences: int = 0
    kv_sequences_max: int = 0
    saved_sessions_bytes: int = 0
    vision_worker_bytes: int = 0  # the CPU encoder's process, resident now
    requests: tuple[RequestView, ...] = ()  # each request the engine holds (request_state.py)
    # (free, total) bytes of each device the model has buffers on, the host's aside, as ggml
    # reports them: read by the backend, which may load llama.cpp, not by the service.
    device_memory: Mapping[str, tuple[int, int]] = field(default_factory=dict)


class ModelOps(Protocol):
    """What call_model's function may do with the model."""

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str: ...

    def pieces(self, tokens: list[int]) -> list[bytes]: ...

    def embed(self, texts: list[str | list[int]]) -> object:
        """One unit vector per input (text, or token ids), and the tokens the inputs took, as
        call_model's result; the work may run in slices between passes (a generator's)."""
        ...


@runtime_checkable
class Backend(Protocol):
    """The contract. `submit` is called on the daemon's event loop and must not block it; the
    sink it is given never blocks either (StreamCollector). Its state, phase included (what
    health and status report), is `snapshot()`."""

    facts: ModelFacts

    @property
    def limits(self) -> RequestLimits: ...

    def submit(self, spec: GenerationSpec, sink: Sink) -> Job:
        """Queue a request; its events go to `sink`, the last one Finished or an error. Cancel it
        with the returned job's `cancel()`. Raises a SidecarError when it cannot be queued."""
        ...

    def end_session(self, session_id: str) -> int:
        """Forget a session; the tokens it held. NotFound if unknown."""
        ...

    def snapshot(self) -> BackendSnapshot: ...


@runtime_checkable
class LocalModel(Backend, Protocol):
    """A backend whose model is loaded in this process (the engine): what SetBudget, the frame
    guard, Tokenize/Detokenize/Embed and save games need besides the contract."""

    # The schedule in force, as status and SetBudget report it.
    config: EngineConfig

    def reload(self, config: EngineConfig, *, force: bool = False) -> Future:
        """Switch to another schedule between forward passes, keeping every conversation; the
        future holds (reloaded, pause_ms)."""
        ...

    def set_pass_limits(self, limits: PassLimits) -> None:
        """The frame guard's limits on each forward pass (threads, tokens, a pause after it), from
        the event loop; in force from the next pass."""
        ...

    def call_model(self, run: Callable[[ModelOps], object]) -> Future:
        """Run `run` on the loaded model where that is safe (between passes); the future holds its
        result, and cancelling it stops a call already running before its next slice."""
        ...

    def export_sessions(self, session_ids: list[str], include_kv: bool) -> Future:
        """Save games: the sessions' archive, unsealed, and what was saved of each."""
        ...

    def import_sessions(self, archive: SessionArchive, ours: KvFingerprint, replace: bool) -> Future:
        """Save games: add a checked archive's sessions; what was restored of each."""
        ...

    def save_fingerprint(self, layers: int = 0) -> KvFingerprint:
        """What an archive's KV must match to be restored here (save_fingerprint.py)."""
        ...


def local_model(backend: Backend) -> LocalModel | None:
    """The backend's model as loaded in this process; None where it runs elsewhere (remote mode)."""
    return backend if isinstance(backend, LocalModel) else None
