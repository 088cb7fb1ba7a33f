"""A long-lived NPC (issue 17, 2): one session driven for many turns of ~200 tokens each on the
default context, through the daemon. Every turn must be answered; prints per-turn prompt, cached
and dropped figures and the time to first token.

    python bench/run.py evening [--turns 50] [--reply-tokens 24]
"""

from __future__ import annotations

import argparse
import os
import statistics

PERSONA = "You are Brom, a gruff dwarven blacksmith in the town of Oakheart. Stay in character."
# About 200 tokens with SmolLM2's tokenizer (checked below against usage).
LINE = ("I walked past the old mill by the river this morning and saw the miller's daughter "
        "arguing with a stranger in a grey cloak about the harvest festival and a missing cart. ")


def options(group) -> None:
    group.add_argument("--turns", type=int, default=None, help="default 50; 5 with --quick")
    group.add_argument("--reply-tokens", type=int, default=24)


def scenario(args: argparse.Namespace) -> dict:
    import grpc

    from sidecar.api import pb
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    args.turns = args.turns or (5 if args.quick else 50)
    daemon = start_daemon("--model", str(args.model_path), "--stream-interval-ms", "33")
    answered = failed = 0
    new_tokens, ttft, dropped = [], [], 0
    try:
        with daemon.client(timeout_s=600) as client:
            ctx = client.status().limits.context_per_session
            for turn in range(args.turns):
                messages = [pb.ChatMessage(role="user", content=f"Turn {turn}. " + LINE * 5)]
                if turn == 0:
                    messages.insert(0, pb.ChatMessage(role="system", content=PERSONA))
                request = pb.GenerateRequest(messages=pb.ChatMessages(messages=messages), max_tokens=args.reply_tokens,
                                             session_id="brom", sampling=pb.SamplingParams(temperature=0.7, seed=turn))
                try:
                    final = client.complete(request).final
                except grpc.RpcError as e:
                    failed += 1
                    print(f"turn {turn}: {e.code().name} {e.details()}")
                    continue
                answered += 1
                dropped += final.history_turns_dropped
                new_tokens.append(final.usage.prompt_tokens - final.usage.cached_prompt_tokens)
                ttft.append(final.timings.time_to_first_token_ms)
                print(f"turn {turn:2d}: prompt {final.usage.prompt_tokens:4d} cached {final.usage.cached_prompt_tokens:4d} "
                      f"dropped {final.history_turns_dropped} kept history {final.history_tokens_kept:4d} "
                      f"reply {final.usage.completion_tokens:2d} ttft {final.timings.time_to_first_token_ms:5.0f} ms", flush=True)
    finally:
        stop_daemon(daemon)
    print(f"{args.turns} turns on a {ctx}-token context: {answered} answered, {failed} failed; "
          f"{dropped} turns dropped in all; tokens computed per turn median {statistics.median(new_tokens):.0f}, "
          f"max {max(new_tokens)}; time to first token median {statistics.median(ttft):.0f} ms, max {max(ttft):.0f} ms; "
          f"load {os.getloadavg()}")
    return {"turns": args.turns, "context": ctx, "answered": answered, "failed": failed, "turns_dropped": dropped,
            "tokens_computed": new_tokens, "ttft_ms": ttft}
