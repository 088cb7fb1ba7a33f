"""A first start without a profile, and what the background profile is worth (issue 18's first two
measurements), quiet and beside a busy loop on one core, in one run.

1. First start: `xlm-sidecar serve --budget 0` with an empty cache (a fresh XDG_CACHE_HOME, so no
   profile and no probe files), launch to the first token of a chat reply; the daemon then stays up
   until its background profile lands (the `background profile saved` line), and that profile is
   kept. Quiet and busy launches alternate.
2. Tokens/s of one stream on three daemons started with `--profile FILE`: the reference taken on a
   quiet machine by `xlm-sidecar profile` (REFERENCE), the background profile that landed quiet,
   and the one that landed beside the busy loop; rounds interleaved over the daemons, quiet and
   with the busy loop running during the stream. Target: background / reference >= 0.95x.

    python bench/run.py first-start --reference PROFILE.json [--repeats 5] [--tokens 64] [--land-s 150]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import REPO, busy_core

PROMPT = "Greetings, traveller! Who are you?"


def uptime() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def first_start(busy: bool, land_s: float, keep: Path) -> dict:
    """Launch with an empty cache; seconds to listening and to the first token; then wait for the
    background profile and copy it to `keep`."""
    from sidecar.client import SidecarClient

    cache = Path(tempfile.mkdtemp(prefix="xlm-first-start-"))
    token = secrets.token_urlsafe(24)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "XLM_SIDECAR_TOKEN": token}
    out: dict = {"busy": busy}
    with busy_core(on=busy):
        t0 = time.monotonic()
        p = subprocess.Popen([sys.executable, "-m", "sidecar", "serve", "--budget", "0", "--port", "0",
                              "--log-format", "json"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             text=True, env=env, cwd=REPO)
        events: list[tuple[float, dict]] = []
        landed = threading.Event()

        def read() -> None:
            for line in p.stderr:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                events.append((time.monotonic() - t0, e))
                if e.get("event") == "re-planned with the measured profile":
                    landed.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            while not any(e.get("event") == "listening" for _, e in events):
                if p.poll() is not None:
                    raise RuntimeError(f"daemon exited with {p.returncode}: {[e for _, e in events]}")
                time.sleep(0.005)
            at, listening = next((t, e) for t, e in events if e.get("event") == "listening")
            out["listening_s"] = round(at, 2)
            with SidecarClient(listening["address"], token=token, timeout_s=120) as client:
                for _piece in client.chat(PROMPT, max_tokens=16):
                    out.setdefault("first_token_s", round(time.monotonic() - t0, 2))
            out["landed"] = landed.wait(land_s)
            saved = [(t, e) for t, e in events if e.get("event") == "background profile saved"]
            replanned = [e for _, e in events if e.get("event") == "re-planned with the measured profile"]
            ready = next((e for _, e in events if e.get("event") == "ready"), {})
            out["default_tier_threads"] = ready.get("tier_threads") or listening.get("tier_threads")
            if saved:
                out["profile_landed_s"] = round(saved[0][0], 1)
                shutil.copy(saved[0][1]["path"], keep)
                out["profile"] = str(keep)
            if replanned:
                out["tier_threads"] = replanned[0].get("tier_threads")
                out["profile_state"] = replanned[0].get("profile")
        finally:
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
            shutil.rmtree(cache, ignore_errors=True)
    if "profile" in out:
        from sidecar.profiler.database import load_profile

        db = load_profile(keep)
        out["deferred_threads"] = list(db.deferred_threads)
        out["contention"] = round(db.contention, 2)
    return out


def stream_rate(daemon, tokens: int, tag: str) -> float:
    """Decode tokens/s of one greedy stream: completion tokens after the first, over the time
    from the first chunk to the end."""
    from sidecar.api import pb

    request = pb.GenerateRequest(prompt=f"{tag}: Once upon a time", max_tokens=tokens,
                                 sampling=pb.SamplingParams(temperature=0, repeat_penalty=1.0))
    first = None
    final = None
    with daemon.client(timeout_s=300) as client:
        for chunk in client.generate(request):
            if first is None and (chunk.text or chunk.token_ids):
                first = time.perf_counter()
            if chunk.HasField("final"):
                final = chunk.final
    end = time.perf_counter()
    n = final.usage.completion_tokens if final is not None else 0
    return (n - 1) / (end - first) if first is not None and n > 1 and end > first else 0.0


def options(group) -> None:
    group.add_argument("--reference", type=Path, required=True,
                       help="a profile taken on a quiet machine by `xlm-sidecar profile --out`")
    group.add_argument("--tokens", type=int, default=64)
    group.add_argument("--land-s", type=float, default=150.0, help="how long to wait for the background profile")
    group.add_argument("--starts", type=int, default=1, help="first starts per condition (alternating)")


def scenario(args: argparse.Namespace) -> dict:
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    keep = Path(tempfile.mkdtemp(prefix="xlm-landed-"))
    print("start:", uptime(), flush=True)
    starts: dict[bool, list[dict]] = {False: [], True: []}
    for i in range(args.starts):
        for busy in (False, True):
            r = first_start(busy, args.land_s, keep / f"{'busy' if busy else 'quiet'}-{i}.json")
            starts[busy].append(r)
            print(f"first start {'busy ' if busy else 'quiet'}: {json.dumps(r)}  ({uptime()})", flush=True)
    profiles = {"reference": args.reference}
    for busy in (False, True):
        landed = [r for r in starts[busy] if "profile" in r]
        if landed:
            profiles["landed busy" if busy else "landed quiet"] = Path(landed[0]["profile"])
    daemons = {name: start_daemon("--budget", "0", "--profile", str(path)) for name, path in profiles.items()}
    rates: dict[tuple[str, bool], list[float]] = {}
    try:
        plans = {}
        for name, d in daemons.items():
            ready = next(e for e in d.log_lines if e.get("event") == "ready")
            plans[name] = {k: ready.get(k) for k in ("ctx", "parallel", "tier_threads", "placement")}
            print(f"{name:13s} plan {json.dumps(plans[name])}", flush=True)
            stream_rate(d, 8, "warm-up")
        same = all(p == plans["reference"] for p in plans.values())
        print("the plans are", "the same: the ratios below measure noise" if same else "different", flush=True)
        names = list(daemons)
        for busy in (False, True):
            with busy_core(on=busy):
                for r in range(args.repeats):
                    # The order rotates each round, so no daemon always streams first after a pause.
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        d = daemons[name]
                        rate = stream_rate(d, args.tokens, f"round {r} {name}")
                        rates.setdefault((name, busy), []).append(rate)
                        print(f"{'busy ' if busy else 'quiet'} round {r} {name:13s} {rate:6.1f} tokens/s ({uptime()})",
                              flush=True)
    finally:
        for d in daemons.values():
            stop_daemon(d)
    print()
    for busy in (False, True):
        cond = "busy " if busy else "quiet"
        ts = [r["first_token_s"] for r in starts[busy] if "first_token_s" in r]
        landed = [r.get("profile_landed_s") for r in starts[busy]]
        print(f"{cond}: launch to first token {ts} s (target <= 5 s); background profile landed at {landed} s")
    for busy in (False, True):
        cond = "busy " if busy else "quiet"
        ref = statistics.median(rates[("reference", busy)])
        line = f"{cond} stream: reference {ref:.1f} tokens/s"
        for name in profiles:
            if name == "reference":
                continue
            med = statistics.median(rates[(name, busy)])
            spread = f"{min(rates[(name, busy)]):.1f}..{max(rates[(name, busy)]):.1f}"
            line += f"; {name} {med:.1f} [{spread}] ({med / ref:.2f}x)"
        ref_spread = f"{min(rates[('reference', busy)]):.1f}..{max(rates[('reference', busy)]):.1f}"
        print(line + f" (reference [{ref_spread}]; medians of {args.repeats} rounds; target >= 0.95x)")
    print("end:", uptime())
    return {"first_starts": {"quiet": starts[False], "busy": starts[True]}, "plans": plans,
            "tokens_per_s": {f"{name} {'busy' if busy else 'quiet'}": v for (name, busy), v in rates.items()}}

