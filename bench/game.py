"""A game's frame rate beside NPCs talking (issue 26): bench/game_loop.py at 60 fps with 8 ms of work
a frame, alone and beside 4 NPC conversations streaming 128-token replies again and again, from
llama-server (defaults, and -t 1) and from the daemon with its frame-time guard off, on with the
game reporting its frames, and on watching the game's process only. Sides interleaved, one round
after another; the game on one thread, then on two.

    python bench/run.py game [--seconds 60] [--game-threads 1,2] [--fps 60] [--work-ms 8]

Per side: frame work p50/p99/p99.9, the share of frames past their deadline and of hitches (over
twice the budget), the NPCs' aggregate tokens/s, and their first-token time (p50, p99): what a
player waits for beside the game. Targets (guard on): late frames at most the
game alone's share + 0.5 points, p99 within 1.2x the game alone's, hitches at most alone + 0.1%,
tokens/s at least half of the guard off's and at least llama-server -t 1's.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import common

SIDES = ("alone", "llama-server", "llama-server -t 1", "guard off", "guard on (reports)", "guard on (watching)",
         "guard on (reports) nice 19")
# Run by default: the last side is the guard's weaker priority lever (nice 19 instead of the idle
# class), there to be measured against the default with --sides.
DEFAULT_SIDES = SIDES[:-1]


def options(group) -> None:
    group.add_argument("--seconds", type=float, default=None, help="per side (default 60; 8 with --quick)")
    group.add_argument("--game-threads", default="1,2", help="game variants: threads doing the frame's work")
    group.add_argument("--fps", type=float, default=60.0)
    group.add_argument("--work-ms", type=float, default=8.0, help="CPU work per frame per thread, on a quiet machine")
    group.add_argument("--npcs", type=int, default=4)
    group.add_argument("--tokens", type=int, default=128)
    group.add_argument("--sides", default=",".join(DEFAULT_SIDES), help="comma-separated subset of: " + ", ".join(SIDES))


class NpcLoad:
    """`npcs` threads, each streaming replies of `tokens` tokens back to back; tokens are counted as
    they arrive, so a window's rate is exact whatever the requests' edges."""

    def __init__(self, stream_one, npcs: int) -> None:
        self.arrivals: list[float] = []
        self.first_tokens: list[tuple[float, float]] = []  # (request sent, ms to its first token)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._npc, args=(stream_one, i), daemon=True) for i in range(npcs)]
        for t in self.threads:
            t.start()

    def _npc(self, stream_one, i: int) -> None:
        turn = 0
        while not self.stop.is_set():
            sent, seen = time.perf_counter(), []

            def arrived(n: int, sent: float = sent, seen: list = seen) -> None:
                if not seen:  # what a player waits for: the reply's first token
                    seen.append(True)
                    with self.lock:
                        self.first_tokens.append((sent, (time.perf_counter() - sent) * 1000))
                self._arrived(n)

            try:
                stream_one(i, turn, arrived)
            except Exception as e:  # noqa: BLE001 - a failed stream is reported, not fatal
                self.errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.5)
            turn += 1

    def _arrived(self, n: int) -> None:
        now = time.perf_counter()
        with self.lock:
            self.arrivals.extend([now] * n)

    def rate(self, t0: float, t1: float) -> float:
        with self.lock:
            return sum(1 for t in self.arrivals if t0 <= t <= t1) / (t1 - t0)

    def first_token_ms(self, t0: float, t1: float) -> tuple[float, float, int]:
        """p50 and p99 of the first-token times of requests sent between t0 and t1, and how many
        there were (none in a side shorter than a reply: --quick's 128-token replies outlast 3 s)."""
        with self.lock:
            times = sorted(ms for sent, ms in self.first_tokens if t0 <= sent <= t1)
        if not times:
            return 0.0, 0.0, 0
        return times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))], len(times)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def _npc_line(i: int, turn: int) -> list[dict]:
    return [{"role": "system", "content": f"You are villager {i} of Ashford, a talkative baker."},
            {"role": "user", "content": f"Tell me everything about the harvest festival, part {turn}."}]


def _daemon_streamer(daemon, tokens: int):
    from sidecar.api import pb

    client = daemon.client(timeout_s=600)
    eog = common.end_token_ids(client)

    def one(i: int, turn: int, arrived) -> None:
        messages = pb.ChatMessages(messages=[pb.ChatMessage(**m) for m in _npc_line(i, turn)])
        request = pb.GenerateRequest(messages=messages, max_tokens=tokens,
                                     sampling=pb.SamplingParams(temperature=0.7, seed=turn * 16 + i,
                                                                logit_bias={t: -100.0 for t in eog}))
        for chunk in client.generate(request):
            if chunk.token_ids:
                arrived(len(chunk.token_ids))

    return one, client


