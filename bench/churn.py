"""Budget churn: how long generation pauses when the budget keeps changing under live streams.

8 streams decode greedy replies while the budget alternates every --every seconds between two
budgets that force a reload (save every conversation's KV cache, rebuild model and context,
restore). Rounds of 8 fresh streams run until --reloads reloads happened. Reported: each reload's
pause (median, p90, max), the longest gap any stream saw, and a check that every stream of every
round completes with the same token ids as an uninterrupted run of the same 8 streams.

Where the reload happens:
  daemon   SetBudget on a real daemon, alternating VRAM budgets (0 and --vram); the pause is the
           response's pause_ms. Needs a GPU: without one every weight is on the CPU already, the
           plan's placement does not change, and SetBudget answers reloaded=false (measured on
           the CPU-only machines these benchmarks were written on).
  device   SetBudget on a real daemon placing onto a GPU-type ggml device without a GPU: ggml's
           RPC backend serving this machine's CPU from a second process (sidecar.native.ggml_rpc), the
           planner handed a described GPU (the stand-in is its speed; placement, buffers and
           reloads are real). Alternates --vram and --vram-low. The default without a GPU when
           llama.cpp was built with RPC (scripts/setup does).
  engine   the engine in-process, `Engine.reload(config, force=True)` alternating thread caps
           (1 and all cores), so each change rebuilds model and context exactly as a placement
           change does.

    python bench/run.py churn [--via auto|daemon|device|engine] [--every 2] [--reloads 10]
                              [--vram 4G] [--vram-low 24M] [--quick]

(deploy/gpu_check.py calls run() with its own figures.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path

from bench.common import percentile
from bench.soak import token_problem

MAX_ROUNDS = 20
PROMPTS = [f"Tell me a long story about a {a} who {b}." for a, b in (
    ("dragon", "guards a library"), ("knight", "fears the dark"), ("merchant", "sells maps"),
    ("wizard", "lost his staff"), ("thief", "steals a bell"), ("baker", "feeds a city"),
    ("sailor", "finds an island"), ("miner", "hears singing"))]


def gpu_present() -> bool:
    from sidecar.native.ggml_devices import list_ggml_devices

    return any(d.is_gpu for d in list_ggml_devices())


class Streams:
    """Token ids and arrival times of n concurrent requests; `wait` blocks until all ended."""

    def __init__(self, n: int) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.arrivals: list[list[float]] = [[] for _ in range(n)]
        self.ends: list[object] = [None] * n
        self._done = [threading.Event() for _ in range(n)]

    def sink(self, i: int):
        from sidecar.engine import TextDelta

        def on_event(event: object) -> None:
            if isinstance(event, TextDelta):
                self.tokens[i].extend(event.token_ids)
                self.arrivals[i].append(time.perf_counter())
            else:
                self.ends[i] = event
                self._done[i].set()
        return on_event

    def running(self) -> bool:
        return not all(d.is_set() for d in self._done)

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(d.wait(max(0.0, deadline - time.monotonic())) for d in self._done)

    def longest_gap_ms(self) -> float:
        return max((b - a for arr in self.arrivals for a, b in zip(arr, arr[1:])), default=0.0) * 1e3


def check(reference: list[list[int]], got: list[list[int]], tokens: int) -> list[str]:
    """Problems of a churned run against the uninterrupted one (empty when none)."""
    problems = []
    for i, (ref, run) in enumerate(zip(reference, got)):
        if len(run) != len(ref):
            problems.append(f"stream {i}: {len(run)} tokens, uninterrupted run {len(ref)}")
        issue = token_problem(ref, run, tokens, completed=True)
        if issue:
            problems.append(f"stream {i}: {issue}")
    return problems


# -- in the engine ------------------------------------------------------------------------------------


def churn_engine(model: Path, n_streams: int, tokens: int, every_s: float, reloads: int) -> dict:
    from sidecar.engine import Engine, EngineConfig, Finished, GenerationSpec, Prompt, SamplingConfig
    from sidecar.lifecycle.logs import configure_logging

    configure_logging(level="warning")  # the engine logs every reload; the figures are printed below
    cores = os.cpu_count() or 1
    config = EngineConfig(model_path=model, n_ctx=1024, n_seq=n_streams, threads_decode=cores, threads_prefill=cores)
    # Two "budgets": the thread caps a game would alternate between, each applied by a full rebuild.
    budgets = [replace(config, threads_decode=1, threads_prefill=1), config]
    greedy = SamplingConfig(temperature=0.0)
    engine = Engine(config)

    def submit_all(tag: str) -> Streams:
        streams = Streams(n_streams)
        for i in range(n_streams):
            engine.submit(GenerationSpec(prompt=Prompt(messages=(("user", PROMPTS[i % len(PROMPTS)]),)), sampling=greedy,
                                         max_tokens=tokens, request_id=f"{tag}-{i}"), streams.sink(i))
        return streams

    try:
        reference = submit_all("reference")
        if not reference.wait(900):
            raise RuntimeError("the uninterrupted run did not finish in 15 minutes")
        pauses: list[float] = []
        gaps: list[float] = []
        problems: list[str] = []
        r = 0
        while len(pauses) < reloads and r < MAX_ROUNDS:
            streams = submit_all(f"churn-{r}")
            n = 0
            while streams.running():
                if streams.wait(every_s):
                    break
                reloaded, pause_ms = engine.reload(budgets[n % 2], force=True).result(300)
                n += 1
                if reloaded:
                    pauses.append(pause_ms)
            if not streams.wait(900):
                raise RuntimeError("streams did not finish after the churn")
            gaps.append(streams.longest_gap_ms())
            ends = [e for e in streams.ends if not isinstance(e, Finished)]
            problems += [f"round {r}: a stream ended with {e!r}" for e in ends]
            problems += [f"round {r}: {p}" for p in check(reference.tokens, streams.tokens, tokens)]
            r += 1
    finally:
        engine.close()
    return {"via": "engine", "rounds": r, "reloads": len(pauses), "pause_ms": pauses, "max_gap_ms": gaps,
            "reference_tokens": [len(t) for t in reference.tokens], "problems": problems}


# -- through the daemon ---------------------------------------------------------------------------------


def churn_device(model: Path, n_streams: int, tokens: int, every_s: float, reloads: int, vram: str, vram_low: str) -> dict:
    """churn_daemon against a daemon that places onto an RPC device served from a second process."""
    from sidecar.native.ggml_rpc import STAND_IN_GPU_HARDWARE, RpcServerProcess

    # One thread on each side: two each on two cores thrash OpenMP's barriers.
    with RpcServerProcess(threads=1) as server:
        result = churn_daemon(model, n_streams, tokens, every_s, reloads, vram, vram_low,
                              ("--rpc", server.endpoint, "--hardware", STAND_IN_GPU_HARDWARE, "--threads", "1",
                               "--ctx", "512"))
    return result | {"via": "device"}


def churn_daemon(model: Path, n_streams: int, tokens: int, every_s: float, reloads: int, vram: str,
                 vram_low: str = "0", extra: tuple[str, ...] = ()) -> dict:
    from sidecar.api import pb
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    daemon = start_daemon("--model", str(model), "--parallel", str(n_streams), "--ctx", "1024", "--budget", vram_low, *extra)
    greedy = pb.SamplingParams(temperature=0.0, seed=1)

    def run_all(client) -> Streams:
        streams = Streams(n_streams)

        def one(i: int) -> None:
            req = pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=PROMPTS[i % len(PROMPTS)])]),
                                     max_tokens=tokens, sampling=greedy)
            final = None
            for chunk in client.generate(req):
                if chunk.token_ids:
                    streams.tokens[i].extend(chunk.token_ids)
                    streams.arrivals[i].append(time.perf_counter())
                if chunk.HasField("final"):
                    final = chunk.final
            streams.ends[i] = final
            streams._done[i].set()

        for i in range(n_streams):
            threading.Thread(target=one, args=(i,), daemon=True).start()
        return streams

    pauses: list[float] = []
    answers: list[bool] = []
    gaps: list[float] = []
    problems: list[str] = []
    try:
        with daemon.client(timeout_s=600) as client:
            reference = run_all(client)
            if not reference.wait(900):
                raise RuntimeError("the uninterrupted run did not finish in 15 minutes")
            r = 0
            # Without a GPU nothing reloads: stop after as many budget changes as reloads were asked.
            while len(answers) < reloads and r < MAX_ROUNDS:
                streams = run_all(client)
                n = 0
                while not streams.wait(every_s):
                    change = client.set_budget(pb.SetBudgetRequest(vram_size=vram if n % 2 == 0 else vram_low))
                    n += 1
                    answers.append(change.reloaded)
                    if change.reloaded:
                        pauses.append(change.pause_ms)
                gaps.append(streams.longest_gap_ms())
                problems += [f"round {r}: stream {i} ended without a final chunk" for i, e in enumerate(streams.ends) if e is None]
                problems += [f"round {r}: {p}" for p in check(reference.tokens, streams.tokens, tokens)]
                r += 1
    finally:
        stop_daemon(daemon)
    return {"via": "daemon", "rounds": r, "budget_changes": len(answers), "reloads": len(pauses), "pause_ms": pauses,
            "max_gap_ms": gaps, "reference_tokens": [len(t) for t in reference.tokens], "problems": problems}


def run(model: Path | None = None, via: str = "auto", n_streams: int = 8, tokens: int = 192, every_s: float = 2.0,
        reloads: int = 10, vram: str = "512M", vram_low: str = "0") -> dict:
    from sidecar.model_info.default_model import default_model_path
    from sidecar.native.ggml_rpc import rpc_available

    model = model or default_model_path()
    if via == "auto":
        via = "daemon" if gpu_present() else "device" if rpc_available() else "engine"
        print({"daemon": "(--via auto: a GPU is visible: SetBudget through the daemon)",
               "device": "(--via auto: no GPU; SetBudget through a daemon placing onto ggml's RPC device)",
               "engine": "(--via auto: no GPU and no RPC build: reloads are forced in the engine "
                         "(Engine.reload(config, force=True)))"}[via])
    print(f"\n== budget churn: {n_streams} live streams, {tokens} tokens each, a reloading budget change every "
          f"{every_s:g} s, rounds of {n_streams} streams until {reloads} reloads, via the {via} ==")
    if via == "device":
        result = churn_device(model, n_streams, tokens, every_s, reloads, vram, vram_low)
    elif via == "daemon":
        result = churn_daemon(model, n_streams, tokens, every_s, reloads, vram, vram_low)
        if result["budget_changes"] and not result["reloads"]:
            print(f"SetBudget answered reloaded=false to all {result['budget_changes']} changes: placement did not change "
                  "(no GPU?); use --via engine to measure reload pauses")
    else:
        result = churn_engine(model, n_streams, tokens, every_s, reloads)
    pauses = result["pause_ms"]
    if pauses:
        print(f"reload pause                 median {statistics.median(pauses):.0f} ms, p90 {percentile(pauses, 90):.0f} ms, "
              f"max {max(pauses):.0f} ms over {len(pauses)} reloads")
    else:
        print("reload pause                 no reload happened"
              + (" (SetBudget never reloaded)" if result.get("budget_changes") else " (the streams ended before the first change)"))
    print(f"longest gap seen by a stream {', '.join(f'{g:.0f}' for g in result['max_gap_ms'])} ms (per round, {result['rounds']} rounds)")
    if result["problems"]:
        print("FAIL: " + "; ".join(result["problems"][:10]))
    else:
        print(f"all {n_streams} streams complete with the token ids of the uninterrupted run "
              f"({', '.join(map(str, result['reference_tokens']))} tokens)")
    result |= {"streams": n_streams, "tokens": tokens, "every_s": every_s,
               "pause_median_ms": statistics.median(pauses) if pauses else None,
               "pause_p90_ms": percentile(pauses, 90) if pauses else None, "pause_max_ms": max(pauses, default=None),
               "ok": not result["problems"]}
    return result


def options(group) -> None:
    group.add_argument("--via", choices=("auto", "daemon", "device", "engine"), default="auto")
    group.add_argument("--every", type=float, default=2.0, help="seconds between budget changes")
    group.add_argument("--reloads", type=int, default=None,
                       help="run rounds of streams until this many reloads (at most 20 rounds; default 10, 3 with --quick)")
    # On the RPC device (no GPU here) 4G is all on the device and 24M part of the attention.
    group.add_argument("--vram", default="4G", help="the budget alternated with --vram-low (daemon, device)")
    group.add_argument("--vram-low", default="24M", help="the other budget (24M on the device: part of it placed)")


def scenario(args: argparse.Namespace) -> dict:
    return run(args.model_path, args.via, tokens=96 if args.quick else 192, every_s=args.every,
               reloads=args.reloads or (3 if args.quick else 10), vram=args.vram, vram_low=args.vram_low)
