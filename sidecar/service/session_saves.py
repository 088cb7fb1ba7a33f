"""ExportSessions and ImportSessions for every transport: archives in chunks out, in parts in.

A KV state is tens of megabytes (about 23 KB a token for SmolLM2-135M, far more for larger
models), past what one message may carry (--max-message-bytes). So an export streams its
archive in chunks, and an import larger than one message arrives in parts under an upload id
that the daemon holds until the last part (bounded: a few uploads at once, the archive limit in
all, dropped when left unfinished). The archive is checked whole before anything is restored.

The heavy work (sealing: serialising, hashing, maybe compressing; reading: the checksum,
parsing, every bound) runs on a worker thread, off the event loop and off the engine thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import structlog

from sidecar.api import pb
from sidecar.backend.contract import LocalModel, local_model
from sidecar.backend.save_fingerprint import model_digest
from sidecar.backend.save_format import MAX_ARCHIVE_BYTES, open_archive, seal
from sidecar.errors import InvalidArgument, ResourceExhausted, Unimplemented
from sidecar.service.memory_saves import check_archive_memories
from sidecar.service.request_checks import check_session_id

log = structlog.get_logger("service")

CHUNK_BYTES = 1 << 20
MIN_CHUNK_BYTES, MAX_CHUNK_BYTES = 64 << 10, 3 << 20
MAX_UPLOADS = 4
UPLOAD_IDLE_S = 120.0
MAX_UPLOAD_ID = 64


@dataclass
class _Upload:
    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    touched: float = field(default_factory=time.monotonic)


@dataclass
class SaveActivity:
    exports: int = 0
    imports: int = 0
    last_export_bytes: int = 0
    last_export_sessions: int = 0
    last_import_bytes: int = 0
    last_import_sessions: int = 0
    last_import_kv: int = 0
    last_import_text: int = 0


class SessionSaves:
    """One per daemon, beside the service core (core.saves)."""

    def __init__(self, core, max_archive_bytes: int = MAX_ARCHIVE_BYTES) -> None:
        self.core = core
        self.max_archive_bytes = max_archive_bytes
        self.activity = SaveActivity()
        self._uploads: dict[str, _Upload] = {}

    def _backend(self) -> LocalModel:
        """The model served here: a session's KV and its fingerprint exist only where it runs."""
        model = local_model(self.core.ready_backend())
        if model is None:
            raise Unimplemented("save games need the model served here (remote mode keeps sessions on the other machine)")
        return model

    async def export_sessions(self, request: pb.ExportSessionsRequest) -> AsyncIterator[pb.ExportSessionsChunk]:
        backend = self._backend()
        for sid in request.session_ids:
            check_session_id(sid)
        step = request.chunk_bytes or CHUNK_BYTES
        if not MIN_CHUNK_BYTES <= step <= MAX_CHUNK_BYTES:
            raise InvalidArgument(f"chunk_bytes {step} is out of range ({MIN_CHUNK_BYTES} to {MAX_CHUNK_BYTES}; 0 for 1 MiB)")
        await asyncio.to_thread(model_digest, backend.config.model_path)  # read once, off the engine thread
        archive, infos = await asyncio.wrap_future(backend.export_sessions(list(request.session_ids), request.include_kv))
        await self.core.memories.add_to_archive(archive, everything=not request.session_ids)
        blob = await asyncio.to_thread(seal, archive)
        if len(blob) > self.max_archive_bytes:
            raise ResourceExhausted(f"the archive would be {len(blob)} bytes; the limit is {self.max_archive_bytes}: "
                                    "export fewer sessions at once, or without their KV")
        self.activity.exports += 1
        self.activity.last_export_bytes, self.activity.last_export_sessions = len(blob), len(archive.sessions)
        log.info("sessions exported", sessions=len(archive.sessions), bytes=len(blob), include_kv=request.include_kv)
        view = memoryview(blob)
        starts = range(0, len(blob), step)
        for start in starts[:-1]:
            yield pb.ExportSessionsChunk(data=bytes(view[start:start + step]))
        yield pb.ExportSessionsChunk(data=bytes(view[starts[-1]:]), sessions=[info_pb(i) for i in infos],
                                     archive_bytes=len(blob), last=True)

    async def export_bytes(self, session_ids: list[str], include_kv: bool) -> tuple[bytes, list[pb.SavedSessionInfo]]:
        """The whole archive at once (HTTP, the CLI)."""
        parts, infos = [], []
        async for chunk in self.export_sessions(pb.ExportSessionsRequest(session_ids=session_ids, include_kv=include_kv)):
            parts.append(chunk.data)
            infos = list(chunk.sessions) or infos
        return b"".join(parts), infos

    async def import_sessions(self, request: pb.ImportSessionsRequest) -> pb.ImportSessionsResponse:
        backend = self._backend()
        blob = self._take_part(request)
        if blob is None:
            return pb.ImportSessionsResponse(received_bytes=self._uploads[request.upload_id].size)
        return await self.import_bytes(blob, replace=request.replace, backend=backend)

    async def import_bytes(self, blob: bytes, *, replace: bool, backend: LocalModel | None = None) -> pb.ImportSessionsResponse:
        backend = backend or self._backend()
        archive = await asyncio.to_thread(open_archive, blob, max_bytes=self.max_archive_bytes)
        check_archive_memories(archive)
        ours = await asyncio.to_thread(_fingerprint_of, backend, archive.fingerprint.layers)
        infos = await asyncio.wrap_future(backend.import_sessions(archive, ours, replace))
        remembered = await self.core.memories.restore(archive, replace)
        if remembered:
            log.info("memories imported", memories=remembered)
        a = self.activity
        a.imports += 1
        a.last_import_bytes, a.last_import_sessions = len(blob), len(infos)
        a.last_import_kv = sum(i.restored == "kv" for i in infos)
        a.last_import_text = len(infos) - a.last_import_kv
        return pb.ImportSessionsResponse(sessions=[info_pb(i) for i in infos], received_bytes=len(blob))

    def _take_part(self, request: pb.ImportSessionsRequest) -> bytes | None:
        """The whole archive once its last part is in (None before)."""
        uid = request.upload_id
        if not uid:
            if request.more:
                raise InvalidArgument("a part of an upload (more) needs an upload_id")
            return request.archive
        if len(uid) > MAX_UPLOAD_ID:
            raise InvalidArgument(f"upload_id is longer than {MAX_UPLOAD_ID} characters")
        now = time.monotonic()
        for stale in [k for k, u in self._uploads.items() if now - u.touched > UPLOAD_IDLE_S]:
            del self._uploads[stale]
        upload = self._uploads.get(uid)
        if upload is None:
            if len(self._uploads) >= MAX_UPLOADS:
                raise ResourceExhausted(f"{MAX_UPLOADS} uploads are unfinished; finish one or wait {UPLOAD_IDLE_S:.0f} s")
            upload = self._uploads[uid] = _Upload()
        held = sum(u.size for u in self._uploads.values())
        if upload.size + len(request.archive) > self.max_archive_bytes or held + len(request.archive) > 2 * self.max_archive_bytes:
            del self._uploads[uid]
            raise InvalidArgument(f"the upload is past the archive limit of {self.max_archive_bytes} bytes")
        upload.parts.append(request.archive)
        upload.size += len(request.archive)
        upload.touched = now
        if request.more:
            return None
        del self._uploads[uid]
        return b"".join(upload.parts)

    def activity_pb(self) -> pb.SaveActivity:
        return pb.SaveActivity(**self.activity.__dict__)


def _fingerprint_of(backend: LocalModel, layers: int):
    model_digest(backend.config.model_path)
    return backend.save_fingerprint(layers)


def info_pb(info) -> pb.SavedSessionInfo:
    return pb.SavedSessionInfo(session_id=info.session_id, tokens=info.tokens, kv_bytes=info.kv_bytes,
                               restored=info.restored, reason=info.reason)
