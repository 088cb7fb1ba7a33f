"""The Godot addon's protocol, held to the daemon: the frames the addon sends and the fields it reads
are listed in clients/godot/addons/xlm_sidecar/protocol_fixtures/*.json; these tests check that the
fixtures agree with the GDScript source (so they cannot drift from the addon) and with the proto,
then replay every fixture against a live daemon's WebSocket bridge (so a protocol change that would
break the addon fails here). The headless Godot test (test_godot_headless.py) checks the other half
where Godot 4 exists: that the addon really sends exactly these frames."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import jsonschema
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from support.daemons import REPO, RunningDaemon, start_daemon, stop_daemon
from support.godot_token_checks import by_candidate, check_token_controls, resolve
from support.no_early_stop import grpc_eog_ids, http_bias
from sidecar.api import pb
from sidecar.errors import InvalidArgument
from sidecar.service import json_frames, tool_calls, websocket_bridge

ADDON = REPO / "clients" / "godot" / "addons" / "xlm_sidecar"
FIXTURES = ADDON / "protocol_fixtures"
PROTOCOL_GD = ADDON / "xlm_protocol.gd"
CLIENT_GD = ADDON / "xlm_sidecar_client.gd"
OPTIONS_GD = ADDON / "xlm_ask_options.gd"
REPORTER_GD = ADDON / "xlm_frame_reporter.gd"
TOKEN_PLACEHOLDER = "$TOKEN"
TERMINALS = ("end", "result", "error")
# Steps the client takes by itself or that are not a method call.
BUILT_IN_STEPS = {"connect", "automatic"}
# Constants the game compares replies against; the addon itself need not use each one.
VALUE_PREFIXES = ("FINISH_", "PHASE_", "STATUS_", "TOOL_CHOICE_")
# Shape names that are types, not messages or enums.
TYPES = {"string", "bool", "int", "int64", "number", "array", "object", "string|null"}
# Shape name -> the proto message its fields come from.
SHAPE_MESSAGES = {
    "GenerateChunk": pb.GenerateChunk,
    "GenerationFinal": pb.GenerationFinal,
    "ToolCallFinal": pb.GenerationFinal,
    "AskImageFinal": pb.GenerationFinal,
    "Status": pb.Status,
    "SetBudgetResponse": pb.SetBudgetResponse,
    "EndSessionResponse": pb.EndSessionResponse,
    "TokenLogprob": pb.TokenLogprob,
    "TokenAlternative": pb.TokenAlternative,
    "EmbedResponse": pb.EmbedResponse,
    "TokenizeResponse": pb.TokenizeResponse,
    "DetokenizeResponse": pb.DetokenizeResponse,
    "FrameGuardState": pb.FrameGuardState,
    "ExportSessionsChunk": pb.ExportSessionsChunk,
    "ImportSessionsResponse": pb.ImportSessionsResponse,
    "SavedSessionInfo": pb.SavedSessionInfo,
    "Memory": pb.Memory,
    "RememberResponse": pb.RememberResponse,
    "RecallResponse": pb.RecallResponse,
    "ForgetResponse": pb.ForgetResponse,
    "ListMemoriesResponse": pb.ListMemoriesResponse,
}
# Map fields of sent requests: their keys are data (token ids), not protocol names.
MAP_FIELDS = {"logitBias"}


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


SHAPES = load("shapes.json")
PRELUDE = load("connect.json")
FIXTURE_NAMES = sorted(p.name for p in FIXTURES.glob("*.json") if p.name not in ("shapes.json", "connect.json"))
ALL_STEP_FIXTURES = ["connect.json", *FIXTURE_NAMES]


def protocol_constants() -> dict[str, str]:
    """NAME -> value of every string constant in xlm_protocol.gd."""
    text = PROTOCOL_GD.read_text(encoding="utf-8")
    return dict(re.findall(r'^const ([A-Z][A-Z0-9_]*) := "([^"\\]*)"$', text, flags=re.M))


def addon_sources() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(ADDON.glob("*.gd"))}


def _walk_keys(value: object, out: set[str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            out.add(key.rstrip("?"))
            _walk_keys(item, out)
    elif isinstance(value, list):
        for item in value:
            _walk_keys(item, out)


def _sent_names(frame: object, out: set[str]) -> None:
    """Keys of a sent frame, plus the values that are protocol names (method, role, format)."""
    if isinstance(frame, dict):
        for key, item in frame.items():
            out.add(key)
            if key in ("method", "role", "format") and isinstance(item, str):
                out.add(item)
            if key not in MAP_FIELDS:
                _sent_names(item, out)
    elif isinstance(frame, list):
        for item in frame:
            _sent_names(item, out)


def fixture_names() -> set[str]:
    """Every protocol name the fixtures use: field names sent and read, methods, enum values."""
    names: set[str] = set()
    for fixture in ALL_STEP_FIXTURES:
        for step in load(fixture)["steps"]:
            for frame in step["sends"]:
                _sent_names(frame, names)
    for shape in SHAPES["frames"].values():
        _walk_keys(shape, names)
    for shape in SHAPES["messages"].values():
        _walk_keys(shape, names)
    for values in SHAPES["enums"].values():
        names.update(values)
    return names


def all_steps(fixture: dict) -> list[dict]:
    return ([] if fixture.get("prelude") is False else PRELUDE["steps"]) + fixture["steps"]


# -- the fixtures agree with the addon's source -----------------------------------------------------


def test_every_protocol_name_in_the_fixtures_is_a_constant_of_the_addon() -> None:
    constants = set(protocol_constants().values())
    missing = sorted(fixture_names() - constants)
    assert not missing, f"fixtures use names that xlm_protocol.gd does not declare: {missing}"


def test_every_constant_of_the_addon_appears_in_the_fixtures() -> None:
    names = fixture_names()
    unused = sorted(f"{k} = {v!r}" for k, v in protocol_constants().items() if v not in names)
    assert not unused, f"xlm_protocol.gd declares names no fixture sends or reads: {unused}"


def test_the_addon_uses_every_field_and_method_it_declares() -> None:
    code = "\n".join(addon_sources().values())
    unused = [
        name
        for name in protocol_constants()
        if not name.startswith(VALUE_PREFIXES) and len(re.findall(rf"\b{name}\b", code)) < 2
    ]
    assert not unused, f"declared in xlm_protocol.gd but never used by the addon: {unused}"


def test_protocol_names_are_spelled_only_in_xlm_protocol() -> None:
    """Field names written as literals elsewhere would bypass the constants these tests check."""
    names = fixture_names()
    offenders = []
    for name, text in addon_sources().items():
        if name == PROTOCOL_GD.name:
            continue
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        for literal in re.findall(r'"((?:[^"\\]|\\.)*)"', code):
            if literal in names:
                offenders.append(f"{name}: {literal!r}")
    assert not offenders, f"use XlmProtocol's constants instead: {offenders}"


def _functions(path: Path) -> set[str]:
    return set(re.findall(r"^func ([a-z][a-z0-9_]*)\(", path.read_text(encoding="utf-8"), flags=re.M))


def test_fixture_steps_name_real_client_methods_and_options() -> None:
    """A step names a method of the client, or of its frame reporter (`frame_reporter.report`)."""
    assert re.search(r"^var frame_reporter: FrameReporter\b", CLIENT_GD.read_text(encoding="utf-8"), flags=re.M)
    methods = _functions(CLIENT_GD) | {f"frame_reporter.{name}" for name in _functions(REPORTER_GD)}
    options = set(re.findall(r"^@export\w* var ([a-z][a-z0-9_]*)", OPTIONS_GD.read_text(encoding="utf-8"), flags=re.M))
    for fixture in ALL_STEP_FIXTURES:
        for step in load(fixture)["steps"]:
            if step["do"] in BUILT_IN_STEPS:
                continue
            assert step["do"] in methods, f"{fixture}: the client has no method {step['do']}"
            unknown = set(step["args"].get("options", {})) - options
            assert not unknown, f"{fixture}: XlmAskOptions has no {sorted(unknown)}"


def test_the_close_code_of_a_refused_token_is_the_bridges() -> None:
    declared = re.search(r"^const CLOSE_UNAUTHENTICATED := (\d+)$", PROTOCOL_GD.read_text(encoding="utf-8"), flags=re.M)
    assert declared is not None and int(declared.group(1)) == websocket_bridge.CLOSE_UNAUTHENTICATED
    assert load("auth_refused.json")["steps"][0]["await"]["close_code"] == websocket_bridge.CLOSE_UNAUTHENTICATED


def test_call_ids_count_up_from_the_status_call_as_the_client_numbers_them() -> None:
    """A fresh client numbers calls xlm-1, xlm-2, ...; the prelude's status call takes xlm-1."""
    prefix = re.search(r'^const CALL_ID_PREFIX := "([^"]+)"$', CLIENT_GD.read_text(encoding="utf-8"), flags=re.M)
    assert prefix is not None
    for fixture_name in FIXTURE_NAMES:
        expected = 1
        for step in all_steps(load(fixture_name)):
            for frame in step["sends"]:
                if "method" in frame:
                    assert frame["id"] == f"{prefix.group(1)}{expected}", (fixture_name, frame)
                    expected += 1


