"""The save-game archive's envelope and the checks an archive passes before anything is restored.

An archive is what ExportSessions returns and ImportSessions takes; a game stores it as opaque
bytes in its own save. Layout (little-endian):

    offset  size  field
    0       8     magic b"XLMSAVE\\0"
    8       2     envelope version (1)
    10      2     flags: bit 0 = the payload is zlib-compressed
    12      8     payload bytes as stored
    20      8     payload bytes once decompressed (== stored when not compressed)
    28      32    SHA-256 of bytes 0..27 and the stored payload
    60      ...   payload: an xlm.v1.SessionArchive (proto/xlm/v1/session_archive.proto)

Never pickle: the payload is a protobuf message, read by a parser that only builds data. The
checks are in the order a damaged file fails them: the magic (not a save at all), the version (a
newer daemon wrote it), the declared sizes against the bytes present and the limits (truncated,
or a hostile size that would make us allocate), the digest (any flipped bit), then the
decompressed size, then the message and every count in it. All of it happens before anything is
restored, so a refused archive changes nothing.
"""

from __future__ import annotations

import hashlib
import struct
import unicodedata
import zlib
from dataclasses import dataclass

from gguf import GGMLQuantizationType
from google.protobuf.message import DecodeError

from sidecar.api.xlm.v1 import session_archive_pb2 as apb
from sidecar.backend.sessions import MAX_SESSION_ID_LENGTH
from sidecar.errors import InvalidArgument
from sidecar.native.seq_state_check import StateLayout, StateLayoutError, read_layout

MAGIC = b"XLMSAVE\x00"
ENVELOPE_VERSION = 1
FORMAT_VERSION = 1
_HEAD = struct.Struct("<8sHHQQ")
_DIGEST = 32
HEADER_BYTES = _HEAD.size + _DIGEST
FLAG_ZLIB = 1

# Bounds on what one archive may hold, whatever its digest says (a hostile file has a valid one).
# Protobuf's own parser stops at 2 GiB; a save holding KV for many NPCs of a large model should be
# several saves (the README says what to keep).
MAX_ARCHIVE_BYTES = 1 << 30
MAX_SESSIONS = 4096
MAX_MESSAGES = 1 << 16
MAX_SESSION_TEXT_BYTES = 64 << 20
MAX_REPLIES = 256  # reply_tokens.MAX_REPLIES: what a session keeps
ROLES = frozenset({"system", "user", "assistant", "tool"})

# zlib's level 1: text shrinks about as much as at 6 (the benchmark's figures, README), in a
# third of the time. A KV state of f16 values barely shrinks (about 8%) at 40 MB/s: an archive
# with KV is stored as is unless a sample of it shrinks by this share.
ZLIB_LEVEL = 1
COMPRESS_IF_BELOW = 0.8
_SAMPLE = 64 << 10


@dataclass(frozen=True)
class Envelope:
    version: int
    compressed: bool
    stored_bytes: int
    raw_bytes: int


def seal(archive: apb.SessionArchive, *, compress: bool | None = None) -> bytes:
    """The archive as bytes to store. `compress` None: only where a sample shows it pays."""
    payload = archive.SerializeToString()
    if compress is None:
        compress = pays_to_compress(payload)
    stored = zlib.compress(payload, ZLIB_LEVEL) if compress else payload
    if compress and len(stored) >= len(payload):
        stored, compress = payload, False
    head = _HEAD.pack(MAGIC, ENVELOPE_VERSION, FLAG_ZLIB if compress else 0, len(stored), len(payload))
    return head + hashlib.sha256(head + stored).digest() + stored


def pays_to_compress(payload: bytes) -> bool:
    """Whether zlib shrinks `payload` enough to be worth its time, judged on its start, middle and
    end (a KV state fills most of an archive with KV)."""
    if len(payload) <= 3 * _SAMPLE:
        sample = payload
    else:
        middle = len(payload) // 2
        sample = payload[:_SAMPLE] + payload[middle:middle + _SAMPLE] + payload[-_SAMPLE:]
    return len(zlib.compress(sample, ZLIB_LEVEL)) < COMPRESS_IF_BELOW * len(sample)


