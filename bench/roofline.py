"""Decode against this machine's memory-bandwidth roofline.

A single decode step reads every weight it uses once (batching would share that read: one stream
does not) plus the KV cache of the tokens it attends to. At one stream decode is bound by that
traffic, so

    achieved bytes/s = decode tokens/s x bytes read per decoded token

set against the DRAM read bandwidth the profiler measured on this machine says how close the
daemon gets to what the memory allows. Bytes per token come from the model's header: each
sub-layer's `bytes_read(1)` (the embedding reads one row, routed experts only the experts a token
picks, everything else all of its weights) plus, per layer, the F16 KV cache (the engine does not
set a KV type, so llama.cpp's F16 default) of the mean context over the decode.

    python bench/run.py roofline [--model PATH] [--repeats 3] [--quick]

Caches, not DRAM, hold a 135M model's hot pieces on some machines: a ratio above 1.0 means the
model is small enough to be served partly from cache, not a measurement error.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.common import spread

PROMPT = "Tell me a long story about a dragon who guards a library."
KV_TYPE = "F16"


@dataclass(frozen=True)
class TokenTraffic:
    """Bytes one decoded token reads: weights and KV cache, and the mean context it assumed."""

    weight_bytes: float
    kv_bytes: float
    mean_context: float

    @property
    def total(self) -> float:
        return self.weight_bytes + self.kv_bytes


def bytes_per_token(model_info, mean_context: float, kv_type: str = KV_TYPE) -> TokenTraffic:
    """What one decode step of one stream reads from memory, from the model's header."""
    from sidecar.model_info import sub_layers
    from sidecar.model_info.kv import kv_read_bytes

    weights = sum(u.bytes_read(1) for u in sub_layers(model_info))
    kv = sum(kv_read_bytes(model_info, layer, int(round(mean_context)), kv_type) for layer in range(model_info.n_layer))
    return TokenTraffic(weights, kv, mean_context)


def roofline_ratio(tokens_per_s: float, traffic: TokenTraffic, dram_gbps: float) -> tuple[float, float]:
    """(achieved GB/s, achieved over measured DRAM bandwidth)."""
    achieved = tokens_per_s * traffic.total / 1e9
    return achieved, achieved / dram_gbps


def measured_dram_gbps(profile: Path | None) -> tuple[float, str]:
    """This machine's measured DRAM read bandwidth (GB/s) and where it came from."""
    from sidecar.planner.hardware_model import hardware_from_profile
    from sidecar.profiler import default_profile_path, load_profile

    path = profile or default_profile_path()
    db = load_profile(path)
    return hardware_from_profile(db).cpu.dram_gbps, f"{path} ({db.mode} profile, {db.created_at})"


def decode_runs(model: Path, tokens: int, repeats: int) -> tuple[list[float], list[int]]:
    """Daemon decode tokens/s (its own timing, first token excluded) and prompt tokens, per run:
    one greedy stream of `tokens` tokens, a fresh opening line each run so no cache is reused."""
    from sidecar.api import pb
    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    rates, prompts = [], []
    daemon = start_daemon("--model", str(model))
    try:
        with daemon.client(timeout_s=600) as client:
            for i in range(-1, repeats):  # run -1 warms up
                req = pb.GenerateRequest(
                    messages=pb.ChatMessages(messages=[pb.ChatMessage(role="system", content=f"Story night {i}."),
                                                       pb.ChatMessage(role="user", content=PROMPT)]),
                    max_tokens=tokens if i >= 0 else 8,
                    sampling=pb.SamplingParams(temperature=0.0),
                )
                final = client.complete(req).final
                if i >= 0:
                    rates.append(final.timings.decode_tokens_per_s)
                    prompts.append(final.usage.prompt_tokens)
                    if final.usage.completion_tokens < tokens:
                        print(f"run {i}: the model stopped after {final.usage.completion_tokens} tokens")
    finally:
        stop_daemon(daemon)
    return rates, prompts


def run(model: Path | None = None, tokens: int = 128, repeats: int = 3, profile: Path | None = None) -> dict:
    from sidecar.model_info.default_model import default_model_path
    from sidecar.model_info import inspect_gguf

    model = model or default_model_path()
    info = inspect_gguf(model)
    dram, source = measured_dram_gbps(profile)
    print(f"\n== decode against the memory roofline: {info.describe()}, one stream, greedy, {tokens} tokens, "
          f"{repeats} repeats ==")
    rates, prompts = decode_runs(model, tokens, repeats)
    # The context a decode step sees grows from the prompt to prompt + tokens - 1.
    traffic = bytes_per_token(info, statistics.median(prompts) + (tokens - 1) / 2)
    per_run = [roofline_ratio(r, traffic, dram) for r in rates]
    achieved = [a for a, _ in per_run]
    ratios = [x for _, x in per_run]

    print(f"bytes read per token        {traffic.total / 1e6:8.1f} MB  (weights {traffic.weight_bytes / 1e6:.1f} MB, "
          f"KV {traffic.kv_bytes / 1e6:.2f} MB at a mean context of {traffic.mean_context:.0f} tokens, {KV_TYPE})")
    print(f"decode (daemon)             {spread(rates, '8.1f')} tok/s")
    print(f"achieved                    {spread(achieved, '8.2f')} GB/s")
    print(f"measured DRAM read          {dram:8.2f} GB/s  (from {source})")
    print(f"achieved / DRAM             {spread(ratios, '8.2f')}")
    return {
        "model": model.name, "model_describe": info.describe(), "tokens": tokens, "kv_type": KV_TYPE,
        "decode_tokens_per_s": rates, "prompt_tokens": prompts, "traffic": asdict(traffic) | {"total": traffic.total},
        "achieved_gbps": achieved, "dram_gbps": dram, "dram_source": source, "ratio": ratios,
    }


def scenario(args: argparse.Namespace) -> dict:
    try:
        return run(args.model_path, tokens=32 if args.quick else 128, repeats=args.repeats)
    except FileNotFoundError as e:
        raise RuntimeError(f"no profile of this machine ({e}): run `xlm-sidecar profile --quick` first") from e
