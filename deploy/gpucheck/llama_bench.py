"""llama.cpp's own llama-bench, built with CUDA from the source llama-cpp-python vendors, as the
peer to compare with: by hand (-ngl N, or all layers with the experts of the first K on the CPU,
-ncmoe K) and by llama.cpp's automatic fit (-fitt: leave this many MiB free)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
DECODE_TOKENS = 64
REPEATS = 2


@dataclass(frozen=True)
class BenchConfig:
    """One llama-bench configuration. `fit_margin_mib` set means llama.cpp's fit picks the rest."""

    label: str
    n_gpu_layers: int | None = None
    n_cpu_moe: int = 0
    fit_margin_mib: int | None = None

    def args(self) -> list[str]:
        if self.fit_margin_mib is not None:
            return ["-fitt", str(self.fit_margin_mib), "-fitc", "4096"]
        args = ["-ngl", str(self.n_gpu_layers if self.n_gpu_layers is not None else 0)]
        if self.n_cpu_moe:
            args += ["-ncmoe", str(self.n_cpu_moe)]
        return args


def find_llama_bench(explicit: Path | None, build_dir: Path) -> Path | None:
    """--llama-bench, else our earlier build, else llama-bench on PATH."""
    for candidate in (explicit, build_dir / "bin" / "llama-bench"):
        if candidate is not None and candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("llama-bench")
    return Path(found) if found else None


def build_commands(work: Path, build_dir: Path, cuda_arch: str, jobs: int, source: Path | None = None) -> list[list[str]]:
    """The commands that build llama-bench with CUDA from llama-cpp-python's source: `source`
    (an unpacked sdist, for machines without PyPI) or the sdist fetched from PyPI."""
    fetch: list[list[str]] = []
    if source is None:
        source = work / "llama-cpp-python-src"
        fetch = [
            ["pip", "download", "--no-deps", "--no-binary", ":all:", LLAMA_CPP_PYTHON, "-d", str(work / "sdist")],
            ["<untar>", str(work / "sdist"), str(source)],
        ]
    return fetch + [
        [
            "cmake", "-S", str(source / "vendor" / "llama.cpp"), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}",
            "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
        ],
        ["cmake", "--build", str(build_dir), "--config", "Release", "-j", str(jobs), "--target", "llama-bench"],
    ]


def build_llama_bench(work: Path, build_dir: Path, cuda_arch: str, jobs: int, python: str, source: Path | None = None) -> Path:
    """Run build_commands (pip through `python -m pip`); returns the binary."""
    for cmd in build_commands(work, build_dir, cuda_arch, jobs, source):
        if cmd[0] == "<untar>":
            _untar_single(Path(cmd[1]), Path(cmd[2]))
            continue
        if cmd[0] == "pip":
            cmd = [python, "-m", "pip", *cmd[1:]]
        subprocess.run(cmd, check=True)
    return build_dir / "bin" / "llama-bench"


def _untar_single(sdist_dir: Path, target: Path) -> None:
    archive = next(sdist_dir.glob("llama_cpp_python-*.tar.gz"))
    shutil.rmtree(target, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(target.parent / "untar", filter="data")
    (next((target.parent / "untar").glob("llama_cpp_python-*"))).rename(target)


def command(binary: Path, model: Path, config: BenchConfig) -> list[str]:
    """The llama-bench command line for one decode measurement, JSON on stdout."""
    return [str(binary), "-m", str(model), "-p", "0", "-n", str(DECODE_TOKENS), "-r", str(REPEATS), "-o", "json", *config.args()]


def decode_tokens_per_s(stdout: str) -> float:
    """The decode rate from llama-bench's JSON output (the tg test's avg_ts)."""
    runs = json.loads(stdout)
    rates = [float(r["avg_ts"]) for r in runs if int(r.get("n_gen", 0)) > 0]
    if not rates:
        raise ValueError("llama-bench reported no decode test")
    return rates[0]