# -- the fixtures agree with the proto ---------------------------------------------------------------


@pytest.mark.parametrize("fixture_name", ALL_STEP_FIXTURES)
def test_every_frame_the_addon_sends_is_one_the_bridge_accepts(fixture_name: str) -> None:
    for step in load(fixture_name)["steps"]:
        for frame in step["sends"]:
            parsed = json_frames.parse_client_frame(json.dumps(substitute(frame, "t" * 32)))
            if "method" in frame:
                assert isinstance(parsed, json_frames.CallFrame) and parsed.call.name == frame["method"]


def test_the_frame_report_fixture_sums_up_its_frames() -> None:
    """What xlm_protocol.gd's frame_report_request must send for the fixture's frames, worked out
    here on its own: the median and 99th percentile by nearest rank, the longest frame, the frames
    over the budget; proto3 JSON of a FrameReport whose figures the daemon's guard takes."""
    import math

    from google.protobuf import json_format

    from sidecar.guard.guard_task import check_report

    [step] = load("report_frames.json")["steps"]
    args, [frame] = step["args"], step["sends"]
    ordered = sorted(args["frame_ms"])

    def rank(q: float) -> float:
        return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]

    budget = args["budget_ms"]
    assert frame["request"] == {
        "frames": len(ordered), "windowMs": args["window_ms"], "frameMsP50": rank(0.5), "frameMsP99": rank(0.99),
        "frameMsMax": ordered[-1], "framesOverBudget": sum(1 for f in ordered if f > budget), "frameBudgetMs": budget,
        "gpuFrameMsP99": 0,
    }
    check_report(json_format.ParseDict(frame["request"], pb.FrameReport()))
    assert budget == 1000 / 60, "the budget of the 60 fps the reporter assumes without Engine.max_fps"


