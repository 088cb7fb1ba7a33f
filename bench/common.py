"""What the scenarios share: how figures are printed, what a result records, the machine, the
peers (llama-cpp-python's server, llama.cpp's binaries) and the daemon's start-up profile.

The daemon itself is started with sidecar.lifecycle.daemon_process (the test suite's launcher too).
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: a vision worker's memory figures include its imports
    import httpx

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
GIB = 1 << 30


class ScenarioFailed(RuntimeError):
    """A scenario's own check failed (the soak's, the placement's): run.py still writes its
    figures, marks the result failed and exits 1."""

    def __init__(self, message: str, results: dict) -> None:
        super().__init__(message)
        self.results = results


# -- figures ---------------------------------------------------------------------------------------


def spread(values: list[float], fmt: str = "8.1f", sep: str = "  ") -> str:
    """'median  [min .. max]': the median in `fmt`, the ends at its precision without its width."""
    inner = fmt.lstrip("0123456789")
    return f"{format(statistics.median(values), fmt)}{sep}[{format(min(values), inner)} .. {format(max(values), inner)}]"


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by the nearest-rank method; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


class TokenCounter:
    """Counts the tokens of delivered text with the model's tokenizer (vocabulary only), so the
    daemon and its peers are counted the same way whatever each reports about itself."""

    def __init__(self, model: Path) -> None:
        from llama_cpp import Llama

        self._llm = Llama(model_path=str(model), vocab_only=True, verbose=False)

    def __call__(self, text: str) -> int:
        return len(self._llm.tokenize(text.encode(), add_bos=False, special=False)) if text else 0


# -- the daemon's profile --------------------------------------------------------------------------


def profile_flags() -> list[str]:
    """`--profile FILE` for the stored profile of this machine; none (auto) when there is none,
    and then the daemon's start-up line says it measures in the background.

    With `--profile auto` a daemon whose stored profile was measured under load (on a shared
    machine, most are) measures a new one in the background whenever its own engine is idle, and
    re-plans when it lands. In a side-by-side benchmark its engine is idle exactly while the other
    sides run, so those would be measured against a profiler spinning on the same cores, and the
    daemon would reload mid-run. The stored file is used as it is: every side runs alone and the
    planner sees the figures `auto` would have started with.
    """
    from sidecar.profiler.store import default_profile_path

    path = default_profile_path()
    if not path.is_file():
        print(f"   no stored machine profile ({path}): the daemon plans from defaults and measures one in the background")
        return []
    return ["--profile", str(path)]


# Dies with its parent (PR_SET_PDEATHSIG), so a killed bench leaves no loop behind.
BUSY_LOOP = "import ctypes, signal; ctypes.CDLL(None).prctl(1, signal.SIGKILL)\nwhile True: pass"


@contextmanager
def busy_core(cpu: int | None = None, on: bool = True):
    """Another process spinning on one core (`cpu`, default the last this process may use)."""
    if not on:
        yield
        return
    loop = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    os.sched_setaffinity(loop.pid, {max(os.sched_getaffinity(0)) if cpu is None else cpu})
    try:
        yield
    finally:
        loop.kill()
        loop.wait()


# -- what a result records -------------------------------------------------------------------------


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
        from sidecar.native.ggml_devices import list_ggml_devices

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


def record(name: str, results: dict, args, argv: list[str], started: float, error: str | None) -> dict:
    """One scenario's result as report.py reads it: the figures with everything needed to compare
    them later (commit, machine, command line, time)."""
    return {
        "scenario": name,
        **git_commit(),
        "machine": describe_machine(),
        "command": "python " + shlex.join(["bench/run.py", *argv]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "seconds": time.time() - started,
        "repeats": args.repeats,
        "quick": args.quick,
        "model": args.model_path.name,
        "results": results,
        "error": error,
    }


def write_record(rec: dict, json_dir: Path) -> Path:
    json_dir.mkdir(parents=True, exist_ok=True)
    stamp = rec["timestamp"][:19].replace("-", "").replace(":", "")
    path = json_dir / f"{rec['scenario']}-{stamp}-{rec['commit'][:8]}.json"
    path.write_text(json.dumps(rec, indent=2, default=str))
    return path


# -- peers -----------------------------------------------------------------------------------------
# Started and driven the same way: llama-cpp-python's OpenAI-compatible server, and llama.cpp's
# own llama-bench and llama-server (built outside the repo; found on PATH, in $LLAMA_CPP_BIN, or
# in --llama-bin).

# Concurrent requests on llama-cpp-python's server: by default a new request interrupts the one
# streaming (`interrupt_requests`), which would cut peers' replies short under load. We turn it
# off so every stream runs to its end, queued as the server queues them.
LLAMA_CPP_PYTHON_SERVER_FLAGS = ("--interrupt_requests", "False")


# The end-of-generation texts of the chat templates a game is likely to serve (SmolLM2's first).
END_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "</s>", "<reponame>")


def end_token_ids(client) -> set[int]:
    """The served model's end-of-generation tokens (each of END_TEXTS that is one token), for a
    logit bias that bans them: replies of the same length on every side compare the same work."""
    ids = set()
    for text in END_TEXTS:
        tokens = client.tokenize(text, add_special=False, parse_special=True)
        if len(tokens) == 1:
            ids.add(tokens[0])
    return ids


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_llama_binary(name: str, folder: Path | None = None) -> Path | None:
    """llama.cpp's `name` binary (in `folder` when given: --llama-bin), or None (benchmarks then
    say the peer was skipped)."""
    if folder is not None:
        return folder / name if (folder / name).is_file() else None
    env_dir = os.environ.get("LLAMA_CPP_BIN")
    if env_dir and (Path(env_dir) / name).is_file():
        return Path(env_dir) / name
    found = shutil.which(name)
    return Path(found) if found else None


def llama_bench_tg(binary: Path, model: Path, threads: list[int], tokens: int, repeats: int,
                   flash: bool | None = None, depth: int = 0) -> dict[int, float]:
    """Token-generation tokens/s that llama-bench measures, per thread count: from `depth`
    tokens already in the cache, flash attention on, off or (None) llama-bench's default."""
    extra = ([] if flash is None else ["-fa", "1" if flash else "0"]) + (["-d", str(depth)] if depth else [])
    out = subprocess.run(
        [str(binary), "-m", str(model), "-p", "0", "-n", str(tokens), "-r", str(repeats),
         "-t", ",".join(map(str, threads)), "-o", "json", *extra],
        capture_output=True, text=True, check=True, timeout=600,
    )
    return {int(row["n_threads"]): float(row["avg_ts"]) for row in json.loads(out.stdout)}


