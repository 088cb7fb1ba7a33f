"""The Unity package (clients/unity): its C# built with mcs and run against a real daemon.

The client core and its tests run on Mono, the runtime Unity itself embeds, over the WebSocket
bridge. The core and the gRPC transport (Runtime/Grpc) are also built against the .NET Core 3.1
runtime from PyPI (dotnetcore2), whose HttpClient speaks HTTP/2 without TLS, and the same client
tests run there over gRPC (its protobuf codec: test_unity_proto_codec.py). (The
WebSocket tests cannot run on that runtime: its ClientWebSocket needs OpenSSL 1.x, and this Debian
has 3.) The Unity components and samples compile against a stand-in for the UnityEngine types they
use (tests/clients/unity/UnityEngineStub), which also hosts a few components for live runs.

The daemon serves the tiny random llama (and the tiny vision projector), so replies are byte
garbage: the C# tests check structure and behaviour, never words. Each C# test runs in its own
process and reports PASS/FAIL lines; a C# test missing from the lists here fails
test_every_csharp_test_is_run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from support.daemons import REPO, RunningDaemon, start_daemon, stop_daemon

UNITY = REPO / "clients" / "unity"
CSHARP_TESTS = REPO / "tests" / "clients" / "unity"
REQUIRE_TOOLS = os.environ.get("XLM_REQUIRE_CLIENT_TOOLS") == "1"
MCS = shutil.which("mcs")
MONO = shutil.which("mono")
SIDECAR_EXE = Path(sys.executable).with_name("xlm-sidecar")
# The C# tests run in a process the daemon did not start: they carry the game token, so their frame
# reports count (only the game's do; README, "Only the game steers the guard").
GAME_TOKEN = "unity-tests-game-token-0123456789"
GAME = {"XLM_SIDECAR_GAME_TOKEN": GAME_TOKEN}

CORE_OFFLINE = [
    "json_round_trips_text_numbers_and_nesting",
    "json_refuses_what_is_not_json",
    "requests_map_to_protobuf_json",
    "tool_requests_and_calls_map_to_protobuf_json",
    "token_controls_map_to_protobuf_json",
    "budget_table_prefers_scene_then_quality",
    "launcher_quotes_arguments_for_the_command_line",
    "frame_stats_give_percentiles_and_reset",
    "frame_reports_map_to_protobuf_json",
]
CORE_LIVE = [
    "streaming_arrives_in_chunks_on_the_main_thread",
    "cancel_ends_the_call_and_frees_the_request",
    "status_says_where_a_streaming_request_is",
    "session_reuse_hits_the_kv_cache",
    "npcs_reply_at_once_one_turn_each",
    "json_schema_mode_returns_a_structured_action",
    "budget_update_applies_and_is_watched",
    "budget_updates_coalesce_to_the_newest",
    "wrong_token_is_refused",
    "errors_carry_status_codes",
    "a_handler_that_throws_ends_the_call_with_its_exception",
    "no_daemon_is_unavailable",
    # Save games (SaveTests.cs): an NPC saved with and without its KV cache, loaded back.
    "an_npc_saves_and_loads_its_conversation",
    # NPC memory (MemoryTests.cs): seed, search, a turn told the memory, list, forget.
    "an_npc_recalls_what_the_game_seeded",
    # Token controls (TokenControlTests.cs): mechanisms on the tiny llama, over both transports.
    "candidates_each_end_with_their_own_final",
    "logprobs_come_with_each_token",
    "logit_bias_bans_and_favours_tokens",
    "a_gbnf_grammar_holds_the_reply",
    "embeddings_are_unit_vectors_of_one_length",
    "tokenize_and_detokenize_round_trip",
]
# Frame reports (FrameTests.cs): ReportFrames, the status's frame_guard, FrameReporter; against a
# daemon of their own with the frame guard on (guarded_daemon).
CORE_FRAMES = [
    "frame_reports_reach_the_guard",
    "frame_reporter_sends_once_a_window_off_the_main_thread",
]
CORE_VISION = ["screenshot_question_about_raw_pixels"]
# On SmolLM2: the tiny random llama would not close a call's JSON within a sane max_tokens.
CORE_TOOLS = ["tools_reply_with_a_call_of_a_declared_function"]
# The tools the C# test declares (passed in XLM_TEST_TOOL_SCHEMAS); each call it prints is
# validated against its tool's schema here.
TOOL_SCHEMAS = {
    "attack": {"description": "Attack someone with your sword.", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["target"],
        "properties": {"target": {"type": "string", "enum": ["thief", "merchant", "player"]}}}},
    "chase": {"description": "Run after someone.", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["target", "shout"],
        "properties": {"target": {"type": "string", "enum": ["thief", "merchant", "player"]},
                       "shout": {"type": "boolean"}}}},
}
CORE_LAUNCHER = [
    "launcher_starts_a_healthy_daemon_and_stops_it",
    "launcher_says_why_the_daemon_did_not_start",
    "launcher_says_when_the_executable_is_missing",
    "launcher_serves_a_unix_socket_with_the_bridge_beside_it",
]
COMPONENTS_LIVE = [
    "npc_dialogue_streams_into_ui_text",
    "npc_dialogue_cancel_and_a_new_line_cancels_the_old",
    "vram_budget_follows_quality_and_scene",
    "launcher_launches_and_stops_with_the_game_object",
    "launcher_reports_frames_once_a_second",
]


def _missing(what: str) -> None:
    """Skip where a tool is missing, except in CI (XLM_REQUIRE_CLIENT_TOOLS=1), where it is a failure."""
    if REQUIRE_TOOLS:
        pytest.fail(f"{what} (XLM_REQUIRE_CLIENT_TOOLS=1)")
    pytest.skip(what)


def _compile(*args: str) -> None:
    result = subprocess.run([MCS, "-langversion:7.2", "-debug", "-warnaserror+", *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"mcs failed:\n{result.stdout}{result.stderr}"


@dataclass
class Build:
    core: Path
    core_tests: Path
    unity_stub: Path
    components: Path
    component_tests: Path


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """Compile like Unity's assemblies: the core (Runtime/Core, no UnityEngine), the components
    (Runtime/Unity) against the UnityEngine stand-in, and the two test programs."""
    if not (MCS and MONO):
        _missing("mcs and mono are not installed (apt-get install mono-mcs)")
    out = tmp_path_factory.mktemp("unity-build")
    system = ["-r:System.dll", "-r:System.Core.dll"]
    b = Build(
        out / "Xlm.Sidecar.Core.dll",
        out / "Xlm.Sidecar.Tests.exe",
        out / "UnityEngine.dll",
        out / "Xlm.Sidecar.Unity.dll",
        out / "Xlm.Sidecar.ComponentTests.exe",
    )
    _compile("-target:library", *system, f"-out:{b.core}", *_sources(UNITY / "Runtime" / "Core"))
    _compile("-target:exe", *system, f"-r:{b.core}", f"-out:{b.core_tests}",
             str(CSHARP_TESTS / "TestRunner.cs"), *_sources(CSHARP_TESTS / "CoreTests"))
    _compile("-target:library", f"-out:{b.unity_stub}", *_sources(CSHARP_TESTS / "UnityEngineStub"))
    _compile("-target:library", *system, f"-r:{b.core}", f"-r:{b.unity_stub}", f"-out:{b.components}",
             *_sources(UNITY / "Runtime" / "Unity"))
    _compile("-target:exe", *system, f"-r:{b.core}", f"-r:{b.unity_stub}", f"-r:{b.components}", f"-out:{b.component_tests}",
             str(CSHARP_TESTS / "TestRunner.cs"), *_sources(CSHARP_TESTS / "ComponentTests"))
    return b


def _sources(folder: Path) -> list[str]:
    files = sorted(str(p) for p in folder.glob("*.cs"))
    assert files, f"no C# sources in {folder}"
    return files


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("unity-models")
    subprocess.run([sys.executable, "-m", "sidecar", "testmodels", "--out", str(out), "--which", "tiny_llama", "--which", "tiny_projector"],
                   check=True, capture_output=True, timeout=120)
    return {"llama": out / "tiny_llama.gguf", "projector": out / "tiny_projector.gguf"}


def _serves_vision() -> bool:
    """Whether this daemon has --mmproj (screenshot questions)."""
    help_text = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    return "--mmproj" in help_text


VISION = _serves_vision()


def _tiny_daemon(models: dict[str, Path], *flags: str) -> RunningDaemon:
    vision = ("--mmproj", str(models["projector"])) if VISION else ()
    # One thread and no chunk batching: a small shared machine, and tests that count chunks. Replies
    # of up to 8000 tokens, so a reply a test cancels is still running however slow the machine.
    return start_daemon("--model", str(models["llama"]), *vision, "--threads", "1", "--stream-interval-ms", "0",
                        "--profile", "off", "--ctx", "8192", "--max-tokens-per-request", "8000", *flags, env=GAME)


@pytest.fixture(scope="module")
def daemon(build: Build, models: dict[str, Path]) -> Iterator[RunningDaemon]:
    # Without the frame guard: beside the other test worker's inference it saw a game filling the
    # cores and lowered this daemon below everything (frames first), and the client's tests waited
    # on it: memory's first load timed out after 30 s beside two busy loops (1.4 s without the
    # guard), CI's candidates test took 34-37 s where it takes under one. The guard's own tests
    # run alone (tests/daemon/test_frame_guard_*.py); the frame reports go to guarded_daemon.
    running = _tiny_daemon(models, "--no-frame-guard")
    yield running
    stop_daemon(running)


@pytest.fixture(scope="module")
def guarded_daemon(build: Build, models: dict[str, Path]) -> Iterator[RunningDaemon]:
    """The frame guard on, for the frame reports: only they talk to it, and only briefly."""
    running = _tiny_daemon(models)
    yield running
    stop_daemon(running)


def _env(daemon: RunningDaemon | None, models: dict[str, Path], tmp_path: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "XLM_TEST_SIDECAR_EXE": str(SIDECAR_EXE),
        "XLM_TEST_MODEL": str(models["llama"]),
        "XLM_TEST_TMP": str(tmp_path),
        "XLM_TEST_VISION": "1" if VISION else "0",
    }
    env.pop("XLM_SIDECAR_TOKEN", None)  # the launcher must pass its own
    if daemon is not None:
        env.update(XLM_TEST_WS=daemon.ws_address, XLM_TEST_TOKEN=GAME_TOKEN)
    return env


def _run(exe: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([MONO, "--debug", str(exe), *args], capture_output=True, text=True, env=env, timeout=timeout)


def _assert_passed(result: subprocess.CompletedProcess, name: str) -> None:
    report = f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, report
    assert f"PASS {name} " in result.stdout, report


# -- the package ------------------------------------------------------------------------------------


def test_package_manifest() -> None:
    manifest = json.loads((UNITY / "package.json").read_text())
    assert manifest["name"] == "com.xlm.sidecar"
    assert manifest["unity"] == "2021.3"
    for sample in manifest["samples"]:
        assert (UNITY / sample["path"]).is_dir(), sample
    assert (UNITY / "README.md").is_file()


def test_every_package_asset_has_a_meta_file() -> None:
    """Unity ignores a file without a .meta in a package from git (it cannot write one there)."""
    spec = importlib.util.spec_from_file_location("unity_meta", CSHARP_TESTS / "unity_meta.py")
    unity_meta = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unity_meta)
    assert unity_meta.problems() == [], "run: python tests/clients/unity/unity_meta.py"
    guids = [line.split()[1] for meta in UNITY.rglob("*.meta") for line in meta.read_text().splitlines() if line.startswith("guid:")]
    assert len(guids) == len(set(guids)) == len(unity_meta.assets())


# -- building ---------------------------------------------------------------------------------------


def test_core_has_no_unityengine_dependency(build: Build) -> None:
    """The core compiled without UnityEngine (the build fixture); its assembly definition says so too."""
    asmdef = json.loads((UNITY / "Runtime" / "Core" / "Xlm.Sidecar.Core.asmdef").read_text())
    assert asmdef["name"] == "Xlm.Sidecar.Core" and asmdef["noEngineReferences"] is True
    grpc = json.loads((UNITY / "Runtime" / "Grpc" / "Xlm.Sidecar.Grpc.asmdef").read_text())
    assert grpc["references"] == ["Xlm.Sidecar.Core"] and grpc["noEngineReferences"] is True
    for source in [*(UNITY / "Runtime" / "Core").glob("*.cs"), *(UNITY / "Runtime" / "Grpc").glob("*.cs")]:
        assert "UnityEngine" not in source.read_text(), source
    assert build.core.is_file()


def test_components_compile_against_the_unityengine_stub(build: Build) -> None:
    asmdef = json.loads((UNITY / "Runtime" / "Unity" / "Xlm.Sidecar.Unity.asmdef").read_text())
    assert asmdef["references"] == ["Xlm.Sidecar.Core"]
    assert build.components.is_file()


def test_samples_compile_against_the_unityengine_stub(build: Build, tmp_path: Path) -> None:
    samples = sorted((UNITY / "Samples~").glob("*/*.cs"))
    assert len(samples) >= 2
    _compile("-target:library", "-r:System.dll", "-r:System.Core.dll", f"-r:{build.core}", f"-r:{build.unity_stub}",
             f"-r:{build.components}", f"-out:{tmp_path / 'Samples.dll'}", *map(str, samples))


def test_the_readme_npc_example_compiles(build: Build, tmp_path: Path) -> None:
    """The ten-line NPC example in clients/unity/README.md (its first C# block)."""
    readme = (UNITY / "README.md").read_text()
    example = readme.split("```csharp\n", 1)[1].split("```", 1)[0]
    assert "class Blacksmith : MonoBehaviour" in example
    source = tmp_path / "Blacksmith.cs"
    source.write_text(example)
    _compile("-target:library", "-r:System.dll", "-r:System.Core.dll", f"-r:{build.core}", f"-r:{build.unity_stub}",
             f"-r:{build.components}", f"-out:{tmp_path / 'Example.dll'}", str(source))


def _readme_example(calling: str) -> str:
    """The one C# block of clients/unity/README.md that mentions `calling`."""
    blocks = [b.split("```", 1)[0] for b in (UNITY / "README.md").read_text().split("```csharp\n")[1:]]
    [example] = [b for b in blocks if calling in b]
    return example


def test_the_readme_tool_call_example_compiles(build: Build, tmp_path: Path) -> None:
    """The NPC-action example in clients/unity/README.md (the C# block that calls ChooseActionAsync)."""
    example = _readme_example("ChooseActionAsync")
    source = tmp_path / "Guard.cs"
    source.write_text("using System.Collections.Generic;\nusing System.Threading.Tasks;\nusing UnityEngine;\nusing Xlm.Sidecar;\n"
                      "class Guard {\n static bool PlayChase(string tool, string target) { return true; }\n"
                      " static async Task Act(NpcConversation guard) {\n" + example + "}\n}\n")
    _compile("-target:library", "-r:System.dll", "-r:System.Core.dll", f"-r:{build.core}", f"-r:{build.unity_stub}",
             f"-out:{tmp_path / 'Guard.dll'}", str(source))


def test_the_readme_memory_example_compiles(build: Build, tmp_path: Path) -> None:
    """The NPC-memory example in clients/unity/README.md (the C# block that calls RememberAsync)."""
    example = _readme_example("RememberAsync")
    source = tmp_path / "Miller.cs"
    source.write_text("using System.Collections.Generic;\nusing System.Threading.Tasks;\nusing UnityEngine;\nusing Xlm.Sidecar;\n"
                      "class Miller {\n static async Task Talk(SidecarClient client) {\n" + example + "}\n}\n")
    _compile("-target:library", "-r:System.dll", "-r:System.Core.dll", f"-r:{build.core}", f"-r:{build.unity_stub}",
             f"-out:{tmp_path / 'Miller.dll'}", str(source))


def test_the_readme_token_controls_example_compiles(build: Build, tmp_path: Path) -> None:
    """The token-controls example in clients/unity/README.md (the C# block that calls CandidatesAsync)."""
    example = _readme_example("CandidatesAsync")
    source = tmp_path / "Choices.cs"
    source.write_text("using System;\nusing System.Collections.Generic;\nusing System.Threading.Tasks;\nusing UnityEngine;\n"
                      "using Xlm.Sidecar;\nclass Choices {\n static async Task Ask(SidecarClient client, NpcConversation brom, int picked) {\n"
                      + example + "}\n}\n")
    _compile("-target:library", "-r:System.dll", "-r:System.Core.dll", f"-r:{build.core}", f"-r:{build.unity_stub}",
             f"-out:{tmp_path / 'Choices.dll'}", str(source))


def test_the_readme_frame_report_example_compiles(build: Build, tmp_path: Path) -> None:
    """The frame-report example in clients/unity/README.md (the C# block that calls ReportFramesAsync)."""
    example = _readme_example("ReportFramesAsync")
    source = tmp_path / "Frames.cs"
    source.write_text("using System.Threading.Tasks;\nusing UnityEngine;\nusing Xlm.Sidecar;\nusing Xlm.Sidecar.Unity;\n"
                      "class Frames {\n static async Task Report(SidecarLauncher launcher, SidecarClient client, double cpuFrameMs,"
                      " double gpuFrameMs, double windowMs) {\n" + example + "}\n}\n")
    _compile("-target:library", "-r:System.dll", "-r:System.Core.dll", f"-r:{build.core}", f"-r:{build.unity_stub}",
             f"-r:{build.components}", f"-out:{tmp_path / 'Frames.dll'}", str(source))


def test_every_csharp_test_is_run(build: Build) -> None:
    core = _run(build.core_tests, "--list").stdout.split()
    assert sorted(core) == sorted(CORE_OFFLINE + CORE_LIVE + CORE_FRAMES + CORE_VISION + CORE_TOOLS + CORE_LAUNCHER)
    components = _run(build.component_tests, "--list").stdout.split()
    assert sorted(components) == sorted(COMPONENTS_LIVE)


# -- the core ---------------------------------------------------------------------------------------


def test_core_offline(build: Build) -> None:
    result = _run(build.core_tests, *CORE_OFFLINE)
    for name in CORE_OFFLINE:
        _assert_passed(result, name)


@pytest.mark.parametrize("name", CORE_LIVE)
def test_core_against_a_live_daemon(build: Build, daemon: RunningDaemon, models: dict[str, Path], tmp_path: Path, name: str) -> None:
    _assert_passed(_run(build.core_tests, name, env=_env(daemon, models, tmp_path)), name)


@pytest.mark.parametrize("name", CORE_FRAMES)
def test_core_frame_reports_reach_a_guarded_daemon(build: Build, guarded_daemon: RunningDaemon, models: dict[str, Path],
                                                   tmp_path: Path, name: str) -> None:
    _assert_passed(_run(build.core_tests, name, env=_env(guarded_daemon, models, tmp_path)), name)


@pytest.mark.skipif(not VISION, reason="this daemon has no --mmproj yet (vision not landed)")
@pytest.mark.parametrize("name", CORE_VISION)
def test_core_screenshot_question(build: Build, daemon: RunningDaemon, models: dict[str, Path], tmp_path: Path, name: str) -> None:
    _assert_passed(_run(build.core_tests, name, env=_env(daemon, models, tmp_path)), name)


@pytest.fixture(scope="module")
def smollm2_daemon(build: Build) -> Iterator[RunningDaemon]:
    """The real default model (SmolLM2), for the tests whose replies must make sense as calls; no
    frame guard, as `daemon` says why (beside two busy loops its tool call took past 120 s)."""
    running = start_daemon("--budget", "0", "--threads", "1", "--stream-interval-ms", "0", "--profile", "off",
                           "--no-frame-guard", env=GAME)
    yield running
    stop_daemon(running)


def _tool_env(daemon: RunningDaemon, models: dict[str, Path], tmp_path: Path) -> dict[str, str]:
    return {**_env(daemon, models, tmp_path), "XLM_TEST_TOOL_SCHEMAS": json.dumps(TOOL_SCHEMAS)}


def _assert_tool_calls_fit_their_schemas(result: subprocess.CompletedProcess) -> None:
    """Each call the C# test printed names a declared tool, and its arguments validate against it."""
    import jsonschema

    calls = [line.split(" ", 2)[1:] for line in result.stdout.splitlines() if line.startswith("TOOL_CALL ")]
    assert len(calls) == 2, result.stdout
    for name, arguments in calls:
        assert name in TOOL_SCHEMAS, result.stdout
        jsonschema.validate(json.loads(arguments), TOOL_SCHEMAS[name]["parameters"])
    assert calls[1][0] == list(TOOL_SCHEMAS)[-1], "the second call names the tool its tool_choice names (the last declared)"


@pytest.mark.parametrize("name", CORE_TOOLS)
def test_core_tool_calls_on_smollm2(build: Build, smollm2_daemon: RunningDaemon, models: dict[str, Path], tmp_path: Path, name: str) -> None:
    result = _run(build.core_tests, name, env=_tool_env(smollm2_daemon, models, tmp_path))
    _assert_passed(result, name)
    _assert_tool_calls_fit_their_schemas(result)


@pytest.mark.parametrize("name", CORE_LAUNCHER)
def test_launcher(build: Build, models: dict[str, Path], tmp_path: Path, name: str) -> None:
    _assert_passed(_run(build.core_tests, name, env=_env(None, models, tmp_path)), name)


def test_the_daemon_stops_when_the_game_crashes(build: Build, models: dict[str, Path], tmp_path: Path) -> None:
    """A game that launched the daemon and died without stopping it (no Dispose, no SIGTERM): the
    daemon's --parent-pid watch ends it, even though the pipe it logs into has lost its reader."""
    result = _run(build.core_tests, "--launch-and-crash", env=_env(None, models, tmp_path))
    assert result.returncode == 17, f"{result.stdout}\n{result.stderr}"
    pid = int(result.stdout.split("DAEMON_PID ")[1].split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        psutil.Process(pid).kill()
        pytest.fail("the daemon outlived the game that launched it by 10 s")


# -- frame reports ----------------------------------------------------------------------------------

# Frame times the C# FrameStats sums up (`--frame-report`), unsorted, some over the 60 fps budget.
FRAME_INPUT = {"frames": [16.0, 17.5, 8.25, 33.3, 16.6, 100.0, 12.0, 16.7] * 9 + [15.9, 70.25], "windowMs": 1012.5,
               "budgetMs": 1000 / 60}


def expected_frame_report() -> object:
    """FRAME_INPUT's report as Python's protobuf: nearest-rank percentiles, frames over the budget."""
    import math

    from sidecar.api import pb

    frames, budget = FRAME_INPUT["frames"], FRAME_INPUT["budgetMs"]
    ordered = sorted(frames)

    def rank(q: float) -> float:
        return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]

    return pb.FrameReport(frames=len(frames), window_ms=FRAME_INPUT["windowMs"], frame_ms_p50=rank(0.5), frame_ms_p99=rank(0.99),
                          frame_ms_max=ordered[-1], frames_over_budget=sum(1 for f in frames if f > budget), frame_budget_ms=budget)


def check_frame_report_json(request: dict) -> None:
    """The request JSON the client sends for ReportFrames: proto3 JSON that Python's protobuf reads as
    the expected FrameReport, in a bridge frame the daemon's parser takes, with figures its guard accepts."""
    from google.protobuf import json_format

    from sidecar.api import pb
    from sidecar.guard.guard_task import check_report
    from sidecar.service import json_frames

    report = json_format.ParseDict(request, pb.FrameReport())  # unknown or misspelt fields fail here
    assert report == expected_frame_report(), json_format.MessageToDict(report)
    frame = json_frames.parse_client_frame(json.dumps({"id": "c1", "method": "ReportFrames", "request": request}))
    assert isinstance(frame, json_frames.CallFrame) and frame.call.name == "ReportFrames" and frame.request == report
    check_report(report)


def test_frame_report_json_on_mono(build: Build) -> None:
    result = subprocess.run([MONO, "--debug", str(build.core_tests), "--frame-report"], input=json.dumps(FRAME_INPUT),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    printed = json.loads(result.stdout)
    assert printed["grpc"] is None, "the Mono build has no gRPC codec"
    check_frame_report_json(printed["request"])


# -- the components ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", COMPONENTS_LIVE)
def test_components_hosted_by_the_stub(build: Build, daemon: RunningDaemon, models: dict[str, Path], tmp_path: Path, name: str) -> None:
    _assert_passed(_run(build.component_tests, name, env=_env(daemon, models, tmp_path)), name)


# -- .NET Core and gRPC -------------------------------------------------------------------------------


@dataclass
class DotnetBuild:
    dotnet: Path
    tests: Path
    config: Path


@pytest.fixture(scope="module")
def dotnet_build(tmp_path_factory: pytest.TempPathFactory) -> DotnetBuild:
    """The core and the gRPC transport (Runtime/Grpc) built against the .NET Core 3.1 runtime from PyPI
    (dotnetcore2), with the test program; run with `dotnet exec`. Its HttpClient speaks HTTP/2
    without TLS, which Mono's does not, so the gRPC transport is tested here."""
    if not MCS:
        _missing("mcs is not installed (apt-get install mono-mcs)")
    try:
        import dotnetcore2
    except ImportError:
        _missing("dotnetcore2 is not installed (the dev extra)")
    root = Path(dotnetcore2.__file__).parent / "bin"
    [runtime] = sorted((root / "shared" / "Microsoft.NETCore.App").iterdir())
    # All of the runtime's managed assemblies but the WinRT projections (they drag in Windows.winmd).
    refs = [f"-r:{p}" for p in sorted(runtime.glob("System.*.dll")) if "WindowsRuntime" not in p.name]
    refs += [f"-r:{runtime / 'netstandard.dll'}", f"-r:{runtime / 'Microsoft.Win32.Primitives.dll'}"]
    base = ["-nostdlib", "-noconfig", "-nowarn:1702", *refs]
    out = tmp_path_factory.mktemp("unity-dotnet")
    core, grpc, tests = out / "Xlm.Sidecar.Core.dll", out / "Xlm.Sidecar.Grpc.dll", out / "Xlm.Sidecar.Tests.exe"
    _compile("-target:library", *base, f"-out:{core}", *_sources(UNITY / "Runtime" / "Core"))
    _compile("-target:library", *base, f"-r:{core}", f"-out:{grpc}", *_sources(UNITY / "Runtime" / "Grpc"))
    _compile("-target:exe", *base, "-define:XLM_GRPC", f"-r:{core}", f"-r:{grpc}", f"-out:{tests}",
             str(CSHARP_TESTS / "TestRunner.cs"), *_sources(CSHARP_TESTS / "CoreTests"))
    config = out / "Xlm.Sidecar.Tests.runtimeconfig.json"
    config.write_text(json.dumps({"runtimeOptions": {
        "tfm": "netcoreapp3.1",
        "framework": {"name": "Microsoft.NETCore.App", "version": runtime.name},
        # No ICU on this machine; the client formats nothing culture-specific.
        "configProperties": {"System.Globalization.Invariant": True},
    }}))
    return DotnetBuild(root / "dotnet", tests, config)


def _dotnet(build: DotnetBuild, *args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(build.dotnet), "exec", "--runtimeconfig", str(build.config), str(build.tests), *args],
                          capture_output=True, text=True, env=env, input=stdin, timeout=240)


def test_core_offline_on_dotnet_core(dotnet_build: DotnetBuild) -> None:
    result = _dotnet(dotnet_build, *CORE_OFFLINE)
    for name in CORE_OFFLINE:
        _assert_passed(result, name)


@pytest.mark.parametrize("name", CORE_LIVE + (CORE_VISION if VISION else []))
def test_core_over_grpc(dotnet_build: DotnetBuild, daemon: RunningDaemon, models: dict[str, Path], tmp_path: Path, name: str) -> None:
    """The same client tests with GrpcTransport (HTTP/2 to the daemon's gRPC port) under the client."""
    env = {**_env(daemon, models, tmp_path), "XLM_TEST_TRANSPORT": "grpc", "XLM_TEST_GRPC": daemon.address}
    _assert_passed(_dotnet(dotnet_build, name, env=env), name)


@pytest.mark.parametrize("name", CORE_FRAMES)
def test_core_frame_reports_over_grpc(dotnet_build: DotnetBuild, guarded_daemon: RunningDaemon, models: dict[str, Path],
                                      tmp_path: Path, name: str) -> None:
    env = {**_env(guarded_daemon, models, tmp_path), "XLM_TEST_TRANSPORT": "grpc", "XLM_TEST_GRPC": guarded_daemon.address}
    _assert_passed(_dotnet(dotnet_build, name, env=env), name)


@pytest.mark.parametrize("name", CORE_TOOLS)
def test_core_tool_calls_over_grpc(dotnet_build: DotnetBuild, smollm2_daemon: RunningDaemon, models: dict[str, Path], tmp_path: Path,
                                   name: str) -> None:
    env = {**_tool_env(smollm2_daemon, models, tmp_path), "XLM_TEST_TRANSPORT": "grpc", "XLM_TEST_GRPC": smollm2_daemon.address}
    result = _dotnet(dotnet_build, name, env=env)
    _assert_passed(result, name)
    _assert_tool_calls_fit_their_schemas(result)
