"""The daemon's settings: one object, resolved once at start-up from flags and environment.

Precedence: command-line flags, then XLM_SIDECAR_* environment variables (e.g.
XLM_SIDECAR_BUDGET=3G, set by a launching game), then these defaults.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import psutil
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sidecar.budget import Budget, parse_size
from sidecar.errors import InvalidArgument

if TYPE_CHECKING:
    from sidecar.local.crowd import MemoryReserve

DEFAULT_PORT = 50551
DEFAULT_HOST = "127.0.0.1"
# A web origin as browsers send it: scheme://host[:port], nothing after (http://localhost:8080,
# tauri://localhost, http://[::1]:3000).
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(:[0-9]{1,5})?")


class Settings(BaseSettings):
    """Everything `xlm-sidecar serve` can be told. Field names match the long flags."""

    model_config = SettingsConfigDict(env_prefix="XLM_SIDECAR_", extra="forbid", frozen=True)

    model: Path | None = Field(None, description="GGUF model to serve; default: the bundled SmolLM2-135M-Instruct")
    mmproj: Path | None = Field(None, description="vision projector (mmproj GGUF) paired with the model; enables AskImage")
    vlmopt: bool = Field(True, description="load the vision encoder only while an image is encoded (VLMOpt); off keeps it resident")
    budget: str = Field("0", description="VRAM the game grants, e.g. 512M, 3G, 2.5GiB; 0 = CPU only")
    ram_budget: str | None = Field(None, description="host memory the daemon may hold, e.g. 512M, 2G; unset = no cap")
    max_cpu_threads: int = Field(0, ge=0, le=4096, description="most CPU threads per forward pass; 0 = no cap")
    host: str = DEFAULT_HOST
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    ctx: int = Field(4096, ge=64, le=1 << 20, description="context tokens per conversation")
    parallel: int = Field(
        0, ge=0, le=256, description="conversations decoded together in one batch; 0 = as many as memory affords, 4 to 16"
    )
    batch: int = Field(512, ge=1, le=1 << 16, description="most prompt tokens per forward pass")
    threads: int = Field(0, ge=0, le=4096, description="CPU threads; 0 = one per physical core")
    flash_attention: Literal["auto", "on", "off"] = "auto"
    profile: str = Field("auto", description='machine profile for the planner: "auto" (measure once), "off", or a file')
    frame_guard: bool = Field(True, description="keep out of the game's way by its frame times and its process's load (sidecar.guard)")
    frame_guard_priority: Literal["auto", "idle", "low"] = Field(
        "auto", description="how far below the game the guard puts the daemon's threads: auto (nice 19, the idle "
        "scheduling class once the game fills every core or its frames run late), idle (always the idle class) or low (nice 19 only)")
    frame_budget_ms: float = Field(1000.0 / 60, ge=1.0, le=1000.0, description="the game's frame budget when its reports do not say (ms)")
    jump_forward: bool = Field(True, description="feed text a grammar forces (tool calls, JSON) in one pass, not one pass a token")
    memory: bool = Field(True, description="NPC memory: turns that leave a session's context are kept and recalled into later turns")
    embedding_model: str = Field("auto", description='what embeds memories: "auto" (all-MiniLM-L6-v2 from its package, else words), "words", or a GGUF file')
    adaptive_threads: bool = Field(True, description="step CPU threads down while passes run far slower than planned (a busy PC); off pins them")
    hardware: str | None = Field(None, description="plan for this machine description (as `plan --hardware` takes it) instead of the profile")
    # Placement device (sidecar.local.executor.placement_device) and ggml RPC servers (sidecar.native.ggml_rpc).
    device: str | None = Field(None, description="ggml device to place onto (CUDA0, Vulkan0, RPC0); default: the first GPU-type one")
    rpc: str | None = Field(None, description="ggml RPC servers to register as devices, host:port, comma-separated")
    max_sessions: int = Field(64, ge=1, le=100_000)
    prefix_cache_mb: int = Field(
        256, ge=0, le=1 << 20, description="host memory for shared prompt prefixes (MiB, least recently used out); 0 = off"
    )
    max_prompt_tokens: int = Field(0, ge=0, description="longest prompt in tokens; 0 = three quarters of --ctx")
    max_tokens_per_request: int = Field(2048, ge=1)
    max_message_bytes: int = Field(8 << 20, ge=1024, le=1 << 30)
    stream_interval_ms: float = Field(33.0, ge=0, le=1000, description="least time between two chunks of a stream")
    log_format: Literal["auto", "console", "json"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Transport and lifecycle (sidecar.service.transports, sidecar.lifecycle).
    socket: Path | None = Field(None, description="serve gRPC on this Unix socket (owner-only) instead of TCP")
    ws_port: int | None = Field(
        None, ge=-1, le=65535, description="WebSocket bridge port; default --port + 1 (0 with --port 0); 0 picks a free one; -1 disables it"
    )
    http_port: int | None = Field(
        None, ge=-1, le=65535, description="OpenAI-compatible HTTP API port; default --port + 2 (0 with --port 0); 0 picks a free one; -1 disables it"
    )
    allow_remote: bool = Field(False, description="accept calls from other machines (needs a token; refuses --no-auth)")
    no_auth: bool = Field(False, description="accept calls without a token (local development only)")
    strict_model_names: bool = Field(False, description="HTTP API: refuse (404) a model name other than the served model's")
    cors_origin: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="web origins whose pages may call the HTTP API (CORS), exact, e.g. http://localhost:8080; comma-separated")
    # Only from the environment (XLM_SIDECAR_TOKEN, set by the launching game): a flag would show in `ps`.
    token: SecretStr | None = Field(None, description="the token calls must carry; default: a random one per launch")
    # Environment only too (XLM_SIDECAR_GAME_TOKEN), and never written to the token file: the tools
    # that read that file are not the game (sidecar/guard/game_clients.py).
    game_token: SecretStr | None = Field(None, description="a second token, which marks the client that carries it as the game: "
                                         "its frame reports steer the frame guard from any process")
    token_file: Path | None = Field(None, description="where to write the token (owner-only); default: in the user's runtime folder")
    parent_pid: int | None = Field(None, ge=1, description="exit when this process (the game) ends")
    grace_seconds: float = Field(5.0, ge=0, le=3600, description="how long in-flight calls may finish after SIGTERM/SIGINT")
    max_image_bytes: int = Field(32 << 20, ge=1024, le=1 << 31, description="largest image accepted by AskImage")
    # Remote mode (sidecar.remote): forward generation to an OpenAI-compatible server.
    remote_url: str | None = Field(None, description="forward generation to this OpenAI-compatible API, e.g. http://host:8000/v1")
    remote_model: str | None = Field(None, description="model name to ask the remote server for; default: the first it lists")
    remote_api_key_env: str | None = Field(None, description="environment variable holding the remote server's API key")

    @field_validator("budget")
    @classmethod
    def _budget_is_a_size(cls, value: str) -> str:
        try:
            parse_size(value)
        except InvalidArgument as e:
            raise ValueError(str(e)) from None  # pydantic reports ValueErrors as field errors
        return value

    @field_validator("cors_origin", mode="before")
    @classmethod
    def _cors_origins_are_exact(cls, value: object) -> object:
        if isinstance(value, str):  # XLM_SIDECAR_CORS_ORIGIN, comma-separated
            value = [o.strip() for o in value.split(",") if o.strip()]
        for origin in value if isinstance(value, (list, tuple)) else ():
            # Either would let pages the player never chose drive the model (cors.py).
            if origin == "*":
                raise ValueError("'*' would let every web page call the daemon; name each origin, e.g. http://localhost:8080")
            if origin == "null":
                raise ValueError("'null' is the origin of every sandboxed frame and local file; name a real origin")
            if isinstance(origin, str) and not _ORIGIN.fullmatch(origin):
                raise ValueError(f"{origin!r} is not an origin: scheme://host[:port] in lower case, no path, "
                                 "e.g. http://localhost:8080")
        return value

    @field_validator("host")
    @classmethod
    def _hosts_are_named(cls, value: str) -> str:
        if any(not h.strip() for h in value.split(",")):
            raise ValueError(f"{value!r} has an empty address; give one, or several comma-separated: 127.0.0.1,::1")
        return value

    @field_validator("ram_budget")
    @classmethod
    def _ram_budget_is_a_size(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_size(value)
            except InvalidArgument as e:
                raise ValueError(str(e)) from None
        return value

    @field_validator("remote_url")
    @classmethod
    def _remote_url_is_http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("give the server's OpenAI API base, e.g. http://host:8000/v1")
        return value

    def sequences(self, budget_name: str = "--ram-budget") -> int:
        """The most conversations held in the KV cache at once: --parallel, or what memory affords
        (local/crowd.py), never more than --ram-budget holds (InvalidArgument when it holds none, naming
        the budget `budget_name`)."""
        from sidecar.local.crowd import parallel_for, ram_ceiling
        from sidecar.model_info.default_model import default_model_path

        model = self.model or default_model_path()
        n = parallel_for(self.parallel, model, self.ctx)
        if self.ram_budget_bytes:
            # --prefix-cache-mb as given: the rule takes the budget's share of it itself.
            n = min(n, ram_ceiling(self.ram_budget_bytes, model, self.ctx, self.prefix_cache_mb << 20, budget_name,
                                   self.vision_reserved_bytes, self.memory_reserve()))
        return n

    def memory_reserve(self) -> MemoryReserve:
        """What NPC memory sets aside of a RAM budget (memory/footprint.py): its embedding model
        when one conversation still fits beside it, and the store's share. Nothing without a
        budget, or with --no-memory."""
        from sidecar.local.crowd import NO_MEMORY, MemoryReserve, ram_ceiling
        from sidecar.model_info.default_model import default_model_path
        from sidecar.memory.footprint import embedder_host_bytes

        if not self.memory or not self.ram_budget_bytes:
            return NO_MEMORY
        with_model = MemoryReserve(embedder_host_bytes(self.embedding_model), store=True)
        try:
            ram_ceiling(self.ram_budget_bytes, self.model or default_model_path(), self.ctx, self.prefix_cache_mb << 20,
                        vision_bytes=self.vision_reserved_bytes, memory=with_model)
        except InvalidArgument:
            return MemoryReserve(0, store=True)  # memories found by words (memory_embedder)
        return with_model

    @property
    def memory_embedder(self) -> str:
        """What embeds memories: --embedding-model, or words where a RAM budget cannot also hold
        its model beside one conversation (memory_reserve)."""
        from sidecar.memory.footprint import embedder_host_bytes

        if self.memory and self.ram_budget_bytes and embedder_host_bytes(self.embedding_model) \
                and not self.memory_reserve().model_bytes:
            return "words"
        return self.embedding_model

    @property
    def memories_max(self) -> int:
        """The most memories in all: the store's share of a RAM budget holds, or the fixed bound."""
        from sidecar.memory.footprint import memories_within

        return memories_within(self.ram_budget_bytes)

    @property
    def vision_reserved_bytes(self) -> int:
        """What a RAM budget sets aside for the vision worker (local/crowd.py): 0 without a projector."""
        from sidecar.local.crowd import vision_host_bytes

        if self.mmproj is None:
            return 0
        try:
            size = Path(self.mmproj).stat().st_size
        except OSError:
            return 0  # loading it says what is wrong with it
        return vision_host_bytes(size, self.flash_attention != "off")

    def start_sequences(self) -> int:
        """Sequences allocated at start: all of --parallel when given, else a few, more on demand."""
        from sidecar.local.crowd import START_SEQUENCES

        return 0 if self.parallel else min(START_SEQUENCES, self.sequences())

    @property
    def ram_budget_bytes(self) -> int:
        return parse_size(self.ram_budget) if self.ram_budget else 0

    @property
    def saved_sessions_bytes(self) -> int:
        """Evicted sessions' KV states: a share of a RAM budget, no cap without one."""
        from sidecar.local.crowd import SAVED_SESSIONS_SHARE

        return int(self.ram_budget_bytes * SAVED_SESSIONS_SHARE)

    @property
    def prefix_cache_bytes(self) -> int:
        """--prefix-cache-mb, within its share of a RAM budget."""
        from sidecar.local.crowd import PREFIX_SHARE

        held = self.prefix_cache_mb << 20
        return min(held, int(self.ram_budget_bytes * PREFIX_SHARE)) if self.ram_budget_bytes else held

    @property
    def game_pid(self) -> int:
        """The game's process, which the frame guard watches and whose frame reports alone count:
        --parent-pid, else the process that started the daemon (a game that launches it)."""
        return self.parent_pid or os.getppid()

    @property
    def budget_value(self) -> Budget:
        return Budget(vram_bytes=parse_size(self.budget), max_cpu_threads=self.max_cpu_threads)

    @property
    def hosts(self) -> tuple[str, ...]:
        """--host as a list: one address, or several, comma-separated (127.0.0.1,::1), each
        listened on by every transport at the same ports. The first is the one addresses name."""
        return tuple(h.strip() for h in self.host.split(","))

    @property
    def address(self) -> str:
        return format_address(self.hosts[0], self.port)

    def cpu_threads(self) -> int:
        """Threads per forward pass: the flag, else one per physical core (hyper-threads slow
        llama.cpp's memory-bound decode down), never above the game's cap."""
        threads = self.threads or psutil.cpu_count(logical=False) or psutil.cpu_count() or 1
        if self.max_cpu_threads:
            threads = min(threads, self.max_cpu_threads)
        return max(threads, 1)

    @property
    def flash_attention_flag(self) -> bool | None:
        return {"auto": None, "on": True, "off": False}[self.flash_attention]


def format_address(host: str, port: int) -> str:
    """host:port as gRPC takes it (IPv6 hosts in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
