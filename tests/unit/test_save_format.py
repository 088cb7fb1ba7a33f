"""The save-game archive without a daemon: its envelope, the bounds on what it holds, the KV
state's layout against its fingerprint, and a fuzz over the bytes (every damage is
INVALID_ARGUMENT naming what is wrong, never another exception)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.api.xlm.v1 import session_archive_pb2 as apb
from sidecar.backend import save_format
from sidecar.backend.save_fingerprint import mismatch
from sidecar.backend.save_format import HEADER_BYTES, open_archive, read_envelope, seal
from sidecar.errors import InvalidArgument
from sidecar.native.seq_state_check import SEQ_MAGIC, StateLayoutError, read_layout

F16, Q8_0 = 1, 8
LAYERS, ROW = 3, 16


def kv_state(cells: int, *, layers: int = LAYERS, streams: int = 2, k_type: int = F16, row: int = ROW,
             positions: list[int] | None = None, n_seq: int = 1) -> bytes:
    """A sequence state laid out as llama.cpp writes one (seq_state_check's docstring)."""
    out = struct.pack("<Ii", SEQ_MAGIC, 0) + struct.pack("<I", streams) + struct.pack("<I", cells)
    for pos in positions if positions is not None else range(cells):
        out += struct.pack("<iI", pos, n_seq) + struct.pack("<i", 0) * n_seq
    out += struct.pack("<II", 0, layers)
    for _ in range(layers):
        out += struct.pack("<iQ", k_type, row) + bytes([7]) * (row * cells)
    for _ in range(layers):
        out += struct.pack("<iQ", k_type, row) + bytes([9]) * (row * cells)
    return out + struct.pack("<I", 0) * (streams - 1)


def fingerprint(**changes) -> apb.KvFingerprint:
    fields = dict(model_digest=b"\x01" * 32, model_bytes=1000, model_name="tiny", context_per_session=64,
                  kv_type_k="F16", kv_type_v="F16", prompt_layout_version=1, llama_build="llama-cpp-python 0.3.36",
                  layers=LAYERS)
    fields.update(changes)
    return apb.KvFingerprint(**fields)


def archive(n_sessions: int = 2, *, cells: int = 5, **kv_changes) -> apb.SessionArchive:
    a = apb.SessionArchive(format_version=1, created_unix_ms=1, fingerprint=fingerprint())
    for i in range(n_sessions):
        s = a.sessions.add(session_id=f"npc-{i}", tokens=cells)
        s.messages.add(role="system", content="You are a blacksmith. " * 20)
        s.messages.add(role="user", content="Hello?")
        s.replies.add(text="Hi.", tokens=[5, 6])
        if cells:
            s.kv.tokens.extend(range(cells))
            s.kv.state = kv_state(cells, **kv_changes)
    return a


def test_round_trip_plain_and_compressed() -> None:
    a = archive()
    for compress in (False, True, None):
        blob = seal(a, compress=compress)
        assert open_archive(blob) == a
    assert read_envelope(seal(a, compress=True)).compressed
    text_only = archive(cells=0)
    assert read_envelope(seal(text_only)).compressed, "text pays to compress: the default compresses it"


def test_truncated_at_every_section_boundary() -> None:
    blob = seal(archive(), compress=False)
    for cut in (0, 4, 8, 10, 12, 20, 28, 59, HEADER_BYTES, HEADER_BYTES + 1, len(blob) // 2, len(blob) - 1):
        with pytest.raises(InvalidArgument) as e:
            open_archive(blob[:cut])
        assert "truncated" in str(e.value) or "XLMSAVE" in str(e.value), (cut, str(e.value))
    with pytest.raises(InvalidArgument, match="past its end"):
        open_archive(blob + b"\0")


def test_every_bit_flip_is_caught() -> None:
    blob = bytearray(seal(archive(cells=2), compress=True))
    for i in range(len(blob)):
        for bit in (0, 7):
            damaged = bytearray(blob)
            damaged[i] ^= 1 << bit
            with pytest.raises(InvalidArgument):
                open_archive(bytes(damaged))


def _resealed(blob: bytes, **fields) -> bytes:
    """`blob` with header fields changed and its digest made right again (a deliberate edit)."""
    import hashlib

    magic, version, flags, stored, raw = struct.unpack_from("<8sHHQQ", blob)
    values = dict(magic=magic, version=version, flags=flags, stored=stored, raw=raw) | fields
    head = struct.pack("<8sHHQQ", *values.values())
    body = blob[HEADER_BYTES:]
    return head + hashlib.sha256(head + body).digest() + body


def test_future_version_and_huge_sizes() -> None:
    blob = seal(archive(), compress=False)
    with pytest.raises(InvalidArgument, match="newer daemon"):
        open_archive(_resealed(blob, version=2))
    with pytest.raises(InvalidArgument, match="declares .* bytes; the limit"):
        open_archive(_resealed(blob, stored=1 << 62, raw=1 << 62))
    with pytest.raises(InvalidArgument, match="limit"):
        open_archive(blob, max_bytes=100)
    # A zip bomb: compressed contents larger than the size it declares.
    bomb = seal(archive(), compress=True)
    with pytest.raises(InvalidArgument, match="do not hold"):
        open_archive(_resealed(bomb, raw=1000))
    # A future payload version inside a current envelope.
    a = archive()
    a.format_version = 2
    with pytest.raises(InvalidArgument, match="format version 2"):
        open_archive(seal(a))


@pytest.mark.parametrize("edit, message", [
    (lambda a: a.sessions[1].__setattr__("session_id", "npc-0"), "twice"),
    (lambda a: a.sessions[0].__setattr__("session_id", ""), "id of 0"),
    (lambda a: a.sessions[0].__setattr__("session_id", "a\nb"), "control"),
    (lambda a: a.sessions[0].messages.add(role="wizard", content="x"), "role"),
    (lambda a: a.sessions[0].__setattr__("text", "raw too"), "both"),
    (lambda a: a.sessions[0].kv.tokens.extend(range(100)), "context holds 64"),
    (lambda a: a.sessions[0].kv.tokens.append(1), "cells for"),
    (lambda a: a.sessions[0].kv.__setattr__("state", kv_state(5, layers=LAYERS + 1)), "layers"),
    (lambda a: a.sessions[0].kv.__setattr__("state", kv_state(5, k_type=Q8_0)), "types"),
    (lambda a: a.sessions[0].kv.__setattr__("state", kv_state(5) + b"\0"), "past its caches|ends inside"),
    (lambda a: a.sessions[0].kv.__setattr__("state", kv_state(5)[:-9]), "ends inside"),
    (lambda a: a.sessions[0].kv.__setattr__("state", kv_state(5, positions=[0, 1, 1, 2, 3])), "position"),
    (lambda a: a.sessions[0].kv.__setattr__("state", kv_state(5, n_seq=2)), "sequences"),
    (lambda a: a.sessions[0].kv.__setattr__("state", b""), "no KV state"),
    (lambda a: a.fingerprint.Clear(), "no fingerprint"),
])
def test_bounds_on_what_an_archive_holds(edit, message) -> None:
    a = archive()
    edit(a)
    with pytest.raises(InvalidArgument, match=message):
        open_archive(seal(a))


def test_state_layout_read_as_llama_cpp_writes_it() -> None:
    layout = read_layout(kv_state(7), max_cells=64)
    assert (layout.cells, layout.layers, layout.streams, layout.max_pos) == (7, LAYERS, 2, 6)
    assert layout.k_types == layout.v_types == {F16}
    # A sliding-window model's two caches, one after the other.
    two = kv_state(7) + kv_state(7)[8:]
    assert read_layout(two, max_cells=64).layers == 2 * LAYERS
    with pytest.raises(StateLayoutError, match="cells"):
        read_layout(kv_state(70), max_cells=64)
    with pytest.raises(StateLayoutError, match="llama.cpp"):
        read_layout(b"\0" * 64, max_cells=64)


def test_fingerprint_mismatch_names_what_differs() -> None:
    ours = fingerprint()
    assert mismatch(fingerprint(), ours) is None
    assert "another model" in mismatch(fingerprint(model_digest=b"\2" * 32), ours)
    assert "context 64" in mismatch(fingerprint(context_per_session=128), ours)
    assert "KV cache type" in mismatch(fingerprint(kv_type_k="Q8_0", kv_type_v="Q8_0"), ours)
    assert "prompt layout" in mismatch(fingerprint(prompt_layout_version=0), ours)
    assert "llama.cpp build" in mismatch(fingerprint(llama_build="llama-cpp-python 0.3.1"), ours)


_BLOB = seal(archive(cells=3), compress=False)
_PAYLOAD = archive(cells=3).SerializeToString()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(_BLOB) - 1), st.integers(0, 255)), min_size=1, max_size=8),
       st.integers(0, len(_BLOB)))