def test_enums_the_addon_knows_are_the_protos() -> None:
    def names(enum: object) -> list[str]:
        return [v.name for v in enum.DESCRIPTOR.values if not v.name.endswith("_UNSPECIFIED")]

    assert SHAPES["enums"]["FinishReason"] == names(pb.FinishReason)
    assert SHAPES["enums"]["EnginePhase"] == names(pb.EnginePhase)
    assert set(SHAPES["enums"]["StatusCode"]) <= {code.name for code in grpc.StatusCode}


def test_tool_choices_the_addon_knows_are_the_daemons() -> None:
    """Each tool_choice value the addon names is one the daemon takes (a tool's own name is the other
    kind); "none" turns the tools off."""
    request = pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="hi")]),
                                 tools=[pb.Tool(name="wave")])
    for choice in SHAPES["enums"]["ToolChoice"]:
        request.tool_choice = choice
        plan = tool_calls.plan_from_pb(request)
        assert (plan is None) == (choice == "none"), choice
    request.tool_choice = "dance"
    with pytest.raises(InvalidArgument):
        tool_calls.plan_from_pb(request)


def _check_fields_exist(shape: object, descriptor: object, path: str) -> None:
    if not isinstance(shape, dict):
        return
    fields = {f.json_name: f for f in descriptor.fields}
    for key, sub in shape.items():
        field = fields.get(key.rstrip("?"))
        assert field is not None, f"{path}.{key} is not a field of {descriptor.full_name}"
        if field.message_type is not None:
            _check_fields_exist(sub[0] if isinstance(sub, list) else sub, field.message_type, f"{path}.{key}")


