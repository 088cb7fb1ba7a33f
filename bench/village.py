"""A town square: 16 NPCs start talking at once, sharing a 1,000-token world prompt (issue 19).

Each NPC's first request is the shared world (the `context` field), a distinct ~40-token persona
and a distinct ~20-token player line, 48 reply tokens, greedy; all 16 are sent at once. A second
wave then asks every NPC a follow-up in its session. Sides, given identical requests:

  daemon, prefix cache     default settings (--parallel not given)
  daemon, no prefix cache  --prefix-cache-mb 0
  llama-server, 16 slots   when a llama.cpp build is given (--llama-bin or PATH); the world opens
                           the system message as the daemon lays it out, and wave 2 resends each
                           conversation (its slot's prompt cache reuses what it holds)

Per side and wave: time to first token per NPC on the client's clock from the wave's start
(median, p90, max; "NPC 1" is the one that spoke first, NPCs 2-16 the others), the time until
all 16 have spoken, aggregate tokens/s (reply tokens counted from the streamed text with the
model's tokenizer, over the wave's wall time), aggregate decode tokens/s (the sum over NPCs of
tokens after the first over the time from their first token to their last), and the prompt
tokens the side computed (each side's own counter: the daemon's status, llama-server's
`timings.prompt_n` per reply). Repeats are interleaved, each with a new world (a round tag opens
it), so no side serves a round from an earlier one's cache; an untimed wave of short requests
first warms every side's sequences.

    python bench/run.py village [--repeats 3] [--llama-bin DIR]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import common
from bench.common import TokenCounter, profile_flags

N_NPCS = 16
REPLY_TOKENS = 48
WORLD_TOKENS, PERSONA_TOKENS, LINE_TOKENS = 1000, 40, 20

NAMES = ["Brom", "Ilsa", "Odo", "Mara", "Tobin", "Wenna", "Garrick", "Lysa",
         "Perrin", "Hild", "Ansel", "Crea", "Dunstan", "Fenna", "Jory", "Talia"]
TRADES = ["blacksmith", "innkeeper", "miller", "gate guard", "fisher", "weaver", "stable master", "herbalist",
          "baker", "shepherd", "scribe", "potter", "brewer", "tanner", "carpenter", "healer"]
MOODS = ["gruff", "cheerful", "gossiping", "wary", "sleepy", "proud", "nervous", "kind"]
FAMILIES = ["Alder", "Birch", "Cedar", "Elm", "Hazel", "Rowan"]
PLACES = ["mill", "bridge", "chapel", "market", "forge", "inn", "well", "tower", "gate", "harbour", "orchard",
          "granary", "stable", "school", "bakery", "tannery", "shrine", "dock", "barn", "green"]


def _fill(count, make, minimum: int) -> str:
    """Sentences from `make(i)` until `count` tokens of them reach `minimum`."""
    parts: list[str] = []
    i = 0
    while count(" ".join(parts)) < minimum:
        parts.append(make(i))
        i += 1
    return " ".join(parts)


def world(count, tag: str) -> str:
    opening = f"[{tag}] You live in the village of Millbrook, by the river Wend, in the realm of Asterra."
    return opening + " " + _fill(count, lambda i: (
        f"The {PLACES[i % len(PLACES)]} was built in the year {300 + 17 * i} and is kept by the "
        f"{FAMILIES[i % len(FAMILIES)]} family, who {['guard it at night', 'sweep it each morning', 'sing there at dusk'][i % 3]}."
    ), WORLD_TOKENS - count(opening))


def persona(count, i: int) -> str:
    base = f"You are {NAMES[i]}, the {MOODS[i % len(MOODS)]} {TRADES[i]} of Millbrook. Answer the player in character."
    return base + " " + _fill(count, lambda k: f"You have lived here for {12 + i + k} years.", PERSONA_TOKENS - count(base))


def line(count, i: int) -> str:
    base = f"Hello {NAMES[i]}! I am new in Millbrook. What can a {TRADES[i]} tell me"
    return base + " " + _fill(count, lambda k: ["about the river?", "and the old families?", "today?"][k % 3],
                              LINE_TOKENS - count(base))


def follow_up(i: int) -> str:
    return f"Thank you, {NAMES[i]}. And what will you do tomorrow?"


@dataclass
class Spoken:
    """One NPC's reply as the client saw it, times from the wave's start."""

    text: str
    first_s: float
    end_s: float


@dataclass
class Wave:
    replies: list[Spoken]
    wall_s: float
    prompt_tokens: int | None
    tokens: list[int] = field(default_factory=list)

    def figures(self) -> dict:
        firsts = sorted(r.first_s for r in self.replies)
        decode = sum((n - 1) / (r.end_s - r.first_s) for r, n in zip(self.replies, self.tokens)
                     if n > 1 and r.end_s > r.first_s)
        return {
            "ttft_ms": [r.first_s * 1e3 for r in self.replies],
            "ttft_median_ms": statistics.median(firsts) * 1e3,
            "ttft_p90_ms": firsts[int(0.9 * (len(firsts) - 1) + 0.5)] * 1e3,
            "ttft_max_ms": firsts[-1] * 1e3,
            "npc1_ttft_ms": firsts[0] * 1e3,
            "npc2_16_ttft_median_ms": statistics.median(firsts[1:]) * 1e3,
            "all_spoken_ms": firsts[-1] * 1e3,
            "tokens": sum(self.tokens),
            "tokens_per_s": sum(self.tokens) / self.wall_s,
            "decode_tokens_per_s": decode,
            "prompt_tokens_computed": self.prompt_tokens,
        }


def _all_at_once(send, n: int) -> tuple[list[Spoken], float]:
    """`send(i, started)` for NPCs 0..n-1, all at once, each on its own thread."""
    out: list[Spoken | None] = [None] * n
    errors: list[BaseException] = []
    gate = threading.Barrier(n + 1)

    def one(i: int) -> None:
        try:
            gate.wait()
            out[i] = send(i, started[0])
        except BaseException as e:  # surfaced after the wave
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    started = [time.perf_counter()]
    gate.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started[0]
    if errors:
        raise errors[0]
    return out, wall  # type: ignore[return-value]


class DaemonSide:
    """The daemon over gRPC: a session per NPC, the world in `context`."""

    def __init__(self, name: str, model: Path, *flags: str) -> None:
        from sidecar.lifecycle.daemon_process import start_daemon

        self.name = name
        self._daemon = start_daemon("--model", str(model), *profile_flags(), *flags)
        self.client = self._daemon.client(timeout_s=600)
        # The sequences the daemon chose: its "ready" line says (the "listening" one comes before the load).
        self.log_parallel = next((e["parallel"] for e in self._daemon.log_lines if "parallel" in e), None)
        self.log_profile = next((e.get("profile") for e in self._daemon.log_lines if e.get("event") == "ready"), None)

    def wave(self, prompts: list[tuple[str, str, str]], tag: str, follow: bool) -> tuple[list[Spoken], float, int]:
        from sidecar.api import pb

        before = self.client.status().throughput.prompt_tokens_processed

        def send(i: int, started: float) -> Spoken:
            w, p, text = prompts[i]
            msgs = [pb.ChatMessage(role="user", content=follow_up(i) if follow else text)]
            if not follow:
                msgs.insert(0, pb.ChatMessage(role="system", content=p))
            req = pb.GenerateRequest(messages=pb.ChatMessages(messages=msgs), context="" if follow else w,
                                     session_id=f"{tag}-{i}", max_tokens=REPLY_TOKENS,
                                     sampling=pb.SamplingParams(temperature=0.0))
            first, parts = None, []
            for chunk in self.client.generate(req):
                if chunk.text:
                    first = first if first is not None else time.perf_counter()
                    parts.append(chunk.text)
            end = time.perf_counter()
            return Spoken("".join(parts), (first or end) - started, end - started)

        replies, wall = _all_at_once(send, len(prompts))
        computed = self.client.status().throughput.prompt_tokens_processed - before
        return replies, wall, computed

    def end(self, tag: str, n: int) -> None:
        for i in range(n):
            self.client.end_session(f"{tag}-{i}")

    def stop(self) -> None:
        from sidecar.lifecycle.daemon_process import stop_daemon

        self.client.close()
        stop_daemon(self._daemon)


class LlamaServerSide:
    """llama-server with 16 slots; stateless, so wave 2 resends each whole conversation."""

    def __init__(self, binary: Path, model: Path, threads: int) -> None:
        import httpx

        self.name = f"llama-server ({N_NPCS} slots)"
        self._server = common.start_llama_server(binary, model, threads, N_NPCS, 2048)
        self._http = httpx.Client(limits=httpx.Limits(max_connections=2 * N_NPCS))
        self._history: dict[str, list[dict]] = {}

    def wave(self, prompts: list[tuple[str, str, str]], tag: str, follow: bool) -> tuple[list[Spoken], float, int | None]:
        def send(i: int, started: float) -> Spoken:
            w, p, text = prompts[i]
            key = f"{tag}-{i}"
            if follow:
                messages = self._history[key] + [{"role": "user", "content": follow_up(i)}]
            else:  # as the daemon lays out `context` (sidecar/backend/prompt_layout.py)
                messages = [{"role": "system", "content": w + "\n\n" + p}, {"role": "user", "content": text}]
            sent = time.perf_counter() - started  # chat_stream times from its own request
            s = self._server.chat_stream(self._http, messages, REPLY_TOKENS)
            self._history[key] = messages + [{"role": "assistant", "content": s.text}]
            computed[i] = s.prompt_computed
            return Spoken(s.text, sent + s.first_s, sent + s.total_s)

        # llama-server's own count: each reply's last event says how many prompt tokens its slot
        # evaluated (`timings.prompt_n`, what its prompt cache held left out).
        computed: list[int | None] = [None] * len(prompts)
        replies, wall = _all_at_once(send, len(prompts))
        return replies, wall, None if None in computed else sum(computed)

    def end(self, tag: str, n: int) -> None:
        pass

    def stop(self) -> None:
        self._http.close()
        self._server.stop()


def scenario(args: argparse.Namespace) -> dict:
    from sidecar.settings import Settings

    model = args.model_path
    count = TokenCounter(model)
    threads = Settings().cpu_threads()
    n = 4 if args.quick else N_NPCS
    sides = [DaemonSide("daemon, prefix cache", model), DaemonSide("daemon, no prefix cache", model, "--prefix-cache-mb", "0")]
    print(f"\n== village: {n} NPCs at once, a {WORLD_TOKENS}-token shared world, {PERSONA_TOKENS}-token personas, "
          f"{LINE_TOKENS}-token lines, {REPLY_TOKENS} reply tokens, greedy; then a follow-up wave in the sessions ==")
    print(f"   daemon sequences (--parallel not given): {sides[0].log_parallel}; profile: {sides[0].log_profile}")
    binary = common.find_llama_binary("llama-server", args.llama_bin)
    try:
        if binary:
            sides.append(LlamaServerSide(binary, model, threads))
        else:
            print("   llama-server not found (PATH, $LLAMA_CPP_BIN or --llama-bin): that side is skipped")
        personas = [(persona(count, i), line(count, i)) for i in range(n)]
        # One untimed wave per side with short prompts and no shared world: the first use of a
        # sequence, a slot or a batch shape costs every side something once.
        for side in sides:
            side.wave([("", f"You are villager {i}.", "Hello!") for i in range(n)], "warm", follow=False)
            side.end("warm", n)
        table: dict[str, dict[str, list[dict]]] = {s.name: {"wave1": [], "wave2": []} for s in sides}
        sizes = {}
        for r in range(args.repeats):
            order = sides[r % len(sides):] + sides[: r % len(sides)]
            for side in order:
                tag = f"round{r + 1}-{side.name[:12].replace(' ', '').replace(',', '')}"
                w = world(count, f"Round {r + 1}")
                prompts = [(w, p, t) for p, t in personas]
                sizes = {"world_tokens": count(w), "persona_tokens": statistics.mean(count(p) for p, _ in personas),
                         "line_tokens": statistics.mean(count(t) for _, t in personas)}
                for wave in ("wave1", "wave2"):
                    replies, wall, computed = side.wave(prompts, tag, follow=wave == "wave2")
                    table[side.name][wave].append(Wave(replies, wall, computed, [count(x.text) for x in replies]).figures())
                side.end(tag, n)
            print(f"   repeat {r + 1}/{args.repeats} done", flush=True)
    finally:
        for side in sides:
            side.stop()
    return _report(table, sizes, n)


def _med(rounds: list[dict], key: str) -> float | None:
    values = [r[key] for r in rounds if r[key] is not None]
    return statistics.median(values) if values else None


def _report(table: dict, sizes: dict, n: int) -> dict:
    print(f"   measured sizes: world {sizes['world_tokens']} tokens, persona {sizes['persona_tokens']:.0f}, "
          f"line {sizes['line_tokens']:.0f} (the model's tokenizer, text only)")
    keys = [("npc1_ttft_ms", "NPC 1 ttft ms"), ("npc2_16_ttft_median_ms", "NPCs 2-16 median"),
            ("ttft_median_ms", "ttft median"), ("ttft_p90_ms", "p90"), ("ttft_max_ms", "max = all spoken"),
            ("tokens_per_s", "tokens/s"), ("decode_tokens_per_s", "decode tok/s"), ("prompt_tokens_computed", "prompt tok")]
    for wave in ("wave1", "wave2"):
        print(f"-- {wave}: {'first turns, all at once' if wave == 'wave1' else 'follow-ups in the sessions, all at once'} "
              "(medians over repeats)")
        print(f"{'':26}" + "".join(f"{label:>18}" for _, label in keys))
        for name, waves in table.items():
            cells = [_med(waves[wave], k) for k, _ in keys]
            print(f"{name:26}" + "".join(f"{'n/a' if c is None else f'{c:.0f}':>18}" for c in cells))
    cache, plain = table["daemon, prefix cache"]["wave1"], table["daemon, no prefix cache"]["wave1"]
    ratios = {
        "npc2_16_over_npc1": _med(cache, "npc2_16_ttft_median_ms") / _med(cache, "npc1_ttft_ms"),
        "all_spoken_speedup_vs_no_cache": _med(plain, "all_spoken_ms") / _med(cache, "all_spoken_ms"),
        "decode_tokens_per_s_vs_no_cache": _med(cache, "decode_tokens_per_s") / _med(plain, "decode_tokens_per_s"),
        "tokens_per_s_vs_no_cache": _med(cache, "tokens_per_s") / _med(plain, "tokens_per_s"),
    }
    server = next((k for k in table if k.startswith("llama-server")), None)
    if server:
        ratios["all_spoken_speedup_vs_llama_server"] = _med(table[server]["wave1"], "all_spoken_ms") / _med(cache, "all_spoken_ms")
    print(f"wave 1, prefix cache: NPCs 2-{n} median ttft / NPC 1's = {ratios['npc2_16_over_npc1']:.2f}x (target <= 0.25x); "
          f"all spoken {ratios['all_spoken_speedup_vs_no_cache']:.1f}x faster than without the cache (target >= 3x)"
          + (f", {ratios['all_spoken_speedup_vs_llama_server']:.1f}x than llama-server" if server else "")
          + f"; decode tokens/s {ratios['decode_tokens_per_s_vs_no_cache']:.2f}x, aggregate tokens/s "
          f"{ratios['tokens_per_s_vs_no_cache']:.2f}x the no-cache daemon's (target >= 1.0x)")
    return {"sizes": sizes, "npcs": n, "reply_tokens": REPLY_TOKENS, "interleaved": True, "table": table, "ratios": ratios}
