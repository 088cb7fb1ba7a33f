"""What a plugin moving from llama-server gets from the new API calls (issue 28's measures):

A) several candidate lines: `n=4` replies of 48 tokens to one NPC prompt in one request, against
   the same 4 lines as 4 separate requests sent at once; wall time, and the prompt tokens the
   daemon computed (its status counter, before and after: the prompt must be computed once);
B) embeddings per second for short dialogue lines, one line per request, on the daemon's
   /v1/embeddings and on llama-server's (a second llama-server with --embeddings, same model,
   same threads), sides interleaved.

    python bench/run.py api-parity [--llama-bin DIR] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import common

REPLY_TOKENS = 48
CANDIDATES = 4
PERSONA = ("You are Brann, the blacksmith of Oakvale. You speak in short, gruff sentences. You love your forge, "
           "you distrust the mages of the tower, and you sell swords, axes, horseshoes and nails. The player has "
           "just walked into your smithy at dusk, soaked from the rain, and is looking at the swords on the wall. ")
LINES = ["Did you see the wolves near the mill?", "I gave the innkeeper twelve silver coins.",
         "The bridge to the north is broken.", "My sister lives in the harbour town.",
         "Never trust the mage in the tower.", "I found a strange ring in the forest."]


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--embed-requests", type=int, default=40, help="embedding requests per side per repeat")


def _chat(http, base: str, headers: dict, n: int, tag: str) -> dict:
    # The tag opens the prompt: no earlier request's prefix is cached, so the prompt is all new.
    body = {"model": "npc", "messages": [{"role": "system", "content": f"Evening {tag}. {PERSONA}"},
                                         {"role": "user", "content": "What would you sell me?"}],
            "max_tokens": REPLY_TOKENS, "temperature": 0.9, "n": n}
    r = http.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=600)
    r.raise_for_status()
    return r.json()


def candidates_round(http, base: str, headers: dict, status, tag: str) -> dict:
    """One repeat: n=4 in one request, then 4 separate requests at once; prompts differ by tag so
    neither side finds the other's prompt cached."""
    out = {}
    for side in ("n=4 in one request", "4 requests at once"):
        before = status()
        t0 = time.perf_counter()
        if side.startswith("n="):
            replies = [_chat(http, base, headers, CANDIDATES, f"{tag}-a")]
        else:
            with ThreadPoolExecutor(CANDIDATES) as pool:
                replies = list(pool.map(lambda _: _chat(http, base, headers, 1, f"{tag}-b"), range(CANDIDATES)))
        wall = time.perf_counter() - t0
        lines = sum(len(r["choices"]) for r in replies)
        assert lines == CANDIDATES, f"{side}: {lines} lines"
        out[side] = {"wall_s": wall, "prompt_computed": status() - before,
                     "prompt_tokens": replies[0]["usage"]["prompt_tokens"]}
    return out


def embeddings_per_s(http, base: str, headers: dict, count: int) -> float:
    t0 = time.perf_counter()
    for i in range(count):
        r = http.post(f"{base}/v1/embeddings", json={"model": "npc", "input": LINES[i % len(LINES)]},
                      headers=headers, timeout=120)
        r.raise_for_status()
        assert r.json()["data"][0]["embedding"]
    return count / (time.perf_counter() - t0)


def _start_embedding_server(binary: Path, model: Path, threads: int) -> common.HttpPeer:
    import subprocess

    port = common.free_port()
    process = subprocess.Popen(
        [str(binary), "-m", str(model), "--port", str(port), "-t", str(threads), "-tb", str(threads),
         "--embeddings", "--pooling", "mean", "-c", "2048", "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peer = common.HttpPeer("llama-server --embeddings", process, f"http://127.0.0.1:{port}")
    peer.wait_ready()
    return peer


def scenario(args: argparse.Namespace) -> dict:
    import httpx

    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    repeats = args.repeats or 3
    count = 6 if args.quick else args.embed_requests
    daemon = start_daemon("--model", str(args.model_path), *common.profile_flags())
    listening = next(e for e in daemon.log_lines if e.get("event") == "listening")
    base, headers = listening["http_address"], {"Authorization": f"Bearer {daemon.token}"}
    client = daemon.client(timeout_s=600)
    status = lambda: client.status().throughput.prompt_tokens_processed  # noqa: E731
    binary = common.find_llama_binary("llama-server", args.llama_bin)
    peer = _start_embedding_server(binary, args.model_path, 2) if binary is not None else None
    rounds, embed = [], {"daemon": [], "llama-server": []}
    try:
        with httpx.Client() as http:
            _chat(http, base, headers, 1, "warm-up")
            for i in range(repeats):
                rounds.append(candidates_round(http, base, headers, status, f"r{i}"))
                embed["daemon"].append(embeddings_per_s(http, base, headers, count))
                if peer is not None:
                    embed["llama-server"].append(embeddings_per_s(http, peer.base_url, {}, count))
    finally:
        client.close()
        stop_daemon(daemon)
        if peer is not None:
            peer.stop()
    return _report(rounds, embed)


def _report(rounds: list[dict], embed: dict) -> dict:
    med = statistics.median
    table = {side: {"wall_s": med(r[side]["wall_s"] for r in rounds),
                    "prompt_computed": med(r[side]["prompt_computed"] for r in rounds),
                    "prompt_tokens": rounds[0][side]["prompt_tokens"]} for side in rounds[0]}
    print(f"\nA) {CANDIDATES} candidate lines of {REPLY_TOKENS} tokens, median of {len(rounds)}")
    print(f"  {'side':24}{'wall s':>9}{'prompt tokens computed':>25}{'prompt tokens':>15}")
    for side, row in table.items():
        print(f"  {side:24}{row['wall_s']:9.2f}{row['prompt_computed']:25.0f}{row['prompt_tokens']:15}")
    one, four = table["n=4 in one request"], table["4 requests at once"]
    print(f"  n=4 / 4 requests: wall x{one['wall_s'] / four['wall_s']:.2f}, "
          f"prompt computed {one['prompt_computed'] / max(one['prompt_tokens'], 1):.2f} prompts' worth "
          f"(4 requests: {four['prompt_computed'] / max(four['prompt_tokens'], 1):.2f})")
    rates = {side: med(v) for side, v in embed.items() if v}
    print("\nB) embeddings per second, one short line per request")
    for side, rate in rates.items():
        print(f"  {side:24}{rate:9.1f}/s  [{min(embed[side]):.1f} .. {max(embed[side]):.1f}]")
    if len(rates) == 2:
        print(f"  daemon / llama-server: {rates['daemon'] / rates['llama-server']:.2f}")
    return {"candidates": table, "embeddings_per_s": rates, "rounds": rounds, "embed_raw": embed}