@pytest.mark.parametrize("shape_name", sorted(SHAPE_MESSAGES))
def test_every_field_the_addon_reads_is_in_the_proto(shape_name: str) -> None:
    _check_fields_exist(SHAPES["messages"][shape_name], SHAPE_MESSAGES[shape_name].DESCRIPTOR, shape_name)


# -- replay against a live daemon --------------------------------------------------------------------


class ShapeError(AssertionError):
    pass


class CrossedCancel(AssertionError):
    """A cancel crossed the call's last frame: the call ended before the daemon read the cancel."""


def check_shape(value: object, shape: object, path: str) -> None:
    """`value` has every field of `shape`, with the type it names (see shapes.json's doc)."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            raise ShapeError(f"{path}: expected an object, got {value!r}")
        for key, sub in shape.items():
            name = key.rstrip("?")
            if name not in value:
                if key.endswith("?"):
                    continue
                raise ShapeError(f"{path}: no field {name!r} in {sorted(value)}")
            check_shape(value[name], sub, f"{path}.{name}")
    elif isinstance(shape, list):
        if not isinstance(value, list):
            raise ShapeError(f"{path}: expected an array, got {value!r}")
        for i, item in enumerate(value):
            check_shape(item, shape[0], f"{path}[{i}]")
    elif shape in SHAPES["messages"]:
        check_shape(value, SHAPES["messages"][shape], path)
    elif shape in SHAPES["enums"]:
        if value not in SHAPES["enums"][shape]:
            raise ShapeError(f"{path}: {value!r} is not a {shape} the addon knows {SHAPES['enums'][shape]}")
    elif shape not in TYPES or not _is_type(value, shape):
        raise ShapeError(f"{path}: expected {shape}, got {value!r}")


def _is_type(value: object, type_name: str) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return {
        "string": isinstance(value, str),
        "string|null": value is None or isinstance(value, str),
        "bool": isinstance(value, bool),
        "int": number and float(value).is_integer(),
        "int64": isinstance(value, str) and re.fullmatch(r"-?\d+", value) is not None,
        "number": number,
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }[type_name]


def _path(message: dict, dotted: str) -> object:
    for part in dotted.split("."):
        message = message[part]
    return message


def substitute(frame: object, token: str, results: dict | None = None) -> object:
    """The frame with the token in place, and earlier calls' results for their placeholders."""
    if frame == TOKEN_PLACEHOLDER:
        return token
    if isinstance(frame, dict):
        return {k: substitute(v, token, results) for k, v in frame.items()}
    if isinstance(frame, list):
        return [substitute(v, token, results) for v in frame]
    return resolve(frame, results)


class FrameReader:
    """Reads frames off the socket, handing each call its own and keeping the rest for later."""

    def __init__(self, ws: ClientConnection, timeout_s: float = 60.0) -> None:
        self.ws = ws
        self.timeout_s = timeout_s
        self.kept: list[dict] = []

    def next_for(self, call_id: object) -> dict:
        for i, frame in enumerate(self.kept):
            if frame.get("id") == call_id:
                return self.kept.pop(i)
        deadline = time.monotonic() + self.timeout_s
        while True:
            frame = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            check_shape(frame, SHAPES["frames"][self.kind(frame)], "frame")
            if frame.get("id") == call_id:
                return frame
            self.kept.append(frame)

    @staticmethod
    def kind(frame: dict) -> str:
        for kind in ("auth", "chunk", "end", "result", "error"):
            if kind in frame:
                return "auth_ok" if kind == "auth" else kind
        raise ShapeError(f"a frame the addon cannot classify: {frame}")


