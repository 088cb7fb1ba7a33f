"""The engine against its peers (issue 5), each scenario side by side in one run.

  single   one stream's decode tokens/s and time to first token: the daemon, llama-cpp-python
           Llama() with its defaults, Llama() hand-tuned (best of a sweep of threads and flash
           attention), and llama-bench's token generation at its best thread count (when the
           binary is found; llama-bench has no time to first token)
  batch    aggregate tokens/s with 1, 4, 16 and 64 concurrent conversations, every side streamed
           (gRPC for the daemon, server-sent events for the peers): the daemon, llama-cpp-python's
           server, llama.cpp's llama-server with as many slots
  session  time to first token of turn 2 of a conversation with a 500-token persona, against turn 1

    python bench/run.py single batch session [--model PATH] [--llama-bin DIR] [--repeats 3] [--quick]
        [--streams 1,4,16,64]

Medians over repeats, with min and max. Run on an otherwise idle machine: llama.cpp's threads
spin, so any other process on the same cores distorts every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from bench import common
from bench.common import TokenCounter, profile_flags, spread

STORY = "Tell me a long story about a dragon who guards a library."
PERSONA = (
    "You are Brom Ironhand, the blacksmith of Oakvale. "
    + "You speak in short, gruff sentences and you love your craft. "
    + " ".join(
        f"Fact {i}: the village of Oakvale has a {thing} near the {place}."
        for i, (thing, place) in enumerate(
            [(t, p) for t in ("well", "mill", "shrine", "tavern", "bridge", "tower", "market", "forge")
             for p in ("river", "hill", "forest", "gate", "square")]
        )
    )
)


def messages(text: str, system: str | None = None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]


# -- how tokens are counted ------------------------------------------------------------------------

TOKEN_COUNTING = (
    "tokens = the streamed reply's text, tokenized with the model's own tokenizer after the run, "
    "the same function for every side; time = client clock from sending the first request to the "
    "end of the last stream; every round's questions are new to every side (a round tag opens "
    "each), so prompts are prefilled, not served from a cache"
)


# -- single stream -----------------------------------------------------------------------------


def daemon_decode(client, tokens: int, nonce: int) -> tuple[float, float]:
    """(decode tokens/s, time to first token in ms), both on the client's clock as for Llama():
    tokens after the first chunk's over the time from the first chunk to the last. The daemon
    sends the first chunk at once and the last as soon as the reply ends, so pacing in between
    does not move the figure."""
    req = story_request(tokens, nonce)
    started = time.perf_counter()
    first = last = None
    after_first = 0
    for chunk in client.generate(req):
        if chunk.token_ids:
            now = time.perf_counter()
            if first is None:
                first = now
            else:
                after_first += len(chunk.token_ids)
                last = now
    rate = after_first / (last - first) if last is not None and last > first else 0.0
    return rate, ((first or time.perf_counter()) - started) * 1e3


def story_request(tokens: int, nonce: int):
    """daemon_decode's request: the story, greedy, opened by a line of its own per run."""
    from sidecar.api import pb

    return pb.GenerateRequest(
        messages=pb.ChatMessages(messages=[pb.ChatMessage(role="system", content=f"Night {nonce}."), pb.ChatMessage(role="user", content=STORY)]),
        max_tokens=tokens,
        sampling=pb.SamplingParams(temperature=0.0),
    )


def story_prompt_tokens(client) -> int:
    """The prompt tokens of daemon_decode's request, as the daemon counted them."""
    return next(c.final.usage.prompt_tokens for c in client.generate(story_request(1, 0)) if c.HasField("final"))


def llama_decode(llm, tokens: int, nonce: int) -> tuple[float, float]:
    """(decode tokens/s of Llama.create_chat_completion timed from the first streamed token,
    time to first token in ms), both on the caller's clock."""
    started = time.perf_counter()
    first = last = None
    n = 0
    for chunk in llm.create_chat_completion(messages(STORY, f"Night {nonce}."), max_tokens=tokens, temperature=0.0, stream=True):
        if chunk["choices"][0]["delta"].get("content"):
            now = time.perf_counter()
            first = first or now
            last = now
            n += 1
    return ((n - 1) / (last - first) if n > 1 else 0.0), ((first or time.perf_counter()) - started) * 1e3


DAEMON = "daemon (its own choice)"
DAEMON_NO_GUARD = "daemon, --no-frame-guard"


