"""What the install-phase profile costs and how well it predicts (issue 3's measures).

In one run, on this machine:
  1. a quick profile and a full profile from an empty probe cache (cold), then a second full
     profile reusing the first one's probe files (warm): wall times and database sizes;
  2. the spread between the two full profiles: per kernel entry the ratio of the two
     measured times (>= 1, slower over faster), its median, 90th percentile and worst entry;
  3. SmolLM2-135M-Instruct Q4_1 decode tokens/s at each thread count three ways:
       predicted  from the second full profile (and, column "quick", from the quick one):
                  each sub-layer's weight bytes over the profiled batch-1 weight stream
                  rate of its type (nearest shape), plus the output projection the same
                  way, plus the profiled per-layer and per-pass overheads;
       roofline   bytes read per token / profiled DRAM read bandwidth;
       measured   llama-cpp-python, greedy, same thread count, flash attention on as in
                  the probes, llama.cpp's own eval timer (prompt excluded).

    python bench/run.py profile-cost [--out DIR] [--reuse] [--tokens 128] [--skip-full]

--out keeps the profiles (default: a temporary folder); --reuse takes profiles already in
--out (quick.json, full-1.json, full-2.json) instead of measuring them again (times then
come from the files). Every figure is printed with the CPU share other processes took
meanwhile: on a busy machine the numbers mean little (see sidecar/profiler/machine_load.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from sidecar.profiler.database import ProfileDB, load_profile, save_profile
from sidecar.profiler.machine_load import OtherLoadMeter
from sidecar.profiler.plan import (
    FULL_PLAN,
    OP_ATTENTION,
    OP_FFN,
    OP_GRAPH_OVERHEAD,
    OP_LAYER_OVERHEAD,
    QUICK_PLAN,
)

KERNEL_OPS = ("attn_qkvo", "ffn", "moe_experts")


# ------------------------------------------------------------------ profiles


class StepClock:
    """A progress reporter that only remembers how long each step took."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, float]] = []
        self._label, self._since = "", 0.0

    def start(self, total: int, title: str) -> None:
        self._since = time.monotonic()

    def step(self, label: str) -> None:
        self._close()
        self._label = label

    def finish(self) -> None:
        self._close()

    def _close(self) -> None:
        now = time.monotonic()
        if self._label:
            self.steps.append((self._label, now - self._since))
        self._since = now

    def by_family(self) -> dict[str, float]:
        """Seconds per probe family ("small", "large", ...; "memory" for bandwidths)."""
        totals: dict[str, float] = defaultdict(float)
        for label, seconds in self.steps:
            totals[label.split()[0]] += seconds
        return dict(totals)


def profile_once(plan, out: Path, cache_dir: Path) -> tuple[ProfileDB, float, int, dict]:
    from sidecar.profiler.runner import run_profile

    clock = StepClock()
    start = time.monotonic()
    db = run_profile(plan, cache_dir=cache_dir, progress=clock)
    wall = time.monotonic() - start
    save_profile(db, out)
    return db, wall, out.stat().st_size, clock.by_family()


def get_profiles(out_dir: Path, reuse: bool, skip_full: bool) -> dict[str, tuple]:
    wanted = [("quick", QUICK_PLAN, "cold-q")]
    if not skip_full:
        wanted += [("full-1", FULL_PLAN, "cold-f"), ("full-2", FULL_PLAN, "cold-f")]
    results = {}
    for name, plan, cache in wanted:
        path = out_dir / f"{name}.json"
        if reuse and path.exists():
            db = load_profile(path)
            results[name] = (db, db.duration_s, path.stat().st_size, {})
            continue
        print(f"measuring {name} profile ...", file=sys.stderr, flush=True)
        # "quick" and "full-1" start from empty probe caches; "full-2" reuses full-1's.
        results[name] = profile_once(plan, path, out_dir / "probes" / cache)
    return results


def profiles_apart(a: ProfileDB, b: ProfileDB) -> tuple[float, float, float, str, int]:
    """(median, 90th percentile, worst ratio, worst entry, entries compared) over kernel entries."""
    def key(e):
        return (e.device, e.op, e.shape, e.weight_type, e.batch, e.threads, e.condition)

    first = {key(e): e for e in a.entries if e.op in KERNEL_OPS}
    ratios = []
    for e in b.entries:
        other = first.get(key(e))
        if other is not None and other.seconds > 0 and e.seconds > 0:
            r = max(e.seconds, other.seconds) / min(e.seconds, other.seconds)
            ratios.append((r, key(e)))
    worst = max(ratios)
    label = "{} {} {} {} b{} t{}".format(*worst[1][:6])
    values = sorted(r for r, _ in ratios)
    p90 = values[int(0.9 * (len(values) - 1))]
    return statistics.median(values), p90, worst[0], label, len(ratios)