def read_envelope(blob: bytes | memoryview, *, max_bytes: int = MAX_ARCHIVE_BYTES) -> Envelope:
    """The envelope's fields, checked against the bytes present; InvalidArgument naming what is
    wrong."""
    if len(blob) > max_bytes + HEADER_BYTES:
        raise InvalidArgument(f"the save is {len(blob)} bytes; the limit is {max_bytes}")
    if len(blob) < len(MAGIC) or bytes(blob[:len(MAGIC)]) != MAGIC:
        raise InvalidArgument("not a save-game archive of this daemon (it does not start with XLMSAVE)")
    if len(blob) < HEADER_BYTES:
        raise InvalidArgument(f"the save is truncated: {len(blob)} bytes, its header alone is {HEADER_BYTES}")
    _, version, flags, stored, raw = _HEAD.unpack_from(blob, 0)
    if version > ENVELOPE_VERSION:
        raise InvalidArgument(f"the save is format version {version}, written by a newer daemon; this one reads "
                              f"version {ENVELOPE_VERSION}: update the daemon to load it")
    if version < 1 or flags & ~FLAG_ZLIB:
        raise InvalidArgument(f"the save's header is damaged (version {version}, flags {flags:#x})")
    if stored > max_bytes or raw > max_bytes:
        raise InvalidArgument(f"the save declares {max(stored, raw)} bytes; the limit is {max_bytes}")
    if len(blob) - HEADER_BYTES < stored:
        raise InvalidArgument(f"the save is truncated: {len(blob) - HEADER_BYTES} of its {stored} bytes are there")
    if len(blob) - HEADER_BYTES > stored:
        raise InvalidArgument(f"the save has {len(blob) - HEADER_BYTES - stored} bytes past its end")
    if not flags & FLAG_ZLIB and raw != stored:
        raise InvalidArgument("the save's header is damaged (sizes disagree)")
    return Envelope(version, bool(flags & FLAG_ZLIB), stored, raw)


def open_archive(blob: bytes | memoryview, *, max_bytes: int = MAX_ARCHIVE_BYTES) -> apb.SessionArchive:
    """The archive in `blob`, every structural bound checked (check_archive); InvalidArgument
    naming what is wrong."""
    env = read_envelope(blob, max_bytes=max_bytes)
    view = memoryview(blob)
    head, digest, stored = view[:_HEAD.size], view[_HEAD.size:HEADER_BYTES], view[HEADER_BYTES:]
    check = hashlib.sha256(head)
    check.update(stored)
    if check.digest() != bytes(digest):
        raise InvalidArgument("the save is damaged: its checksum does not match its contents")
    payload = _inflate(stored, env.raw_bytes) if env.compressed else stored
    archive = apb.SessionArchive()
    try:
        archive.ParseFromString(payload)
    except DecodeError as e:
        raise InvalidArgument(f"the save's contents do not parse: {e}") from None
    check_archive(archive)
    return archive


def _inflate(stored: memoryview, raw_bytes: int) -> bytes:
    # A bounded inflate: a zip bomb stops at its declared size, which the limit bounds.
    inflater = zlib.decompressobj()
    try:
        payload = inflater.decompress(stored, raw_bytes + 1)
    except zlib.error as e:
        raise InvalidArgument(f"the save's compressed contents are damaged: {e}") from None
    if len(payload) != raw_bytes or not inflater.eof or inflater.unused_data:
        raise InvalidArgument(f"the save's compressed contents do not hold the {raw_bytes} bytes it declares")
    return payload


