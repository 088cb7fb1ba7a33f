"""How well does the planner predict, and how good are its choices? (issue 4's measures)

On this machine, with SmolLM2-135M and its MoE variant, real llama.cpp forward passes are timed
for several token tiers, thread counts and micro-batch sizes, and set against the cost model:

  fidelity          predicted vs measured ms per pass, per (model, tier, threads, micro-batch),
                    and the median absolute error. Target: <= 15%.
  decision quality  per tier, the measured time of the knobs the schedule chose (threads,
                    micro-batch) against the best measured in an exhaustive sweep of those
                    knobs. Target: within 5% of the best.

Tiers: decode of 1 token, batched decode of 4 and 16 sequences (one new token each, in one
multi-sequence llama_batch, every sequence with --context tokens cached), and prompt chunks of
64 and 512 tokens from an empty cache. The model is loaded once, with one context per
micro-batch size; every configuration runs a short burst of back-to-back passes per round (the
first discarded, as a tier's passes follow each other in service) and rounds repeat, so load
from other processes falls on all configurations alike; each point is the median over rounds.
The share of the CPUs other processes took is printed: on a shared machine it, not the model,
dominates the error. --fresh-profile profiles first (quick plan) so the profile and the
measurements see the same conditions.

    python bench/run.py planner [--repeats 3] [--context 64] [--models smollm2,smollm2_moe]
                                [--profile PATH | --fresh-profile]

(rounds: --repeats, at least 3; the scenario then runs budget_sweep.py's measures)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

DECODE_TIERS = (1, 4, 16)
PREFILL_TIERS = (64, 512)
UBATCH_SWEEP = (64, 128, 256, 512)
# Measured passes per configuration per round (after one discarded pass).
BURST = {"decode": 3, "prefill": 1}


@dataclass(frozen=True)
class Config:
    """One measured configuration: a pass of `tokens` tokens in `phase` with these knobs."""

    phase: str
    tokens: int
    threads: int
    n_ubatch: int


@dataclass(frozen=True)
class Point:
    model: str
    config: Config
    measured_ms: float
    predicted_ms: float

    @property
    def error(self) -> float:
        return (self.predicted_ms - self.measured_ms) / self.measured_ms


class Bench:
    """One model loaded once (CPU only), with a context per micro-batch size."""

    def __init__(self, path: Path, ubatches: tuple[int, ...], n_seq: int, context: int, flash_attn: bool) -> None:
        import llama_cpp

        from sidecar.profiler.llama_runtime import ensure_backend

        ensure_backend()
        self.ll = llama_cpp
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"cannot load {path}")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.contexts = {}
        self.n_seq, self.context = n_seq, context
        n_batch = max(512, max(ubatches))
        # The last context serves decode passes only: prompt passes clear their own caches.
        # Decode uses one KV stream per sequence (kv_unified off), so each sequence attends to
        # its own cache only: in a unified cache every pass attends over every sequence's
        # cells (masked), which costs a 1-token decode 16 times the cache reads here.
        for key, ub in [(ub, ub) for ub in ubatches] + [("decode", max(ubatches))]:
            cp = llama_cpp.llama_context_default_params()
            decode = key == "decode"
            cp.n_ctx = n_seq * max(256, context + 8) if decode else max(2048, n_batch)
            cp.n_batch = n_batch
            cp.n_ubatch = ub
            cp.n_seq_max = n_seq if decode else 1
            cp.kv_unified = False
            cp.flash_attn_type = 1 if flash_attn else 0
            ctx = llama_cpp.llama_init_from_model(self.model, cp)
            if not ctx:
                raise RuntimeError(f"cannot create a context with n_ubatch {ub}")
            self.contexts[key] = ctx
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, n_seq)
        self._prepare_decode()

    def close(self) -> None:
        self.ll.llama_batch_free(self.batch)
        for ctx in self.contexts.values():
            self.ll.llama_free(ctx)
        self.ll.llama_model_free(self.model)

    def _token(self, i: int) -> int:
        return 100 + (i * 7919) % (self.n_vocab - 200)

    def _fill(self, items: list[tuple[int, int, int, bool]]) -> None:
        b = self.batch
        for i, (tok, pos, seq, logits) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, 1 if logits else 0
            b.seq_id[i][0] = seq
        b.n_tokens = len(items)

    def _decode(self, ctx) -> float:
        start = time.perf_counter()
        rc = self.ll.llama_decode(ctx, self.batch)
        self.ll.llama_synchronize(ctx)
        elapsed = time.perf_counter() - start
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        return elapsed

    def _prepare_decode(self) -> None:
        # Every sequence gets `context` cached tokens once; decode steps remove what they add.
        ctx = self.contexts["decode"]
        self.ll.llama_memory_clear(self.ll.llama_get_memory(ctx), True)
        for s in range(self.n_seq):
            self._fill([(self._token(s * 1000 + p), p, s, p == self.context - 1) for p in range(self.context)])
            self._decode(ctx)

    def run(self, c: Config) -> float:
        """Seconds of one pass of configuration `c`."""
        if c.phase == "decode":
            ctx = self.contexts["decode"]
            self.ll.llama_set_n_threads(ctx, c.threads, c.threads)
            self._fill([(self._token(9000 + s), self.context, s, True) for s in range(c.tokens)])
            elapsed = self._decode(ctx)
            mem = self.ll.llama_get_memory(ctx)
            for s in range(c.tokens):
                self.ll.llama_memory_seq_rm(mem, s, self.context, -1)
            return elapsed
        ctx = self.contexts[c.n_ubatch]
        self.ll.llama_set_n_threads(ctx, c.threads, c.threads)
        self.ll.llama_memory_clear(self.ll.llama_get_memory(ctx), True)
        self._fill([(self._token(p), p, 0, p == c.tokens - 1) for p in range(c.tokens)])
        return self._decode(ctx)


def configs(threads: tuple[int, ...]) -> list[Config]:
    """The exhaustive sweep of the knobs a schedule sets on this machine."""
    found = [Config("decode", t, th, max(UBATCH_SWEEP)) for t in DECODE_TIERS for th in threads]
    for tokens in PREFILL_TIERS:
        # A chunk no larger than the smallest micro-batch runs as one pass whatever n_ubatch is.
        ubs = [ub for ub in UBATCH_SWEEP if ub < tokens] + [min(ub for ub in UBATCH_SWEEP if ub >= tokens)]
        found += [Config("prefill", tokens, th, ub) for th in threads for ub in ubs]
    return found


def wait_for_quiet(limit: float, max_wait_s: float) -> float:
    """Wait until other processes use less than `limit` of the CPUs (sampled over a second),
    at most `max_wait_s`; returns the last share seen."""
    from sidecar.profiler.machine_load import others_busy_now

    deadline = time.monotonic() + max_wait_s
    share = others_busy_now(1.0)
    while share >= limit and time.monotonic() < deadline:
        time.sleep(2.0)
        share = others_busy_now(1.0)
    return share


def measure(bench: Bench, sweep: list[Config], rounds: int, quiet: float,
            max_wait_s: float) -> tuple[dict[Config, float], list[float]]:
    """Median ms per configuration over interleaved rounds, and the CPU share others took in
    each round. Each round waits for a quiet machine first (up to `max_wait_s`); rounds that
    still overlapped other work are dropped when at least three quiet ones remain."""
    from sidecar.profiler.machine_load import OtherLoadMeter

    for c in sweep:  # warm-up: pages weights in, starts each thread pool size
        bench.run(c)
    per_round: list[tuple[float, dict[Config, float]]] = []
    for r in range(rounds):
        wait_for_quiet(quiet, max_wait_s)
        meter = OtherLoadMeter()
        order = sweep if r % 2 == 0 else list(reversed(sweep))
        times = {}
        for c in order:
            # A burst of back-to-back passes, the first discarded: a tier's passes follow one
            # another in service, so caches and the thread pool are as warm as they are there.
            bench.run(c)
            times[c] = statistics.median(bench.run(c) for _ in range(BURST[c.phase]))
        per_round.append((meter.share(), times))
    quiet_rounds = [t for share, t in per_round if share < quiet]
    kept = quiet_rounds if len(quiet_rounds) >= 3 else [t for _, t in per_round]
    medians = {c: statistics.median(t[c] for t in kept) * 1e3 for c in sweep}
    return medians, [share for share, _ in per_round]


def predict(model_info, hw, c: Config, context: int, kv_type: str) -> float:
    """The cost model's ms for one configuration: every unit on the CPU, as on this machine."""
    from sidecar.model_info import sub_layers
    from sidecar.planner.cost_model import ON_CPU, FiguresMemo, PassShape, pass_cost
    from sidecar.planner.search import prompt_passes

    units = sub_layers(model_info)
    where = tuple(ON_CPU for _ in units)
    shapes = [PassShape.decode(c.tokens, context)] if c.phase == "decode" else list(prompt_passes(c.tokens, c.n_ubatch))
    memo = FiguresMemo()
    return 1e3 * sum(pass_cost(hw, model_info, units, where, frozenset(), s, c.threads, kv_type, memo=memo).seconds
                     for s in shapes)