def check_tool_call(final: dict, expected: str, request: dict) -> None:
    """`expected`: "none" (no call), "any" (a call of one of the request's tools) or a tool's name.
    A call's arguments must validate against its tool's parameters schema."""
    if expected == "none":
        assert "toolCall" not in final and final["finishReason"] != "FINISH_REASON_TOOL_CALL", final
        return
    assert final["finishReason"] == "FINISH_REASON_TOOL_CALL", final
    tools = {t["name"]: t for t in request["tools"]}
    name = final["toolCall"]["name"]
    assert name in tools and (expected == "any" or name == expected), (expected, final)
    jsonschema.validate(json.loads(final["toolCall"]["argumentsJson"]), json.loads(tools[name].get("parametersJsonSchema", "{}")))


def check_await(reader: FrameReader, wait: dict, sent: dict | None = None, results: dict | None = None) -> None:
    if "frame" in wait:
        frame = reader.next_for(None)
        assert frame == wait["frame"], frame
        return
    call_id = wait["id"]
    chunks: list[dict] = []
    while True:
        frame = reader.next_for(call_id)
        if "chunk" in frame:
            check_shape(frame["chunk"], wait["reads"], "chunk")
            chunks.append(frame["chunk"])
            if wait.get("until") == "chunk":
                return
            continue
        terminal = next(k for k in TERMINALS if k in frame)
        break
    if terminal != wait["terminal"]:
        if wait.get("error_code") == "CANCELLED" and terminal == "end":
            raise CrossedCancel(frame)
        raise AssertionError(f"expected {wait['terminal']}, got {frame}")
    checked: dict = {}
    if terminal == "end" and results is not None and any("data" in c for c in chunks):
        # An export: its chunks' bytes are the archive, as the addon's call.archive holds them.
        results[call_id] = {"archive": base64.b64encode(b"".join(base64.b64decode(c["data"]) for c in chunks)).decode()}
    if terminal == "end" and "final" in wait:
        # Each candidate (one unless the request asked for n) ends with its own final chunk.
        candidates = by_candidate(chunks, wait.get("candidates", 1))
        for candidate in candidates:
            check_shape(candidate[-1]["final"], wait["final"], "final")
        checked = candidates[0][-1]["final"]
    elif terminal == "result":
        checked = frame["result"]
        check_shape(checked, wait["reads"], "result")
        if results is not None:
            results[call_id] = checked
    elif terminal == "error":
        check_shape(frame["error"], wait["reads"], "error")
        assert frame["error"]["code"] == wait["error_code"], frame
    if "tool_call" in wait:
        check_tool_call(checked, wait["tool_call"], (sent or {})[call_id])
    check_token_controls(wait, chunks, checked)
    for dotted in wait.get("positive", []):
        assert _path(checked, dotted) > 0, f"{dotted} should be positive in {checked}"
    if "close_code" in wait:
        with pytest.raises(ConnectionClosed) as closed:
            reader.ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == wait["close_code"]


def needs_the_whole_reply(wait: dict) -> bool:
    """An await that holds only if its call's reply does not end early: a call left running (to be
    cancelled next), or log probabilities to check (a reply of no tokens has none)."""
    return wait.get("until") == "chunk" or "logprobs" in wait


def without_an_early_end(frame: dict, eog: tuple[int, ...]) -> dict:
    """The frame as the addon sends it, its request banning the model's end-of-generation tokens
    besides any bias of its own (no_early_stop.py): the reply runs to maxTokens whatever the model
    says. (Not the fixture's frame any more, but the same call: the static checks above read the
    fixtures' frames as they are.)"""
    request = frame["request"]
    sampling = request.get("sampling", {})
    bias = {**http_bias(eog), **sampling.get("logitBias", {})}
    return {**frame, "request": {**request, "sampling": {**sampling, "logitBias": bias}}}


