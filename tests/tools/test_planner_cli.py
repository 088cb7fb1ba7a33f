"""The `plan` command: text and JSON reports, sweeps, other machines, and clear errors."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.planner.cli import register
from sidecar.planner.sources import load_hardware, parse_short_spec
from sidecar.testmodels import ensure_test_models

REPO = Path(__file__).resolve().parents[2]
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                 "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sidecar.planner", "plan", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def qwen_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "config.json"
    path.write_text(json.dumps(QWEN3_30B_A3B))
    return path


def test_json_schedule_for_a_config_json_on_a_laptop(qwen_config):
    result = run("--model", str(qwen_config), "--weight-type", "Q4_K_M", "--budget", "2G", "--hardware",
                 "laptop-4gb", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    schedule = data["schedule"]
    assert [t["max_tokens"] for t in schedule["tiers"]] == [1, 4, 16, 64, 512, 1024, 2048]
    assert schedule["tiers"][0]["placement"] == "STATIC"
    assert schedule["vram_bytes"] <= 2 << 30 and schedule["op_offload"]
    assert [a["name"] for a in data["anchors"]][1] == "--fit"


def test_text_report_has_tiers_runner_ups_vram_and_anchors(qwen_config):
    result = run("--model", str(qwen_config), "--budget", "2G", "--hardware", "desktop-16gb", "--ctx", "8192",
                 "--max-cpu-threads", "8")
    assert result.returncode == 0, result.stderr
    for text in ("Plan per token tier", "runner-up", "VRAM by component", "kv_cache", "-ot", "--fit", "-ngl",
                 "geometric mean", "CPU threads 8", "context 8192"):
        assert text in result.stdout, text


def test_gguf_on_a_short_hardware_spec(tmp_path):
    model = ensure_test_models(tmp_path)["tiny_qwen3moe"]
    result = run("--model", str(model), "--budget", "1M", "--json", "--no-anchors", "--hardware",
                 "cpu=4/8,dram=50,ram=16G,gpu=2G,gpu_bw=200,tflops=8,pcie=3.0x16")
    assert result.returncode == 0, result.stderr
    schedule = json.loads(result.stdout)["schedule"]
    assert schedule["vram_bytes"] <= 1 << 20
    assert max(t["threads"] for t in schedule["tiers"]) <= 8


def test_sweep_prints_rates_across_budgets(qwen_config):
    result = run("--model", str(qwen_config), "--hardware", "laptop-4gb", "--sweep", "--decode-tiers", "1,4",
                 "--prefill-tiers", "512")
    assert result.returncode == 0, result.stderr
    assert "Predicted tokens/s across VRAM budgets" in result.stdout
    for budget in ("0", "512M", "1G", "2G", "4G"):
        assert f"\n│ {budget} " in result.stdout or f"│ {budget:<6s}" in result.stdout


def test_sweep_plot(qwen_config, tmp_path):
    png = tmp_path / "sweep.png"
    result = run("--model", str(qwen_config), "--hardware", "laptop-4gb", "--sweep", "--plot", str(png),
                 "--decode-tiers", "1", "--prefill-tiers", "512")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert result.returncode == 1 and "matplotlib" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budget", "3"], "no unit"),
        (["--budget", "2G", "--hardware", "laptop-99gb"], "preset"),
        (["--budget", "2G", "--model", "/nonexistent.gguf"], "nonexistent"),
        ([], "--budget is required"),
        (["--budget", "1G", "--weight-type", "Q4_0"], "config.json"),
    ],
)
def test_errors_are_clear(args, message):
    result = run(*args, "--hardware", "cpu-only") if "--hardware" not in args else run(*args)
    assert result.returncode == 2
    assert message in result.stderr


def test_projector_is_refused(tmp_path):
    model = ensure_test_models(tmp_path)["tiny_projector"]
    result = run("--model", str(model), "--budget", "1G", "--hardware", "laptop-4gb")
    assert result.returncode == 1 and "projector" in result.stderr


def test_register_adds_plan_to_another_cli():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["plan", "--budget", "2G", "--hardware", "laptop-4gb", "--json"])
    assert args.command == "plan" and args.budget == "2G" and args.run is args.func


@pytest.mark.parametrize(
    "text, expected",
    [
        ("cpu=8/16,dram=60", {"cpu": {"cores": 8, "threads": 16, "dram_gbps": 60.0}}),
        ("cpu=4,ram=8G,gpu=2G,gpu_bw=100,tflops=5,pcie=4.0x4",
         {"cpu": {"cores": 4, "threads": 4}, "ram": "8G",
          "gpu": {"vram": "2G", "mem_gbps": 100.0, "tflops": 5.0, "pcie": "4.0x4"}}),
    ],
)
def test_parse_short_spec(text, expected):
    assert parse_short_spec(text) == expected


def test_hardware_files(tmp_path):
    spec = tmp_path / "laptop.json"
    spec.write_text(json.dumps({"name": "friend's laptop", "cpu": {"cores": 6, "threads": 12, "dram_gbps": 50},
                                "gpu": {"vram": "6G", "mem_gbps": 288, "tflops": 13, "pcie": "4.0x8"}}))
    hw, source = load_hardware(str(spec))
    assert hw.name == "friend's laptop" and hw.gpu.vram_bytes == 6 << 30 and source.startswith("spec")
    with pytest.raises(ValueError):
        parse_short_spec("gpu")
    with pytest.raises(ValueError):
        parse_short_spec("cores=8")
