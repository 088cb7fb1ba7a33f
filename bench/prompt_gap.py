"""What one large prompt costs the other NPCs (issue 37, 2): three streams reply token by token
while a fourth request brings a prompt at the token limit (accepted, --max-prompt-tokens), one
just under the size check (32 bytes a token of the limit: it passes the check, is tokenized, and
is refused for its tokens) or 6 MB (refused by the size check, before any tokenizing); the
streams' longest gap against their typical one, in passes. Quiet and beside a busy core. With --before-src DIR (a
checkout of another commit, e.g. `git worktree add /tmp/before HEAD~1`), that daemon is measured
in the same run, rounds alternating. Target: the longest gap no more than one pass longer than
with no such request.

    python bench/run.py prompt-gap [--before-src DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

from bench.common import busy_core
from sidecar.service.request_checks import MAX_BYTES_PER_TOKEN

# The defaults of a daemon: --ctx 4096, so --max-prompt-tokens 3072 and 98 KB pass the size check.
CTX, LIMIT = 4096, 3072
STREAMS = 3
FILLER = "the old mill by the river keeps its wheel turning "
LOADS = ("none", "at the limit", "at the size check", "6 MB")


def options(group) -> None:
    group.add_argument("--before-src", help="a checkout of another commit to measure side by side")
    group.add_argument("--reply-tokens", type=int, default=None, help="tokens each stream replies (default 160)")
    group.add_argument("--no-frame-guard", action="store_true",
                       help="both daemons without the frame guard (on by default: it caps a pass's tokens itself "
                            "when it sees load, which hides what the scheduler does alone)")


def _stream(client, tag: str, tokens: int, times: list[float]) -> None:
    from sidecar.api import pb

    request = pb.GenerateRequest(prompt=f"{tag}: The caravan reached the gates at dusk, and the guard",
                                 max_tokens=tokens, sampling=pb.SamplingParams(temperature=0, repeat_penalty=1.0))
    for chunk in client.generate(request):
        if chunk.text:
            times.append(time.perf_counter())


def _load_prompt(client, load: str, tag: str) -> str:
    """The large request's text, opened by `tag`: new to the prefix cache every round."""
    return f"{tag}. " + _load_text(client, load)


def _load_text(client, load: str) -> str:
    if load == "at the size check":
        size = LIMIT * MAX_BYTES_PER_TOKEN - 128  # the service's check counts the template's and tag's bytes
        return (FILLER * (1 + size // len(FILLER)))[:size]
    if load == "6 MB":
        return (FILLER * (1 + (6 << 20) // len(FILLER)))[: 6 << 20]
    per = len(client.tokenize(FILLER))
    return FILLER * ((LIMIT - 80) // per)  # at the limit, less the template's and the tag's tokens


def one_round(client, load: str, tokens: int, tag: str) -> dict:
    """The streams' gaps (ms): the longest, and the median, while `load` is sent once they run."""
    from sidecar.api import pb

    times: list[list[float]] = [[] for _ in range(STREAMS)]
    threads = [threading.Thread(target=_stream, args=(client, f"{tag} npc {i}", tokens, times[i])) for i in range(STREAMS)]
    for t in threads:
        t.start()
    while any(len(ts) < 4 for ts in times) and any(t.is_alive() for t in threads):
        time.sleep(0.01)
    outcome, took = "-", 0.0
    if load != "none":
        prompt = _load_prompt(client, load, tag)
        t0 = time.perf_counter()
        try:
            client.complete(pb.GenerateRequest(prompt=prompt, max_tokens=1))
            outcome = "served"
        except Exception as e:  # noqa: BLE001 - the refusal is what the large ones get
            code = e.code() if callable(getattr(e, "code", None)) else type(e).__name__
            outcome = getattr(code, "name", str(code))
        took = time.perf_counter() - t0
    for t in threads:
        t.join()
    gaps = [(b - a) * 1000 for ts in times for a, b in zip(ts[1:], ts[2:])]  # from the second token
    return {"longest_ms": max(gaps), "median_ms": statistics.median(gaps), "outcome": outcome, "load_s": took}


def scenario(args: argparse.Namespace) -> dict:
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    tokens = args.reply_tokens or (48 if args.quick else 160)
    flags = ("--model", str(args.model_path), "--ctx", str(CTX), "--max-prompt-tokens", str(LIMIT), "--parallel", str(STREAMS + 1),
             "--stream-interval-ms", "0", "--profile", "off", "--no-websocket")
    flags += ("--no-frame-guard",) if args.no_frame_guard else ()
    sides = {"this tree": start_daemon(*flags)}
    if args.before_src:
        env = {"PYTHONPATH": os.path.abspath(args.before_src)}
        # -P: `python -m` would put the working directory (this tree) ahead of PYTHONPATH, and the
        # "before" daemon would be this tree's again.
        sides["before"] = start_daemon(*flags, env=env, program=(sys.executable, "-P", "-m", "sidecar"))
    results: dict = {}
    try:
        for side, daemon in sides.items():  # first passes, the KV's first growth: not measured
            with daemon.client(timeout_s=600) as client:
                one_round(client, "at the limit", 16, f"{side} warm-up")
        for busy in (False, True):
            with busy_core(on=busy):
                for r in range(args.repeats):
                    for load in LOADS:
                        for side, daemon in sides.items():
                            with daemon.client(timeout_s=600) as client:
                                got = one_round(client, load, tokens, f"{side} round {r} {busy} {load}")
                            key = f"{'busy core' if busy else 'quiet'} | {side} | {load}"
                            results.setdefault(key, []).append(got)
                            print(f"round {r} {key}: longest gap {got['longest_ms']:.0f} ms, median {got['median_ms']:.0f} ms, "
                                  f"the large request {got['outcome']} in {got['load_s'] * 1000:.0f} ms", flush=True)
    finally:
        for daemon in sides.values():
            stop_daemon(daemon)
    summary = {}
    guard = "off" if args.no_frame_guard else "on"
    print(f"\n{STREAMS} streams x {tokens} tokens, --ctx {CTX} --max-prompt-tokens {LIMIT}, frame guard {guard}; "
          f"medians over {args.repeats} rounds")
    print(f"{'':44s} longest gap  median gap  extra passes  the large request")
    for key, rounds in results.items():
        longest = statistics.median(g["longest_ms"] for g in rounds)
        median = statistics.median(g["median_ms"] for g in rounds)
        base = statistics.median(g["longest_ms"] for g in results[key.rsplit("|", 1)[0] + "| none"])
        extra = (longest - base) / median if median else 0.0
        summary[key] = {"longest_ms": longest, "median_ms": median, "extra_passes": extra,
                        "outcome": rounds[-1]["outcome"], "load_ms": statistics.median(g["load_s"] for g in rounds) * 1000}
        print(f"{key:44s} {longest:8.0f} ms {median:8.0f} ms {extra:10.1f}     {rounds[-1]['outcome']} "
              f"({summary[key]['load_ms']:.0f} ms)")
    return {"streams": STREAMS, "tokens": tokens, "frame_guard": guard, "ctx": CTX, "limit": LIMIT, "rounds": results, "summary": summary}
