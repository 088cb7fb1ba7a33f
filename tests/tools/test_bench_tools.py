"""The benchmark tools' own logic, on small synthetic data: no benchmark runs here.

report.py renders the README section and PNGs from fixture results; run.py's help names every
scenario; the soak's checks (tokens against the reference, memory growth, p99 gap) catch what
they must; the roofline's bytes per token add up for the real SmolLM2 header.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import common, report, soak
from bench.soak import RequestRecord

REPO = Path(__file__).resolve().parents[2]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

MACHINE = {"cpu": "Test CPU 9000", "physical_cores": 4, "logical_cores": 8, "ram_bytes": 16 << 30, "gpus": [],
           "os": "Linux-test", "python": "3.11.0", "llama_cpp_python": "0.3.36", "load_average_1m": 0.1, "dram_gbps": 40.0}


def record(scenario: str, results: dict, timestamp: str = "2026-11-29T10:00:00+0000", **extra) -> dict:
    return {"scenario": scenario, "commit": "0123456789abcdef", "dirty": False, "machine": MACHINE,
            "command": f"python bench/run.py {scenario} --repeats 3", "timestamp": timestamp, "repeats": 3,
            "quick": False, "model": "SmolLM2.gguf", "results": results, "error": None, **extra}


FIXTURES = {
    "single": {"tokens": 128, "rows": {"daemon (its own choice)": [90.0, 92.0, 88.0], "Llama() defaults": [60.0, 61.0, 59.0],
                                       "llama-bench tg128 (t=2)": [95.0]},
               "ttft_ms": {"daemon (its own choice)": [40.0, 42.0, 41.0], "Llama() defaults": [55.0, 50.0, 60.0]},
               "ratios": {"vs_defaults": 1.5, "vs_hand_tuned": 1.0, "vs_llama_bench": 0.95, "ttft_vs_defaults": 0.75,
                          "llama_bench_vs_defaults": 1.58}},
    "batch": {"max_tokens": 64, "token_counting": "tokens = the streamed text, tokenized",
              "table": {"daemon": {"1": [90.0, 91.0], "4": [200.0, 210.0], "16": [400.0, 390.0], "64": [500.0, 520.0]},
                        "llama-cpp-python server": {"1": [80.0, 82.0], "4": [80.0, 81.0], "16": [79.0, 80.0], "64": [78.0, 80.0]}},
              "ratios": {"vs_llama_cpp_python_1": 1.1, "vs_llama_cpp_python_4": 2.5, "vs_llama_cpp_python_16": 5.0,
                         "vs_llama_cpp_python_64": 6.5}},
    "roofline": {"decode_tokens_per_s": [90.0, 95.0], "achieved_gbps": [8.9, 9.4], "dram_gbps": 40.0, "ratio": [0.22, 0.235],
                 "kv_type": "F16", "traffic": {"weight_bytes": 96.6e6, "kv_bytes": 2.2e6, "mean_context": 96.0, "total": 98.8e6}},
    "planner": {"fidelity": {"median_abs_error": 0.12, "worst_decision_loss": 0.03,
                             "points": [{"model": "smollm2", "phase": "decode", "tokens": 1, "threads": 2, "n_ubatch": 512,
                                         "measured_ms": 10.0, "predicted_ms": 11.0, "error": 0.1},
                                        {"model": "smollm2", "phase": "prefill", "tokens": 512, "threads": 2, "n_ubatch": 512,
                                         "measured_ms": 300.0, "predicted_ms": 270.0, "error": -0.1}],
                             "decisions": [{"model": "smollm2", "tier": "decode 1", "chosen": "t2 ub512", "chosen_ms": 10.0,
                                            "best": "t2 ub512", "best_ms": 10.0, "loss": 0.0}]},
                "budget_sweep": {"points": [{"vram_bytes": 0, "max_cpu_threads": 1, "predicted_tokens_per_s": 60.0,
                                             "measured_tokens_per_s": [55.0, 58.0]},
                                            {"vram_bytes": 0, "max_cpu_threads": 2, "predicted_tokens_per_s": 90.0,
                                             "measured_tokens_per_s": [85.0, 88.0]}]}},
    "vision": {"flash_compute_bytes": {"flash": 121 << 20, "no_flash": 1132 << 20},
               "runs": [{"resolution": "480p", "mode": m, "latency_s": 60.0, "encode_ms": 55000.0, "rss_encode_peak": (900 if m == "vlmopt" else 1500) << 20,
                         "rss_decode_peak": (300 if m == "vlmopt" else 1100) << 20,
                         "vram": {"peak_vlmopt": 1000 << 20, "peak_resident": 1700 << 20}} for m in ("vlmopt", "resident")]},
    "churn": {"via": "engine", "streams": 8, "every_s": 2.0, "pause_ms": [300.0, 350.0, 500.0], "pause_p90_ms": 500.0,
              "max_gap_ms": [700.0], "ok": True, "problems": []},
}


def write_fixtures(folder: Path) -> None:
    for name, results in FIXTURES.items():
        (folder / f"{name}-20261129T100000-01234567.json").write_text(json.dumps(record(name, results)))


def test_report_renders_every_section_and_its_plots(tmp_path: Path) -> None:
    results, out = tmp_path / "results", tmp_path / "docs" / "perf"
    results.mkdir()
    write_fixtures(results)
    body = report.render(report.load_latest(results), out, "docs/perf")

    for png in ("single_stream.png", "batch_throughput.png", "planner_fidelity.png", "budget_tokens_per_s.png", "vision_memory.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC, png
        assert f"](docs/perf/{png})" in body
    assert "Test CPU 9000, 4 cores / 8 threads, 16 GiB RAM (DRAM read 40 GB/s measured); no GPU" in body
    assert "python bench/run.py batch --repeats 3" in body
    assert "| daemon (its own choice) | 90.0 [88.0 .. 92.0] | 41 [40 .. 42] |" in body
    assert "llama.cpp's own best (llama-bench) / Llama() defaults is 1.58x" in body
    assert "| daemon | 90.5 [90.0 .. 91.0] | 205.0 [200.0 .. 210.0] | 395.0 [390.0 .. 400.0] | 510.0 [500.0 .. 520.0] |" in body
    assert "median 350, p90 500, max 500" in body
    assert "**12.0%**" in body
    # The session scenario has no fixture: the section says how to run it.
    assert "Not run: `python bench/run.py session`." in body


def test_report_replaces_only_the_text_between_the_markers(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    write_fixtures(results)
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nintro\n\n## Performance\n\n{report.BEGIN}\nold figures\n{report.END}\n\n## After\n\nkept\n")
    code = report.main(["--json-dir", str(results), "--out-dir", str(tmp_path / "docs" / "perf"), "--readme", str(readme)])
    text = readme.read_text()
    assert code == 0
    assert "old figures" not in text
    assert text.startswith("# Title\n\nintro\n\n## Performance\n\n" + report.BEGIN + "\n")
    assert text.endswith(report.END + "\n\n## After\n\nkept\n")
    assert "](docs/perf/batch_throughput.png)" in text


def test_report_refuses_a_readme_without_markers(tmp_path: Path) -> None:
    with pytest.raises(report.MarkersMissing):
        report.replace_section("# no markers here\n", "body")
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    assert report.main(["--json-dir", str(tmp_path), "--out-dir", str(tmp_path / "p"), "--readme", str(readme)]) == 2
    assert readme.read_text() == "# no markers\n"


def test_report_takes_the_newest_result_of_each_scenario(tmp_path: Path) -> None:
    old = record("roofline", FIXTURES["roofline"] | {"dram_gbps": 10.0}, timestamp="2026-11-01T10:00:00+0000")
    new = record("roofline", FIXTURES["roofline"] | {"dram_gbps": 77.0}, timestamp="2026-11-29T10:00:00+0000")
    (tmp_path / "roofline-b.json").write_text(json.dumps(old))
    (tmp_path / "roofline-a.json").write_text(json.dumps(new))
    (tmp_path / "not-a-record.json").write_text("[1, 2]")
    latest = report.load_latest(tmp_path)
    assert list(latest) == ["roofline"]
    assert latest["roofline"]["results"]["dram_gbps"] == 77.0


def test_report_marks_quick_and_failed_runs(tmp_path: Path) -> None:
    records = {"roofline": record("roofline", FIXTURES["roofline"], quick=True) | {"quick": True},
               "churn": record("churn", {}) | {"error": "RuntimeError: boom"}}
    body = report.render(records, tmp_path, "p")
    assert "A smoke run (`--quick`)" in body
    assert "The run failed: RuntimeError: boom." in body


def test_run_help_lists_every_scenario() -> None:
    from bench.run import SCENARIOS

    out = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for name in ("single", "batch", "roofline", "planner", "vision", "churn", "session", "village", "soak", "all"):
        assert f"  {name} " in out.stdout, name
    for name, scenario in SCENARIOS.items():
        assert f"  {name:15}{scenario.about}" in out.stdout, name
    bad = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "nonsense"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_run_works_as_a_module_and_from_elsewhere(tmp_path: Path) -> None:
    # As a module from the repository's root; by path from another folder (bench/ then comes
    # first on sys.path and the package is loaded by location), with a scenario's own options.
    module = subprocess.run([sys.executable, "-m", "bench.run", "soak", "--help"], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert module.returncode == 0, module.stderr
    assert "soak options:" in module.stdout and "--duration" in module.stdout
    by_path = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "churn", "--help"], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)
    assert by_path.returncode == 0, by_path.stderr
    assert "churn options:" in by_path.stdout and "--via" in by_path.stdout
    # A scenario's option without that scenario is refused, as any unknown option is.
    wrong = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "single", "--duration", "3"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert wrong.returncode == 2 and "unrecognized arguments: --duration 3" in wrong.stderr
    report_help = subprocess.run([sys.executable, str(REPO / "bench" / "report.py"), "--help"], capture_output=True,
                                 text=True, timeout=60, cwd=tmp_path)
    assert report_help.returncode == 0, report_help.stderr


def test_every_scenario_resolves_and_every_bench_module_imports() -> None:
    from bench.run import SCENARIOS, _resolve, build_parser

    for name, scenario in SCENARIOS.items():
        assert callable(_resolve(scenario.run)), name
    # Every scenario's options at once, as `all` and single runs build them (the suite's must not clash).
    build_parser([name for name, s in SCENARIOS.items() if s.suite])
    for name in SCENARIOS:
        build_parser([name])
    folder = REPO / "bench"
    for info in pkgutil.iter_modules([str(folder)]):
        importlib.import_module(f"bench.{info.name}")


# -- the soak's checks --------------------------------------------------------------------------------------

REF = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]


@pytest.mark.parametrize(("got", "max_tokens", "completed", "expected"), [
    (REF, 10, True, None),
    (REF[:6], 6, True, None),                       # a shorter max_tokens cuts the reference
    (REF[:4], 10, False, None),                     # cancelled: a prefix is right
    (REF[:3] + REF[4:], 10, True, "token lost at 3"),
    (REF[:5] + [REF[4]] + REF[5:9], 10, True, "token duplicated at 5"),
    (REF[:2] + [99] + REF[3:], 10, True, "different token at 2 (expected 12, got 99)"),
    (REF[:7], 10, True, "reply ended after 7 of 10 tokens"),
    (REF + [20], 10, True, "1 token(s) past the expected 10"),
    ([10, 11, 99], 10, False, "different token at 2 (expected 12, got 99)"),
])
def test_token_check_names_what_went_wrong(got, max_tokens, completed, expected) -> None:
    assert soak.token_problem(REF, got, max_tokens, completed) == expected


def test_a_reference_that_stopped_early_is_whole() -> None:
    assert soak.token_problem(REF[:5], REF[:5], 96, completed=True) is None
    assert soak.token_problem(REF[:5], REF[:4], 96, completed=True) == "reply ended after 4 of 5 tokens"


def test_rss_growth_and_percentile() -> None:
    assert soak.rss_growth(1000, 1049) == pytest.approx(0.049)
    assert soak.rss_growth(1000, 900) == pytest.approx(-0.1)
    values = [float(v) for v in range(1, 101)]
    assert common.percentile(values, 99) == 99.0
    assert common.percentile(values, 50) == 50.0
    assert common.percentile([5.0], 99) == 5.0
    assert common.percentile([], 99) == 0.0


def test_spread_prints_the_median_and_the_ends() -> None:
    assert common.spread([3.0, 1.0, 2.0]) == "     2.0  [1.0 .. 3.0]"
    assert common.spread([0.25, 0.5, 0.75], "8.2f") == "    0.50  [0.25 .. 0.75]"
    assert report.cell([3.0, 1.0, 2.0]) == "2.0 [1.0 .. 3.0]"
    assert report.cell([7.0], 0) == "7" and report.cell([]) == "-"


def good(prompt: int = 0, gaps: tuple[float, ...] = (0.05, 0.05)) -> RequestRecord:
    return RequestRecord(prompt, 10, None, tokens=list(REF), gaps_s=list(gaps), finish="FINISH_REASON_LENGTH", reported_tokens=10)


def test_evaluate_passes_a_clean_soak() -> None:
    cancelled = RequestRecord(0, 10, 3, tokens=REF[:3], gaps_s=[0.05], finish="cancelled")
    verdict = soak.evaluate([good(), good(), cancelled], [REF], 1000, 1040, max_gap_s=2.0)
    assert verdict.ok, verdict.failures
    assert (verdict.requests, verdict.completed, verdict.cancelled) == (3, 2, 1)


def test_evaluate_fails_on_each_broken_promise() -> None:
    dropped = RequestRecord(0, 10, None, tokens=REF[:4])  # no final chunk, not cancelled by us
    lost = RequestRecord(0, 10, None, tokens=REF[:3] + REF[4:], finish="FINISH_REASON_LENGTH", reported_tokens=9)
    miscounted = RequestRecord(0, 10, None, tokens=list(REF), finish="FINISH_REASON_LENGTH", reported_tokens=11)
    errored = RequestRecord(0, 10, None, error="UNAVAILABLE: gone")
    verdict = soak.evaluate([good(), dropped, lost, miscounted, errored], [REF], 1000, 1000, max_gap_s=2.0)
    text = "\n".join(verdict.failures)
    assert "request 1 (prompt 0, max_tokens 10): dropped" in text
    assert "request 2 (prompt 0, max_tokens 10): token lost at 3" in text
    assert "request 3 (prompt 0, max_tokens 10): final says 11 tokens, 10 streamed" in text
    assert "request 4 (prompt 0, max_tokens 10): failed: UNAVAILABLE: gone" in text
    assert not verdict.ok


def test_evaluate_fails_on_memory_growth_and_slow_gaps() -> None:
    slow = [good(gaps=(0.05,) * 98 + (3.0, 3.0))]
    assert soak.evaluate([good()], [REF], 1000, 1049, max_gap_s=2.0).ok
    grown = soak.evaluate([good()], [REF], 1000, 1050, max_gap_s=2.0)
    assert grown.failures == ["resident memory grew +5.0% (limit +5%)"]
    gaps = soak.evaluate(slow, [REF], 1000, 1000, max_gap_s=2.0)
    assert gaps.failures == ["p99 gap between chunks 3000 ms (limit 2000 ms)"] and gaps.gap_p99_s == 3.0


def test_gaps_are_told_apart_by_budget_calls() -> None:
    r = good(gaps=(0.1, 0.1, 2.0))
    r.gap_ends = [1.0, 1.1, 5.0]
    inside, outside = soak.gaps_during([r], [(3.5, 4.0)])
    assert inside == [2.0] and outside == [0.1, 0.1]


# -- the roofline's arithmetic ---------------------------------------------------------------------------------


def test_bytes_per_token_of_smollm2_add_up(smollm2_path: Path) -> None:
    from bench import roofline

    from sidecar.model_info import inspect_gguf

    info = inspect_gguf(smollm2_path)
    short, long = roofline.bytes_per_token(info, 100), roofline.bytes_per_token(info, 200)
    # Dense and tied: a token reads every weight once, one embedding row, and the embedding again
    # as the output matrix: about the file's size.
    assert 0.9 * smollm2_path.stat().st_size < short.weight_bytes < 1.1 * smollm2_path.stat().st_size
    # F16 keys and values, 30 layers x 3 KV heads x 64 x 2 (K and V) x 2 bytes per cached token.
    assert short.kv_bytes == pytest.approx(100 * 30 * 3 * 64 * 2 * 2)
    assert long.kv_bytes == pytest.approx(2 * short.kv_bytes)
    achieved, ratio = roofline.roofline_ratio(100.0, short, 50.0)
    assert achieved == pytest.approx(100.0 * short.total / 1e9)
    assert ratio == pytest.approx(achieved / 50.0)


def test_xlm_sidecar_bench_hands_every_argument_to_the_runner() -> None:
    out = subprocess.run([sys.executable, "-m", "sidecar", "bench", "--help"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: bench/run.py")
    bad = subprocess.run([sys.executable, "-m", "sidecar", "bench", "nonsense", "--quick"], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert bad.returncode == 2 and "bench/run.py: error" in bad.stderr


def test_a_streamed_reply_carries_the_prompt_tokens_the_server_computed() -> None:
    # The events are the shape llama-server's /v1/chat/completions streams (its last event holds
    # `timings`); a replay, since llama-server is built outside the repo. The village benchmark
    # sums `prompt_computed` as llama-server's own count of prompt tokens computed.
    import httpx

    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"index": 0, "delta": {"content": "Hello"}}]},
        {"choices": [{"index": 0, "delta": {"content": " there"}, "finish_reason": None}]},
        {"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 1094, "total_tokens": 1096},
         "timings": {"cache_n": 1012, "prompt_n": 82, "predicted_n": 2}},
    ]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=body, headers={"content-type": "text/event-stream"}))
    peer = common.HttpPeer("replay", process=None, base_url="http://replay")  # type: ignore[arg-type]
    with httpx.Client(transport=transport) as client:
        got = peer.chat_stream(client, [{"role": "user", "content": "hi"}], 2)
    assert (got.text, got.events, got.reported_tokens, got.prompt_computed) == ("Hello there", 2, 2, 82)
    without = body.replace(', "timings": {"cache_n": 1012, "prompt_n": 82, "predicted_n": 2}', "")
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=without))
    with httpx.Client(transport=transport) as client:
        assert peer.chat_stream(client, [{"role": "user", "content": "hi"}], 2).prompt_computed is None


# -- tool-choice's tally ------------------------------------------------------------------------------------


def test_tool_choice_counts_calls_words_and_cut_calls() -> None:
    from bench import tool_choice as tc

    call = {"content": None, "tool_calls": [{"function": {"name": "give_item", "arguments": "{}"}}]}
    assert tc.outcome(call, "tool_calls") == "call:give_item"
    assert tc.outcome({"content": '{"name":"give_it'}, "length") == "cut call"
    assert tc.outcome({"content": "Hello there"}, "stop") == "words"
    assert tc.outcome({"content": "Hello there"}, "length") == "words"
    rows = [{"case": "hello", "temperature": 0.0, "outcome": "call:give_item", "placeholder": False},
            {"case": "joke", "temperature": 0.0, "outcome": "words", "placeholder": True},
            {"case": "give-potion", "temperature": 0.0, "outcome": "call:get_current_weather", "placeholder": False},
            {"case": "give-key", "temperature": 0.0, "outcome": "cut call", "placeholder": False},
            {"case": "weather-paris", "temperature": 0.7, "outcome": "words", "placeholder": False}]
    summary = tc.summarize(rows)
    assert summary["0"] == {"no_tool_in_words": 1, "no_tool": 2, "tool_called": 2, "tool_right_function": 0, "tool": 2,
                            "placeholders": 1}
    assert summary["0.7"]["tool_called"] == 0 and summary["0.7"]["tool"] == 1