# ------------------------------------------------------------------ SmolLM2


def model_inventory(path: Path) -> dict:
    """Per-token weight bytes of a llama-arch GGUF, grouped the way the profile measures."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"]
    arch_name = bytes(arch.parts[arch.data[0]]).decode()
    n_embd_field = reader.fields[f"{arch_name}.embedding_length"]
    layers: dict[str, dict[str, int]] = {OP_ATTENTION: defaultdict(int), OP_FFN: defaultdict(int)}
    names = {t.name for t in reader.tensors}
    output_bytes, output_type = 0, ""
    for t in reader.tensors:
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else t.name
        if kind.startswith("attn_") and kind != "attn_norm":
            layers[OP_ATTENTION][t.tensor_type.name] += t.n_bytes
        elif kind.startswith("ffn_") and kind != "ffn_norm":
            layers[OP_FFN][t.tensor_type.name] += t.n_bytes
        elif t.name == "output.weight" or (t.name == "token_embd.weight" and "output.weight" not in names):
            # A tied embedding is read whole by the output projection every token.
            output_bytes, output_type = t.n_bytes, t.tensor_type.name
    n_layer = 1 + max(int(t.name.split(".")[1]) for t in reader.tensors if t.name.startswith("blk."))
    return {
        "n_embd": int(n_embd_field.parts[n_embd_field.data[0]][0]),
        "n_layer": n_layer,
        "layers": layers,
        "output": (output_type, output_bytes),
        "bytes_per_token": sum(sum(v.values()) for v in layers.values()) + output_bytes,
    }


def nearest_shape(db: ProfileDB, n_embd: int) -> str:
    dense = [s for s in db.shapes if not s.n_expert]
    return min(dense, key=lambda s: abs(s.n_embd - n_embd)).name


def predicted_tokens_per_s(db: ProfileDB, inv: dict, threads: int) -> tuple[float, dict]:
    """Decode tokens/s the profile predicts, and the time split (seconds per token)."""
    shape = nearest_shape(db, inv["n_embd"])
    parts = defaultdict(float)

    def stream_seconds(op: str, wtype: str, nbytes: int) -> float:
        entry = db.kernel(op, wtype, 1, threads, shape=shape)
        if entry is None:
            raise SystemExit(f"profile has no {op} {wtype} entry: cannot predict")
        return nbytes / (entry.weight_gbps * 1e9)

    for op, by_type in inv["layers"].items():
        for wtype, nbytes in by_type.items():  # bytes of all layers together
            parts[op] += stream_seconds(op, wtype, nbytes)
    out_type, out_bytes = inv["output"]
    parts["output"] = stream_seconds(OP_FFN, out_type, out_bytes)
    layer = db.kernel(OP_LAYER_OVERHEAD, "", 1, threads, shape=shape)
    graph = db.kernel(OP_GRAPH_OVERHEAD, "", 1, threads, shape=shape)
    parts["overhead"] = inv["n_layer"] * (layer.seconds if layer else 0.0) + (graph.seconds if graph else 0.0)
    total = sum(parts.values())
    return 1.0 / total, dict(parts)


def measured_tokens_per_s(path: Path, threads: int, n_tokens: int) -> float:
    """Greedy decode rate from llama.cpp's own eval timer (prompt processing excluded)."""
    import llama_cpp
    from llama_cpp import Llama

    # flash_attn=True: the profile's probes run with llama.cpp's default ("auto"), which on
    # the CPU means on; llama-cpp-python's own default is off.
    llm = Llama(model_path=str(path), n_ctx=512, n_threads=threads, n_threads_batch=threads,
                n_gpu_layers=0, flash_attn=True, verbose=False, seed=0)
    prompt = "Write a long story about a lighthouse keeper and the sea."
    eos = llm.token_eos()
    # Warm-up pass so page faults and thread start-up are not timed.
    llm.create_completion(prompt, max_tokens=8, temperature=0.0)
    llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
    llm.create_completion(prompt, max_tokens=n_tokens, temperature=0.0,
                          logit_bias={eos: -100.0})  # fixed length: no early stop
    perf = llama_cpp.llama_perf_context(llm._ctx.ctx)
    llm.close()
    return perf.n_eval / (perf.t_eval_ms / 1e3)


