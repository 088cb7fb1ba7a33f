"""Save games (issue 38): NPCs' conversations exported, the daemon restarted, imported, resumed.

16 NPCs talk for two turns of ~700 tokens each (about 1,500 tokens a conversation, greedy). Then:

  export            every NPC with its KV state and without: archive size (stored, and raw before
                    compression), time; zlib's levels 1 and 6 on each payload, to show what pays
  never left        each NPC's next turn on the first daemon (its KV in a sequence or evicted to
                    host memory): the reference a restored NPC is held to
  restored (kv)     a fresh daemon imports the archive with KV; each NPC's next turn
  rebuilt (text)    the text-only archive imported over it (replace); the next turn computes
                    the conversation again (timed for --rebuild-sample NPCs: seconds apiece)
  full resend       new sessions sent the whole conversation in one request (what a game does
                    with llama-server or LLMUnity 3's JSON history), as many NPCs
  another model     the archive with KV imported into a daemon serving a generated test model:
                    every session must be rebuilt from text, none restored

Time to first token per NPC is the daemon's own (Timings.time_to_first_token_ms), median and max.
Targets (the issue's): restored within 1.5x of never-left, at least 10x faster than rebuilt, and
export and import of 16 NPCs with KV under 1 s.

    python bench/run.py save-games [--npcs 16] [--turn-tokens 700] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import zlib
from pathlib import Path

from bench.village import NAMES, TRADES, _fill

REPLY_TOKENS = 16
ARGS = ("--ctx", "2048", "--max-prompt-tokens", "1900", "--max-sessions", "64", "--stream-interval-ms", "0")


def options(group) -> None:
    group.add_argument("--npcs", type=int, default=None, help="default 16; 4 with --quick")
    group.add_argument("--turn-tokens", type=int, default=None, help="tokens of each of the two player turns; default 700, 300 with --quick")
    group.add_argument("--rebuild-sample", type=int, default=4,
                       help="NPCs whose rebuilt and full-resend turns are timed (each computes its whole "
                            "conversation: seconds apiece); 0 for all")


def _line(i: int, npc: int) -> str:
    return (f"Entry {i}: on day {i + npc} the caravan from the {TRADES[(i + npc) % 16]}'s guild reached the north gate "
            f"with {3 + i % 7} carts of iron, and {NAMES[(i * 3 + npc) % 16]} counted them twice.")


def _ttft(client, request) -> tuple[float, object]:
    final = client.complete(request).final
    return final.timings.time_to_first_token_ms, final


def scenario(args: argparse.Namespace) -> dict:
    from sidecar.api import pb
    from sidecar.backend.save_format import HEADER_BYTES, read_envelope
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon
    from sidecar.testmodels.registry import write_models

    n = args.npcs or (4 if args.quick else 16)
    turn_tokens = args.turn_tokens or (300 if args.quick else 700)
    sampling = pb.SamplingParams(temperature=0.0)

    def chat(*messages: tuple[str, str]) -> pb.ChatMessages:
        return pb.ChatMessages(messages=[pb.ChatMessage(role=r, content=c) for r, c in messages])

    def next_turn(i: int, sid: str | None = None) -> pb.GenerateRequest:
        return pb.GenerateRequest(messages=chat(("user", "So, what do you make of all that?")), sampling=sampling,
                                  max_tokens=4, session_id=sid or f"npc-{i}")

    out: dict = {"npcs": n, "turn_tokens": turn_tokens}
    conversations: dict[int, list[tuple[str, str]]] = {}
    a = start_daemon("--model", str(args.model_path), *ARGS)
    try:
        with a.client(timeout_s=600) as c:
            count = lambda text: len(c.tokenize(text))  # noqa: E731
            t0 = time.perf_counter()
            for i in range(n):
                persona = f"You are {NAMES[i % 16]}, the village {TRADES[i % 16]}. Answer in one short sentence."
                convo = [("system", persona)]
                for turn in range(2):
                    said = _fill(count, lambda k: _line(k + 40 * turn, i), turn_tokens)
                    convo.append(("user", said))
                    reply = c.complete(pb.GenerateRequest(messages=chat(*convo[-2 if turn == 0 else -1:]), sampling=sampling,
                                                          max_tokens=REPLY_TOKENS, session_id=f"npc-{i}"))
                    convo.append(("assistant", reply.text))
                conversations[i] = convo
            out["build_s"] = time.perf_counter() - t0
            tokens = {s.session_id: s.tokens for s in c.status().sessions}
            out["tokens_per_npc"] = statistics.median(tokens.values())
            t0 = time.perf_counter()
            with_kv = c.export_sessions(include_kv=True)
            out["export_kv_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            text_only = c.export_sessions()
            out["export_text_s"] = time.perf_counter() - t0
            out["never_left_ms"] = [_ttft(c, next_turn(i))[0] for i in range(n)]
    finally:
        stop_daemon(a)
    for name, saved in (("kv", with_kv.data), ("text", text_only.data)):
        env = read_envelope(saved)
        out[f"archive_{name}_bytes"] = len(saved)
        out[f"archive_{name}_raw_bytes"] = env.raw_bytes + HEADER_BYTES
        out[f"archive_{name}_compressed"] = env.compressed
    out["kv_bytes_per_npc"] = statistics.median(s.kv_bytes for s in with_kv.sessions)
    out["zlib"] = _zlib_figures(with_kv.data, text_only.data)

    b = start_daemon("--model", str(args.model_path), *ARGS)
    try:
        with b.client(timeout_s=600) as c:
            t0 = time.perf_counter()
            infos = c.import_sessions(with_kv.data)
            out["import_kv_s"] = time.perf_counter() - t0
            out["import_kv_restored"] = sum(i.restored == "kv" for i in infos)
            restored = [_ttft(c, next_turn(i)) for i in range(n)]
            out["restored_ms"] = [t for t, _ in restored]
            out["restored_cached"] = statistics.median(f.usage.cached_prompt_tokens for _, f in restored)
            t0 = time.perf_counter()
            infos = c.import_sessions(text_only.data, replace=True)
            out["import_text_s"] = time.perf_counter() - t0
            out["import_text_rebuilt"] = sum(i.restored == "text" for i in infos)
            sample = min(n, args.rebuild_sample or n)
            out["rebuild_sample"] = sample
            out["rebuilt_ms"] = [_ttft(c, next_turn(i))[0] for i in range(sample)]
            full = []
            for i in range(sample):
                request = pb.GenerateRequest(messages=chat(*conversations[i], ("user", "So, what do you make of all that?")),
                                             sampling=sampling, max_tokens=4, session_id=f"fresh-{i}")
                full.append(_ttft(c, request)[0])
            out["full_resend_ms"] = full
    finally:
        stop_daemon(b)

    with tempfile.TemporaryDirectory() as folder:
        tiny = write_models(Path(folder), ["tiny_llama"])["tiny_llama"]
        other = start_daemon("--model", str(tiny), *ARGS)
        try:
            with other.client(timeout_s=600) as c:
                infos = c.import_sessions(with_kv.data)
                out["other_model_kv"] = sum(i.restored == "kv" for i in infos)
                out["other_model_text"] = sum(i.restored == "text" for i in infos)
                out["other_model_reason"] = infos[0].reason if infos else ""
        finally:
            stop_daemon(other)
    _print(out)
    return out


def _zlib_figures(with_kv: bytes, text_only: bytes) -> dict:
    """zlib at levels 1 and 6 over each archive's payload: size ratio and MB/s."""
    from sidecar.backend.save_format import HEADER_BYTES, read_envelope

    figures = {}
    for name, blob in (("kv", with_kv), ("text", text_only)):
        env = read_envelope(blob)
        payload = zlib.decompress(blob[HEADER_BYTES:]) if env.compressed else blob[HEADER_BYTES:]
        for level in (1, 6):
            t0 = time.perf_counter()
            packed = zlib.compress(payload, level)
            seconds = time.perf_counter() - t0
            figures[f"{name}_l{level}"] = {"ratio": len(packed) / len(payload), "mb_s": len(payload) / seconds / 1e6}
    return figures


