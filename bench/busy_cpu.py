"""A busy CPU (issue 17, 4): 4 streams' aggregate tokens/s with another process spinning on one
core, the daemon left to itself (its thread governor) against `SetBudget {maxCpuThreads: 1}` set
by hand, rounds interleaved on one daemon. Target: governor / by hand >= 0.9.

    python bench/run.py busy-cpu [--streams 4] [--tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

from bench.common import busy_core


def aggregate_tokens_per_s(daemon, streams: int, tokens: int, tag: str) -> float:
    from sidecar.api import pb

    counts = [0] * streams

    def one(i: int) -> None:
        request = pb.GenerateRequest(prompt=f"{tag} story {i}: Once upon a time", max_tokens=tokens,
                                     sampling=pb.SamplingParams(temperature=0, repeat_penalty=1.0))
        with daemon.client(timeout_s=600) as c:
            counts[i] = c.complete(request).final.usage.completion_tokens

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def options(group) -> None:
    group.add_argument("--streams", type=int, default=4)
    group.add_argument("--tokens", type=int, default=None, help="tokens per request (default 64; 16 with --quick)")


def scenario(args: argparse.Namespace) -> dict:
    from sidecar.api import pb
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    args.tokens = args.tokens or (16 if args.quick else 64)
    daemon = start_daemon("--model", str(args.model_path), "--stream-interval-ms", "33", drain=False)
    listening = next(e for e in daemon.log_lines if e.get("event") == "listening")
    print("plan: tier threads", listening.get("tier_threads"), "planned", listening.get("planned"))
    results: dict[str, list[float]] = {"governor": [], "by hand": []}
    try:
        with busy_core(cpu=0), daemon.client(timeout_s=600) as client:
            planned = max(t.threads for t in client.status().schedule.tiers)
            aggregate_tokens_per_s(daemon, args.streams, 8, "warm-up")
            for r in range(args.repeats):
                for side in ("governor", "by hand"):
                    # A fresh configuration each round: the governor starts again at the plan's
                    # threads, so every "governor" figure includes noticing the busy core.
                    client.set_budget(pb.SetBudgetRequest(max_cpu_threads=1 if side == "by hand" else planned))
                    load = os.getloadavg()[0]
                    rate = aggregate_tokens_per_s(daemon, args.streams, args.tokens, f"round {r} {side}")
                    results[side].append(rate)
                    print(f"round {r} {side:8s}: {rate:6.1f} tokens/s (load {load:.2f})", flush=True)
    finally:
        stop_daemon(daemon)
    g, h = statistics.median(results["governor"]), statistics.median(results["by hand"])
    print(f"{args.streams} streams x {args.tokens} tokens, one core busy: governor {g:.1f} tokens/s "
          f"[{min(results['governor']):.1f} .. {max(results['governor']):.1f}], maxCpuThreads 1 by hand {h:.1f} "
          f"[{min(results['by hand']):.1f} .. {max(results['by hand']):.1f}]; ratio {g / h:.2f}x (target >= 0.9x); "
          f"planned threads {planned}; load {os.getloadavg()}")
    capped = [line[:200] for line in daemon.process.stderr.read().splitlines() if "thread cap" in line]
    for line in capped:
        print("daemon:", line)
    return {"streams": args.streams, "tokens": args.tokens, "planned_threads": planned, "tokens_per_s": results,
            "ratio": g / h, "thread_cap_lines": capped}