def _llama_server_streamer(peer, tokens: int):
    import httpx

    http = httpx.Client(timeout=600)

    def one(i: int, turn: int, arrived) -> None:
        body = {"messages": _npc_line(i, turn), "max_tokens": tokens, "temperature": 0.7, "seed": turn * 16 + i,
                "stream": True, "ignore_eos": True}
        with http.stream("POST", f"{peer.base_url}/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    event = json.loads(line[5:])
                    if any((c.get("delta") or {}).get("content") for c in event.get("choices") or ()):
                        arrived(1)

    return one, http


def _game(args, units: int, threads: int, seconds: float, folder: Path, report: str | None, token: str | None):
    start_file = folder / f"go-{time.monotonic_ns()}"
    out = folder / f"frames-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "bench.game_loop", "--fps", str(args.fps), "--units", str(units), "--threads",
           str(threads), "--seconds", str(seconds), "--out", str(out), "--start-file", str(start_file)]
    if report:
        cmd += ["--report", report]
    env = {**os.environ, **({"XLM_SIDECAR_TOKEN": token} if token else {})}
    return subprocess.Popen(cmd, env=env, cwd=Path(__file__).resolve().parent.parent), start_file, out


def _frame_figures(result: dict, fps: float) -> dict:
    frames = result["frame_work_ms"]
    budget = 1000.0 / fps
    ordered = sorted(frames)
    return {"frames": len(frames), "p50": common.percentile(ordered, 50), "p99": common.percentile(ordered, 99),
            "p999": common.percentile(ordered, 99.9), "late_pct": 100.0 * result["late"] / len(frames),
            "hitch_pct": 100.0 * sum(1 for f in frames if f > 2 * budget) / len(frames)}


def _side(args, side: str, units: int, threads: int, seconds: float, folder: Path, model: Path, binary) -> dict:
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    server = daemon = streamer_owner = game = None
    try:
        if side.startswith("guard on (reports)"):
            # The game must know the daemon's address before its frames start: the daemon first.
            # So the daemon's parent is this harness, not the game: the game reports with the game
            # token, as a launcher names a game that did not start the daemon itself.
            flags = ["--frame-guard-priority", "low"] if side.endswith("nice 19") else []
            game_token = secrets.token_urlsafe(24)
            daemon = start_daemon("--model", str(model), *common.profile_flags(), "--stream-interval-ms", "33", *flags,
                                  env={"XLM_SIDECAR_GAME_TOKEN": game_token})
            game, start_file, out = _game(args, units, threads, seconds, folder, daemon.address, game_token)
        else:
            game, start_file, out = _game(args, units, threads, seconds, folder, None, None)
        if side.startswith("llama-server"):
            t = 1 if side.endswith("-t 1") else None
            port = common.free_port()
            cmd = [str(binary), "-m", str(model), "--port", str(port), "--no-webui", "-np", str(args.npcs)]
            cmd += ["-t", str(t), "-tb", str(t)] if t else []
            server = common.HttpPeer(side, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                                     f"http://127.0.0.1:{port}")
            server.wait_ready()
            stream_one, streamer_owner = _llama_server_streamer(server, args.tokens)
        elif side in ("guard off", "guard on (watching)"):
            # The game launched the daemon, as it would: --parent-pid names it (the guard watches it).
            flags = ["--no-frame-guard"] if side == "guard off" else []
            daemon = start_daemon("--model", str(model), *common.profile_flags(), "--stream-interval-ms", "33",
                                  "--parent-pid", str(game.pid), *flags)
        if daemon is not None:
            stream_one, streamer_owner = _daemon_streamer(daemon, args.tokens)
        load = None
        if side != "alone":
            stream_one(0, 1000, lambda n: None)  # warm: the model's first pass, the KV grown
            load = NpcLoad(stream_one, args.npcs)
            time.sleep(1 if args.quick else 3)  # every NPC streaming before the frames start
        t0 = time.perf_counter()
        start_file.touch()
        guard = None
        if daemon is not None:
            # Before the game's end: the daemon it launched (--parent-pid) stops with it.
            time.sleep(max(0.0, seconds - 1.5))
            with daemon.client() as c:
                guard = c.status().frame_guard
        game.wait(seconds + 60)
        t1 = time.perf_counter()
        played = json.loads(out.read_text())
        figures = _frame_figures(played, args.fps)
        if "report_errors" in played:  # the game's reports the daemon refused or did not answer
            figures["report_errors"] = played["report_errors"]
        figures["tokens_per_s"] = load.rate(t0, t1) if load else 0.0
        figures["ttft_p50_ms"], figures["ttft_p99_ms"], figures["ttft_requests"] = (
            load.first_token_ms(t0, t1) if load else (0.0, 0.0, 0))
        if load is not None:
            load.close()
            figures["npc_errors"] = len(load.errors)
        if guard is not None:
            figures["guard"] = {"threads": guard.max_threads, "pass_tokens": guard.max_pass_tokens,
                                "pause_ms": round(guard.pause_ms, 1), "source": guard.source,
                                "reason": guard.reason, "changes": guard.changes}
        return figures
    finally:
        if game is not None and game.poll() is None:
            game.kill()
        if streamer_owner is not None:
            streamer_owner.close()
        if server is not None:
            server.stop()
        if daemon is not None:
            stop_daemon(daemon)