def check_archive(archive: apb.SessionArchive) -> None:
    """Every count of the archive within its bounds, before anything is restored."""
    if archive.format_version != FORMAT_VERSION:
        raise InvalidArgument(f"the save's contents are format version {archive.format_version}; this daemon reads {FORMAT_VERSION}")
    if len(archive.sessions) > MAX_SESSIONS:
        raise InvalidArgument(f"the save holds {len(archive.sessions)} sessions; the limit is {MAX_SESSIONS}")
    seen: set[str] = set()
    for saved in archive.sessions:
        sid = saved.session_id
        if not sid or len(sid) > MAX_SESSION_ID_LENGTH:
            raise InvalidArgument(f"a session of the save has an id of {len(sid)} characters (1 to {MAX_SESSION_ID_LENGTH})")
        if any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in sid):
            raise InvalidArgument(f"a session id of the save holds control characters: {sid[:32]!r}")
        if sid in seen:
            raise InvalidArgument(f"the save holds session {sid!r} twice")
        seen.add(sid)
        _check_session(saved, archive.fingerprint)


def _check_session(saved: apb.SavedSession, fingerprint: apb.KvFingerprint) -> None:
    sid = saved.session_id
    if saved.messages and saved.text:
        raise InvalidArgument(f"session {sid!r} of the save holds both chat messages and raw text")
    for what, messages in (("messages", saved.messages), ("sent messages", saved.sent)):
        if len(messages) > MAX_MESSAGES:
            raise InvalidArgument(f"session {sid!r} of the save holds {len(messages)} {what}; the limit is {MAX_MESSAGES}")
        bad = next((m.role for m in messages if m.role not in ROLES), None)
        if bad is not None:
            raise InvalidArgument(f"session {sid!r} of the save has a message of role {bad[:32]!r}")
    size = len(saved.text) + sum(len(m.content) for m in saved.messages) + sum(len(m.content) for m in saved.sent)
    if size > MAX_SESSION_TEXT_BYTES:
        raise InvalidArgument(f"session {sid!r} of the save holds {size} characters; the limit is {MAX_SESSION_TEXT_BYTES}")
    if len(saved.replies) > MAX_REPLIES:
        raise InvalidArgument(f"session {sid!r} of the save holds {len(saved.replies)} replies' tokens; the limit is {MAX_REPLIES}")
    if not saved.HasField("kv"):
        return
    if not fingerprint.model_digest or not fingerprint.context_per_session:
        raise InvalidArgument(f"session {sid!r} of the save has a KV state but the save no fingerprint")
    n = len(saved.kv.tokens)
    if not 0 < n <= fingerprint.context_per_session:
        raise InvalidArgument(f"session {sid!r} of the save has a KV state of {n} tokens; its context holds "
                              f"{fingerprint.context_per_session}")
    if not saved.kv.state:
        raise InvalidArgument(f"session {sid!r} of the save has tokens but no KV state")
    check_kv_layout(sid, saved.kv, fingerprint)


def check_kv_layout(sid: str, kv: apb.SavedKv, fingerprint: apb.KvFingerprint) -> StateLayout:
    """The KV state holds what its fingerprint and tokens declare: one sequence's cells, one per
    token, within the context, of the declared layers and KV types, and not a byte more."""
    try:
        layout = read_layout(kv.state, max_cells=fingerprint.context_per_session)
    except StateLayoutError as e:
        raise InvalidArgument(f"session {sid!r} of the save: {e}") from None
    declared = {_ggml_type_id(fingerprint.kv_type_k)}, {_ggml_type_id(fingerprint.kv_type_v)}
    if layout.cells != len(kv.tokens):
        raise InvalidArgument(f"session {sid!r} of the save: its KV state holds {layout.cells} cells for "
                              f"{len(kv.tokens)} tokens")
    if layout.layers != fingerprint.layers:
        raise InvalidArgument(f"session {sid!r} of the save: its KV state has {layout.layers} layers; its "
                              f"fingerprint declares {fingerprint.layers}")
    if set(layout.k_types) != declared[0] or (layout.v_types and set(layout.v_types) != declared[1]):
        raise InvalidArgument(f"session {sid!r} of the save: its KV state's types are not the "
                              f"{fingerprint.kv_type_k}/{fingerprint.kv_type_v} its fingerprint declares")
    return layout


def _ggml_type_id(name: str) -> int | None:
    try:
        return GGMLQuantizationType[name.upper()].value
    except KeyError:
        return None