class StandInGame:
    """An idle process the benchmark's daemons take as their game (`--parent-pid`), so that the
    frame guard does not take this process for one. The guard counts its game's busy threads at
    once (a game thread needs its core when it runs), and this process is busy between the
    daemon's runs: single runs the Llama() sides in it, batch reads the peers' streams. Seen as
    the game, it took a thread from the next daemon run now and then (2026-12-08: 1 of 3 single
    repeats at 130-152 against 207-210 tokens/s; a whole batch repeat at one thread). As another
    process, its load waits for the replies, which the guard leaves be."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(86400)"])
        self.flags = ["--parent-pid", str(self.process.pid)]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def thread_choices() -> list[int]:
    """Thread counts a person tuning by hand would try: one, one per physical core, one per
    hardware thread."""
    import psutil

    return sorted({1, psutil.cpu_count(logical=False) or 1, psutil.cpu_count() or os.cpu_count() or 1})


def single(args: argparse.Namespace) -> dict:
    """Every side is loaded before the first run and the runs are interleaved, one of each per
    repeat, so drift on this shared machine touches all sides alike. The hand-tuned row is the
    best, by median, of every setting a person would try (threads x flash attention)."""
    from llama_cpp import Llama

    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    model = args.model_path
    tokens = 32 if args.quick else 128
    print(f"\n== single stream decode and time to first token, {tokens} tokens, {args.repeats} repeats, runs interleaved ==")
    bench_bin = common.find_llama_binary("llama-bench", args.llama_bin)
    if not bench_bin:
        print("llama-bench not found (PATH, $LLAMA_CPP_BIN or --llama-bin): skipped")
    llms = {"Llama() defaults": Llama(model_path=str(model), verbose=False)}
    for threads in thread_choices():
        for flash in (False, True):
            llms[f"threads={threads} flash={flash}"] = Llama(model_path=str(model), n_threads=threads, n_threads_batch=threads,
                                                            flash_attn=flash, n_ctx=2048, verbose=False)
    runs: dict[str, list[tuple[float, float]]] = {DAEMON: [], DAEMON_NO_GUARD: [], **{name: [] for name in llms}}
    bench_tg: dict[int, list[float]] = {}
    matched_tg: list[float] = []
    # The frame guard is on by default; the same daemon without it shows what it costs where no
    # game runs (issue 40: its rule is that a load waiting for the replies costs them nothing).
    # Without a stored profile, off: a daemon measuring one in the background does so while the
    # other sides run, and each daemon's profiler is then a load beside the other's replies.
    profile = profile_flags() or ["--profile", "off"]
    # This process runs the Llama() sides between the daemon's runs (StandInGame).
    game = StandInGame()
    daemons = {DAEMON: start_daemon("--model", str(model), *profile, *game.flags),
               DAEMON_NO_GUARD: start_daemon("--model", str(model), "--no-frame-guard", *profile, *game.flags)}
    try:
        with daemons[DAEMON].client(timeout_s=600) as c, daemons[DAEMON_NO_GUARD].client(timeout_s=600) as c_off:
            clients = {DAEMON: c, DAEMON_NO_GUARD: c_off}
            for client in clients.values():
                daemon_decode(client, 8, -1)
            # llama-bench's tg starts from an empty cache with its own attention kernel (flash
            # attention auto: on, on a CPU); the daemon's replies start after the prompt, with the
            # kernel its plan chose. Both matter on a CPU: flash attention is ~5-10% faster near
            # depth 0 and slower past ~250 tokens (README, "One stream against llama-bench"), so
            # a second llama-bench row runs the daemon's kernel from the prompt's depth.
            schedule = c.status().schedule
            daemon_flash = schedule.flash_attention
            daemon_threads = min(schedule.tiers, key=lambda tier: tier.max_tokens).threads
            prompt_tokens = story_prompt_tokens(c)
            for llm in llms.values():
                llama_decode(llm, 8, -1)
            for i in range(args.repeats):
                for name in (clients if i % 2 == 0 else list(clients)[::-1]):
                    runs[name].append(daemon_decode(clients[name], tokens, i))
                for name, llm in llms.items():
                    runs[name].append(llama_decode(llm, tokens, i))
                if bench_bin:
                    for t, tg in common.llama_bench_tg(bench_bin, model, thread_choices(), tokens, 1).items():
                        bench_tg.setdefault(t, []).append(tg)
                    matched_tg.extend(common.llama_bench_tg(bench_bin, model, [daemon_threads], tokens, 1,
                                                            flash=daemon_flash, depth=prompt_tokens).values())
    finally:
        for daemon in daemons.values():
            stop_daemon(daemon)
        game.stop()
        llms.clear()
    rows = {name: [r[0] for r in pairs] for name, pairs in runs.items()}
    ttft = {name: [r[1] for r in pairs] for name, pairs in runs.items()}
    tuned = [name for name in rows if name.startswith("threads=")]
    best_name = max(tuned, key=lambda name: statistics.median(rows[name]))
    best, best_ttft = rows[best_name], ttft[best_name]
    for name in tuned:
        del rows[name], ttft[name]
    rows[f"Llama() hand-tuned ({best_name})"] = best
    ttft[f"Llama() hand-tuned ({best_name})"] = best_ttft
    if bench_tg:
        t_best = max(bench_tg, key=lambda t: statistics.median(bench_tg[t]))
        rows[f"llama-bench tg{tokens} (t={t_best})"] = bench_tg[t_best]
    if matched_tg:
        matched_name = f"llama-bench t={daemon_threads} flash {'on' if daemon_flash else 'off'} from depth {prompt_tokens}"
        rows[matched_name] = matched_tg
    print(f"{'':45} {'decode tok/s: median [min .. max]':>34}   {'first token ms':>30}")
    for name, values in rows.items():
        first = spread(ttft[name]) if name in ttft else f"{'n/a (llama-bench has none)':>30}"
        print(f"{name:45} {spread(values):>34}   {first:>30}")
    d = statistics.median(rows[DAEMON])
    ratios = {
        "guard_on_vs_off": d / statistics.median(rows[DAEMON_NO_GUARD]),
        "ttft_guard_on_vs_off": statistics.median(ttft[DAEMON]) / statistics.median(ttft[DAEMON_NO_GUARD]),
        "vs_defaults": d / statistics.median(rows["Llama() defaults"]),
        "vs_hand_tuned": d / statistics.median(best),
        "ttft_vs_defaults": statistics.median(ttft[DAEMON]) / statistics.median(ttft["Llama() defaults"]),
    }
    bench_row = next((v for k, v in rows.items() if k.startswith("llama-bench")), None)
    if bench_row:
        ratios["vs_llama_bench"] = d / statistics.median(bench_row)
        # llama.cpp's own decode loop at its best threads: how far above the defaults any side on top of it gets.
        ratios["llama_bench_vs_defaults"] = statistics.median(bench_row) / statistics.median(rows["Llama() defaults"])
    print("decode: daemon / defaults %.2fx (target 1.3x), / hand-tuned %.2fx (target 1.0x)" % (ratios["vs_defaults"], ratios["vs_hand_tuned"])
          + (", / llama-bench %.2fx (aim 0.95x)" % ratios["vs_llama_bench"] if bench_row else ""))
    if matched_tg:
        ratios["vs_llama_bench_matched"] = d / statistics.median(matched_tg)
        ratios["daemon_flash_attention"] = daemon_flash
        ratios["prompt_tokens"] = prompt_tokens
        print("decode: daemon / llama-bench with the daemon's attention kernel from the prompt's depth %.2fx "
              "(where the rest of the gap to llama-bench's own defaults is the kernel and the depth, not the daemon)"
              % ratios["vs_llama_bench_matched"])
    if bench_row:
        print("llama-bench / defaults %.2fx: llama.cpp's own decode loop (no sampling, no streaming) at its best threads, "
              "against which 1.3x would have to be reached" % ratios["llama_bench_vs_defaults"])
    print("first token: daemon / defaults %.2fx (lower is better); the daemon's figure includes gRPC" % ratios["ttft_vs_defaults"])
    print("frame guard on (the default) / off: decode %.2fx (target >= 0.97x), first token %.2fx (target <= 1.10x)"
          % (ratios["guard_on_vs_off"], ratios["ttft_guard_on_vs_off"]))
    return {"tokens": tokens, "interleaved": True, "rows": rows, "ttft_ms": ttft, "ratios": ratios}


# -- batch ----------------------------------------------------------------------------------------


# Requests whose replies run past max_tokens on every side, so each side streams the same number
# of tokens: with short answers, a side whose chat template differs (llama-server renders its
# own) ends its replies at other lengths, and per-request costs then weigh differently.
QUESTIONS = [f"Tell me a long story about a {a} {b}." for a in ("brave", "sly", "old", "young") for b in ("knight", "thief", "wizard", "merchant")]
BATCH_STREAMS = (1, 4, 16, 64)
DAEMON_HTTP = "daemon HTTP API"
# Context per conversation: a question and its reply fit, and 64 of them stay small.
BATCH_CTX = 512


@dataclass
class Round:
    """One round of n concurrent streams: aggregate tokens/s, median time to first token, and the
    tokens each side says it sent (for the cross-check printed beside the counted ones)."""

    tokens_per_s: float
    ttft_ms: float
    counted: int
    self_reported: int | None
    # Median over the round's streams of one stream's decode rate: tokens after the first over
    # the time after the first (what a player watching one NPC sees, TTFT left out).
    decode_tokens_per_s: float = 0.0


def aggregate(send, n_streams: int, max_tokens: int, count, tag: str = "") -> Round:
    """n_streams streamed requests in flight at once; `send(question, max_tokens)` returns a
    common.Streamed. Tokens are counted from the delivered text by `count`, for every side.

    `tag` opens every question of the round ("[tag] Tell me a long story..."): with a new tag per
    round no side can serve a round from the cache of an earlier one, while the chat template's
    opening stays shared, as NPCs share a system prompt."""
    replies: list[common.Streamed | None] = [None] * n_streams
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            question = QUESTIONS[i % len(QUESTIONS)]
            replies[i] = send(f"[{tag}] {question}" if tag else question, max_tokens)
        except BaseException as e:  # surfaced after the run
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n_streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    counted = sum(count(r.text) for r in replies)
    reported = [r.reported_tokens for r in replies]
    decode = statistics.median(max(count(r.text) - 1, 0) / max(r.total_s - r.first_s, 1e-9) for r in replies)
    return Round(counted / wall, statistics.median(r.first_s for r in replies) * 1e3, counted,
                 None if None in reported else sum(reported), decode)


def _daemon_stream(client, question: str, max_tokens: int) -> common.Streamed:
    from sidecar.api import pb

    req = pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=question)]),
                             max_tokens=max_tokens, sampling=pb.SamplingParams(temperature=0.0))
    started = time.perf_counter()
    first = None
    parts: list[str] = []
    chunks = produced = 0
    for chunk in client.generate(req):
        if chunk.text:
            first = first if first is not None else time.perf_counter()
            parts.append(chunk.text)
            chunks += 1
        if chunk.HasField("final"):
            produced = chunk.final.usage.completion_tokens
    ended = time.perf_counter()
    return common.Streamed("".join(parts), (first or ended) - started, ended - started, chunks, produced)


def batch_options(group) -> None:
    group.add_argument("--streams", type=lambda s: tuple(int(n) for n in s.split(",")), default=None,
                       help="concurrent stream counts, e.g. 1,4 (default 1,4,16,64)")
    group.add_argument("--daemon-variant", default="", metavar="FLAGS",
                       help="one more daemon side (gRPC) started with these extra flags, e.g. "
                            "'--flash-attention on': a choice of the daemon's measured beside its default in the same rounds")


def batch(args: argparse.Namespace) -> dict:
    """Every side is started before the first round and the rounds are interleaved (each repeat
    runs every side at every stream count, in an order that rotates), so a slow spell on this
    shared machine lands on all sides alike instead of on whichever ran then. Idle servers sleep:
    llama.cpp's threads spin only while a graph computes."""
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon
    from sidecar.settings import Settings

    model = args.model_path
    max_tokens, streams = (16 if args.quick else 64), (args.streams or BATCH_STREAMS)
    threads = Settings().cpu_threads()
    count = TokenCounter(model)
    print(f"\n== aggregate tokens/s, {max_tokens} tokens per conversation, {threads} threads, all sides streamed, rounds interleaved ==")
    print(f"   ({TOKEN_COUNTING})")

    with contextlib.ExitStack() as stack:
        import httpx

        http = stack.enter_context(httpx.Client(limits=httpx.Limits(max_connections=max(streams) * 2)))
        game = StandInGame()
        stack.callback(game.stop)
        daemon = start_daemon("--model", str(model), "--parallel", str(max(streams)), "--ctx", str(BATCH_CTX),
                              *profile_flags(), *game.flags)
        stack.callback(stop_daemon, daemon)
        print(f"   daemon profile: {next((e.get('profile') for e in daemon.log_lines if e.get('event') == 'ready'), None)}")
        client = stack.enter_context(daemon.client(timeout_s=600))
        senders: dict[str, dict[int, Callable[[str, int], common.Streamed]]] = {
            "daemon": {n: (lambda q, k: _daemon_stream(client, q, k)) for n in streams}}
        # The same daemon through its OpenAI-compatible API, read with the same client code as
        # the HTTP peers: the two HTTP servers compared on one client.
        listening = next(e for e in reversed(daemon.log_lines) if e.get("event") == "listening")
        daemon_http = common.HttpPeer("daemon HTTP", daemon.process, listening["http_address"],
                                     headers={"Authorization": f"Bearer {daemon.token}"})
        senders[DAEMON_HTTP] = {n: _http_sender(daemon_http, http) for n in streams}
        if args.daemon_variant:
            variant = start_daemon("--model", str(model), "--parallel", str(max(streams)), "--ctx", str(BATCH_CTX),
                                   *profile_flags(), *game.flags, *shlex.split(args.daemon_variant))
            stack.callback(stop_daemon, variant)
            variant_client = stack.enter_context(variant.client(timeout_s=600))
            senders[f"daemon {args.daemon_variant}"] = {n: (lambda q, k: _daemon_stream(variant_client, q, k)) for n in streams}
        # One sequence, so concurrent requests queue (interrupt_requests off: see common.py).
        cpp_python = common.start_llama_cpp_python_server(model, threads, 2048)
        stack.callback(cpp_python.stop)
        senders["llama-cpp-python server"] = {n: _http_sender(cpp_python, http) for n in streams}
        server_bin = common.find_llama_binary("llama-server", args.llama_bin)
        if server_bin:
            per_n = {}
            for n in streams:  # as many slots as streams, as the issue asks
                server = common.start_llama_server(server_bin, model, threads, n, BATCH_CTX)
                stack.callback(server.stop)
                per_n[n] = _http_sender(server, http)
            senders["llama-server (slots = streams)"] = per_n
        else:
            print("llama-server not found (PATH, $LLAMA_CPP_BIN or --llama-bin, a llama.cpp build): its comparison is skipped")
        # One untimed round per side and stream count: first use of a sequence, a slot or a
        # batch shape costs every side something once, and that is not what is measured.
        for side in senders.values():
            for n, send in side.items():
                aggregate(send, n, 4, count, tag="warm")

        table: dict[str, dict[int, list[Round]]] = {name: {n: [] for n in streams} for name in senders}
        names = list(senders)
        for r in range(args.repeats):
            for n in streams:
                order = names[r % len(names):] + names[: r % len(names)]
                for name in order:
                    # The side in the tag too: the daemon's two transports share one daemon, whose
                    # free sequences would otherwise serve the second side's prompts from cache.
                    tag = f"{r + 1}.{n}.{names.index(name)}"
                    table[name][n].append(aggregate(senders[name][n], n, max_tokens, count, tag=tag))
            print(f"   repeat {r + 1}/{args.repeats} done", flush=True)

    def med(rounds: list[Round], field: str = "tokens_per_s") -> float:
        return statistics.median(getattr(r, field) for r in rounds)

    print("aggregate tok/s: median [min .. max]")
    print(f"{'':34}" + "".join(f"{str(n) + ' streams':>26}" for n in streams))
    for name, row in table.items():
        print(f"{name:34}" + "".join(f"{spread([r.tokens_per_s for r in row[n]]):>26}" for n in streams))
    print("median time to first token (ms)")
    for name, row in table.items():
        print(f"{name:34}" + "".join(f"{med(row[n], 'ttft_ms'):26.0f}" for n in streams))
    print("tokens counted / tokens the side reports (last round; '-' where it reports none while streaming)")
    for name, row in table.items():
        print(f"{name:34}" + "".join(f"{str(row[n][-1].counted) + ' / ' + str(row[n][-1].self_reported if row[n][-1].self_reported is not None else '-'):>26}"
                                     for n in streams))
    d = table["daemon"]
    cpp = table["llama-cpp-python server"]
    ratios = {f"vs_llama_cpp_python_{n}": med(d[n]) / med(cpp[n]) for n in streams}
    if "llama-server (slots = streams)" in table:
        ratios |= {f"vs_llama_server_{n}": med(d[n]) / med(table["llama-server (slots = streams)"][n]) for n in streams}
    print("daemon / llama-cpp-python server: " + ", ".join(f"{n} streams {ratios[f'vs_llama_cpp_python_{n}']:.2f}x" for n in streams)
          + "   (targets 2.5x at 4, 4x at 16)")
    h = table[DAEMON_HTTP]
    ratios |= {f"http_vs_grpc_{n}": med(h[n]) / med(d[n]) for n in streams}
    print("daemon HTTP / daemon gRPC, aggregate: " + ", ".join(f"{n} streams {ratios[f'http_vs_grpc_{n}']:.2f}x" for n in streams))
    if 1 in streams:
        g1, h1 = med(d[1], "decode_tokens_per_s"), med(h[1], "decode_tokens_per_s")
        ratios["single_stream_decode_http_vs_grpc"] = h1 / g1
        print(f"one stream's decode tokens/s: gRPC {spread([r.decode_tokens_per_s for r in d[1]])}, "
              f"HTTP {spread([r.decode_tokens_per_s for r in h[1]])}: HTTP / gRPC {h1 / g1:.3f}x   (target >= 0.97x)")
    if "llama-server (slots = streams)" in table:
        s = table["llama-server (slots = streams)"]
        ratios |= {f"http_vs_llama_server_{n}": med(h[n]) / med(s[n]) for n in streams}
        print("daemon HTTP / llama-server: " + ", ".join(f"{n} streams {ratios[f'http_vs_llama_server_{n}']:.2f}x" for n in streams)
              + "   (target >= 1.0x, same client, same requests)")
    if args.daemon_variant and "llama-server (slots = streams)" in table:
        v, s = table[f"daemon {args.daemon_variant}"], table["llama-server (slots = streams)"]
        ratios |= {f"variant_vs_llama_server_{n}": med(v[n]) / med(s[n]) for n in streams}
        print(f"daemon {args.daemon_variant} / llama-server: "
              + ", ".join(f"{n} streams {ratios[f'variant_vs_llama_server_{n}']:.2f}x" for n in streams))
    if "vs_llama_server_1" in ratios:
        print("daemon / llama-server: " + ", ".join(f"{n} streams {ratios[f'vs_llama_server_{n}']:.2f}x" for n in streams) + "   (target >= 1.0x)")
    return {
        "max_tokens": max_tokens, "threads": threads, "token_counting": TOKEN_COUNTING, "interleaved": True,
        "table": {k: {str(n): [r.tokens_per_s for r in rounds] for n, rounds in row.items()} for k, row in table.items()},
        "ttft_ms": {k: {str(n): [r.ttft_ms for r in rounds] for n, rounds in row.items()} for k, row in table.items()},
        "decode_tokens_per_s": {k: {str(n): [r.decode_tokens_per_s for r in rounds] for n, rounds in row.items()}
                                for k, row in table.items()},
        "cross_check": {k: {str(n): {"counted": rounds[-1].counted, "self_reported": rounds[-1].self_reported}
                            for n, rounds in row.items()} for k, row in table.items()},
        "ratios": ratios,
    }


