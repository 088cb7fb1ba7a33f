"""The GPU check's parts that need no GPU (deploy/gpu_check.py, deploy/gpucheck/).

This machine has no GPU: the check itself has not run here. What runs here for real: argument
parsing and the dry run, the choice of configurations and the table, llama-bench's command line
and output, the generated Q4_K mixture-of-experts model (loaded and run by llama.cpp on the CPU),
and the daemon measurement (budget 0, so VRAM reads 0 without NVML).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "deploy"))

from gpucheck import llama_bench  # noqa: E402
from gpucheck.moe_model import MoeShape, q4k_blocks, write_moe_model  # noqa: E402
from gpucheck.report import GIB, BudgetResult, Measured, best_within, ncmoe_candidates, ngl_candidates, render_table  # noqa: E402

SMALL = MoeShape(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=8, n_expert_used=2, n_ff_exp=512, ctx=2048)


def _gpu_check():
    import gpu_check

    return gpu_check


def test_arguments_and_budgets() -> None:
    gc = _gpu_check()
    args = gc.parse_args([])
    assert args.budget_bytes == [2 * GIB, 4 * GIB, 8 * GIB] and args.moe_layers == 28 and not args.dry_run
    assert gc.parse_args(["--budgets", "1.5G, 3G"]).budget_bytes == [int(1.5 * GIB), 3 * GIB]
    with pytest.raises(SystemExit):
        gc.parse_args(["--budgets", "0"])
    with pytest.raises(Exception, match="no unit"):
        gc.parse_args(["--budgets", "2048"])
    assert [gc._size(b) for b in (2 * GIB, int(2.5 * GIB), 700 << 20)] == ["2G", "2.5G", "700M"]


def test_dry_run_prints_every_step_and_runs_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    gc = _gpu_check()
    assert gc.main(["--dry-run", "--workdir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split(":")[0].split(". ", 1)[1] for line in lines]
    assert names[:6] == ["gpu", "cuda-build", "peer-build", "profile", "model", "cuda-context"]
    for budget in ("2G", "4G", "8G"):
        assert [f"plan {budget}", f"daemon {budget}", f"by hand {budget}", f"fit {budget}"] == [n for n in names if n.endswith(budget)]
    assert "--budget 8G" in lines[names.index("daemon 8G")]
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing built
    assert gc.main(["--dry-run", "--skip-peers", "--budgets", "2G", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "llama-bench" not in out and "daemon 2G" in out


def test_a_failed_step_is_reported_and_the_rest_still_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lent GPU machine runs the check once: one llama-bench configuration failing must not
    lose the other budgets' figures, and results are on disk after every step."""
    gc = _gpu_check()
    args = gc.parse_args(["--budgets", "2G,4G", "--out", str(tmp_path / "out"), "--workdir", str(tmp_path)])
    check = gc.GpuCheck(args)
    ran: list[str] = []

    def step(name: str, fail: bool = False):
        def run() -> None:
            ran.append(name)
            assert (tmp_path / "out" / "results.json").is_file() or not ran[:-1]  # written after the earlier step
            if fail:
                raise RuntimeError(f"{name} broke")
        return gc.Step(name, name, run)

    steps = [step("gpu"), step("by hand 2G", fail=True), step("daemon 4G")]
    monkeypatch.setattr(check, "steps", lambda: steps)
    assert check.run(dry_run=False) == 4
    assert ran == ["gpu", "by hand 2G", "daemon 4G"]
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["errors"] == {"by hand 2G": "RuntimeError: by hand 2G broke"} and saved["skipped"] == []
    assert set(saved["step_seconds"]) == {"gpu", "by hand 2G", "daemon 4G"}

    fatal = gc.GpuCheck(args)
    monkeypatch.setattr(fatal, "steps", lambda: [step("model", fail=True), step("daemon 4G")])
    with pytest.raises(RuntimeError, match="model broke"):  # nothing can be measured without the model
        fatal.run(dry_run=False)

    late = gc.GpuCheck(gc.parse_args(["--budgets", "2G", "--deadline-s", "0", "--out", str(tmp_path / "late")]))
    monkeypatch.setattr(late, "steps", lambda: [step("gpu"), step("daemon 2G")])
    ran.clear()
    assert late.run(dry_run=False) == 0 and ran == []
    assert json.loads((tmp_path / "late" / "results.json").read_text())["skipped"] == ["gpu", "daemon 2G"]


def test_best_configuration_is_the_fastest_within_the_budget() -> None:
    runs = [Measured("-ngl 4", 20.0, int(1.9 * GIB)), Measured("-ngl 5", 25.0, int(2.2 * GIB)),
            Measured("-ngl 99 -ncmoe 24", 30.0, int(1.95 * GIB))]
    assert best_within(runs, 2 * GIB).label == "-ngl 99 -ncmoe 24"
    assert best_within(runs, 1 * GIB) is None
    assert best_within(runs, 3 * GIB).tokens_per_s == 30.0


@pytest.mark.parametrize(("planned", "n_layer", "expected"), [(4, 28, [3, 4, 5]), (0, 28, [0, 1]), (28, 28, [27, 28])])
def test_ngl_candidates(planned: int, n_layer: int, expected: list[int]) -> None:
    assert ngl_candidates(planned, n_layer) == expected