def scenario(args: argparse.Namespace) -> dict:
    seconds = args.seconds or (8.0 if args.quick else 60.0)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = set(sides) - set(SIDES)
    if unknown:
        raise SystemExit(f"unknown sides: {sorted(unknown)}")
    binary = common.find_llama_binary("llama-server", args.llama_bin)
    if binary is None:
        print("llama-server not found (PATH, $LLAMA_CPP_BIN or --llama-bin): its sides are skipped")
        sides = [s for s in sides if not s.startswith("llama-server")]
    model = args.model_path
    rate = json.loads(subprocess.run([sys.executable, "-m", "bench.game_loop", "--calibrate"], capture_output=True,
                                     text=True, check=True, cwd=Path(__file__).resolve().parent.parent).stdout)
    units = max(1, round(rate["units_per_ms"] * args.work_ms))
    print(f"game: {args.fps:g} fps, {args.work_ms:g} ms of work a frame ({units} units), {seconds:g} s a side, "
          f"{args.npcs} NPCs x {args.tokens} tokens")
    results: dict = {"units": units, "seconds": seconds, "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for threads in [int(t) for t in args.game_threads.split(",")]:
            rows: dict[str, list[dict]] = {s: [] for s in sides}
            for r in range(args.repeats):
                for side in sides:
                    rows[side].append(_side(args, side, units, threads, seconds, Path(tmp), model, binary))
                    print(f"  [{threads} game thread(s), round {r + 1}] {side}: {_line(rows[side][-1])}", flush=True)
            results["variants"][str(threads)] = rows
            _table(threads, rows)
    return results


def _first_tokens(f: dict) -> str:
    if "npc_errors" not in f:  # the game alone
        return "no NPCs"
    if not f.get("ttft_requests"):
        return "NPC first token: no reply started in the side"
    return f"NPC first token p50 {f['ttft_p50_ms']:.0f} p99 {f['ttft_p99_ms']:.0f} ms ({f['ttft_requests']} replies)"


def _line(f: dict) -> str:
    return (f"p50 {f['p50']:.1f} p99 {f['p99']:.1f} p99.9 {f['p999']:.1f} ms, late {f['late_pct']:.2f}%, "
            f"hitches {f['hitch_pct']:.2f}%, {f['tokens_per_s']:.1f} tok/s, {_first_tokens(f)}"
            + (f" | guard: {f['guard']['threads'] or 'plan'} threads, {f['guard']['source']}" if "guard" in f else ""))


def _median(rows: list[dict], key: str) -> float:
    values = sorted(r[key] for r in rows)
    return values[len(values) // 2]


def _table(threads: int, rows: dict[str, list[dict]]) -> None:
    print(f"\ngame on {threads} thread(s): medians over rounds")
    print(f"  {'side':24} {'p50':>6} {'p99':>6} {'p99.9':>6} {'late %':>7} {'hitch %':>8} {'tok/s':>7}"
          f" {'NPC 1st tok p50':>16} {'p99 ms':>7}")
    for side, rs in rows.items():
        if rs:
            print(f"  {side:24} {_median(rs, 'p50'):6.1f} {_median(rs, 'p99'):6.1f} {_median(rs, 'p999'):6.1f} "
                  f"{_median(rs, 'late_pct'):7.2f} {_median(rs, 'hitch_pct'):8.2f} {_median(rs, 'tokens_per_s'):7.1f}"
                  + (f" {_median(rs, 'ttft_p50_ms'):16.0f} {_median(rs, 'ttft_p99_ms'):7.0f}"
                     if _median(rs, 'ttft_requests') else f" {'-':>16} {'-':>7}"))
    alone = rows.get("alone")
    off = rows.get("guard off")
    peer = rows.get("llama-server -t 1")
    for side in ("guard on (reports)", "guard on (watching)", "guard on (reports) nice 19"):
        on = rows.get(side)
        if not on or not alone:
            continue
        checks = [
            ("late <= alone + 0.5 pt", _median(on, "late_pct") <= _median(alone, "late_pct") + 0.5),
            ("p99 <= 1.2x alone", _median(on, "p99") <= 1.2 * _median(alone, "p99")),
            ("hitches <= alone + 0.1 pt", _median(on, "hitch_pct") <= _median(alone, "hitch_pct") + 0.1),
        ]
        if off:
            ratio = _median(on, "tokens_per_s") / max(1e-9, _median(off, "tokens_per_s"))
            checks.append((f"tok/s vs guard off {ratio:.2f} >= 0.5", ratio >= 0.5))
        if peer:
            ratio = _median(on, "tokens_per_s") / max(1e-9, _median(peer, "tokens_per_s"))
            checks.append((f"tok/s vs llama-server -t 1 {ratio:.2f} >= 1", ratio >= 1.0))
        print(f"  {side}: " + ", ".join(f"{name} {'ok' if ok else 'MISSED'}" for name, ok in checks))