def _http_sender(peer: common.HttpPeer, http) -> Callable[[str, int], common.Streamed]:
    return lambda q, k: peer.chat_stream(http, messages(q), k)


# -- session --------------------------------------------------------------------------------------


def session(args: argparse.Namespace) -> dict:
    from sidecar.api import pb
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    model = args.model_path
    print("\n== time to first token: turn 2 of a session with a ~500-token persona, against turn 1 ==")
    daemon = start_daemon("--model", str(model), *profile_flags())
    t1, t2, prompt_tokens = [], [], 0
    try:
        with daemon.client(timeout_s=600) as c:
            for i in range(args.repeats):
                sid = f"brom-{i}"
                first = c.complete(pb.GenerateRequest(
                    messages=pb.ChatMessages(messages=[pb.ChatMessage(role="system", content=f"[{i}] " + PERSONA),
                                                       pb.ChatMessage(role="user", content="Good morning! Can you fix my sword?")]),
                    session_id=sid, max_tokens=24, sampling=pb.SamplingParams(temperature=0.0)))
                second = c.complete(pb.GenerateRequest(
                    messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="How much will it cost?")]),
                    session_id=sid, max_tokens=24, sampling=pb.SamplingParams(temperature=0.0)))
                prompt_tokens = first.final.usage.prompt_tokens
                t1.append(first.final.timings.time_to_first_token_ms)
                t2.append(second.final.timings.time_to_first_token_ms)
                c.end_session(sid)
    finally:
        stop_daemon(daemon)
    ratio = statistics.median(t2) / statistics.median(t1)
    print(f"turn 1 ({prompt_tokens} prompt tokens)  {spread(t1)} ms")
    print(f"turn 2                         {spread(t2)} ms")
    print(f"turn 2 / turn 1: {ratio:.2f}x (target 0.2x)")
    return {"turn1_ms": t1, "turn2_ms": t2, "persona_prompt_tokens": prompt_tokens, "ratio": ratio}
