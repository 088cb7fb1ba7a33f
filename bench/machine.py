"""What a benchmark result needs to be compared later: the machine it ran on and the commit.

Every JSON that bench/run.py writes carries these, and the README's performance section prints
them, so a figure is never read without knowing the CPU, memory, GPU and code behind it.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30


def cpu_model() -> str:
    """The CPU's marketing name (from /proc/cpuinfo on Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpus() -> list[dict]:
    """GPUs llama.cpp can use (name, description, memory), empty on a CPU-only build or machine."""
    try:
        from sidecar.ggml_devices import list_ggml_devices

        return [{"name": d.name, "description": d.description, "memory_bytes": d.memory_total}
                for d in list_ggml_devices() if d.is_gpu]
    except Exception:  # no llama.cpp libraries: say nothing rather than guess
        return []


def profile_figures() -> dict:
    """This machine's measured DRAM bandwidth from its profile, when one is stored."""
    try:
        from sidecar.planner.hardware_model import hardware_from_profile
        from sidecar.profiler import default_profile_path, load_profile

        path = default_profile_path()
        db = load_profile(path)
        return {"profile": str(path), "profile_mode": db.mode, "profile_created": db.created_at,
                "dram_gbps": hardware_from_profile(db).cpu.dram_gbps}
    except Exception:  # no profile yet, or one of another schema
        return {}


def describe_machine() -> dict:
    import psutil

    try:
        from importlib.metadata import version

        llama_version = version("llama-cpp-python")
    except Exception:
        llama_version = "unknown"
    return {
        "cpu": cpu_model(),
        "physical_cores": psutil.cpu_count(logical=False) or os.cpu_count(),
        "logical_cores": psutil.cpu_count() or os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
        "gpus": gpus(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "llama_cpp_python": llama_version,
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        **profile_figures(),
    }


def machine_line(m: dict) -> str:
    """One line for people: 'AMD EPYC 7B13, 2 cores / 2 threads, 24 GiB RAM (DRAM read 53 GB/s measured); no GPU; ...'."""
    dram = f" (DRAM read {m['dram_gbps']:.0f} GB/s measured)" if m.get("dram_gbps") else ""
    gpu = ", ".join(f"{g['description'] or g['name']} {g['memory_bytes'] / GIB:.0f} GiB" for g in m.get("gpus") or []) or "no GPU"
    return (f"{m['cpu']}, {m['physical_cores']} cores / {m['logical_cores']} threads, {m['ram_bytes'] / GIB:.0f} GiB RAM{dram}; "
            f"{gpu}; {m['os']}; Python {m['python']}, llama-cpp-python {m['llama_cpp_python']}")


def git_commit() -> dict:
    """The checkout's commit and whether it had uncommitted changes to tracked files."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": commit or "unknown", "dirty": dirty}
