"""tool_choice "auto": does the reply call a tool where one fits, and answer in words where none
does (issue 36, item 7)? The same prompts, tools and seeds go to the daemon and to llama-server
(same model, its own chat template and tool handling, --jinja), over the OpenAI chat API.

Prompts that need a tool (the weather, an NPC handing over an item) and prompts that do not
(greetings, a joke, arithmetic, lore an NPC is asked, and llama.cpp's own no-tool case from
test_tool_call.py: "say hello world with python" with its TEST_TOOL and no tool_choice), each at
temperature 0 and at 0.7 under a few seeds. The table gives, per side and temperature, the share
of no-tool prompts answered in words and the share of tool prompts answered with a call (of the
right function), and how many replies held a `<...>` placeholder.

    python bench/run.py tool-choice [--llama-bin DIR] [--tool-seeds 3] [--tool-max-tokens 96]
                                    [--tool-sides daemon,llama-server]
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass

from bench import common

NPC = ("You are Mira, the innkeeper of the Prancing Goat in the village of Oakvale. You are warm and "
       "talkative. Behind the bar you keep ale, bread, a healing potion and an old iron key.")
CHATBOT = "You are a chatbot that uses tools/functions. Dont overthink things."  # llama.cpp's test_weather
CODING = "You are a coding assistant."  # llama.cpp's test_completion_without_tool_call_fast

WEATHER = {"type": "function", "function": {  # llama.cpp's WEATHER_TOOL
    "name": "get_current_weather", "description": "Get the current weather in a given location",
    "parameters": {"type": "object", "properties": {"location": {
        "type": "string", "description": "The city and country/state, e.g. 'San Francisco, CA', or 'Paris, France'"}},
        "required": ["location"]}}}
GIVE_ITEM = {"type": "function", "function": {
    "name": "give_item", "description": "Hand an item from behind the bar to the player.",
    "parameters": {"type": "object", "properties": {"item": {"type": "string", "description": "The item to give"}},
                   "required": ["item"]}}}
TEST_TOOL = {"type": "function", "function": {  # llama.cpp's TEST_TOOL
    "name": "test", "description": "", "parameters": {
        "type": "object", "properties": {"success": {"type": "boolean", "const": True}}, "required": ["success"]}}}
NPC_TOOLS = [WEATHER, GIVE_ITEM]


@dataclass(frozen=True)
class Case:
    name: str
    system: str
    user: str
    wants: str | None  # the function that fits, or None: words
    tools: tuple = tuple(NPC_TOOLS)


CASES = [
    # A tool fits (the first is llama.cpp's test_weather).
    Case("weather-istanbul", CHATBOT, "What is the weather in Istanbul?", "get_current_weather"),
    Case("weather-paris", NPC, "What's the weather like in Paris, France right now?", "get_current_weather"),
    Case("weather-london", NPC, "Is it raining in London today? Check the current weather for me.",
         "get_current_weather"),
    Case("weather-tokyo", CHATBOT, "Get the current weather in Tokyo, Japan.", "get_current_weather"),
    Case("give-potion", NPC, "Please give me the healing potion, I'm badly hurt.", "give_item"),
    Case("give-key", NPC, "Here are ten silver coins. Hand me the old iron key.", "give_item"),
    # No tool fits.
    Case("hello", NPC, "Hello, who are you?", None),
    Case("joke", NPC, "Tell me a joke.", None),
    Case("arithmetic", NPC, "What is 2+2?", None),
    Case("lore-founder", NPC, "Who founded this village?", None),
    Case("lore-dragon", NPC, "Have you heard anything about the dragon in the mountains?", None),
    Case("evening", NPC, "Good evening! How is business tonight?", None),
    Case("farewell", NPC, "Thank you for the warm meal. Farewell!", None),
    Case("capital", CHATBOT, "What is the capital of France?", None),
    Case("hello-python", CODING, "say hello world with python", None, (TEST_TOOL,)),  # llama.cpp's no-tool case
]
PLACEHOLDER = re.compile(r"<[^<>\n]{1,40}>")


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--tool-seeds", type=int, default=3, help="seeds at temperature 0.7 (default 3)")
    group.add_argument("--tool-max-tokens", type=int, default=96, help="max_tokens of each reply (default 96)")
    group.add_argument("--tool-sides", default="daemon,llama-server", help="the sides to run (default both)")


def outcome(message: dict, finish: str | None) -> str:
    """'call:<name>' (the first call's function), 'cut call' (a call's JSON cut by max_tokens),
    or 'words'."""
    calls = message.get("tool_calls") or []
    if calls:
        return "call:" + calls[0]["function"]["name"]
    content = (message.get("content") or "").lstrip()
    if finish == "length" and content[:1] in "{[" and content:
        return "cut call"
    return "words"


def ask(http, base: str, headers: dict, case: Case, temperature: float, seed: int, max_tokens: int) -> dict:
    messages = [{"role": "system", "content": case.system}, {"role": "user", "content": case.user}]
    body = {"model": "npc", "messages": messages,
            "tools": list(case.tools), "max_tokens": max_tokens, "temperature": temperature, "seed": seed}
    if case.name != "hello-python":  # llama.cpp's case sends no tool_choice: the default, auto
        body["tool_choice"] = "auto"
    r = http.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=600)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    message = choice["message"]
    return {"case": case.name, "temperature": temperature, "seed": seed,
            "outcome": outcome(message, choice.get("finish_reason")),
            "placeholder": bool(PLACEHOLDER.search(message.get("content") or "")),
            "text": (message.get("content") or str(message.get("tool_calls")))[:160]}


def run_side(http, base: str, headers: dict, settings: list[tuple[float, int]], max_tokens: int) -> list[dict]:
    return [ask(http, base, headers, case, t, seed, max_tokens) for t, seed in settings for case in CASES]


def summarize(rows: list[dict]) -> dict:
    wants = {c.name: c.wants for c in CASES}
    out = {}
    for t in sorted({r["temperature"] for r in rows}):
        at = [r for r in rows if r["temperature"] == t]
        words = [r for r in at if wants[r["case"]] is None]
        tools = [r for r in at if wants[r["case"]] is not None]
        out[f"{t:g}"] = {
            "no_tool_in_words": sum(r["outcome"] == "words" for r in words), "no_tool": len(words),
            "tool_called": sum(r["outcome"].startswith("call:") or r["outcome"] == "cut call" for r in tools),
            "tool_right_function": sum(r["outcome"] == "call:" + wants[r["case"]] for r in tools), "tool": len(tools),
            "placeholders": sum(r["placeholder"] for r in at),
        }
    return out


def _share(n: int, of: int) -> str:
    return f"{n}/{of} {100 * n / of:3.0f}%" if of else "-"


def print_table(summaries: dict[str, dict]) -> None:
    print(f"\n  {'side':14}{'temp':>6}{'no-tool prompts in words':>27}{'tool prompts called':>22}"
          f"{'right function':>17}{'placeholders':>14}")
    for side, by_t in summaries.items():
        for t, s in by_t.items():
            words, called = _share(s["no_tool_in_words"], s["no_tool"]), _share(s["tool_called"], s["tool"])
            print(f"  {side:14}{t:>6}{words:>27}{called:>22}{_share(s['tool_right_function'], s['tool']):>17}"
                  f"{s['placeholders']:>14}")


def _daemon_side(http, args: argparse.Namespace, settings: list[tuple[float, int]], rows: dict) -> None:
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    daemon = start_daemon("--model", str(args.model_path), *common.profile_flags())
    try:
        listening = next(e for e in daemon.log_lines if e.get("event") == "listening")
        t0 = time.perf_counter()
        rows["daemon"] = run_side(http, listening["http_address"], {"Authorization": f"Bearer {daemon.token}"},
                                  settings, args.tool_max_tokens)
        print(f"daemon: {len(rows['daemon'])} replies in {time.perf_counter() - t0:.0f} s")
    finally:
        stop_daemon(daemon)


def scenario(args: argparse.Namespace) -> dict:
    import httpx

    seeds = 1 if args.quick else args.tool_seeds
    settings = [(0.0, 0)] + [(0.7, seed) for seed in range(1, seeds + 1)]
    rows: dict[str, list[dict]] = {}
    binary = common.find_llama_binary("llama-server", args.llama_bin)
    sides = args.tool_sides.split(",")
    with httpx.Client() as http:
        if "daemon" in sides:
            _daemon_side(http, args, settings, rows)
        if "llama-server" in sides and binary is None:
            print("llama-server: not found (--llama-bin, $LLAMA_CPP_BIN or PATH): skipped")
        elif "llama-server" in sides:
            # --jinja: llama-server reads tools only through the model's Jinja chat template.
            peer = common.start_llama_server(binary, args.model_path, 2, 1, 4096, extra=("--jinja",))
            try:
                t0 = time.perf_counter()
                rows["llama-server"] = run_side(http, peer.base_url, {}, settings, args.tool_max_tokens)
                print(f"llama-server: {len(rows['llama-server'])} replies in {time.perf_counter() - t0:.0f} s")
            finally:
                peer.stop()
    summaries = {side: summarize(r) for side, r in rows.items()}
    print_table(summaries)
    for side, side_rows in rows.items():
        print(f"\n  {side}, per prompt (temperature 0, then 0.7 by seed):")
        for case in CASES:
            got = [r["outcome"] for r in side_rows if r["case"] == case.name]
            print(f"    {case.name:18}{'(' + (case.wants or 'words') + ')':23}{', '.join(got)}")
    return {"summary": summaries, "replies": rows, "settings": settings}
