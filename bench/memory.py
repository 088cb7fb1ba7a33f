"""NPC memory (issue 39): does a fact told early in a long evening reach the prompt when the player
asks about it again, long after it left the context; and what recall costs a turn.

  retrieval   one NPC at --ctx 1024: 20 facts told in the first turns (bench/memory_facts.py),
              --small-talk turns of chatter, then a paraphrased question about each fact. A hit
              is a question whose turn told the model (final.memories_used) a memory holding the
              fact's key word: the mechanism, not what a 135M model answers. Side by side: the
              default embedder (all-MiniLM-L6-v2), `--embedding-model words`, and memory off.
  cost        the time to first token a turn adds when it recalls from a scope of N memories
              (seeded with Remember) against the same turn with memory off, alternating, p50 and
              p99; the prompt tokens the recalled block adds; the store's and the embedding
              model's bytes beside the daemon's resident memory.

    python bench/run.py memory [--small-talk 110] [--sizes 100,1000,10000] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.common import end_token_ids, percentile
from bench.memory_facts import FACTS, small_talk

ARGS = ("--ctx", "1024", "--stream-interval-ms", "0")
REPLY_TOKENS = 16
# An NPC's line in the crowd part: a sentence or two.
CROWD_REPLY_TOKENS = 48
SYSTEM = "You are Brom, the blacksmith of Eld. Answer in one short sentence."


def options(group) -> None:
    group.add_argument("--small-talk", type=int, default=None, help="turns between the facts and the questions; default 110 (30 with --quick)")
    group.add_argument("--sizes", default=None, help="scope sizes for the cost, comma-separated; default 100,1000,10000 (100,1000 with --quick)")
    group.add_argument("--turns", type=int, default=None, help="timed turns per side and size; default 30 (8 with --quick)")


def _say(client, pb, sid: str, text: str, memory=None, system: str = "", max_tokens: int = REPLY_TOKENS,
         banned: set[int] = frozenset()):
    messages = ([pb.ChatMessage(role="system", content=system)] if system else []) + [pb.ChatMessage(role="user", content=text)]
    return client.complete(pb.GenerateRequest(
        messages=pb.ChatMessages(messages=messages), max_tokens=max_tokens, session_id=sid, memory=memory,
        sampling=pb.SamplingParams(temperature=0.0, logit_bias={t: -100.0 for t in banned}))).final


def _evening(client, pb, small: int) -> dict:
    sid = "brom/p1"
    _say(client, pb, sid, FACTS[0].told, system=SYSTEM)
    for fact in FACTS[1:]:
        _say(client, pb, sid, fact.told)
    dropped = 0
    for line in small_talk(small):
        dropped += _say(client, pb, sid, line).history_turns_dropped
    texts = {m.id: m.text for m in client.list_memories(sid, limit=1000).memories}
    hits, asked, told_before = 0, [], ""
    for fact in FACTS:
        final = _say(client, pb, sid, fact.asked)
        told = [texts.get(i, "") for i in final.memories_used]
        # Told now, or told on an earlier question and still in the context.
        hit = any(fact.key.lower() in t.lower() for t in told) or fact.key.lower() in told_before
        told_before += " ".join(told).lower()
        hits += hit
        asked.append({"question": fact.asked, "hit": hit, "told": len(told)})
    return {"recall": hits / len(FACTS), "hits": hits, "facts": len(FACTS), "turns_dropped": dropped,
            "memories": len(texts), "questions": asked}


def _seed(client, scope: str, size: int) -> None:
    have = 0
    while have < size:
        batch = [f"Rumour {have + i}: {small_talk(1, seed=have + i)[0]}" for i in range(min(64, size - have))]
        have += len(client.remember(batch, scope=scope))


def _cost(client, pb, sizes: list[int], turns: int) -> dict:
    """Per scope size: the recall itself (the Recall call runs the same embedding and search on
    the memory thread as a turn does), and a turn's time to first token with and without the
    recalled block (fresh one-turn sessions alike but for it, alternating)."""
    results = {}
    for size in sizes:
        scope = f"lore-{size}"
        _seed(client, scope, size)
        client.remember([f.told for f in FACTS], scope=scope)
        searches, on, off, extra = [], [], [], []
        for i in range(turns):
            question = FACTS[i % len(FACTS)].asked
            t0 = time.perf_counter()
            client.recall(question, [scope], k=4)
            searches.append((time.perf_counter() - t0) * 1000)
            a = _say(client, pb, f"off-{size}-{i}", question, pb.MemoryOptions(off=True), SYSTEM)
            b = _say(client, pb, f"on-{size}-{i}", question, pb.MemoryOptions(read_scopes=[scope], k=4), SYSTEM)
            off.append(a.timings.time_to_first_token_ms)
            on.append(b.timings.time_to_first_token_ms)
            extra.append(b.usage.prompt_tokens - a.usage.prompt_tokens)
            client.end_session(f"off-{size}-{i}")
            client.end_session(f"on-{size}-{i}")
        status = client.status()
        results[size] = {
            "recall_ms_p50": statistics.median(searches), "recall_ms_p99": percentile(searches, 99),
            "ttft_on_p50": statistics.median(on), "ttft_on_p99": percentile(on, 99),
            "ttft_off_p50": statistics.median(off), "ttft_off_p99": percentile(off, 99),
            "added_prompt_tokens_p50": statistics.median(extra), "added_prompt_tokens_max": max(extra),
            "store_bytes": status.memories.bytes, "model_bytes": status.memories.model_bytes,
            "resident_bytes": status.memory.host_resident_bytes,
        }
        client.forget(scope=scope)
    return results


def _crowd(daemon, pb, npcs: int, turns: int, memory: bool, round_: int, banned: set[int] = frozenset()) -> dict:
    """Aggregate tokens/s of `npcs` sessions talking at once, each reading a scope of 1,000, and
    per turn the prompt tokens computed (not cached) and the reply's tokens. `banned`: end tokens
    banned, so every reply runs its CROWD_REPLY_TOKENS on both sides (the model ends its replies
    where it likes, and the memories before them change where)."""
    import threading

    tokens = [0] * npcs
    computed: list[int] = []
    session = f"{memory}-{round_}-{bool(banned)}"

    def npc(i: int) -> None:
        with daemon.client(timeout_s=600) as c:
            options = pb.MemoryOptions(read_scopes=["crowd"]) if memory else pb.MemoryOptions(off=True)
            for t in range(turns):
                final = _say(c, pb, f"npc{i}-{session}", FACTS[(i + t) % len(FACTS)].asked, options,
                             SYSTEM if t == 0 else "", max_tokens=CROWD_REPLY_TOKENS, banned=banned)
                tokens[i] += final.usage.completion_tokens
                computed.append(final.usage.prompt_tokens - final.usage.cached_prompt_tokens)
            c.end_session(f"npc{i}-{session}")
    started = time.perf_counter()
    threads = [threading.Thread(target=npc, args=(i,)) for i in range(npcs)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {"tokens_per_s": sum(tokens) / (time.perf_counter() - started),
            "computed_prompt_tokens": statistics.mean(computed), "reply_tokens": sum(tokens) / len(computed)}


def scenario(args: argparse.Namespace) -> dict:
    from sidecar.api import pb
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    small = args.small_talk or (30 if args.quick else 110)
    sizes = [int(s) for s in (args.sizes or ("100,1000" if args.quick else "100,1000,10000")).split(",")]
    turns = args.turns or (8 if args.quick else 30)
    out: dict = {"retrieval": {}, "cost": {}}
    for name, extra in (("all-MiniLM-L6-v2", ()), ("words", ("--embedding-model", "words")), ("off", ("--no-memory",))):
        daemon = start_daemon("--model", str(args.model_path), *ARGS, *extra, "--profile", "off")
        try:
            with daemon.client(timeout_s=600) as client:
                if name == "off":
                    out["retrieval"][name] = {"recall": 0.0, "note": "--no-memory: dropped turns are gone"}
                    continue
                out["retrieval"][name] = _evening(client, pb, small)
                if name == "all-MiniLM-L6-v2":
                    out["cost"] = _cost(client, pb, sizes, turns)
                    _seed(client, "crowd", 1000)
                    client.remember([f.told for f in FACTS], scope="crowd")
                    npcs = 4 if args.quick else 16
                    ends = end_token_ids(client)
                    for key, banned in (("crowd", frozenset()), ("crowd_full_replies", ends)):
                        runs: dict[str, list[dict]] = {"off": [], "on": []}
                        for r in range(2):  # alternating, so drift on a shared machine hits both
                            runs["off"].append(_crowd(daemon, pb, npcs, 3, memory=False, round_=r, banned=banned))
                            runs["on"].append(_crowd(daemon, pb, npcs, 3, memory=True, round_=r, banned=banned))
                        out[key] = {"npcs": npcs, **{
                            f"{figure}_{side}": statistics.median(run[figure] for run in runs[side])
                            for side in runs for figure in ("tokens_per_s", "computed_prompt_tokens", "reply_tokens")}}
        finally:
            stop_daemon(daemon)
    _print(out)
    return out


def _print(out: dict) -> None:
    print("retrieval: share of questions whose planted fact was told to the model")
    for name, r in out["retrieval"].items():
        extra = f"  ({r['hits']}/{r['facts']}, {r['memories']} memories, {r['turns_dropped']} turns dropped)" if "hits" in r else ""
        print(f"  {name:18} {r['recall'] * 100:5.0f}%{extra}")
    print("cost per turn: recall (embed + search, ms), time to first token with the block and without (ms)")
    print("  memories  recall p50/p99   ttft on p50/p99    ttft off p50/p99   +prompt tok p50/max  store MB  model MB  RSS MB")
    for size, c in out["cost"].items():
        print(f"  {size:8}  {c['recall_ms_p50']:6.1f}/{c['recall_ms_p99']:6.1f}   {c['ttft_on_p50']:7.1f}/{c['ttft_on_p99']:7.1f}"
              f"   {c['ttft_off_p50']:7.1f}/{c['ttft_off_p99']:7.1f}   {c['added_prompt_tokens_p50']:8.0f}/{c['added_prompt_tokens_max']:<6.0f}"
              f"     {c['store_bytes'] / 2**20:7.1f}  {c['model_bytes'] / 2**20:7.1f}  {c['resident_bytes'] / 2**20:6.0f}")
    for key, replies in (("crowd", "replies ended by the model"), ("crowd_full_replies", f"every reply {CROWD_REPLY_TOKENS} tokens")):
        if key in out:
            c = out[key]
            print(f"{c['npcs']} NPCs at once, 3 turns each, reading a scope of 1,000, {replies}: "
                  f"{c['tokens_per_s_on']:.1f} tokens/s with memory, {c['tokens_per_s_off']:.1f} without: "
                  f"{c['tokens_per_s_on'] / c['tokens_per_s_off']:.2f}x; a turn computed {c['computed_prompt_tokens_on']:.1f} "
                  f"prompt tokens against {c['computed_prompt_tokens_off']:.1f} and wrote {c['reply_tokens_on']:.1f} "
                  f"against {c['reply_tokens_off']:.1f}")
