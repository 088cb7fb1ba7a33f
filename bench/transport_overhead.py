"""Does the daemon's transport cost decode throughput? (issue 2's measure)

One run, side by side: decode tokens/s and time to first token of one stream
  A) through the daemon (separate process, gRPC over loopback, streamed chunk by chunk), and
  B) the same model, prompt and settings called in-process through llama-cpp-python (Llama.generate),
interleaved A, B, A, B, ... so machine noise hits both alike. Prints medians, spreads and A/B.
Target: A/B >= 0.95.

    python bench/run.py transport [--model PATH] [--tokens 128] [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

PROMPT = "Tell me a long story about a dragon who guards a library."


def rendered_prompts(model_path: Path, n: int) -> list[str]:
    """One prompt per run, each with its own opening line, so neither side can reuse a previous
    run's KV cache: both prefill from scratch and their first-token times compare."""
    from sidecar.native.model import NativeModel

    model = NativeModel(model_path)
    try:
        return [model.render_chat([("system", f"Story night number {i}."), ("user", PROMPT)]) for i in range(n)]
    finally:
        model.close()


def run_daemon(client, prompt: str, tokens: int) -> tuple[float, float, int]:
    """(decode tokens/s, time to first token ms, tokens) measured at the client."""
    from sidecar.api import pb

    request = pb.GenerateRequest(
        prompt=prompt, max_tokens=tokens, sampling=pb.SamplingParams(temperature=0.0, repeat_penalty=1.0)
    )
    start = time.perf_counter()
    first = last = None
    n = 0
    for chunk in client.generate(request):
        if chunk.token_ids:
            now = time.perf_counter()
            first = first or now
            last = now
            n += len(chunk.token_ids)
    return (n - 1) / (last - first), (first - start) * 1000, n


def run_in_process(llm, prompt: str, tokens: int) -> tuple[float, float, int]:
    llm.reset()  # no prompt cache between runs: the daemon's request also prefills from scratch
    ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
    start = time.perf_counter()
    first = last = None
    n = 0
    for token in llm.generate(ids, temp=0.0, repeat_penalty=1.0, reset=True):
        now = time.perf_counter()
        if llm._model.token_is_eog(token) if hasattr(llm._model, "token_is_eog") else token == llm.token_eos():
            break
        first = first or now
        last = now
        n += 1
        if n >= tokens:
            break
    return (n - 1) / (last - first), (first - start) * 1000, n


def summarize(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def options(group) -> None:
    group.add_argument("--tokens", type=int, default=None, help="tokens per run (default 128; 32 with --quick)")
    group.add_argument("--threads", type=int, default=0, help="default: what the daemon picks (one per physical core)")


def scenario(args: argparse.Namespace) -> dict:
    from llama_cpp import Llama

    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon
    from sidecar.settings import Settings

    model = args.model_path
    args.tokens = args.tokens or (32 if args.quick else 128)
    threads = args.threads or Settings().cpu_threads()
    prompts = rendered_prompts(model, args.repeats + 1)
    # Same settings on both sides: no planner, the threads and flash-attention setting given here.
    common = ["--model", str(model), "--threads", str(threads), "--flash-attention", "off", "--ctx", "4096", "--profile", "off"]
    daemon = start_daemon(*common)
    llm = Llama(
        model_path=str(model), n_ctx=4096, n_batch=512, n_threads=threads, n_threads_batch=threads,
        flash_attn=False, verbose=False,
    )
    daemon_runs, local_runs = [], []
    try:
        with daemon.client(timeout_s=300) as client:
            run_daemon(client, prompts[-1], 8)  # warm both: page in the mmapped weights
            run_in_process(llm, prompts[-1], 8)
            for i in range(args.repeats):
                daemon_runs.append(run_daemon(client, prompts[i], args.tokens))
                local_runs.append(run_in_process(llm, prompts[i], args.tokens))
                print(
                    f"run {i + 1}: daemon {daemon_runs[-1][0]:6.1f} tok/s ({daemon_runs[-1][2]} tokens), "
                    f"in-process {local_runs[-1][0]:6.1f} tok/s ({local_runs[-1][2]} tokens)",
                    flush=True,
                )
    finally:
        stop_daemon(daemon)

    d_tps, l_tps = summarize([r[0] for r in daemon_runs]), summarize([r[0] for r in local_runs])
    d_ttft, l_ttft = summarize([r[1] for r in daemon_runs]), summarize([r[1] for r in local_runs])
    ratio = d_tps["median"] / l_tps["median"]
    # Each daemon run sits next to an in-process run: the median of the pairs' ratios cancels
    # slow drifts of the machine that the ratio of medians does not.
    paired = statistics.median(d[0] / l[0] for d, l in zip(daemon_runs, local_runs))
    print()
    print(f"model {model.name}, {threads} threads, {args.tokens} tokens, {args.repeats} interleaved repeats")
    print(f"{'':28}{'median':>10}{'min':>10}{'max':>10}")
    print(f"{'daemon decode tok/s':28}{d_tps['median']:10.1f}{d_tps['min']:10.1f}{d_tps['max']:10.1f}")
    print(f"{'in-process decode tok/s':28}{l_tps['median']:10.1f}{l_tps['min']:10.1f}{l_tps['max']:10.1f}")
    print(f"{'daemon first token ms':28}{d_ttft['median']:10.1f}{d_ttft['min']:10.1f}{d_ttft['max']:10.1f}")
    print(f"{'in-process first token ms':28}{l_ttft['median']:10.1f}{l_ttft['min']:10.1f}{l_ttft['max']:10.1f}")
    print(f"daemon / in-process decode: {ratio:.3f} (ratio of medians), {paired:.3f} (median of paired runs)"
          f"  (target >= 0.95: {'met' if min(ratio, paired) >= 0.95 else 'NOT met'})")
    return {
        "model": model.name, "threads": threads, "tokens": args.tokens, "repeats": args.repeats,
        "daemon_decode_tps": d_tps, "in_process_decode_tps": l_tps,
        "daemon_ttft_ms": d_ttft, "in_process_ttft_ms": l_ttft, "ratio": ratio, "paired_ratio": paired,
    }
