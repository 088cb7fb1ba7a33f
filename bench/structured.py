"""NPC actions and JSON replies under a grammar (issue 40): jump-forward decoding against plain
constrained decoding and llama-server, with the same grammar text on every side.

Replies: a tool call among 3 tools of 2-4 required arguments, a tool call among 2 tools of 3-5,
and an NPC state reply of 6 fields. Each is asked greedily, at 1 stream and 8 at once, of:
- the daemon (jump-forward on, its default), over its OpenAI-compatible HTTP API;
- the daemon with --no-jump-forward (token by token, as llama.cpp decodes constrained text);
- llama-server, same model, same threads, the same GBNF in its `grammar` field.
Printed per side: median reply wall time, completion tokens, tokens the daemon jumped (its final
usage's `forced_tokens`), passes per reply (tokens less jumped ones), and how many replies parse
as JSON and fit their schema (all must).

    python bench/run.py structured [--llama-bin DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from bench import common

THREADS = 2
MAX_TOKENS = 160
TEXT = {"type": "string", "maxLength": 24}
INT = {"type": "integer"}


def _tool(name: str, **arguments: dict) -> dict:
    return {"type": "object", "properties": {
        "name": {"const": name},
        "arguments": {"type": "object", "properties": arguments, "required": list(arguments)}},
        "required": ["name", "arguments"]}


CASES = {
    "tool call, 3 tools": ("The player hands you 30 gold for the steel sword. Act.", {"anyOf": [
        _tool("give_item", item=TEXT, count=INT),
        _tool("attack", target=TEXT, weapon=TEXT, power=INT),
        _tool("trade", give=TEXT, take=TEXT, price=INT, haggle={"type": "boolean"})]}),
    "tool call, 2 tools": ("A wolf runs into the smithy. Act.", {"anyOf": [
        _tool("flee", direction=TEXT, speed=INT, shout=TEXT),
        _tool("defend", target=TEXT, weapon=TEXT, stance=TEXT, power=INT, call_guards={"type": "boolean"})]}),
    "JSON reply, 6 fields": ("Describe your state as the smith of Oakvale.", {
        "type": "object", "properties": {"mood": {"enum": ["calm", "angry", "afraid"]}, "trust": INT, "quest": TEXT,
                                         "gold": INT, "hostile": {"type": "boolean"}, "line": TEXT},
        "required": ["mood", "trust", "quest", "gold", "hostile", "line"]}),
}
# The daemon's default penalties, sent to every side: llama-server's own default is no penalty,
# and the replies would differ by more than the decoding.
SAMPLING = {"repeat_penalty": 1.1, "repeat_last_n": 64}
SYSTEM = "You are Brann, the blacksmith of Oakvale. Answer only with the JSON asked for."


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--streams", default="1,8", help="concurrent replies, comma-separated (default 1,8)")


def _ask(http, base: str, headers: dict | None, prompt: str, grammar: str) -> dict:
    body = {"model": "npc", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
            "max_tokens": MAX_TOKENS, "temperature": 0.0, "grammar": grammar, **SAMPLING}
    started = time.perf_counter()
    r = http.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=600)
    r.raise_for_status()
    wall = time.perf_counter() - started
    reply = r.json()
    usage = reply.get("usage") or {}
    return {"wall_s": wall, "text": reply["choices"][0]["message"].get("content") or "",
            "tokens": usage.get("completion_tokens", 0), "forced": usage.get("forced_tokens", 0)}


def _fits(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def _round(http, side: str, base: str, headers, streams: int, grammars: dict) -> list[dict]:
    rows = []
    for case, (prompt, schema) in CASES.items():
        with ThreadPoolExecutor(streams) as pool:
            replies = list(pool.map(lambda _: _ask(http, base, headers, prompt, grammars[case]), range(streams)))
        for r in replies:
            rows.append({"side": side, "case": case, "streams": streams, **r, "fits": _fits(r["text"], schema)})
    return rows


def scenario(args: argparse.Namespace) -> dict:
    import httpx

    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon
    from sidecar.native.grammar import json_schema_grammar

    grammars = {case: json_schema_grammar(json.dumps(schema)) for case, (_, schema) in CASES.items()}
    streams = [int(s) for s in args.streams.split(",")]
    repeats = args.repeats or 3
    # Threads fixed, so no profile is needed; without a stored one, off: an idle daemon would
    # measure one while the other sides run.
    flags = ("--model", str(args.model_path), "--threads", str(THREADS), "--parallel", str(max(streams)),
             "--no-frame-guard", *(common.profile_flags() or ["--profile", "off"]))
    sides = {"daemon, jump-forward": flags, "daemon, token by token": (*flags, "--no-jump-forward")}
    # Every side is up at once, idle while another runs, and the repeats alternate their order:
    # on a shared machine a disturbance then lands on no side in particular.
    servers: dict[str, tuple[str, dict | None]] = {}
    daemons, peer = [], None
    rows: list[dict] = []
    try:
        for side, side_flags in sides.items():
            daemon = start_daemon(*side_flags)
            daemons.append(daemon)
            listening = next(e for e in daemon.log_lines if e.get("event") == "listening")
            servers[side] = (listening["http_address"], {"Authorization": f"Bearer {daemon.token}"})
        binary = common.find_llama_binary("llama-server", args.llama_bin)
        if binary is None:
            print("llama-server not found (PATH, $LLAMA_CPP_BIN or --llama-bin): its side is skipped")
        else:
            peer = common.start_llama_server(binary, args.model_path, THREADS, max(streams), 2048)
            servers["llama-server"] = (peer.base_url, None)
        with httpx.Client() as http:
            for base, headers in servers.values():
                _round(http, "warm-up", base, headers, 1, grammars)  # each grammar checked once
            order = list(servers)
            for i in range(repeats):
                for n in streams:
                    for side in (order if i % 2 == 0 else order[::-1]):
                        rows += _round(http, side, *servers[side], n, grammars)
    finally:
        for daemon in daemons:
            stop_daemon(daemon)
        if peer is not None:
            peer.stop()
    return _report(rows, streams)


def _report(rows: list[dict], streams: list[int]) -> dict:
    med = statistics.median
    table: dict[str, dict] = {}
    print(f"\n{'case':22}{'streams':>8}  {'side':26}{'wall s':>8}{'tokens':>8}{'jumped':>8}{'passes':>8}{'fit':>7}")
    for case in CASES:
        for n in streams:
            for side in ("daemon, jump-forward", "daemon, token by token", "llama-server"):
                mine = [r for r in rows if r["case"] == case and r["streams"] == n and r["side"] == side]
                if not mine:
                    continue
                row = {"wall_s": med(r["wall_s"] for r in mine), "tokens": med(r["tokens"] for r in mine),
                       "jumped": med(r["forced"] for r in mine), "fits": sum(r["fits"] for r in mine),
                       "replies": len(mine)}
                row["passes"] = row["tokens"] - row["jumped"]
                table[f"{case} | {n} | {side}"] = row
                print(f"{case:22}{n:8}  {side:26}{row['wall_s']:8.2f}{row['tokens']:8.0f}{row['jumped']:8.0f}"
                      f"{row['passes']:8.0f}{row['fits']:4}/{row['replies']}")
            peer = table.get(f"{case} | {n} | llama-server")
            for side in ("daemon, jump-forward", "daemon, token by token"):
                ours = table.get(f"{case} | {n} | {side}")
                if ours and peer:
                    print(f"{'':32}{side} faster than llama-server: x{peer['wall_s'] / ours['wall_s']:.2f}")
    same = _same_values(rows)
    if same:
        print("greedy, 1 stream: replies whose parsed JSON equals the daemon's token by token: "
              + ", ".join(f"{side} {k}/{n}" for side, (k, n) in same.items()))
    return {"table": table, "rows": rows, "same_values": same}


def _parsed(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _same_values(rows: list[dict]) -> dict[str, tuple[int, int]]:
    """Jump-forward's values against plain constrained decoding's, reply by reply: the forced
    text is the same, but its tokens are the tokenizer's split, and what the model writes after
    them may differ (jump_forward.py). At 1 stream, greedy, each case's repeats pair up in order."""
    same: dict[str, tuple[int, int]] = {}
    for side in ("daemon, jump-forward", "llama-server"):
        k = n = 0
        for case in CASES:
            plain = [r for r in rows if r["case"] == case and r["streams"] == 1 and r["side"] == "daemon, token by token"]
            mine = [r for r in rows if r["case"] == case and r["streams"] == 1 and r["side"] == side]
            for a, b in zip(plain, mine):
                n += 1
                k += _parsed(a["text"]) is not None and _parsed(a["text"]) == _parsed(b["text"])
        if n:
            same[side] = (k, n)
    return same