def test_fuzz_damaged_envelope(edits, cut) -> None:
    damaged = bytearray(_BLOB)
    for at, value in edits:
        damaged[at] = value
    for blob in (bytes(damaged), bytes(damaged[:cut])):
        try:
            open_archive(blob)
        except InvalidArgument:
            pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(_PAYLOAD) - 1), st.integers(0, 255)), min_size=1, max_size=6),
       st.booleans())
def test_fuzz_hostile_payload_with_a_valid_checksum(edits, compress) -> None:
    """A player who edits the save and fixes its checksum: the contents' own bounds hold."""
    payload = bytearray(_PAYLOAD)
    for at, value in edits:
        payload[at] = value
    a = apb.SessionArchive()
    try:
        a.ParseFromString(bytes(payload))
    except Exception:
        return  # not even a message: the envelope's read refuses it (the test above)
    try:
        opened = open_archive(seal(a, compress=compress))
    except InvalidArgument:
        return
    for s in opened.sessions:  # what passed holds within the bounds
        assert len(s.kv.tokens) <= opened.fingerprint.context_per_session
        if s.HasField("kv"):
            assert read_layout(s.kv.state, max_cells=opened.fingerprint.context_per_session).cells == len(s.kv.tokens)


def test_compression_is_chosen_by_what_pays() -> None:
    import random

    noise = random.Random(1).randbytes(1 << 16)
    assert not save_format.pays_to_compress(noise)
    assert save_format.pays_to_compress(b"the blacksmith says hello " * 4000)