def model_paths(names: list[str], workdir: Path) -> dict[str, Path]:
    from sidecar.model_info.default_model import default_model_path
    from sidecar.testmodels import write_smollm2_moe

    paths = {}
    for name in names:
        if name == "smollm2":
            paths[name] = default_model_path()
        elif name == "smollm2_moe":
            target = workdir / "smollm2_moe.gguf"
            if not target.exists():
                write_smollm2_moe(target)
            paths[name] = target
        else:
            raise SystemExit(f"unknown model {name!r}: smollm2, smollm2_moe")
    return paths


def load_hw(args: argparse.Namespace):
    from sidecar.planner.hardware_model import hardware_from_profile
    from sidecar.profiler import default_profile_path, load_profile

    if args.fresh_profile:
        from sidecar.profiler import QUICK_PLAN, run_profile, save_profile

        print("profiling first (quick plan), so profile and measurements share conditions ...", flush=True)
        wait_for_quiet(args.quiet, args.max_wait * 5)
        db = run_profile(QUICK_PLAN)
        path = save_profile(db, args.workdir / "fresh-profile.json")
        return hardware_from_profile(db), path, db
    path = args.profile or default_profile_path()
    db = load_profile(path)
    return hardware_from_profile(db), path, db


def options(group) -> None:
    group.add_argument("--models", default=None, help="smollm2, smollm2_moe (default both; smollm2 with --quick)")
    group.add_argument("--context", type=int, default=64, help="cached tokens per sequence in decode passes")
    group.add_argument("--profile", type=Path, help="profile file (default: this machine's)")
    group.add_argument("--fresh-profile", action="store_true", help="profile this machine first (quick)")
    group.add_argument("--quiet", type=float, default=0.1,
                       help="a round counts as quiet when other processes use less than this CPU share")
    group.add_argument("--max-wait", type=float, default=None,
                       help="seconds to wait for quiet before a round (default 60; 5 with --quick)")
    group.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "xlm-planner-bench")


