"""Serve the model with a budget (the real daemon, a subprocess) and measure decode speed and VRAM."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gpucheck.vram import PeakVram

PROMPT = "The caravan reached the gates of the old city at dusk, and the guard asked"
DECODE_TOKENS = 128
REQUESTS = 3


@dataclass(frozen=True)
class DaemonMeasurement:
    tokens_per_s: float  # decode, over every reply's tokens after the first
    peak_vram_bytes: int  # NVML, the daemon process, CUDA context included
    llama_vram_bytes: int  # what llama.cpp reports it allocated on the GPU (status)
    placement: str  # the daemon's own description of what went where


def serve_command(xlm_sidecar: list[str], model: Path, budget: str, ctx: int) -> list[str]:
    return [*xlm_sidecar, "serve", "--model", str(model), "--budget", budget, "--ctx", str(ctx),
            "--parallel", "1", "--port", "0", "--no-websocket", "--log-format", "json"]


def measure_daemon(xlm_sidecar: list[str], model: Path, budget: str, ctx: int, timeout_s: float = 180) -> DaemonMeasurement:
    """Start the daemon, wait for "listening", generate REQUESTS greedy replies, stop it."""
    from sidecar.api import pb
    from sidecar.client import SidecarClient

    token = secrets.token_urlsafe(24)
    env = {**os.environ, "XLM_SIDECAR_TOKEN": token}
    process = subprocess.Popen(serve_command(xlm_sidecar, model, budget, ctx), stderr=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, text=True, env=env)
    sampler = PeakVram(process.pid).start()
    try:
        listening = _wait_listening(process, timeout_s)
        # Nobody reads the log from here on: drain it, so a full pipe never blocks the daemon.
        threading.Thread(target=process.stderr.read, daemon=True).start()
        tokens, seconds = 0, 0.0
        with SidecarClient(listening["address"], token=token, timeout_s=timeout_s) as client:
            client.complete(pb.GenerateRequest(prompt=PROMPT, max_tokens=8))  # warm-up: first-pass costs
            for i in range(REQUESTS):
                sampling = pb.SamplingParams(temperature=0.0, seed=i)
                reply = client.complete(pb.GenerateRequest(prompt=f"{PROMPT} ({i})", max_tokens=DECODE_TOKENS, sampling=sampling))
                f = reply.final
                # A random-weight model may end its turn early; pool tokens and time across replies.
                if f.usage.completion_tokens > 1 and f.timings.decode_tokens_per_s > 0:
                    tokens += f.usage.completion_tokens - 1
                    seconds += (f.usage.completion_tokens - 1) / f.timings.decode_tokens_per_s
            status = client.status()
        return DaemonMeasurement(
            tokens_per_s=tokens / seconds if seconds else 0.0,
            peak_vram_bytes=sampler.stop(),
            llama_vram_bytes=status.memory.vram_used_bytes,
            placement=str(listening.get("placement", "")),
        )
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def _wait_listening(process: subprocess.Popen, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    assert process.stderr is not None
    seen: list[str] = []
    listening: dict = {}
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            raise RuntimeError(f"the daemon exited with {process.wait()} before listening: {seen[-5:]}")
        seen.append(line.strip())
        try:
            event = json.loads(line)
        except ValueError:
            continue
        # "listening" comes at bind time with the addresses; "ready" once loaded, with the placement.
        if event.get("event") == "listening":
            listening = event
        elif event.get("event") == "ready":
            return {**listening, **event}
    raise RuntimeError(f"the daemon did not listen within {timeout_s} s: {seen[-5:]}")
