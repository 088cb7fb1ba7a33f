"""Decode tokens/s against the budget, measured through the daemon beside what the planner predicted.

One daemon; for each budget (VRAM sizes worth trying on this machine, from the planner's own
sweep, times thread caps 1 .. physical cores) SetBudget puts it in force, the response's schedule
gives the planner's predicted decode tokens/s (the 1-token tier), and greedy single-stream
requests measure it (the daemon's own decode timing, first token excluded). Without a GPU the
only VRAM budget is 0, so the sweep is over thread caps: the CPU half of the budget a game grants.

Part of `python bench/run.py planner` (after planner_fidelity.py's measures).
"""

from __future__ import annotations

import statistics
from pathlib import Path

PROMPT = "Tell me a long story about a dragon who guards a library."
# At most this many VRAM budgets (spread over the planner's sweep): each one costs a reload.
MAX_VRAM_POINTS = 5


def pick(values: tuple[int, ...], n: int) -> list[int]:
    """`n` values spread evenly over `values` (all of them when there are fewer), ends kept."""
    if len(values) <= n:
        return list(values)
    step = (len(values) - 1) / (n - 1)
    return sorted({values[round(i * step)] for i in range(n)})


def predicted_decode(schedule) -> float:
    from sidecar.api import pb

    decode = [t for t in schedule.tiers if t.phase == pb.TIER_PHASE_DECODE]
    return min(decode, key=lambda t: t.max_tokens).predicted_tokens_per_s if decode else 0.0


def run(model: Path | None = None, tokens: int = 64, repeats: int = 3) -> dict:
    import psutil

    from sidecar.api import pb
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon
    from sidecar.model_info.default_model import default_model_path
    from sidecar.model_info import inspect_gguf
    from sidecar.planner.sources import load_hardware
    from sidecar.planner.sweep import sweep_budgets

    model = model or default_model_path()
    hw, source = load_hardware(None)
    vrams = pick(sweep_budgets(inspect_gguf(model), hw), MAX_VRAM_POINTS)
    caps = list(range(1, (psutil.cpu_count(logical=False) or 1) + 1))
    print(f"\n== decode tokens/s against the budget: measured (daemon, {tokens} tokens, {repeats} repeats) "
          f"and predicted (planner, {source}) ==")
    points = []
    daemon = start_daemon("--model", str(model))
    try:
        with daemon.client(timeout_s=600) as client:
            nonce = 0
            for vram in vrams:
                for cap in caps:
                    change = client.set_budget(pb.SetBudgetRequest(vram_bytes=vram, max_cpu_threads=cap))
                    measured = []
                    for i in range(-1, repeats):  # -1 warms the new configuration up
                        nonce += 1
                        req = pb.GenerateRequest(
                            messages=pb.ChatMessages(messages=[pb.ChatMessage(role="system", content=f"Tale {nonce}."),
                                                               pb.ChatMessage(role="user", content=PROMPT)]),
                            max_tokens=tokens if i >= 0 else 4, sampling=pb.SamplingParams(temperature=0.0))
                        rate = client.complete(req).final.timings.decode_tokens_per_s
                        if i >= 0:
                            measured.append(rate)
                    point = {"vram_bytes": vram, "max_cpu_threads": cap, "predicted_tokens_per_s": predicted_decode(change.schedule),
                             "measured_tokens_per_s": measured, "reloaded": change.reloaded, "pause_ms": change.pause_ms}
                    points.append(point)
                    pred = point["predicted_tokens_per_s"]
                    print(f"VRAM {vram / 2**20:7.0f} MiB, threads {cap:2d}: measured {statistics.median(measured):7.1f} "
                          f"[{min(measured):.1f} .. {max(measured):.1f}] tok/s, "
                          + (f"predicted {pred:7.1f}  (measured/predicted {statistics.median(measured) / pred:.2f}x)"
                             if pred else "no prediction (the daemon runs without a plan)"))
    finally:
        stop_daemon(daemon)
    if len(vrams) == 1:
        print("(one VRAM budget: this machine has no GPU, so the budget that can change is the thread cap)")
    return {"hardware_source": source, "tokens": tokens, "points": points}
