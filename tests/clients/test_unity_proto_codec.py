"""The Unity package's own protobuf codec (clients/unity/Runtime/Grpc): its table (ProtoSchema.cs)
against the proto, and what it writes and reads against Python's protobuf, both ways. Built on the
.NET Core 3.1 runtime with the client tests (test_unity_client.py's dotnet_build); no daemon."""

from __future__ import annotations

import base64
import importlib.util
import json

import pytest

from test_unity_client import (  # noqa: F401 (dotnet_build is a fixture)
    CSHARP_TESTS,
    FRAME_INPUT,
    DotnetBuild,
    _dotnet,
    check_frame_report_json,
    dotnet_build,
    expected_frame_report,
)


def test_proto_schema_is_up_to_date() -> None:
    spec = importlib.util.spec_from_file_location("gen_proto_schema", CSHARP_TESTS / "gen_proto_schema.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.TARGET.read_text() == gen.render(), "run: .venv/bin/python tests/clients/unity/gen_proto_schema.py"


ENCODE_CASES = [
    ("GenerateRequest", {"messages": {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "h\u00e9 \U0001F600"}]},
                         "sampling": {"temperature": 0, "topK": -1, "seed": "18446744073709551615"}, "maxTokens": 8,
                         "stop": ["\n", "END"], "jsonSchema": "{}", "sessionId": "npc", "resetSession": True}),
    ("GenerateRequest", {"prompt": ""}),
    ("GenerateRequest", {"messages": {"messages": [{"role": "user", "content": "a thief!"}]}, "toolChoice": "flee",
                         "tools": [{"name": "attack", "description": "attack a target", "parametersJsonSchema": '{"type": "object"}'},
                                   {"name": "flee"}]}),
    ("AskImageRequest", {"question": "what?", "image": {"raw": {"pixels": "AQIDBA==", "width": 1, "height": 1,
                                                                "format": "PIXEL_FORMAT_BGRA8", "bottomUp": True}}}),
    ("SetBudgetRequest", {"vramSize": "2G", "maxCpuThreads": 0}),
    ("SetBudgetRequest", {"autoReserveBytes": "1073741824"}),
    ("EndSessionRequest", {"sessionId": "x"}),
    # Token controls: a map keyed by int32 (negative ids take ten bytes), an optional set to 0, n, a grammar.
    ("GenerateRequest", {"prompt": "x", "sampling": {"logitBias": {"5": -100, "-3": 2.5, "0": 0}}, "logprobs": 0, "n": 3,
                         "grammar": 'root ::= "Aye" | "Nay"'}),
    ("EmbedRequest", {"input": ["a sword", "", "h\u00e9"]}),
    ("TokenizeRequest", {"text": "<|im_end|>", "addSpecial": True, "parseSpecial": True}),
    ("DetokenizeRequest", {"tokens": [0, 72, -1, 2147483647]}),
    # Frame reports, and the RAM budget beside the VRAM one.
    ("FrameReport", {"frames": 60, "windowMs": 1000.5, "frameMsP50": 16.5, "frameMsP99": 33.25, "frameMsMax": 40,
                     "framesOverBudget": 3, "frameBudgetMs": 16.666666666666668, "gpuFrameMsP99": 0}),
    ("SetBudgetRequest", {"vramSize": "2G", "maxCpuThreads": 3, "ramSize": "512M"}),
    ("SetBudgetRequest", {"ramSize": "0"}),
]