def scenario(args: argparse.Namespace) -> dict:
    """Fidelity and decision quality over max(3, --repeats) rounds, then the budget sweep."""
    from bench import budget_sweep

    args.models = args.models or ("smollm2" if args.quick else "smollm2,smollm2_moe")
    args.max_wait = args.max_wait if args.max_wait is not None else 5.0 if args.quick else 60.0
    args.rounds = max(3, args.repeats)
    fidelity = measure_fidelity(args)
    sweep = budget_sweep.run(args.model_path, tokens=32 if args.quick else 64, repeats=args.repeats)
    return {"fidelity": fidelity, "budget_sweep": sweep}


def measure_fidelity(args: argparse.Namespace) -> dict:
    """Prints the fidelity and decision-quality tables; returns every point and decision."""
    from sidecar.budget import Budget
    from sidecar.model_info import inspect_gguf
    from sidecar.planner import PlanOptions, plan
    from sidecar.profiler.llama_runtime import quiet_llama_logs

    args.workdir.mkdir(parents=True, exist_ok=True)
    try:
        hw, profile_path, db = load_hw(args)
    except FileNotFoundError as exc:
        raise RuntimeError(f"no profile ({exc}): run `python -m sidecar.profiler profile --quick` or pass --fresh-profile") from exc
    cores = os.cpu_count() or 1
    threads = tuple(sorted({1, cores}))
    contention = getattr(db, "contention", None)
    print(f"hardware: {hw.describe()}")
    print(f"profile:  {profile_path} ({db.mode}, {db.created_at}"
          + (f", other processes used {contention:.0%} of the CPUs while it ran)" if contention is not None else ")"))
    print(f"load average at start: {os.getloadavg()[0]:.2f}")

    points: list[Point] = []
    decisions: list[dict] = []
    shares: dict[str, float] = {}
    for name, path in model_paths(args.models.split(","), args.workdir).items():
        info = inspect_gguf(path)
        options = PlanOptions(decode_tiers=DECODE_TIERS, prefill_tiers=PREFILL_TIERS, n_batch=512,
                              micro_batches=UBATCH_SWEEP, reference_context=args.context)
        schedule = plan(info, hw, Budget(0, max_cpu_threads=cores), ctx=4096, options=options)
        sweep = configs(threads)
        started = time.monotonic()
        with quiet_llama_logs():
            bench = Bench(path, UBATCH_SWEEP, max(DECODE_TIERS), args.context, schedule.flash_attention)
            try:
                measured, round_shares = measure(bench, sweep, args.rounds, args.quiet, args.max_wait)
            finally:
                bench.close()
        shares[name] = round_shares
        quiet_rounds = sum(s < args.quiet for s in round_shares)
        print(f"\n{name}: {info.describe()}: {len(sweep)} configurations x {args.rounds} rounds in "
              f"{time.monotonic() - started:.0f} s; other processes' CPU share per round: "
              + ", ".join(f"{s:.0%}" for s in round_shares)
              + f" ({quiet_rounds} under {args.quiet:.0%}"
              + ("; all rounds kept" if quiet_rounds < 3 else "; only those kept") + ")")
        for c, ms in measured.items():
            context = args.context if c.phase == "decode" else 0
            points.append(Point(name, c, ms, predict(info, hw, c, context, schedule.kv_type)))
        for tier in schedule.tiers:
            tier_configs = [c for c in sweep if (c.phase, c.tokens) == (tier.phase, tier.max_tokens)]
            chosen_ub = schedule.micro_batch if tier.phase == "prefill" else max(UBATCH_SWEEP)
            chosen = next((c for c in tier_configs if c.threads == tier.threads and
                           (c.n_ubatch == chosen_ub or c.n_ubatch >= tier.max_tokens and chosen_ub >= tier.max_tokens)),
                          None)
            if chosen is None:
                continue
            best = min(tier_configs, key=measured.__getitem__)
            decisions.append({
                "model": name, "tier": f"{tier.phase} {tier.max_tokens}",
                "chosen": f"t{chosen.threads} ub{chosen.n_ubatch}", "chosen_ms": measured[chosen],
                "best": f"t{best.threads} ub{best.n_ubatch}", "best_ms": measured[best],
                "loss": measured[chosen] / measured[best] - 1.0,
            })

    print("\nFidelity: predicted vs measured ms per pass (CPU only)")
    print(f"{'model':12s} {'pass':13s} {'thr':>3s} {'ubatch':>6s} {'measured':>9s} {'predicted':>9s} {'error':>7s}")
    for p in points:
        c = p.config
        print(f"{p.model:12s} {c.phase + ' ' + str(c.tokens):13s} {c.threads:3d} {c.n_ubatch:6d} "
              f"{p.measured_ms:9.2f} {p.predicted_ms:9.2f} {p.error:+7.1%}")
    mae = statistics.median(abs(p.error) for p in points)
    print(f"median absolute error: {mae:.1%} over {len(points)} points (target <= 15%)")
    for t in threads:
        sub = [abs(p.error) for p in points if p.config.threads == t]
        print(f"  with {t} thread(s): median absolute error {statistics.median(sub):.1%} over {len(sub)} points")

    print("\nDecision quality: the schedule's knobs against the best of an exhaustive sweep")
    print(f"{'model':12s} {'tier':13s} {'chosen':>10s} {'ms':>9s} {'best':>10s} {'ms':>9s} {'loss':>6s}")
    for d in decisions:
        print(f"{d['model']:12s} {d['tier']:13s} {d['chosen']:>10s} {d['chosen_ms']:9.2f} {d['best']:>10s} "
              f"{d['best_ms']:9.2f} {d['loss']:6.1%}")
    worst = max((d["loss"] for d in decisions), default=0.0)
    within = sum(d["loss"] <= 0.05 for d in decisions)
    print(f"within 5% of the best: {within} of {len(decisions)} tiers; worst loss {worst:.1%}, "
          f"median {statistics.median(d['loss'] for d in decisions):.1%}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return {
        "profile": str(profile_path), "other_cpu_share": shares,
        "points": [{"model": p.model, **asdict(p.config), "measured_ms": p.measured_ms,
                    "predicted_ms": p.predicted_ms, "error": p.error} for p in points],
        "decisions": decisions, "median_abs_error": mae, "worst_decision_loss": worst,
    }
