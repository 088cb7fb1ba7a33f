#!/usr/bin/env python3
"""The engine against its peers (issue 5), each scenario side by side in one run.

  single   one stream's decode tokens/s: the daemon, llama-cpp-python Llama() with its defaults,
           Llama() hand-tuned (best of a sweep of threads and flash attention), and llama-bench's
           token generation at its best thread count (when the binary is found)
  batch    aggregate tokens/s with 1, 4 and 16 concurrent conversations: the daemon, llama-cpp-
           python's server, llama.cpp's llama-server with as many slots
  session  time to first token of turn 2 of a conversation with a 500-token persona, against turn 1
  reload   pause of a reload (what a placement-changing budget update costs) with 8 live streams

    python bench/engine_benchmark.py [single batch session reload] [--model PATH | --moe]
        [--llama-bin DIR] [--repeats 3] [--json OUT]

Medians over repeats, with min and max. Run on an otherwise idle machine: llama.cpp's threads
spin, so any other process on the same cores distorts every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import peers  # noqa: E402

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


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f}  [{min(values):.1f} .. {max(values):.1f}]"


def messages(text: str, system: str | None = None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]


# -- single stream -----------------------------------------------------------------------------


def daemon_decode(client, tokens: int, nonce: int) -> float:
    from sidecar.api import pb

    req = pb.GenerateRequest(
        messages=pb.ChatMessages(messages=[pb.ChatMessage(role="system", content=f"Night {nonce}."), pb.ChatMessage(role="user", content=STORY)]),
        max_tokens=tokens,
        sampling=pb.SamplingParams(temperature=0.0),
    )
    return client.complete(req).final.timings.decode_tokens_per_s


def llama_decode(llm, tokens: int, nonce: int) -> float:
    """Decode tokens/s of Llama.create_chat_completion, timed from the first streamed token."""
    first = last = None
    n = 0
    for chunk in llm.create_chat_completion(messages(STORY, f"Night {nonce}."), max_tokens=tokens, temperature=0.0, stream=True):
        if chunk["choices"][0]["delta"].get("content"):
            now = time.perf_counter()
            first = first or now
            last = now
            n += 1
    return (n - 1) / (last - first) if n > 1 else 0.0


def scenario_single(model: Path, args, results: dict) -> None:
    from conftest import start_daemon, stop_daemon
    from llama_cpp import Llama

    tokens = 128
    print(f"\n== single stream decode, {tokens} tokens, {args.repeats} repeats ==")
    rows: dict[str, list[float]] = {}
    daemon = start_daemon("--model", str(model))
    try:
        with daemon.client(timeout_s=600) as c:
            daemon_decode(c, 8, -1)
            rows["daemon (its own choice)"] = [daemon_decode(c, tokens, i) for i in range(args.repeats)]
    finally:
        stop_daemon(daemon)
    llm = Llama(model_path=str(model), verbose=False)
    llama_decode(llm, 8, -1)
    rows["Llama() defaults"] = [llama_decode(llm, tokens, i) for i in range(args.repeats)]
    del llm
    best_name, best = None, []
    for threads in (1, 2):
        for flash in (False, True):
            llm = Llama(model_path=str(model), n_threads=threads, n_threads_batch=threads, flash_attn=flash, n_ctx=2048, verbose=False)
            llama_decode(llm, 8, -1)
            runs = [llama_decode(llm, tokens, i) for i in range(args.repeats)]
            del llm
            if not best or statistics.median(runs) > statistics.median(best):
                best_name, best = f"threads={threads} flash={flash}", runs
    rows[f"Llama() hand-tuned ({best_name})"] = best
    bench_bin = peers.find_llama_binary("llama-bench", args.llama_bin and args.llama_bin / "llama-bench")
    if bench_bin:
        tg = peers.llama_bench_tg(bench_bin, model, [1, 2], tokens, args.repeats)
        t_best = max(tg, key=tg.get)
        rows[f"llama-bench tg{tokens} (t={t_best})"] = [tg[t_best]]
    else:
        print("llama-bench not found (PATH, $LLAMA_CPP_BIN or --llama-bin): skipped")
    for name, values in rows.items():
        print(f"{name:45} {spread(values)} tok/s")
    d = statistics.median(rows["daemon (its own choice)"])
    ratios = {
        "vs_defaults": d / statistics.median(rows["Llama() defaults"]),
        "vs_hand_tuned": d / statistics.median(best),
    }
    bench_row = next((v for k, v in rows.items() if k.startswith("llama-bench")), None)
    if bench_row:
        ratios["vs_llama_bench"] = d / bench_row[0]
    print("daemon / defaults %.2fx (target 1.3x), / hand-tuned %.2fx (target 1.0x)" % (ratios["vs_defaults"], ratios["vs_hand_tuned"])
          + (", / llama-bench %.2fx (aim 0.95x)" % ratios["vs_llama_bench"] if bench_row else ""))
    results["single"] = {"rows": rows, "ratios": ratios}


# -- batch ----------------------------------------------------------------------------------------


QUESTIONS = [f"In two sentences, describe a {a} {b}." for a in ("brave", "sly", "old", "young") for b in ("knight", "thief", "wizard", "merchant")]


def aggregate(send, n_streams: int, max_tokens: int) -> float:
    """Total completion tokens per second with n_streams requests in flight at once."""
    counts = [0] * n_streams
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            counts[i] = send(QUESTIONS[i % len(QUESTIONS)], max_tokens)
        except BaseException as e:  # surfaced after the run
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n_streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(counts) / (time.perf_counter() - start)


def scenario_batch(model: Path, args, results: dict) -> None:
    from conftest import start_daemon, stop_daemon
    from sidecar.api import pb
    from sidecar.settings import Settings

    max_tokens, streams = 64, (1, 4, 16)
    threads = Settings().cpu_threads()
    print(f"\n== aggregate tokens/s, {max_tokens} tokens per conversation, {threads} threads ==")
    table: dict[str, dict[int, list[float]]] = {}

    daemon = start_daemon("--model", str(model), "--parallel", "16", "--ctx", "1024")
    try:
        with daemon.client(timeout_s=600) as c:
            def send(q: str, n: int) -> int:
                req = pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=q)]),
                                         max_tokens=n, sampling=pb.SamplingParams(temperature=0.0))
                return c.complete(req).final.usage.completion_tokens
            send("warm up", 4)
            table["daemon"] = {n: [aggregate(send, n, max_tokens) for _ in range(args.repeats)] for n in streams}
    finally:
        stop_daemon(daemon)

    peer = peers.start_llama_cpp_python_server(model, threads, 2048)
    try:
        table["llama-cpp-python server"] = {n: _http_aggregate(peer, n, max_tokens, args.repeats) for n in streams}
    finally:
        peer.stop()
    server_bin = peers.find_llama_binary("llama-server", args.llama_bin and args.llama_bin / "llama-server")
    if server_bin:
        per_n: dict[int, list[float]] = {}
        for n in streams:  # as many slots as streams, as the issue asks
            peer = peers.start_llama_server(server_bin, model, threads, n, 1024)
            try:
                per_n[n] = _http_aggregate(peer, n, max_tokens, args.repeats)
            finally:
                peer.stop()
        table["llama-server (slots = streams)"] = per_n
    else:
        print("llama-server not found (PATH, $LLAMA_CPP_BIN or --llama-bin): skipped")
    print(f"{'':34}" + "".join(f"{n:>12} streams" for n in streams))
    for name, row in table.items():
        print(f"{name:34}" + "".join(f"{statistics.median(row[n]):20.1f}" for n in streams))
    d = table["daemon"]
    ratios = {f"vs_llama_cpp_python_{n}": statistics.median(d[n]) / statistics.median(table["llama-cpp-python server"][n]) for n in streams}
    if "llama-server (slots = streams)" in table:
        ratios |= {f"vs_llama_server_{n}": statistics.median(d[n]) / statistics.median(table["llama-server (slots = streams)"][n]) for n in streams}
    print("daemon / llama-cpp-python server: " + ", ".join(f"{n} streams {ratios[f'vs_llama_cpp_python_{n}']:.2f}x" for n in streams)
          + "   (targets 2.5x at 4, 4x at 16)")
    if "vs_llama_server_1" in ratios:
        print("daemon / llama-server: " + ", ".join(f"{n} streams {ratios[f'vs_llama_server_{n}']:.2f}x" for n in streams) + "   (target >= 1.0x)")
    results["batch"] = {"table": {k: {str(n): v for n, v in row.items()} for k, row in table.items()}, "ratios": ratios}


def _http_aggregate(peer: peers.HttpPeer, n: int, max_tokens: int, repeats: int) -> list[float]:
    import httpx

    with httpx.Client(limits=httpx.Limits(max_connections=32)) as http:
        def send(q: str, k: int) -> int:
            return peer.chat(http, messages(q), k)
        send("warm up", 4)
        return [aggregate(send, n, max_tokens) for _ in range(repeats)]


# -- session --------------------------------------------------------------------------------------


def scenario_session(model: Path, args, results: dict) -> None:
    from conftest import start_daemon, stop_daemon
    from sidecar.api import pb

    print("\n== time to first token: turn 2 of a session with a ~500-token persona, against turn 1 ==")
    daemon = start_daemon("--model", str(model))
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
    results["session"] = {"turn1_ms": t1, "turn2_ms": t2, "persona_prompt_tokens": prompt_tokens, "ratio": ratio}


# -- reload ---------------------------------------------------------------------------------------


def scenario_reload(model: Path, args, results: dict) -> None:
    from sidecar.engine import Engine, EngineConfig, GenerationSpec, Prompt, SamplingConfig, TextDelta
    from sidecar.settings import Settings

    print("\n== reload with 8 live streams (engine in-process) ==")
    threads = Settings().cpu_threads()
    engine = Engine(EngineConfig(model_path=model, n_ctx=1024, n_seq=8, threads_decode=threads, threads_prefill=threads))
    pauses, gaps = [], []
    try:
        for r in range(args.repeats):
            arrivals: list[list[float]] = [[] for _ in range(8)]
            done = [threading.Event() for _ in range(8)]
            for i in range(8):
                def sink(ev, i=i):
                    if isinstance(ev, TextDelta):
                        arrivals[i].append(time.perf_counter())
                    else:
                        done[i].set()
                engine.submit(GenerationSpec(prompt=Prompt(messages=(("user", QUESTIONS[i]),)), sampling=SamplingConfig(temperature=0.0),
                                             max_tokens=120, session_id=f"npc-{r}-{i}"), sink)
            while min(len(a) for a in arrivals) < 10:
                time.sleep(0.005)
            pauses.append(engine.reload(engine.config, force=True).result(120)[1])
            for d in done:
                d.wait(300)
            gaps.append(max(b - a for arr in arrivals for a, b in zip(arr, arr[1:])) * 1000)
            for i in range(8):
                engine.end_session(f"npc-{r}-{i}")
    finally:
        engine.close()
    print(f"reload pause (engine)        {spread(pauses)} ms")
    print(f"longest gap seen by a stream {spread(gaps)} ms")
    results["reload"] = {"pause_ms": pauses, "max_gap_ms": gaps}


SCENARIOS = {"single": scenario_single, "batch": scenario_batch, "session": scenario_session, "reload": scenario_reload}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="*", choices=[*SCENARIOS, []], default=[])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--moe", action="store_true", help="use the MoE made from SmolLM2 (generated on the fly)")
    ap.add_argument("--llama-bin", type=Path, default=None, help="folder with llama-bench and llama-server")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from sidecar.default_model import default_model_path

    tmp = tempfile.TemporaryDirectory()
    model = args.model or default_model_path()
    if args.moe:
        from sidecar.testmodels import write_smollm2_moe

        model = write_smollm2_moe(Path(tmp.name) / "smollm2-moe.gguf")
    print(f"model: {model.name}")
    results: dict = {"model": model.name}
    for name in args.scenarios or list(SCENARIOS):
        SCENARIOS[name](model, args, results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
