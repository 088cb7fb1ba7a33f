"""NPC memories in save games: what an export adds to the archive, and what an import restores.

A save holds what its NPCs remember: the memories of every exported session's scopes (the one it
writes and the ones it reads, so a shared "village" scope travels with the NPCs that know it),
every scope when every session is exported, with each session's memory options. Vectors travel
with the name of the embedder that made them; a daemon with another embedder computes them again
from the text (on the memory thread), since two embedders' vectors do not compare.

An import restores memories only once its sessions were taken (all or nothing, as the sessions
are): with `replace`, the archive's scopes are emptied first; without, its memories are added.
Restored memories get this daemon's ids.
"""

from __future__ import annotations

import unicodedata

import numpy as np

from sidecar.api.xlm.v1 import session_archive_pb2 as apb
from sidecar.errors import InvalidArgument
from sidecar.memory.checks import check_scopes, check_tags
from sidecar.memory.store import Memory

# Bounds on the memories one archive may carry (a hostile archive's digest is valid too).
MAX_SAVED_MEMORIES = 100_000
MAX_SAVED_TEXT_BYTES = 4096
MAX_SAVED_DIMS = 4096
MAX_SAVED_NAME = 128


def add_to_archive(memories, archive: apb.SessionArchive, everything: bool) -> None:
    """The memories of the archive's sessions' scopes (all of them when `everything`)."""
    store, embedder = memories.store, memories.embedder
    options = {s.session_id: memories.held_options(s.session_id) for s in archive.sessions}
    for sid, o in options.items():
        if sid in memories.given_options:
            archive.memory_options.add(session_id=sid, scope=o.scope, read_scopes=list(o.reads),
                                       max_tokens=o.max_tokens, k=o.k, tags=list(o.tags), off=o.off)
    if store is None or embedder is None:  # never loaded: nothing remembered yet
        return
    scopes = set(store.scope_names()) if everything else {
        scope for o in options.values() for scope in (o.scope, *o.reads)}
    saved, vectors = store.of_scopes(scopes)
    archive.memory_embedder = embedder.name
    for memory, vector in zip(saved, vectors):
        archive.memories.add(
            scope=memory.scope, text=memory.text, tags=list(memory.tags), created_unix_ms=int(memory.created * 1000),
            source=memory.source, session_id=memory.session_id, turn=memory.turn, uses=memory.uses,
            last_used_unix_ms=int(memory.last_used * 1000), vector=np.asarray(vector, "<f4").tobytes())


def check_archive_memories(archive: apb.SessionArchive) -> None:
    """Every memory of the archive within bounds, before anything is restored."""
    if len(archive.memories) > MAX_SAVED_MEMORIES:
        raise InvalidArgument(f"the save holds {len(archive.memories)} memories; the limit is {MAX_SAVED_MEMORIES}")
    dims = {len(m.vector) for m in archive.memories}
    if len(dims) > 1 or any(d % 4 or d > 4 * MAX_SAVED_DIMS for d in dims):
        raise InvalidArgument("the save's memory vectors are damaged (lengths differ or are not float32)")
    for m in archive.memories:
        if not m.scope or len(m.scope) > MAX_SAVED_NAME or not m.text or len(m.text.encode("utf-8")) > MAX_SAVED_TEXT_BYTES:
            raise InvalidArgument(f"a memory of the save is out of bounds (scope {m.scope[:32]!r}, {len(m.text)} characters)")
        if any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in m.scope):
            raise InvalidArgument(f"a memory scope of the save holds control characters: {m.scope[:32]!r}")
    for o in archive.memory_options:
        check_scopes([o.scope] if o.scope else [])
        check_scopes(o.read_scopes)
        check_tags(o.tags)


def restore_from_archive(memories, archive: apb.SessionArchive, replace: bool) -> int:
    """On the memory thread: the archive's memories into the store; returns how many."""
    store, embedder = memories.store, memories.embedder
    if store is None or embedder is None or not archive.memories:
        return 0
    if replace:
        for scope in {m.scope for m in archive.memories}:
            store.forget(scope=scope)
    restored = [Memory(0, m.scope, m.text, tuple(m.tags), created=m.created_unix_ms / 1000, source=m.source or "game",
                       session_id=m.session_id, turn=m.turn, uses=m.uses, last_used=m.last_used_unix_ms / 1000)
                for m in archive.memories]
    same = archive.memory_embedder == embedder.name and len(archive.memories[0].vector) == 4 * embedder.dims
    if same:
        vectors = np.stack([np.frombuffer(m.vector, "<f4") for m in archive.memories]).astype(np.float32)
    else:
        vectors = embedder.embed([m.text for m in restored])
    return len(store.restore(restored, vectors))
