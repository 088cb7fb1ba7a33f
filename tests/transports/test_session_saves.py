"""Save games through a live daemon and each transport, with a daemon restart in between: gRPC
(the Python client, an archive of megabytes in parts), the WebSocket bridge (JSON frames, the
archive in base64 chunks) and the HTTP extension (raw bytes and base64 JSON).

The next turn after the restart is held to what the daemon that never stopped did: the same
prompt tokens, the same tokens found in the KV cache (cached_prompt_tokens), and, computed the
same way from the same cache on pinned threads, the same reply tokens. What the model says is
never asserted. Damaged archives are INVALID_ARGUMENT on every transport and the daemon serves on.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from sidecar.api import pb
from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.no_early_stop import default_eog_ids, grpc_sampling, http_bias
from support.openai_http_support import http_base
from support.bridge import BridgeClient

ARGS = ("--budget", "0", "--ctx", "512", "--threads", "1", "--no-adaptive-threads", "--stream-interval-ms", "0")
SAMPLING = grpc_sampling(default_eog_ids(), temperature=0.0, repeat_penalty=1.0)
NEXT = pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="How much?")]),
                          sampling=SAMPLING, max_tokens=5, session_id="brom")


def talk(client, sid: str, *messages: tuple[str, str], context: str = "") -> None:
    client.complete(pb.GenerateRequest(
        messages=pb.ChatMessages(messages=[pb.ChatMessage(role=r, content=c) for r, c in messages]),
        sampling=SAMPLING, max_tokens=6, session_id=sid, context=context))


@pytest.fixture(scope="module")
def before_restart() -> Iterator[dict]:
    """Two NPCs' conversations on a first daemon, saved with and without KV; then the turn the
    first daemon runs next."""
    a = start_daemon(*ARGS)
    try:
        with a.client(timeout_s=120) as c:
            talk(c, "brom", ("system", "You are Brom, the smith."), ("user", "Morning!"), context="Winter in Eld.")
            talk(c, "brom", ("user", "Mend my sword?"))
            talk(c, "ilsa", ("system", "You are Ilsa, a guard."), ("user", "Halt?"))
            with_kv = c.export_sessions(include_kv=True)
            text_only = c.export_sessions(["brom"])
            reply = c.complete(NEXT)
        yield dict(with_kv=with_kv, text_only=text_only, reply=reply)
    finally:
        stop_daemon(a)


@pytest.fixture(scope="module")
def daemon_b(before_restart) -> Iterator[RunningDaemon]:
    b = start_daemon(*ARGS)
    yield b
    stop_daemon(b)


def test_export_over_grpc_says_what_it_saved(before_restart) -> None:
    saved = before_restart["with_kv"]
    assert [(s.session_id, s.restored) for s in saved.sessions] == [("brom", "kv"), ("ilsa", "kv")]
    assert len(saved.data) > sum(s.kv_bytes for s in saved.sessions) > 1 << 20
    assert [(s.session_id, s.restored, s.kv_bytes) for s in before_restart["text_only"].sessions] == [("brom", "text", 0)]


def test_grpc_round_trip_after_a_restart(before_restart, daemon_b) -> None:
    with daemon_b.client(timeout_s=120) as c:
        # In parts: the archive is larger than one message may be.
        infos = c.import_sessions(before_restart["with_kv"].data, part_bytes=256 << 10)
        assert [(i.session_id, i.restored, i.reason) for i in infos] == [("brom", "kv", ""), ("ilsa", "kv", "")]
        status = c.status()
        assert {s.session_id: s.imported for s in status.sessions} == {"brom": "kv", "ilsa": "kv"}
        assert all(s.saved_kv_bytes > 0 for s in status.sessions)
        assert (status.saves.imports, status.saves.last_import_kv, status.saves.last_import_text) == (1, 2, 0)
        reply = c.complete(NEXT)
        want = before_restart["reply"]
        assert reply.final.usage.prompt_tokens == want.final.usage.prompt_tokens
        assert reply.final.usage.cached_prompt_tokens == want.final.usage.cached_prompt_tokens > 0
        assert reply.token_ids == want.token_ids
        # Ids that exist are refused whole; with replace the text-only save rebuilds brom from text.
        with pytest.raises(grpc.RpcError) as e:
            c.import_sessions(before_restart["text_only"].data)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "exist already" in e.value.details()
        [info] = c.import_sessions(before_restart["text_only"].data, replace=True)
        assert (info.restored, info.reason) == ("text", "saved without its KV state")
        rebuilt = c.complete(NEXT)
        assert rebuilt.final.usage.prompt_tokens == want.final.usage.prompt_tokens
        assert rebuilt.final.usage.cached_prompt_tokens < want.final.usage.cached_prompt_tokens


def _damaged(blob: bytes) -> list[bytes]:
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0x10
    return [blob[:30], blob[:-1], bytes(flipped), b"XLMSAVE\0" + b"\xff" * 60, b"not a save at all"]


def test_damaged_archives_are_refused_over_grpc(before_restart, daemon_b) -> None:
    with daemon_b.client(timeout_s=120) as c:
        before = [(s.session_id, s.tokens) for s in c.status().sessions]
        for blob in _damaged(before_restart["text_only"].data):
            with pytest.raises(grpc.RpcError) as e:
                c.import_sessions(blob, replace=True)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            c.export_sessions(["nobody"])
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert [(s.session_id, s.tokens) for s in c.status().sessions] == before


def test_bridge_round_trip(before_restart, daemon_b) -> None:
    with BridgeClient(daemon_b.ws_address, daemon_b.token) as bridge:
        frames = bridge.call("ExportSessions", {"includeKv": True}, call_id="x")
        chunks = [f["chunk"] for f in frames if "chunk" in f]
        assert "end" in frames[-1] and chunks[-1]["last"] and len(chunks) > 1
        archive = b"".join(base64.b64decode(ch.get("data", "")) for ch in chunks)
        assert int(chunks[-1]["archiveBytes"]) == len(archive)
        # Back in, in parts of one upload, replacing both.
        step = 512 << 10
        for i, start in enumerate(range(0, len(archive), step)):
            more = start + step < len(archive)
            [frame] = bridge.call("ImportSessions", {"archive": base64.b64encode(archive[start:start + step]).decode(),
                                                     "uploadId": "save-1", "more": more, "replace": True}, call_id=f"i{i}")
        assert [(s["sessionId"], s["restored"]) for s in frame["result"]["sessions"]] == [("brom", "kv"), ("ilsa", "kv")]
        [bad] = bridge.call("ImportSessions", {"archive": base64.b64encode(archive[:-5]).decode()}, call_id="bad")
        assert bad["error"]["code"] == "INVALID_ARGUMENT" and "truncated" in bad["error"]["message"]
        [turn_end] = [f for f in bridge.call("Generate", {
            "messages": {"messages": [{"role": "user", "content": "Papers?"}]}, "sessionId": "ilsa", "maxTokens": 3,
            "sampling": {"temperature": 0, "logitBias": http_bias(default_eog_ids())}}, call_id="g") if "chunk" in f and "final" in f["chunk"]]
        assert int(turn_end["chunk"]["final"]["usage"]["cachedPromptTokens"]) > 0


def _post(url: str, data: bytes, token: str | None, content_type: str, accept: str = "application/json"):
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": content_type, "Accept": accept, **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_http_round_trip(before_restart, daemon_b) -> None:
    base = http_base(daemon_b)
    status, raw = _post(f"{base}/v1/sessions/export", json.dumps({"session_ids": ["brom"], "include_kv": True}).encode(),
                        daemon_b.token, "application/json", accept="application/octet-stream")
    assert status == 200 and raw.startswith(b"XLMSAVE")
    status, body = _post(f"{base}/v1/sessions/import?replace=true", raw, daemon_b.token, "application/octet-stream")
    assert status == 200, body
    [info] = json.loads(body)["sessions"]
    assert (info["session_id"], info["restored"]) == ("brom", "kv")
    # JSON with base64, both ways.
    status, body = _post(f"{base}/v1/sessions/export", b"{}", daemon_b.token, "application/json")
    exported = json.loads(body)
    assert status == 200 and exported["object"] == "sessions.export" and exported["bytes"] > 0
    status, body = _post(f"{base}/v1/sessions/import", json.dumps({"archive": exported["archive"], "replace": True}).encode(),
                         daemon_b.token, "application/json")
    assert status == 200 and {s["restored"] for s in json.loads(body)["sessions"]} == {"text"}
    for blob in _damaged(raw):
        status, body = _post(f"{base}/v1/sessions/import?replace=true", blob, daemon_b.token, "application/octet-stream")
        assert status == 400, body
        assert json.loads(body)["error"]["type"] == "invalid_request_error"


def test_cli_writes_and_restores_a_save_file(before_restart, daemon_b, tmp_path) -> None:
    import subprocess
    import sys

    flags = ["--address", daemon_b.address, "--token", daemon_b.token]
    with daemon_b.client(timeout_s=120) as c:
        c.import_sessions(before_restart["with_kv"].data, replace=True)
    save = tmp_path / "slot1.xlms"
    done = subprocess.run([sys.executable, "-m", "sidecar", "sessions", "export", str(save), "--kv", "--session", "ilsa", *flags],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert save.read_bytes().startswith(b"XLMSAVE") and "ilsa" in done.stdout and "kv" in done.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["slot1.xlms"], "no temporary file left behind"
    refused = subprocess.run([sys.executable, "-m", "sidecar", "sessions", "import", str(save), *flags],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "INVALID_ARGUMENT" in refused.stderr and "exist already" in refused.stderr
    done = subprocess.run([sys.executable, "-m", "sidecar", "sessions", "import", str(save), "--replace", *flags],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "restored: kv" in done.stdout