# ------------------------------------------------------------------ report


def options(group) -> None:
    group.add_argument("--out", type=Path, help="keep profiles here (default: temporary)")
    group.add_argument("--reuse", action="store_true", help="use profiles already in --out")
    group.add_argument("--skip-full", action="store_true", help="quick profile only (no spread; so does --quick)")
    group.add_argument("--tokens", type=int, default=None, help="tokens generated per measurement (default 128; 32 with --quick)")


def scenario(args: argparse.Namespace) -> dict:
    """Prints the three tables; returns their figures."""
    from sidecar.model_info.default_model import default_model_path

    args.skip_full = args.skip_full or args.quick
    args.tokens = args.tokens or (32 if args.quick else 128)
    figures: dict = {"profiles": {}, "decode": []}

    with tempfile.TemporaryDirectory(prefix="profile-report-") as tmp:
        out_dir = args.out or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        profiles = get_profiles(out_dir, args.reuse, args.skip_full)

        print("\n== profile cost ==")
        print(f"{'profile':8} {'wall s':>8} {'size KB':>8} {'entries':>8} {'others CPU':>10}  seconds by family")
        for name, (db, wall, size, families) in profiles.items():
            split = ", ".join(f"{k} {v:.0f}" for k, v in families.items())
            print(f"{name:8} {wall:8.1f} {size / 1024:8.1f} {len(db.entries):8d} {db.contention:10.0%}  {split}")
            figures["profiles"][name] = {"wall_s": wall, "bytes": size, "entries": len(db.entries),
                                         "others_cpu": db.contention, "seconds_by_family": families}
        print("(quick and full-1 start from an empty probe cache; full-2 reuses full-1's probes)")

        if "full-2" in profiles:
            med, p90, worst, label, n = profiles_apart(profiles["full-1"][0], profiles["full-2"][0])
            print("\n== spread between the two full profiles ==")
            print(f"{n} kernel entries; ratio slower/faster: median {med:.3f}, 90th percentile "
                  f"{p90:.3f}, worst {worst:.2f} ({label})")
            figures["apart"] = {"entries": n, "median": med, "p90": p90, "worst": worst, "worst_entry": label}

        reference = profiles.get("full-2", profiles["quick"])[0]
        model = default_model_path()
        inv = model_inventory(model)
        dram = reference.dram_read_gbps()
        print(f"\n== SmolLM2-135M-Instruct Q4_1 decode (profile: {'full-2' if 'full-2' in profiles else 'quick'}) ==")
        print(f"weights read per token: {inv['bytes_per_token'] / 1e6:.1f} MB "
              f"({inv['n_layer']} layers + {inv['output'][0]} output); DRAM read {dram:.1f} GB/s")
        print(f"{'threads':>7} {'predicted':>10} {'quick':>7} {'roofline':>9} {'measured':>9} {'pred/meas':>9} "
              f"{'others':>7}  predicted split (ms/token)")
        for threads in sorted({e.threads for e in reference.entries if e.device == "cpu"}):
            predicted, parts = predicted_tokens_per_s(reference, inv, threads)
            from_quick, _ = predicted_tokens_per_s(profiles["quick"][0], inv, threads)
            dram_t = reference.bandwidth("dram_read")
            by_threads = [b for b in reference.bandwidths if b.kind == "dram_read" and b.threads == threads]
            bw = by_threads[0].gbps if by_threads else (dram_t.gbps if dram_t else dram)
            roofline = bw * 1e9 / inv["bytes_per_token"]
            meter = OtherLoadMeter()
            measured = statistics.median(measured_tokens_per_s(model, threads, args.tokens) for _ in range(3))
            others = meter.share()
            split = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in parts.items())
            print(f"{threads:7d} {predicted:10.1f} {from_quick:7.1f} {roofline:9.1f} {measured:9.1f} {predicted / measured:9.2f} "
                  f"{others:7.0%}  {split}")
            figures["decode"].append({"threads": threads, "predicted": predicted, "from_quick": from_quick, "roofline": roofline,
                                      "measured": measured, "others_cpu": others, "predicted_split_s": parts})
        print("(tokens/s; quick: predicted from the quick profile; measured: median of 3 runs; others: CPU share other processes used "
              "meanwhile; roofline: the DRAM read figure measured at that thread count)")
    return figures