def _med(values: list[float]) -> str:
    return f"{statistics.median(values):7.0f} ms (max {max(values):5.0f})"


def _print(o: dict) -> None:
    mib = 1 << 20
    print(f"\nsave-games: {o['npcs']} NPCs of {o['tokens_per_npc']:.0f} tokens each (built in {o['build_s']:.0f} s)")
    print(f"  export with KV     {o['archive_kv_bytes'] / mib:8.1f} MiB stored ({o['archive_kv_raw_bytes'] / mib:.1f} raw, "
          f"compressed: {'yes' if o['archive_kv_compressed'] else 'no'}), {o['kv_bytes_per_npc'] / mib:.1f} MiB KV per NPC, "
          f"{o['export_kv_s'] * 1000:.0f} ms")
    print(f"  export text only   {o['archive_text_bytes'] / 1024:8.1f} KiB stored ({o['archive_text_raw_bytes'] / 1024:.1f} raw, "
          f"compressed: {'yes' if o['archive_text_compressed'] else 'no'}), {o['export_text_s'] * 1000:.0f} ms")
    for name, z in o["zlib"].items():
        print(f"  zlib {name:8}      {z['ratio'] * 100:5.1f}% of raw at {z['mb_s']:6.0f} MB/s")
    print(f"  import with KV     {o['import_kv_s'] * 1000:6.0f} ms, {o['import_kv_restored']} of {o['npcs']} restored from KV")
    print(f"  import text        {o['import_text_s'] * 1000:6.0f} ms, {o['import_text_rebuilt']} rebuilt from text")
    print("  next turn's time to first token:")
    print(f"    never left       {_med(o['never_left_ms'])}")
    print(f"    restored (kv)    {_med(o['restored_ms'])}   cached tokens median {o['restored_cached']:.0f}")
    print(f"    rebuilt (text)   {_med(o['rebuilt_ms'])}   ({o['rebuild_sample']} NPCs)")
    print(f"    full resend      {_med(o['full_resend_ms'])}   ({o['rebuild_sample']} NPCs)")
    restored, left, rebuilt = (statistics.median(o[k]) for k in ("restored_ms", "never_left_ms", "rebuilt_ms"))
    print(f"  restored / never left {restored / left:.2f}x (target <= 1.5x); rebuilt / restored {rebuilt / restored:.1f}x "
          f"(target >= 10x); export + import with KV {(o['export_kv_s'] + o['import_kv_s']) * 1000:.0f} ms (target < 1000)")
    print(f"  another model: {o['other_model_kv']} restored from KV, {o['other_model_text']} rebuilt from text "
          f"({o['other_model_reason'][:60]})")
