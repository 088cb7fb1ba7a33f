#!/usr/bin/env python3
"""GPU check: on a machine with an NVIDIA GPU, does the daemon keep within a VRAM budget, run as
fast as the planner says, and beat llama.cpp's own ways of fitting a model into that budget?

Steps (`--dry-run` prints them with their commands and runs nothing):
  1. the GPU, through nvidia-smi and NVML;
  2. llama-cpp-python with CUDA in this venv (deploy/cuda/build_linux.sh when it lacks CUDA);
  3. llama.cpp's llama-bench with CUDA, built from the same vendored source (unless found);
  4. `xlm-sidecar profile --quick`: this machine's profile for the planner;
  5. a mixture-of-experts model larger than the largest budget (a generated qwen3moe with
     Qwen3-30B-A3B's shapes in Q4_K, about 9.8 GB; or --model);
  6. the CUDA context every process pays (llama-bench on a tiny model, nothing offloaded);
  7. per budget (default 2G, 4G, 8G): `xlm-sidecar plan` (predicted decode tokens/s, for us
     and for llama.cpp's -ngl and --fit as the planner models them); the daemon serving with
     that budget (measured decode tokens/s, VRAM); llama-bench by hand (-ngl N near the best that
     fits, and all layers with the experts of the first K on the CPU, -ncmoe K), keeping the
     fastest that stayed within the budget; llama-bench with llama.cpp's own fit (-fitt: leave
     all free memory but the budget);
  8. a budget churn with real reloads: 8 live streams on the model while SetBudget alternates the
     largest and the smallest budget (bench/run.py churn --via daemon): pauses, gaps, token identity;
  9. the table, and a JSON file with every number (--json; --out DIR writes both, and the churn).

Offline (`--offline`, what deploy/gpu_bundle.py's run.sh uses on a GPU machine that reaches no
package registry): nothing is built or fetched; a llama-cpp-python without CUDA is an error, and
llama.cpp's peers run only when --llama-bench names a CUDA build.

The check (steps 4-8) is meant to take under 10 minutes on a 16-core machine; the one-time CUDA
builds (steps 2-3) come on top when they have not been done. VRAM is NVML's peak for each process
less the CUDA context (step 6), so the daemon and llama-bench are measured alike.

    python deploy/gpu_check.py [--budgets 2G,4G,8G] [--model M.gguf] [--llama-bench PATH]
                               [--workdir DIR] [--cuda-arch native] [--json OUT] [--out DIR]
                               [--offline] [--skip-churn] [--deadline-s S] [--dry-run]

A step that fails (a llama-bench configuration, one budget's daemon) is reported and the check goes
on; results.json and table.md are rewritten after every step, and --deadline-s skips the steps
that would start after it, so a run cut short on a lent machine keeps what it measured. Exit 0:
all done within the time target; 3: done, slower than the target; 4: some step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
REPO = DEPLOY.parent
sys.path[:0] = [str(REPO), str(DEPLOY)]

from gpucheck import llama_bench  # noqa: E402
from gpucheck.report import GIB, BudgetResult, Measured, ncmoe_candidates, ngl_candidates, render_table  # noqa: E402

MIB = 1 << 20
TIME_TARGET_S = 600
# Without these nothing after them can be measured: their failure ends the check.
FATAL_STEPS = frozenset({"gpu", "cuda-build", "model"})
XLM_SIDECAR = [sys.executable, "-m", "sidecar"]
CTX = 4096


@dataclass(frozen=True)
class Step:
    """One step: what it does (for --dry-run and the log) and how."""

    name: str
    what: str
    run: Callable[[], None]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", default="2G,4G,8G", help="VRAM budgets to check, comma-separated (default 2G,4G,8G)")
    p.add_argument("--model", type=Path, help="a MoE GGUF larger than the smallest budget (default: generate one)")
    p.add_argument("--moe-layers", type=int, default=28, help="layers of the generated model (28: about 9.8 GB)")
    p.add_argument("--llama-bench", type=Path, help="a CUDA llama-bench to compare with (default: build one)")
    p.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "xlm-sidecar" / "gpu-check",
                   help="where the model and the llama-bench build are kept between runs")
    p.add_argument("--llama-cpp-source", type=Path,
                   help="an unpacked llama-cpp-python 0.3.36 sdist, for GPU machines without PyPI (default: fetch it)")
    p.add_argument("--cuda-arch", default="native", help="CMAKE_CUDA_ARCHITECTURES for the builds (default: native)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 4, help="parallel compile jobs")
    p.add_argument("--skip-peers", action="store_true", help="measure the daemon only (no llama-bench)")
    p.add_argument("--json", type=Path, help="write every number here")
    p.add_argument("--out", type=Path, help="write the table (table.md), every number (results.json) and the churn here")
    p.add_argument("--offline", action="store_true",
                   help="build and fetch nothing: CUDA must be in llama-cpp-python already; peers only with --llama-bench")
    p.add_argument("--skip-churn", action="store_true", help="no budget churn step")
    p.add_argument("--dry-run", action="store_true", help="print the steps and their commands; run nothing")
    p.add_argument("--deadline-s", type=float, default=float("inf"),
                   help="skip the steps that would start after this many seconds (a lent machine's time is short)")
    args = p.parse_args(argv)
    from sidecar.budget import parse_size

    args.budget_bytes = [parse_size(b.strip()) for b in args.budgets.split(",") if b.strip()]
    if not args.budget_bytes or any(b <= 0 for b in args.budget_bytes):
        p.error("--budgets needs one or more sizes above 0, e.g. 2G,4G,8G")
    if args.offline and not args.llama_bench:
        args.skip_peers = True  # nothing may be built: without a CUDA llama-bench there is no peer
    if args.out:
        args.json = args.json or args.out / "results.json"
    return args


class GpuCheck:
    """Carries what one step learns to the next."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir: Path = args.workdir
        self.model: Path = args.model or self.workdir / f"qwen3moe-{args.moe_layers}L-q4k.gguf"
        self.bench: Path | None = None
        self.cuda_context_bytes = 0
        self.free_bytes = 0
        self.results = [BudgetResult(b) for b in args.budget_bytes]
        self.timings: dict[str, float] = {}
        self.churn: dict | None = None
        self.errors: dict[str, str] = {}
        self.skipped: list[str] = []

    # -- the steps -------------------------------------------------------------------------------

    def steps(self) -> list[Step]:
        a = self.args
        steps = [Step("gpu", "nvidia-smi -L; NVML: name, memory, driver", self.check_gpu)]
        if a.offline:
            steps.append(Step("cuda-build", "llama_cpp/lib must have libggml-cuda (offline: nothing is built)", self.require_cuda_build))
        else:
            steps.append(Step("cuda-build", f"if llama_cpp/lib lacks libggml-cuda: deploy/cuda/build_linux.sh {a.cuda_arch}", self.ensure_cuda_build))
        if a.offline and not a.skip_peers:
            steps.append(Step("peer-build", f"use {a.llama_bench}", self.ensure_llama_bench))
        elif not a.skip_peers:
            cmds = llama_bench.build_commands(self.workdir, self.workdir / "llama.cpp-cuda", a.cuda_arch, a.jobs, a.llama_cpp_source)
            steps.append(Step("peer-build", "unless llama-bench is found: " + " && ".join(" ".join(c) for c in cmds), self.ensure_llama_bench))
        steps += [
            Step("profile", " ".join(XLM_SIDECAR + ["profile", "--quick"]), self.profile),
            Step("model", f"use {a.model}" if a.model else f"write {self.model} (qwen3moe, {a.moe_layers} layers, Q4_K)", self.ensure_model),
        ]
        if not a.skip_peers:
            steps.append(Step("cuda-context", "llama-bench -ngl 0 on a tiny model: NVML peak = the CUDA context", self.measure_cuda_context))
        for r in self.results:
            b = _size(r.budget_bytes)
            steps.append(Step(f"plan {b}", " ".join(XLM_SIDECAR + ["plan", "--model", str(self.model), "--budget", b, "--ctx", str(CTX), "--json"]),
                              lambda r=r: self.plan(r)))
            steps.append(Step(f"daemon {b}", " ".join(XLM_SIDECAR + ["serve", "--model", str(self.model), "--budget", b, "..."]) + "; 3 greedy replies of 128 tokens",
                              lambda r=r: self.run_daemon(r)))
            if not a.skip_peers:
                steps.append(Step(f"by hand {b}", "llama-bench -p 0 -n 64 with -ngl N around the best that fits, and -ngl 99 -ncmoe K",
                                  lambda r=r: self.run_by_hand(r)))
                steps.append(Step(f"fit {b}", "llama-bench -p 0 -n 64 -fitt <free - CUDA context - budget in MiB> -fitc 4096",
                                  lambda r=r: self.run_fit(r)))
        if not a.skip_churn:
            steps.append(Step("churn", "bench/run.py churn --via daemon: 8 live streams while SetBudget alternates "
                                       f"{_size(max(a.budget_bytes))} and {_size(min(a.budget_bytes))}", self.run_churn))
        return steps

    def check_gpu(self) -> None:
        from gpucheck.vram import gpu_info

        if shutil.which("nvidia-smi"):
            print(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip())
        info = gpu_info()
        self.free_bytes = info.free_bytes
        print(f"{info.name}: {info.total_bytes / GIB:.1f} GiB, {info.free_bytes / GIB:.1f} GiB free, driver {info.driver}")
        if info.free_bytes < max(self.args.budget_bytes) + GIB:
            raise SystemExit(f"gpu_check: the largest budget needs {_size(max(self.args.budget_bytes))} free plus 1 GiB")

    def ensure_cuda_build(self) -> None:
        lib = _llama_lib_dir()
        if any(lib.glob("libggml-cuda*")):
            print(f"llama-cpp-python already has CUDA ({lib})")
            return
        env = {**os.environ, "PYTHON": sys.executable, "JOBS": str(self.args.jobs)}
        if self.args.llama_cpp_source:
            env["LLAMA_CPP_PYTHON_SOURCE"] = str(self.args.llama_cpp_source)
        subprocess.run(["bash", str(DEPLOY / "cuda" / "build_linux.sh"), self.args.cuda_arch], check=True, env=env)

    def require_cuda_build(self) -> None:
        lib = _llama_lib_dir()
        if not any(lib.glob("libggml-cuda*")):
            raise SystemExit(f"gpu_check --offline: {lib} has no libggml-cuda: install the bundle's CUDA wheel "
                             "(deploy/gpu_bundle.py build --build-cuda) or drop --offline")
        print(f"llama-cpp-python has CUDA ({lib})")

    def run_churn(self) -> None:
        from bench import churn  # the repository is on sys.path (above)

        a = self.args
        self.churn = churn.run(self.model, via="daemon", n_streams=8, tokens=64, every_s=3.0, reloads=4,
                               vram=_size(max(a.budget_bytes)), vram_low=_size(min(a.budget_bytes)))

    def ensure_llama_bench(self) -> None:
        build = self.workdir / "llama.cpp-cuda"
        self.bench = llama_bench.find_llama_bench(self.args.llama_bench, build)
        if self.bench is None:
            self.bench = llama_bench.build_llama_bench(self.workdir, build, self.args.cuda_arch, self.args.jobs,
                                                       sys.executable, self.args.llama_cpp_source)
        print(f"llama-bench: {self.bench}")

    def profile(self) -> None:
        subprocess.run(XLM_SIDECAR + ["profile", "--quick"], check=True, cwd=REPO)

    def ensure_model(self) -> None:
        from gpucheck.moe_model import MoeShape, write_moe_model

        if not self.model.is_file():
            if self.args.model:
                raise SystemExit(f"gpu_check: {self.model} does not exist")
            write_moe_model(self.model, MoeShape(n_layer=self.args.moe_layers))
        size = self.model.stat().st_size
        print(f"model {self.model}: {size / GIB:.2f} GiB")
        if size <= min(self.args.budget_bytes):
            raise SystemExit("gpu_check: the model must be larger than the smallest budget, or there is nothing to fit")

    def measure_cuda_context(self) -> None:
        from sidecar.testmodels.registry import write_models

        tiny = write_models(self.workdir / "tiny", ["tiny_llama"])["tiny_llama"]
        self.cuda_context_bytes = self._bench(tiny, llama_bench.BenchConfig("context", n_gpu_layers=0), raw=True).vram_bytes
        print(f"CUDA context: {self.cuda_context_bytes / MIB:.0f} MiB")

    def plan(self, r: BudgetResult) -> None:
        out = subprocess.run(XLM_SIDECAR + ["plan", "--model", str(self.model), "--budget", _size(r.budget_bytes),
                                            "--ctx", str(CTX), "--json"], check=True, capture_output=True, text=True, cwd=REPO)
        plan = json.loads(out.stdout)
        r.predicted = _decode_rate(plan["schedule"]["tiers"])
        for anchor in plan.get("anchors") or []:
            if anchor["name"] == "--fit":
                r.predicted_fit = _decode_rate(anchor["tiers"])
            elif anchor["name"].startswith("-ngl"):
                r.predicted_ngl = _decode_rate(anchor["tiers"])
                r.planned_ngl = int(anchor["n_gpu_layers"])
        print(f"predicted: ours {r.predicted:.1f} tok/s, -ngl {r.predicted_ngl:.1f}, --fit {r.predicted_fit:.1f}")

    def run_daemon(self, r: BudgetResult) -> None:
        from gpucheck.daemon_run import measure_daemon

        m = measure_daemon(XLM_SIDECAR, self.model, _size(r.budget_bytes), CTX)
        r.measured = Measured("xlm-sidecar", m.tokens_per_s, max(m.peak_vram_bytes - self.cuda_context_bytes, 0))
        r.llama_buffers_bytes = m.llama_vram_bytes
        print(f"daemon: {m.tokens_per_s:.1f} tok/s, VRAM {r.measured.vram_bytes / GIB:.2f} GiB "
              f"(llama.cpp's buffers {m.llama_vram_bytes / GIB:.2f} GiB); {m.placement}")

    def run_by_hand(self, r: BudgetResult) -> None:
        n_layer, expert_bytes, dense_bytes = _model_sizes(self.model)
        configs = [llama_bench.BenchConfig(f"-ngl {n}", n_gpu_layers=n)
                   for n in ngl_candidates(r.planned_ngl, n_layer)]
        configs += [llama_bench.BenchConfig(f"-ngl 99 -ncmoe {k}", n_gpu_layers=99, n_cpu_moe=k)
                    for k in ncmoe_candidates(expert_bytes, dense_bytes, n_layer, r.budget_bytes)]
        for config in configs:
            r.manual.append(self._bench(self.model, config))
            m = r.manual[-1]
            print(f"{config.label}: {m.tokens_per_s:.1f} tok/s, VRAM {m.vram_bytes / GIB:.2f} GiB")

    def run_fit(self, r: BudgetResult) -> None:
        from gpucheck.vram import gpu_info

        margin = (gpu_info().free_bytes - self.cuda_context_bytes - r.budget_bytes) // MIB
        r.fit = self._bench(self.model, llama_bench.BenchConfig(f"--fit ({margin} MiB free)", fit_margin_mib=margin))
        print(f"--fit: {r.fit.tokens_per_s:.1f} tok/s, VRAM {r.fit.vram_bytes / GIB:.2f} GiB")

    def _bench(self, model: Path, config: llama_bench.BenchConfig, raw: bool = False) -> Measured:
        from gpucheck.vram import PeakVram

        assert self.bench is not None
        process = subprocess.Popen(llama_bench.command(self.bench, model, config), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        sampler = PeakVram(process.pid).start()
        stdout, stderr = process.communicate(timeout=300)
        peak = sampler.stop()
        if process.returncode != 0:
            raise RuntimeError(f"llama-bench {config.label} failed ({process.returncode}): {stderr[-800:]}")
        vram = peak if raw else max(peak - self.cuda_context_bytes, 0)
        return Measured(config.label, llama_bench.decode_tokens_per_s(stdout), vram)

    # -- running them ------------------------------------------------------------------------------

    def run(self, dry_run: bool) -> int:
        steps = self.steps()
        if dry_run:
            for i, step in enumerate(steps, 1):
                print(f"{i:2}. {step.name}: {step.what}")
            return 0
        started = time.monotonic()
        for step in steps:
            left = self.args.deadline_s - (time.monotonic() - started)
            if left <= 0:
                # A lent GPU machine is held for minutes, not hours: what was measured is kept.
                self.skipped.append(step.name)
                print(f"== {step.name}: skipped, past --deadline-s {self.args.deadline_s:.0f}", flush=True)
                continue
            print(f"== {step.name}", flush=True)
            t = time.monotonic()
            try:
                step.run()
            except Exception as e:  # noqa: BLE001 - one configuration failing must not lose the others
                if step.name in FATAL_STEPS:
                    raise
                self.errors[step.name] = f"{type(e).__name__}: {e}"[-2000:]
                print(f"== {step.name} FAILED: {self.errors[step.name]}", flush=True)
            self.timings[step.name] = time.monotonic() - t
            self.write_results()  # after every step: a run cut short still leaves its figures
        self.write_results()
        measured_s = sum(s for name, s in self.timings.items() if name not in ("cuda-build", "peer-build"))
        print()
        print(render_table(self.results))
        print(f"\ncheck took {measured_s:.0f} s (target {TIME_TARGET_S} s) plus {time.monotonic() - started - measured_s:.0f} s of builds")
        for name, error in self.errors.items():
            print(f"failed: {name}: {error}")
        if self.skipped:
            print(f"skipped (past the deadline): {', '.join(self.skipped)}")
        if self.errors:
            return 4
        return 0 if measured_s <= TIME_TARGET_S else 3

    def write_results(self) -> None:
        if self.args.out:
            self.args.out.mkdir(parents=True, exist_ok=True)
            (self.args.out / "table.md").write_text(render_table(self.results) + "\n")
            if self.churn is not None:
                (self.args.out / "churn.json").write_text(json.dumps(self.churn, indent=2))
        if self.args.json:
            self.args.json.parent.mkdir(parents=True, exist_ok=True)
            self.args.json.write_text(json.dumps(self.summary(), indent=2))

    def summary(self) -> dict:
        return {
            "model": str(self.model),
            "cuda_context_bytes": self.cuda_context_bytes,
            "results": [asdict(r) for r in self.results],
            "step_seconds": self.timings,
            "churn": self.churn,
            "errors": self.errors,
            "skipped": self.skipped,
        }


def _size(n: int) -> str:
    """A size the daemon's flags take: "2G", "2.5G", or MiB."""
    return f"{n / GIB:g}G" if n % (GIB // 4) == 0 else f"{n // MIB}M"


def _decode_rate(tiers: list[dict]) -> float:
    """Predicted tokens/s of the one-token decode tier."""
    return next((float(t["predicted_tokens_per_s"]) for t in tiers if t["max_tokens"] == 1), 0.0)


def _llama_lib_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("gpu_check: llama-cpp-python is not installed in this Python")
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def _model_sizes(model: Path) -> tuple[int, int, int]:
    """(layers, expert bytes of one layer, bytes of everything but the experts), from the GGUF."""
    from gguf import GGUFReader

    reader = GGUFReader(model)
    layers: set[int] = set()
    experts = dense = 0
    for t in reader.tensors:
        if t.name.startswith("blk."):
            layers.add(int(t.name.split(".")[1]))
        if "_exps." in t.name:
            experts += int(t.n_bytes)
        else:
            dense += int(t.n_bytes)
    return len(layers), experts // max(len(layers), 1), dense


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return GpuCheck(args).run(args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
