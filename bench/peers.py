"""The peers we measure against, started and driven the same way: llama-cpp-python in-process,
llama-cpp-python's OpenAI-compatible server, and llama.cpp's own llama-bench and llama-server
(built outside the repo; found on PATH, in $LLAMA_CPP_BIN, or given by flag)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

# Concurrent requests on llama-cpp-python's server: by default a new request interrupts the one
# streaming (`interrupt_requests`), which would cut peers' replies short under load. We turn it
# off so every stream runs to its end, queued as the server queues them.
LLAMA_CPP_PYTHON_SERVER_FLAGS = ("--interrupt_requests", "False")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_llama_binary(name: str, explicit: Path | None = None) -> Path | None:
    """llama.cpp's `name` binary, or None (benchmarks then say the peer was skipped)."""
    if explicit is not None:
        return explicit if explicit.is_file() else None
    env_dir = os.environ.get("LLAMA_CPP_BIN")
    if env_dir and (Path(env_dir) / name).is_file():
        return Path(env_dir) / name
    found = shutil.which(name)
    return Path(found) if found else None


def llama_bench_tg(binary: Path, model: Path, threads: list[int], tokens: int, repeats: int) -> dict[int, float]:
    """Token-generation tokens/s that llama-bench measures, per thread count."""
    out = subprocess.run(
        [str(binary), "-m", str(model), "-p", "0", "-n", str(tokens), "-r", str(repeats),
         "-t", ",".join(map(str, threads)), "-o", "json"],
        capture_output=True, text=True, check=True, timeout=600,
    )
    return {int(row["n_threads"]): float(row["avg_ts"]) for row in json.loads(out.stdout)}


@dataclass
class Streamed:
    """One streamed reply as the client saw it. Tokens are counted by the caller, the same way
    for every side (see engine_benchmark.count_tokens); `events` and `reported_tokens` (the
    server's own usage figure, where it sends one while streaming) are cross-checks."""

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


def start_llama_server(binary: Path, model: Path, threads: int, slots: int, ctx_per_slot: int) -> HttpPeer:
    port = free_port()
    process = subprocess.Popen(
        [str(binary), "-m", str(model), "--port", str(port), "-t", str(threads), "-tb", str(threads),
         "-np", str(slots), "-c", str(ctx_per_slot * slots), "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    peer = HttpPeer(f"llama-server ({slots} slots)", process, f"http://127.0.0.1:{port}")
    peer.wait_ready()
    return peer
