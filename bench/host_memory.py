"""What the daemon holds of the player's RAM (issue 27's measures), side by side in one run:

A) idle resident memory, the default model, the daemon with its defaults against llama.cpp's
   llama-server with its defaults (-t 2), sides interleaved;
B) on a fresh daemon, 4 then 16 one-off streams at once (aggregate tokens/s: the KV grows during
   them), then 16 NPCs talking at once (a session each, 64-token replies, two waves): resident
   memory at its peak, just after, and once the sequences are given back (the daemon waits 30 s
   of quiet), for the daemon as it is (KV grows with the crowd) and with every sequence allocated
   at start (--parallel 16: the engine path and memory of the commit before), with the crowd's
   all-spoken time;
C) the same crowd under --ram-budget 512M: the peak must stay under it (fewer NPCs at once).

    python bench/run.py ram [--llama-bin DIR] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import threading
import time

from bench import common

NPCS = 16
REPLY_TOKENS = 64
WORLD = ("Oakvale is a harbour town of fishers and smiths under a grey sky. The mages of the tower watch "
         "the bay, and the old bridge to the north fell in the spring floods. ") * 3


def _rss(pid: int) -> int:
    import psutil

    return psutil.Process(pid).memory_info().rss


class Peak:
    """The largest resident memory of a process, sampled every 50 ms while in a `with`."""

    def __init__(self, pid: int) -> None:
        self.pid, self.value, self._stop = pid, 0, threading.Event()

    def __enter__(self) -> "Peak":
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.value = max(self.value, _rss(self.pid))
            self._stop.wait(0.05)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _crowd(client, tag: str) -> float:
    """Two waves of NPCS sessions talking at once; the wall time of both."""
    from sidecar.api import pb

    def npc(i: int, line: str) -> None:
        request = pb.GenerateRequest(
            messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=line)]), context=WORLD,
            session_id=f"{tag}-{i}", max_tokens=REPLY_TOKENS, sampling=pb.SamplingParams(temperature=0.0))
        client.complete(request)

    t0 = time.perf_counter()
    for line in ("Good evening! What news from the harbour?", "And what about the bridge?"):
        talkers = [threading.Thread(target=npc, args=(i, f"(NPC {i}) {line}")) for i in range(NPCS)]
        for t in talkers:
            t.start()
        for t in talkers:
            t.join()
    return time.perf_counter() - t0


def _aggregate_tokens_per_s(client, streams: int, tag: str) -> float:
    """`streams` one-off requests at once (fresh prompts), generated tokens per second of wall time."""
    from sidecar.api import pb

    counts = [0] * streams

    def one(i: int) -> None:
        reply = client.complete(pb.GenerateRequest(prompt=f"{tag} story {i}: once upon a time", max_tokens=REPLY_TOKENS,
                                                   sampling=pb.SamplingParams(temperature=0.0)))
        counts[i] = reply.final.usage.completion_tokens

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def _daemon_side(model, flags: list[str], settle_s: float) -> dict:
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    daemon = start_daemon("--model", str(model), *common.profile_flags(), *flags)
    pid = daemon.process.pid
    try:
        with daemon.client(timeout_s=600) as client:
            time.sleep(2)
            idle = _rss(pid)
            with Peak(pid) as peak:
                # First on a fresh daemon: the KV grows during these (the worst case for growth).
                rates = {n: _aggregate_tokens_per_s(client, n, f"b{n}") for n in (4, 16)}
                wall = _crowd(client, "v")
            after = _rss(pid)
            deadline, settled = time.monotonic() + settle_s, after
            while time.monotonic() < deadline:
                time.sleep(1)
                settled = _rss(pid)
                if client.status().memory.kv_sequences <= 2:
                    break
            back_s = settle_s - (deadline - time.monotonic())
            memory = client.status().memory
            return {"idle": idle, "peak": peak.value, "after": after, "settled": settled, "back_s": back_s,
                    "wall_s": wall, "sequences_max": memory.kv_sequences_max, "tokens_per_s": rates}
    finally:
        stop_daemon(daemon)


def _idle_llama_server(binary, model) -> int:
    port = common.free_port()
    process = subprocess.Popen([str(binary), "-m", str(model), "-t", "2", "--port", str(port), "--no-webui"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peer = common.HttpPeer("llama-server", process, f"http://127.0.0.1:{port}")
    try:
        peer.wait_ready()
        time.sleep(2)
        return _rss(process.pid)
    finally:
        peer.stop()


def _idle_daemon(model) -> int:
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    daemon = start_daemon("--model", str(model), *common.profile_flags())
    try:
        time.sleep(2)
        return _rss(daemon.process.pid)
    finally:
        stop_daemon(daemon)


def scenario(args: argparse.Namespace) -> dict:
    repeats = args.repeats or 2
    binary = common.find_llama_binary("llama-server", args.llama_bin)
    idle = {"daemon": [], "llama-server": []}
    for _ in range(repeats):
        idle["daemon"].append(_idle_daemon(args.model_path))
        if binary is not None:
            idle["llama-server"].append(_idle_llama_server(binary, args.model_path))
    settle = 10 if args.quick else 75
    crowd = {}
    for name, flags in (("grows with the crowd", []), ("all 16 at start (--parallel 16)", ["--parallel", "16"]),
                        ("--ram-budget 512M", ["--ram-budget", "512M"])):
        crowd[name] = _daemon_side(args.model_path, flags, settle if not flags or "--ram-budget" in flags else 0)
    return _report(idle, crowd)


def _report(idle: dict, crowd: dict) -> dict:
    mib = lambda b: b / 2**20  # noqa: E731
    med = {side: statistics.median(v) for side, v in idle.items() if v}
    print("\nA) idle resident memory, MiB (median of the rounds)")
    for side, value in med.items():
        print(f"  {side:18}{mib(value):8.0f}   {[round(mib(v)) for v in idle[side]]}")
    if len(med) == 2:
        print(f"  daemon / llama-server: {med['daemon'] / med['llama-server']:.2f}x (target <= 1.25x)")
    print(f"\nB, C) {NPCS} NPCs, two waves of {REPLY_TOKENS}-token replies; resident memory, MiB")
    print("  (first 4, then 16 one-off streams at once, aggregate tokens/s; then the crowd)")
    print(f"  {'side':34}{'idle':>7}{'peak':>7}{'after':>7}{'settled':>9}{'back in s':>11}{'all spoken s':>14}"
          f"{'tok/s @4':>10}{'tok/s @16':>11}{'max seq':>9}")
    for side, r in crowd.items():
        print(f"  {side:34}{mib(r['idle']):7.0f}{mib(r['peak']):7.0f}{mib(r['after']):7.0f}{mib(r['settled']):9.0f}"
              f"{r['back_s']:11.0f}{r['wall_s']:14.1f}{r['tokens_per_s'][4]:10.1f}{r['tokens_per_s'][16]:11.1f}"
              f"{r['sequences_max']:9}")
    grows, fixed = crowd.get("grows with the crowd"), crowd.get("all 16 at start (--parallel 16)")
    if grows and fixed:
        print(f"  grows / all at start: all spoken x{grows['wall_s'] / fixed['wall_s']:.3f}, tokens/s @4 "
              f"x{grows['tokens_per_s'][4] / fixed['tokens_per_s'][4]:.3f}, @16 "
              f"x{grows['tokens_per_s'][16] / fixed['tokens_per_s'][16]:.3f}")
    return {"idle": idle, "idle_median": med, "crowd": crowd}