@pytest.mark.parametrize(("message", "request_json"), ENCODE_CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_proto_encoding_matches_python_protobuf(dotnet_build: DotnetBuild, message: str, request_json: dict) -> None:
    """What the C# codec writes, Python's protobuf reads as the same message (optionals set to their
    defaults included: temperature 0 must reach the daemon)."""
    from google.protobuf import json_format
    from sidecar.api.xlm.v1 import sidecar_pb2

    result = _dotnet(dotnet_build, "--proto-encode", f"xlm.v1.{message}", stdin=json.dumps(request_json))
    assert result.returncode == 0, result.stdout + result.stderr
    parsed = getattr(sidecar_pb2, message).FromString(base64.b64decode(result.stdout.strip()))
    assert parsed == json_format.ParseDict(request_json, getattr(sidecar_pb2, message)())


def _sample_replies() -> list:
    from sidecar.api.xlm.v1 import sidecar_pb2 as pb

    schedule = pb.Schedule(tiers=[pb.TierPlan(max_tokens=1, phase=pb.TIER_PHASE_DECODE, placement=pb.PLACEMENT_STATIC, threads=3,
                                              predicted_tokens_per_s=12.5)],
                           vram_bytes_by_component={"weights": 3 << 30, "kv_cache": 7}, kv_type="q8_0", micro_batch=512)
    return [
        pb.GenerateChunk(text="h\u00e9", token_ids=[1, 70000, -3], final=pb.GenerationFinal(
            finish_reason=pb.FINISH_REASON_CANCELLED, usage=pb.Usage(prompt_tokens=9, cached_prompt_tokens=4, completion_tokens=2),
            timings=pb.Timings(total_ms=1.25), session_id="npc",
            image=pb.ImageInfo(original_width=64, encoded_width=32, downscaled=True, image_tokens=16, encode_ms=0.5))),
        pb.GenerateChunk(),
        pb.GenerateChunk(text='{"name": "flee"}', final=pb.GenerationFinal(
            finish_reason=pb.FINISH_REASON_TOOL_CALL, tool_call=pb.ToolCall(name="flee", arguments_json='{"to": "north"}'))),
        pb.Status(version="1", phase=pb.ENGINE_PHASE_RELOADING, budget=pb.Budget(vram_bytes=(1 << 63) + 5, auto_vram=True), schedule=schedule,
                  sessions=[pb.SessionInfo(session_id="a", tokens=3, last_used_unix_ms=-2, in_kv_cache=True)],
                  listen_addresses=["127.0.0.1:1", "ws://127.0.0.1:2"], uptime_s=0.1),
        pb.StateEvent(unix_ms=1_700_000_000_000, phase=pb.ENGINE_PHASE_READY, schedule=schedule, reason="budget"),
        pb.GenerateChunk(text="hi", token_ids=[104, 105], index=2, logprobs=[
            pb.TokenLogprob(token_id=104, piece=b"h", logprob=-0.5, top=[pb.TokenAlternative(token_id=104, piece=b"h", logprob=-0.5),
                                                                        pb.TokenAlternative(token_id=72, piece=b"\xff", logprob=-1.25)]),
            pb.TokenLogprob(token_id=105, piece=b"i", logprob=-2.0)]),
        pb.EmbedResponse(embeddings=[pb.Embedding(values=[0.6, -0.8]), pb.Embedding()], prompt_tokens=7),
        pb.TokenizeResponse(tokens=[1, -2, 70000]),
        pb.DetokenizeResponse(text="h\u00e9"),
        pb.SamplingParams(logit_bias={120: 100.0, -3: -0.5}),
        pb.FrameGuardState(enabled=True, source="frame reports", frame_budget_ms=16.7, max_threads=2, max_pass_tokens=64, pause_ms=1.5,
                           low_priority=True, reason="frames run late", game_frame_ms_p99=30.5, game_over_budget_share=0.25,
                           game_busy_cores=1.5, game_busy_threads=2, changes=(1 << 64) - 1, reports=7),
        pb.Status(version="1", frame_guard=pb.FrameGuardState(source="nothing seen", reports=3)),
    ]


@pytest.mark.parametrize("reply", range(len(_sample_replies())))
def test_proto_decoding_matches_python_protobuf(dotnet_build: DotnetBuild, reply: int) -> None:
    """What Python's protobuf writes, the C# codec reads as the JSON mapping the bridge would send
    (fields at their defaults included, 64-bit integers as strings, enums by name)."""
    from google.protobuf import json_format

    message = _sample_replies()[reply]
    result = _dotnet(dotnet_build, "--proto-decode", message.DESCRIPTOR.full_name,
                     stdin=base64.b64encode(message.SerializeToString()).decode())
    assert result.returncode == 0, result.stdout + result.stderr
    expected = json_format.MessageToDict(message, always_print_fields_with_no_presence=True)
    assert _approx(json.loads(result.stdout)) == _approx(expected)


def test_frame_report_bytes_match_python_protobuf(dotnet_build: DotnetBuild) -> None:
    """FrameStats' report of FRAME_INPUT as the gRPC transport writes it: Python's protobuf reads the
    bytes as the expected FrameReport, and the JSON mapping of it is the one the bridge takes."""
    from sidecar.api import pb

    result = _dotnet(dotnet_build, "--frame-report", stdin=json.dumps(FRAME_INPUT))
    assert result.returncode == 0, result.stdout + result.stderr
    printed = json.loads(result.stdout)
    assert pb.FrameReport.FromString(base64.b64decode(printed["grpc"])) == expected_frame_report()
    check_frame_report_json(printed["request"])


def _approx(value: object) -> object:
    """Floats compared at float32 precision (Python prints float fields shortest, C# as doubles)."""
    if isinstance(value, dict):
        return {k: _approx(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_approx(v) for v in value]
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-6)
    return value