@dataclass
class Streamed:
    """One streamed reply as the client saw it. Tokens are counted by the caller, the same way
    for every side (TokenCounter); `events` and `reported_tokens` (the server's own usage
    figure, where it sends one while streaming) are cross-checks."""

    text: str
    first_s: float
    total_s: float
    events: int
    reported_tokens: int | None
    # Prompt tokens the server says it computed for this request, cache hits left out
    # (llama-server's `timings.prompt_n` in its last event); None where a server reports none.
    prompt_computed: int | None = None


@dataclass
class HttpPeer:
    """An OpenAI-compatible server process we started."""

    name: str
    process: subprocess.Popen
    base_url: str
    # Sent with every request: the daemon's HTTP API wants its token (Authorization: Bearer).
    headers: dict[str, str] | None = None

    def wait_ready(self, timeout_s: float = 120) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.base_url}/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not start within {timeout_s} s")

    def chat_stream(self, client: httpx.Client, messages: list[dict], max_tokens: int) -> Streamed:
        """One greedy chat request streamed over server-sent events, as a game would read it
        and as the daemon is read over gRPC: the text delivered and when it arrived."""
        started = time.perf_counter()
        first = None
        parts: list[str] = []
        events = 0
        reported = computed = None
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                # llama-server reports usage in a last event with this; llama-cpp-python ignores it.
                "stream_options": {"include_usage": True}}
        with client.stream("POST", f"{self.base_url}/v1/chat/completions", json=body, timeout=600,
                           headers=self.headers) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if event.get("usage"):
                    reported = event["usage"].get("completion_tokens")
                if isinstance(event.get("timings"), dict) and "prompt_n" in event["timings"]:
                    computed = event["timings"]["prompt_n"]
                for choice in event.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        first = first if first is not None else time.perf_counter()
                        parts.append(piece)
                        events += 1
        ended = time.perf_counter()
        return Streamed("".join(parts), (first or ended) - started, ended - started, events, reported, computed)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_llama_cpp_python_server(model: Path, threads: int, n_ctx: int) -> HttpPeer:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--port", str(port),
         "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx),
         *LLAMA_CPP_PYTHON_SERVER_FLAGS],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    peer = HttpPeer("llama-cpp-python server", process, f"http://127.0.0.1:{port}")
    peer.wait_ready()
    return peer


def start_llama_server(binary: Path, model: Path, threads: int, slots: int, ctx_per_slot: int,
                       extra: tuple[str, ...] = ()) -> HttpPeer:
    port = free_port()
    process = subprocess.Popen(
        [str(binary), "-m", str(model), "--port", str(port), "-t", str(threads), "-tb", str(threads),
         "-np", str(slots), "-c", str(ctx_per_slot * slots), "--no-webui", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    peer = HttpPeer(f"llama-server ({slots} slots)", process, f"http://127.0.0.1:{port}")
    peer.wait_ready()
    return peer