def test_ncmoe_candidates_put_the_rest_of_the_budget_into_expert_layers() -> None:
    # 28 layers of 340 MB experts, 0.5 GB of everything else: 2 GiB leaves room for 4 layers' experts.
    assert ncmoe_candidates(340_000_000, 500_000_000, 28, 2 * GIB) == [23, 24, 25]
    assert ncmoe_candidates(340_000_000, 3 * GIB, 28, 2 * GIB) == [27, 28]  # nothing fits: all on the CPU
    assert ncmoe_candidates(340_000_000, 0, 28, 100 * GIB) == [0, 1]


def test_table_compares_with_the_best_peer_that_fits() -> None:
    r = BudgetResult(2 * GIB, predicted=31.0, predicted_ngl=20.0, predicted_fit=22.0)
    r.measured = Measured("xlm-sidecar", 30.0, int(1.8 * GIB))
    r.manual = [Measured("-ngl 4", 20.0, int(1.9 * GIB)), Measured("-ngl 9", 60.0, 5 * GIB)]
    r.fit = Measured("--fit", 24.0, int(1.7 * GIB))
    table = render_table([r, BudgetResult(4 * GIB)])
    row = table.splitlines()[2]
    assert row.startswith("   2G") and "-ngl 4" in row and "1.25x" in row  # 30 / max(20, 24)
    assert "none fits" in table.splitlines()[3]


def test_llama_bench_command_and_output() -> None:
    binary, model = Path("/opt/llama-bench"), Path("/m.gguf")
    assert llama_bench.command(binary, model, llama_bench.BenchConfig("x", n_gpu_layers=4))[-2:] == ["-ngl", "4"]
    assert llama_bench.command(binary, model, llama_bench.BenchConfig("x", n_gpu_layers=99, n_cpu_moe=20))[-4:] == ["-ngl", "99", "-ncmoe", "20"]
    fit = llama_bench.command(binary, model, llama_bench.BenchConfig("x", fit_margin_mib=135000))
    assert fit[-4:] == ["-fitt", "135000", "-fitc", "4096"] and "-ngl" not in fit
    out = json.dumps([{"n_prompt": 0, "n_gen": 64, "n_gpu_layers": 4, "avg_ts": 41.5, "stddev_ts": 0.3}])
    assert llama_bench.decode_tokens_per_s(out) == 41.5
    with pytest.raises(ValueError):
        llama_bench.decode_tokens_per_s(json.dumps([{"n_prompt": 512, "n_gen": 0, "avg_ts": 900.0}]))
    cmds = llama_bench.build_commands(Path("/w"), Path("/w/b"), "90", 16, source=Path("/src"))
    assert cmds[0][:4] == ["cmake", "-S", "/src/vendor/llama.cpp", "-B"] and "-DCMAKE_CUDA_ARCHITECTURES=90" in cmds[0]
    assert cmds[1][-2:] == ["--target", "llama-bench"]


def test_q4k_blocks_dequantize_to_small_centred_weights() -> None:
    import gguf

    blocks = q4k_blocks(seed=1, n_blocks=64, fan_in=2048)
    weights = gguf.quants.dequantize(blocks.reshape(1, -1), gguf.GGMLQuantizationType.Q4_K)
    assert np.isfinite(weights).all()
    assert abs(float(weights.mean())) < 0.01 and 0.01 < float(weights.std()) < 0.06  # about 1/sqrt(2048) = 0.022


def test_generated_moe_loads_and_runs_in_llama_cpp(tmp_path: Path) -> None:
    import llama_cpp

    from gpu_check import _model_sizes

    path = write_moe_model(tmp_path / "moe.gguf", SMALL)
    assert abs(path.stat().st_size - SMALL.file_bytes()) < 0.01 * SMALL.file_bytes()
    n_layer, expert_bytes, dense_bytes = _model_sizes(path)
    assert n_layer == 2 and expert_bytes == 3 * 8 * 512 * 256 * 144 // 256 and dense_bytes > 0
    llm = llama_cpp.Llama(str(path), n_ctx=256, verbose=False)
    try:
        llm.eval(llm.tokenize(b"The guard asked"))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))
        assert np.isfinite(logits).all() and logits.std() > 0.1  # a spread, so sampling varies
    finally:
        llm.close()
    with pytest.raises(ValueError, match="multiple of 256"):
        MoeShape(n_embd=300).validate()


def test_default_model_is_larger_than_every_budget() -> None:
    assert MoeShape().file_bytes() > 8 * GIB


def test_daemon_measurement_on_the_cpu(tmp_path: Path) -> None:
    from gpucheck.daemon_run import measure_daemon

    path = write_moe_model(tmp_path / "moe.gguf", SMALL)
    m = measure_daemon([sys.executable, "-m", "sidecar"], path, "0", 1024, timeout_s=120)
    assert m.tokens_per_s > 0 and m.peak_vram_bytes == 0 and m.llama_vram_bytes == 0 and m.placement == "cpu only"
