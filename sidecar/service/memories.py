"""NPC memory for every transport: turns that leave the context are kept, and recalled into the
prompt at each turn; Remember, Recall, Forget and ListMemories for the game.

Embedding and searching run on one memory thread (embedder.py), never on the event loop or the
engine thread. A turn waits for its memories at most RECALL_WAIT_S: past that it goes on without
them (counted in status as recalls_late) rather than hold the player's first token. 150 ms is
about fifteen queued embeddings on 2 cores (a crowd whose turns all start at once), while one
turn's own recall takes 5-15 ms (bench/run.py memory prints it); a reply's first token is some
hundreds of milliseconds anyway, so a late memory costs less than a stalled NPC.

The embedding model loads at first use (_loaded), not at start: a game that never uses memory
keeps its RAM and start-up (the RAM-budget tests measured 43 MB of it in the process).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from sidecar.api import pb
from sidecar.backend.requests import Finished, GenerationSpec
from sidecar.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, SidecarError
from sidecar.memory import recall
from sidecar.memory.checks import MAX_SCOPE_CHARS, check_name, check_scopes, check_tags, check_text
from sidecar.memory.embedder import Embedder, open_embedder
from sidecar.memory.store import Memory, MemoryStore
from sidecar.service import memory_saves

log = structlog.get_logger("memory")

RECALL_WAIT_S = 0.15
DEFAULT_K = 4
MAX_K_TURN = 32
MAX_K_SEARCH = 100
MAX_TEXTS = 64
MAX_LIST = 1000
# The recalled block's default share of the context.
BUDGET_SHARE = 8
# How long a memory call (and a turn's dropped turns) waits for the embedding model to load at
# start (about a second the first time, when it is converted; 0.1 s later).
LOAD_WAIT_S = 30.0
# Remember calls waiting for the memory thread at once; past that RESOURCE_EXHAUSTED (a flood of
# calls must not queue minutes of embedding in front of the NPCs' recalls).
MAX_PENDING_WRITES = 8


@dataclass(frozen=True)
class MemorySettings:
    enabled: bool = True
    embedder: str = "auto"  # embedder.open_embedder's choice
    cache_dir: Path = Path(".")
    # 10,000 in a scope: an evening's turns of every player an NPC meets, and the largest scope
    # the benchmark measures; 20,000 in all is about 40 MB with all-MiniLM-L6-v2's 384 floats.
    max_per_scope: int = 10_000
    max_total: int = 20_000


@dataclass(frozen=True)
class SessionMemory:
    """What a session remembers with (GenerateRequest.memory, held for its later turns)."""

    scope: str
    reads: tuple[str, ...]
    max_tokens: int = 0
    k: int = DEFAULT_K
    tags: tuple[str, ...] = ()
    off: bool = False


def memory_pb(m: Memory) -> pb.Memory:
    return pb.Memory(id=m.id, scope=m.scope, text=m.text, tags=list(m.tags), created_unix_ms=int(m.created * 1000),
                     source=m.source, session_id=m.session_id, turn=m.turn, uses=m.uses)


def _query(spec: GenerationSpec) -> str:
    """What a turn recalls by: its last user message (or its raw text)."""
    p = spec.prompt
    if not p.is_chat:
        return (p.text or "")[-2000:]
    messages = p.messages or ()
    users = [content for role, content in messages if role == "user"]
    return (users[-1] if users else messages[-1][1])[-2000:]


class Memories:
    """One per daemon, beside the service core (core.memories)."""

    def __init__(self, settings: MemorySettings) -> None:
        self.settings = settings
        self.embedder: Embedder | None = None
        self.store: MemoryStore | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="memory")
        self._sessions: dict[str, SessionMemory] = {}
        self._pending_writes = 0
        self._loading: asyncio.Future | None = None  # the embedder's load, once first asked for
        self.load_error = ""
        self.recalls = 0
        self.recalls_late = 0

    async def _loaded(self) -> bool:
        """Whether the embedder and store are there, loading them on first use: a game that never
        uses memory pays nothing for it (its 44 MB model, a second of start-up). Waits at most
        LOAD_WAIT_S; a load that failed stays failed (load_error says why)."""
        if not self.settings.enabled:
            return False
        if self.store is None and self._loading is None:
            self._loading = asyncio.ensure_future(self._load())
        if self._loading is not None and not self._loading.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._loading), LOAD_WAIT_S)
            except asyncio.TimeoutError:
                pass
        return self.store is not None

    async def _load(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            embedder = await loop.run_in_executor(self._thread, open_embedder, self.settings.embedder, self.settings.cache_dir)
        except SidecarError as e:  # a bad --embedding-model: the daemon serves on, without memory
            self.load_error = str(e)
            log.error("memory is off: its embedding model did not load", error=self.load_error)
            return
        self.store = MemoryStore(embedder.dims, self.settings.max_per_scope, self.settings.max_total)
        self.embedder = embedder
        log.info("memory ready", embedder=embedder.name, dims=embedder.dims)

    def set_max_total(self, max_total: int) -> None:
        """A RAM budget set at runtime bounds the memories as one given at launch would
        (footprint.memories_within); past it the least used leave now."""
        self.settings = replace(self.settings, max_total=max_total,
                                max_per_scope=min(self.settings.max_per_scope, max_total))
        if self.store is not None:
            gone = self.store.set_max_total(max_total)
            if gone:
                log.info("memories let go under a lowered RAM budget", evicted=gone, max_total=max_total)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def _ready(self) -> MemoryStore:
        if not self.settings.enabled:
            raise FailedPrecondition("memory is off (--no-memory)")
        if not await self._loaded() or self.store is None:
            raise FailedPrecondition(self.load_error or "memory is still loading its embedding model; try again in a moment")
        return self.store

    def _embed(self, texts: list[str]):
        """On the memory thread only (embedder.py)."""
        assert self.embedder is not None  # set together with the store, before any call reaches here
        return self.embedder.embed(texts)

    async def _on_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    # -- turns ---------------------------------------------------------------------------------

    def session_memory(self, request: pb.GenerateRequest, spec: GenerationSpec) -> SessionMemory | None:
        """The memory options of the request's session (given now, or held from an earlier turn)."""
        if not spec.session_id or not self.settings.enabled:
            return None
        if request.HasField("memory"):
            o = request.memory
            scope = check_name(o.scope, "memory.scope", MAX_SCOPE_CHARS) if o.scope else spec.session_id
            if o.k > MAX_K_TURN:
                raise InvalidArgument(f"memory.k is {o.k}; at most {MAX_K_TURN}")
            chosen = SessionMemory(scope, check_scopes(o.read_scopes) or (scope,), o.max_tokens, o.k or DEFAULT_K,
                                   check_tags(o.tags), o.off)
            self._sessions[spec.session_id] = chosen
            return chosen
        return self.held_options(spec.session_id)

    def held_options(self, session_id: str) -> SessionMemory:
        """A session's memory options: the last it was given, else its own scope alone."""
        return self._sessions.get(session_id) or SessionMemory(session_id, (session_id,))

    @property
    def given_options(self) -> dict[str, SessionMemory]:
        return self._sessions

    def hold_options(self, session_id: str, scope: str, reads: tuple[str, ...], max_tokens: int, k: int,
                     tags: tuple[str, ...], off: bool) -> None:
        """Options restored from a save (checked as a request's are)."""
        scope = check_name(scope or session_id, "memory.scope", MAX_SCOPE_CHARS)
        self._sessions[session_id] = SessionMemory(scope, check_scopes(reads) or (scope,), max_tokens,
                                                   min(k, MAX_K_TURN) or DEFAULT_K, check_tags(tags), off)

    async def add_to_archive(self, archive, everything: bool) -> None:
        await asyncio.to_thread(memory_saves.add_to_archive, self, archive, everything)

    async def restore(self, archive, replace: bool) -> int:
        """The archive's memories and options (after its sessions were taken)."""
        for o in archive.memory_options:
            self.hold_options(o.session_id, o.scope, tuple(o.read_scopes), o.max_tokens, o.k, tuple(o.tags), o.off)
        if not archive.memories or not await self._loaded():
            return 0
        return await self._on_thread(memory_saves.restore_from_archive, self, archive, replace)

    async def for_turn(self, options: SessionMemory | None, spec: GenerationSpec,
                       context_tokens: int | None) -> tuple[GenerationSpec, list[Memory]]:
        """`spec` with its recalled memories in the prompt, and those memories."""
        if options is None or options.off or self.store is None or not spec.prompt.is_chat:
            return spec, []
        store = self.store
        if not any(scope in store.scope_names() for scope in options.reads):
            return spec, []
        budget = options.max_tokens or (context_tokens or 4096) // BUDGET_SHARE
        self.recalls += 1
        started = time.perf_counter()
        try:
            found = await asyncio.wait_for(self._on_thread(self._search, options, _query(spec)), RECALL_WAIT_S)
        except asyncio.TimeoutError:
            self.recalls_late += 1
            log.info("memories late; the turn goes without them", session_id=spec.session_id)
            return spec, []
        picked = recall.choose([(m, s, m.text) for m, s in found], budget)
        chosen = [found[i][0] for i, _ in picked]
        log.debug("recalled", session_id=spec.session_id, ms=round((time.perf_counter() - started) * 1000, 1),
                  found=len(found), told=len(chosen))
        if not chosen:
            return spec, []
        store.mark_used(chosen)
        prompt = replace(spec.prompt, memories=tuple(text for _, text in picked))
        return replace(spec, prompt=prompt), chosen

    def _search(self, options: SessionMemory, query: str) -> list[tuple[Memory, float]]:
        vector = self._embed([query])[0]
        assert self.store is not None
        return self.store.search(list(options.reads), vector, options.k, tags=options.tags)

    async def keep_dropped(self, options: SessionMemory | None, finished: Finished) -> list[Memory]:
        """The turns `finished` dropped from its session, stored as memories of its scope."""
        if options is None or options.off or not finished.dropped_messages:
            return []
        if not await self._loaded() or self.store is None:
            return []
        turns = recall.turn_memories(finished.dropped_messages, finished.first_dropped_turn)
        if not turns:
            return []
        texts = [t.text for t in turns]
        vectors = await self._on_thread(self._embed, [t.said or t.text for t in turns])
        added = self.store.add(options.scope, texts, vectors, source="context", session_id=finished.session_id,
                               turns=[t.turn for t in turns])
        log.info("context full: turns became memories", session_id=finished.session_id, scope=options.scope,
                 memories=len(added))
        return added

    def end_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    # -- the game's calls ----------------------------------------------------------------------

    def _scope_of(self, scope: str, session_id: str) -> str:
        if scope:
            return check_name(scope, "scope", MAX_SCOPE_CHARS)
        if session_id:
            held = self._sessions.get(session_id)
            return held.scope if held is not None else check_name(session_id, "session_id", MAX_SCOPE_CHARS)
        raise InvalidArgument("name a scope or a session_id")

    async def remember(self, request: pb.RememberRequest) -> pb.RememberResponse:
        store = await self._ready()
        scope = self._scope_of(request.scope, request.session_id)
        if not request.texts:
            raise InvalidArgument("texts is empty")
        if len(request.texts) > MAX_TEXTS:
            raise InvalidArgument(f"{len(request.texts)} texts; at most {MAX_TEXTS} a call")
        texts = [check_text(t, f"texts[{i}]") for i, t in enumerate(request.texts)]
        tags = check_tags(request.tags)
        if self._pending_writes >= MAX_PENDING_WRITES:
            raise ResourceExhausted(f"{MAX_PENDING_WRITES} Remember calls are being embedded; wait for them")
        self._pending_writes += 1
        try:
            vectors = await self._on_thread(self._embed, texts)
        finally:
            self._pending_writes -= 1
        added = store.add(scope, texts, vectors, tags=tags, session_id=request.session_id)
        return pb.RememberResponse(memories=[memory_pb(m) for m in added])

    async def recall_memories(self, request: pb.RecallRequest) -> pb.RecallResponse:
        store = await self._ready()
        scopes = check_scopes(request.scopes)
        if not scopes:
            raise InvalidArgument("scopes is empty")
        query = check_text(request.query, "query")
        if request.k > MAX_K_SEARCH:
            raise InvalidArgument(f"k is {request.k}; at most {MAX_K_SEARCH}")
        tags = check_tags(request.tags)
        k = request.k or DEFAULT_K

        def search():
            return store.search(list(scopes), self._embed([query])[0], k, tags=tags)
        found = await self._on_thread(search)
        return pb.RecallResponse(memories=[pb.RecalledMemory(memory=memory_pb(m), score=s) for m, s in found])

    async def forget(self, request: pb.ForgetRequest) -> pb.ForgetResponse:
        store = await self._ready()
        tags = check_tags(request.tags)
        scope = check_name(request.scope, "scope", MAX_SCOPE_CHARS) if request.scope else ""
        if not request.ids and not tags and not scope:
            raise InvalidArgument("name memories by ids, tags or a scope")
        if len(request.ids) > MAX_LIST:
            raise InvalidArgument(f"{len(request.ids)} ids; at most {MAX_LIST} a call")
        return pb.ForgetResponse(forgotten=store.forget(ids=tuple(request.ids), tags=tags, scope=scope))

    async def list_memories(self, request: pb.ListMemoriesRequest) -> pb.ListMemoriesResponse:
        store = await self._ready()
        scope = check_name(request.scope, "scope", MAX_SCOPE_CHARS) if request.scope else ""
        if request.limit > MAX_LIST:
            raise InvalidArgument(f"limit is {request.limit}; at most {MAX_LIST}")
        page, total = store.listing(scope=scope, tags=check_tags(request.tags), offset=request.offset,
                                    limit=request.limit or 100)
        return pb.ListMemoriesResponse(memories=[memory_pb(m) for m in page], total=total)

    def status_pb(self) -> pb.MemoryStatus:
        store, embedder = self.store, self.embedder
        return pb.MemoryStatus(
            enabled=self.settings.enabled,
            embedder=embedder.name if embedder is not None else "",
            memories=len(store) if store is not None else 0,
            scopes=len(store.scope_names()) if store is not None else 0,
            bytes=store.bytes if store is not None else 0,
            model_bytes=embedder.model_bytes if embedder is not None else 0,
            recalls=self.recalls,
            recalls_late=self.recalls_late,
            evicted=store.evicted if store is not None else 0,
        )


def added_event(session_id: str, scope: str, added: list[Memory]) -> pb.MemoriesAdded:
    return pb.MemoriesAdded(session_id=session_id, scope=scope, memory_ids=[m.id for m in added])


def stamp(final: pb.GenerationFinal, told: tuple[int, ...], recalled: list[Memory], added: list[Memory]) -> None:
    """The final chunk's memory ids: those the turn told (of those recalled, the ones its
    conversation did not hold yet), and those its dropped turns became."""
    final.memories_used.extend(recalled[i].id for i in told if i < len(recalled))
    final.memories_added.extend(m.id for m in added)

