"""The Python API modules are generated from proto/ and must match it exactly."""

import importlib.util
from pathlib import Path

import grpc

from sidecar.api import pb, rpc

REPO = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_proto", REPO / "scripts" / "gen_proto.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    gen = _generator()
    fresh = gen.generate(tmp_path)
    assert fresh, "protoc produced nothing"
    for path in fresh:
        committed = REPO / path.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is missing: run python scripts/gen_proto.py"
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed.relative_to(REPO)} differs from what proto/ generates: run python scripts/gen_proto.py"
        )


def test_api_is_versioned_and_complete() -> None:
    service = pb.DESCRIPTOR.services_by_name["Sidecar"]
    assert service.full_name == "xlm.v1.Sidecar"
    methods = {m.name: (m.input_type.name, m.output_type.name) for m in service.methods}
    assert methods == {
        "Generate": ("GenerateRequest", "GenerateChunk"),
        "AskImage": ("AskImageRequest", "GenerateChunk"),
        "SetBudget": ("SetBudgetRequest", "SetBudgetResponse"),
        "WatchState": ("WatchStateRequest", "StateEvent"),
        "GetStatus": ("GetStatusRequest", "Status"),
        "EndSession": ("EndSessionRequest", "EndSessionResponse"),
        "Embed": ("EmbedRequest", "EmbedResponse"),
        "Tokenize": ("TokenizeRequest", "TokenizeResponse"),
        "Detokenize": ("DetokenizeRequest", "DetokenizeResponse"),
        "ReportFrames": ("FrameReport", "FrameGuardState"),
        "ExportSessions": ("ExportSessionsRequest", "ExportSessionsChunk"),
        "ImportSessions": ("ImportSessionsRequest", "ImportSessionsResponse"),
        "Remember": ("RememberRequest", "RememberResponse"),
        "Recall": ("RecallRequest", "RecallResponse"),
        "Forget": ("ForgetRequest", "ForgetResponse"),
        "ListMemories": ("ListMemoriesRequest", "ListMemoriesResponse"),
    }
    assert hasattr(rpc, "SidecarStub") and grpc is not None