def replay(daemon: RunningDaemon, fixture: dict) -> None:
    """Send each step's frames as the addon would (no Authorization header: Godot's WebSocketPeer
    sends the token as the first frame), then check what comes back. A Generate whose await needs
    the whole reply bans the end-of-generation tokens (needs_the_whole_reply)."""
    token = fixture.get("token", daemon.token)
    eog = None
    with connect(daemon.ws_address, open_timeout=30, max_size=None) as ws:
        reader = FrameReader(ws)
        sent: dict = {}
        results: dict = {}
        for step in all_steps(fixture):
            for frame in step["sends"]:
                frame = substitute(frame, token, results)
                if frame.get("method") == "Generate" and needs_the_whole_reply(step["await"]):
                    if eog is None:
                        with daemon.client(timeout_s=60) as client:
                            eog = grpc_eog_ids(client)
                    frame = without_an_early_end(frame, eog)
                ws.send(json.dumps(frame))
                if "method" in frame:
                    sent[frame["id"]] = frame["request"]
            check_await(reader, step["await"], sent, results)


def replay_with_retries(daemon: RunningDaemon, fixture: dict, attempts: int = 3) -> None:
    """A cancel that crosses the call's end is legal but tests nothing: try again (rarely needed:
    the cancelled reply is 2048 greedy tokens, its end-of-generation tokens banned, far longer than
    a cancel takes to arrive)."""
    for attempt in range(attempts):
        try:
            replay(daemon, fixture)
            return
        except CrossedCancel:
            if attempt == attempts - 1:
                raise


@pytest.fixture(scope="module")
def models(model_files) -> dict[str, Path]:
    return model_files("tiny_llama", "tiny_projector")


@pytest.fixture(scope="module")
def tiny_daemon(models: dict[str, Path]) -> Iterator[RunningDaemon]:
    running = start_daemon("--model", str(models["tiny_llama"]), "--threads", "1", "--profile", "off")
    yield running
    stop_daemon(running)


def vision_flag_exists() -> bool:
    help_text = subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", "--help"], capture_output=True, text=True, timeout=120
    ).stdout
    return "--mmproj" in help_text


@pytest.mark.parametrize("fixture_name", [n for n in FIXTURE_NAMES if load(n).get("needs") is None])
def test_fixture_replays_against_a_live_daemon(tiny_daemon: RunningDaemon, fixture_name: str) -> None:
    replay_with_retries(tiny_daemon, load(fixture_name))


@pytest.mark.parametrize("fixture_name", [n for n in FIXTURE_NAMES if load(n).get("needs") == "smollm2"])
def test_tool_fixture_replays_against_smollm2(daemon: RunningDaemon, fixture_name: str) -> None:
    """Tool calls on the real model (conftest's session daemon): each reply the fixture expects to be a
    call names one of the request's tools, and its arguments validate against that tool's schema."""
    replay(daemon, load(fixture_name))


def test_every_fixture_needs_a_daemon_a_test_starts() -> None:
    assert {load(n).get("needs") for n in FIXTURE_NAMES} <= {None, "vision", "smollm2"}


@pytest.mark.parametrize("fixture_name", [n for n in FIXTURE_NAMES if load(n).get("needs") == "vision"])
def test_vision_fixture_replays_against_a_daemon_with_a_projector(models: dict[str, Path], fixture_name: str) -> None:
    if not vision_flag_exists():
        pytest.skip("`xlm-sidecar serve` has no --mmproj yet (vision is being built): runs once it lands")
    running = start_daemon(
        "--model", str(models["tiny_llama"]), "--mmproj", str(models["tiny_projector"]), "--threads", "1", "--profile", "off"
    )
    try:
        replay(running, load(fixture_name))
    finally:
        stop_daemon(running)
