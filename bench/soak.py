"""Soak: many streams through the real daemon for minutes, with budget changes and cancels.

16 streams (threads of one client) send greedy chat requests back to back for --duration seconds
(default 300) while the budget changes every 10 s (alternating VRAM sizes and thread caps) and
about 10% of requests are cancelled at a random point. Before the soak, each prompt's reply is
generated once at the longest length used (the reference). It checks:

  no stream dropped     every request ends with a final chunk, or is one the soak cancelled
  no token lost/duped   a completed request's token ids equal its prompt's reference cut at its
                        max_tokens; a cancelled one's are a prefix of it; every final's
                        completion_tokens equals the token ids streamed
  memory                the daemon's resident memory at the end is < 5% above after warm-up
  latency               p99 client-side gap between two chunks of one stream is under --max-gap-s

and prints its figures; the exit code is 1 when a check fails. Not part of the test suite.

    python bench/run.py soak [--duration 300] [--streams 16]       (--quick: 30 s, a quick look)

Without a GPU a budget change moves no weights (everything is on the CPU already), so SetBudget
changes the thread cap and answers reloaded=false. With --device the daemon places onto a GPU-type
ggml device that runs on this machine's CPU (ggml's RPC backend in a second process, the planner
handed a described GPU, as `bench/run.py churn --via device`): then every budget change moves
tensors and reloads for real.

    python bench/run.py soak --device [--duration 300]
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.common import ScenarioFailed, percentile

PROMPTS = [f"In a few sentences, tell me about a {a} {b}." for a in ("brave", "sly", "old", "young")
           for b in ("knight", "thief", "wizard", "merchant")]
MAX_TOKENS_CHOICES = (24, 48, 96)
# Budgets the soak cycles through: (VRAM size, thread cap).
BUDGETS = (("0", 1), ("512M", 2), ("1G", 1), ("0", 2))
# On the RPC device every one of these places differently: part of the attention, all of the
# model, attention and a few whole layers, nothing (the thread cap stays 1: see churn_device).
DEVICE_BUDGETS = (("24M", 1), ("4G", 1), ("96M", 1), ("0", 1))
RSS_LIMIT = 0.05
SEED = 1234


# -- checks (pure: unit-tested in tests/tools/test_bench_tools.py) -------------------------------------------


def expected_tokens(reference: list[int], max_tokens: int) -> list[int]:
    """What a greedy request with `max_tokens` must produce: the reference (made with the longest
    max_tokens) cut there. A reference that stopped earlier is whole."""
    return reference[:max_tokens]


def token_problem(reference: list[int], got: list[int], max_tokens: int, completed: bool) -> str | None:
    """None when `got` is right, else what went wrong and where: a token lost (the rest shifted
    back by one), duplicated (shifted forward), a different token, or a reply cut short/too long."""
    want = expected_tokens(reference, max_tokens)
    if completed and got == want or not completed and got == want[: len(got)]:
        return None
    i = next((k for k in range(min(len(want), len(got))) if want[k] != got[k]), min(len(want), len(got)))
    if i == len(got) and completed:
        return f"reply ended after {len(got)} of {len(want)} tokens"
    if i == len(want):
        return f"{len(got) - len(want)} token(s) past the expected {len(want)}"
    window = 4
    if got[i:i + window] == want[i + 1:i + 1 + window] and len(got) > i:
        return f"token lost at {i}"
    if got[i + 1:i + 1 + window] == want[i:i + window] and len(got) > i + 1:
        return f"token duplicated at {i}"
    return f"different token at {i} (expected {want[i]}, got {got[i]})"


def rss_growth(baseline_bytes: int, end_bytes: int) -> float:
    """Relative growth of resident memory from `baseline_bytes`."""
    return (end_bytes - baseline_bytes) / baseline_bytes


@dataclass
class RequestRecord:
    """One request of the soak as the client saw it."""

    prompt: int
    max_tokens: int
    cancel_after: int | None  # cancel once this many tokens arrived (None: run to the end)
    tokens: list[int] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)
    gap_ends: list[float] = field(default_factory=list)  # perf_counter() when each gap ended
    finish: str = ""  # the final chunk's finish reason, "cancelled" (ours), or "" (none came)
    reported_tokens: int | None = None
    error: str = ""


def request_problems(record: RequestRecord, reference: list[int]) -> list[str]:
    """Everything wrong with one request (empty when it is right)."""
    problems = []
    if record.error:
        problems.append(f"failed: {record.error}")
    elif record.finish == "cancelled":
        if record.cancel_after is None:
            problems.append("cancelled without the soak asking")
    elif not record.finish:
        problems.append("dropped: the stream ended without a final chunk")
    if record.reported_tokens is not None and record.reported_tokens != len(record.tokens):
        problems.append(f"final says {record.reported_tokens} tokens, {len(record.tokens)} streamed")
    if not record.error and record.finish:
        issue = token_problem(reference, record.tokens, record.max_tokens, completed=record.finish != "cancelled")
        if issue:
            problems.append(issue)
    return problems


@dataclass
class Verdict:
    """The soak's figures and whether each check passed."""

    requests: int
    completed: int
    cancelled: int
    failures: list[str]
    rss_baseline: int
    rss_end: int
    gap_p50_s: float
    gap_p99_s: float
    gap_max_s: float

    @property
    def ok(self) -> bool:
        return not self.failures


def evaluate(records: list[RequestRecord], references: list[list[int]], rss_baseline: int, rss_end: int,
             max_gap_s: float, rss_limit: float = RSS_LIMIT) -> Verdict:
    failures = []
    for n, record in enumerate(records):
        for problem in request_problems(record, references[record.prompt]):
            failures.append(f"request {n} (prompt {record.prompt}, max_tokens {record.max_tokens}): {problem}")
    gaps = [g for r in records for g in r.gaps_s]
    growth = rss_growth(rss_baseline, rss_end)
    if growth >= rss_limit:
        failures.append(f"resident memory grew {growth:+.1%} (limit {rss_limit:+.0%})")
    p99 = percentile(gaps, 99)
    if p99 > max_gap_s:
        failures.append(f"p99 gap between chunks {p99 * 1e3:.0f} ms (limit {max_gap_s * 1e3:.0f} ms)")
    if not records:
        failures.append("no request ran")
    return Verdict(
        requests=len(records),
        completed=sum(r.finish not in ("", "cancelled") and not r.error for r in records),
        cancelled=sum(r.finish == "cancelled" for r in records),
        failures=failures, rss_baseline=rss_baseline, rss_end=rss_end,
        gap_p50_s=percentile(gaps, 50), gap_p99_s=p99, gap_max_s=max(gaps, default=0.0),
    )


# -- driving the daemon ---------------------------------------------------------------------------------


def _request(prompt: int, max_tokens: int):
    from sidecar.api import pb

    return pb.GenerateRequest(
        messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=PROMPTS[prompt])]),
        max_tokens=max_tokens,
        sampling=pb.SamplingParams(temperature=0.0, seed=SEED),
    )


def run_request(client, record: RequestRecord) -> RequestRecord:
    """Stream one request into `record`, cancelling it where the record says."""
    import grpc

    from sidecar.api import pb

    stream = client.generate(_request(record.prompt, record.max_tokens))
    last = time.perf_counter()
    try:
        for chunk in stream:
            if chunk.token_ids:
                now = time.perf_counter()
                if record.tokens:
                    record.gaps_s.append(now - last)
                    record.gap_ends.append(now)
                last = now
                record.tokens.extend(chunk.token_ids)
            if chunk.HasField("final"):
                record.finish = pb.FinishReason.Name(chunk.final.finish_reason)
                record.reported_tokens = chunk.final.usage.completion_tokens
            if record.cancel_after is not None and len(record.tokens) >= record.cancel_after and not record.finish:
                record.finish = "cancelled"
                break
    except grpc.RpcError as e:
        record.error = f"{e.code().name}: {e.details()}"
    finally:
        stream.close()  # cancels the call when we broke out early
    return record


def references(client, streams: int) -> list[list[int]]:
    """Each prompt's greedy reply at the longest max_tokens, generated `streams` at a time."""
    out: list[list[int] | None] = [None] * len(PROMPTS)

    def one(i: int) -> None:
        record = run_request(client, RequestRecord(i, max(MAX_TOKENS_CHOICES), None))
        if record.error or not record.finish:
            raise RuntimeError(f"reference for prompt {i} failed: {record.error or 'no final chunk'}")
        out[i] = record.tokens

    for start in range(0, len(PROMPTS), streams):
        threads = [threading.Thread(target=one, args=(i,)) for i in range(start, min(start + streams, len(PROMPTS)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if any(r is None for r in out):
        raise RuntimeError("a reference request failed (see above)")
    return out  # type: ignore[return-value]


def gaps_during(records: list[RequestRecord], windows: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Gaps that overlapped one of the (start, end) windows, and the others."""
    inside, outside = [], []
    for r in records:
        for gap, end in zip(r.gaps_s, r.gap_ends):
            overlaps = any(end - gap < w_end and end > w_start for w_start, w_end in windows)
            (inside if overlaps else outside).append(gap)
    return inside, outside


@dataclass
class BudgetEvent:
    at_s: float
    vram: str
    threads: int
    reloaded: bool
    pause_ms: float
    call_ms: float
    error: str = ""


def change_budgets(client, stop: threading.Event, every_s: float, started: float, events: list[BudgetEvent],
                   budgets: tuple[tuple[str, int], ...] = BUDGETS) -> None:
    from sidecar.api import pb

    n = 0
    while not stop.wait(every_s):
        vram, threads = budgets[n % len(budgets)]
        n += 1
        t0 = time.perf_counter()
        try:
            r = client.set_budget(pb.SetBudgetRequest(vram_size=vram, max_cpu_threads=threads))
            events.append(BudgetEvent(t0 - started, vram, threads, r.reloaded, r.pause_ms, (time.perf_counter() - t0) * 1e3))
        except Exception as e:  # recorded; a refused budget fails the soak
            events.append(BudgetEvent(t0 - started, vram, threads, False, 0.0, 0.0, f"{type(e).__name__}: {e}"))


def soak(duration_s: float, n_streams: int, budget_every_s: float, cancel_share: float, max_gap_s: float,
         model: Path | None, device: bool = False) -> tuple[Verdict, dict]:
    if not device:
        return _soak(duration_s, n_streams, budget_every_s, cancel_share, max_gap_s, model, (), BUDGETS, None)
    from sidecar.native.ggml_rpc import STAND_IN_GPU_HARDWARE, RpcServerProcess

    with RpcServerProcess(threads=1) as server:
        extra = ("--rpc", server.endpoint, "--hardware", STAND_IN_GPU_HARDWARE, "--threads", "1", "--budget", "4G")
        # Memory is compared at the budget the baseline was taken at: on the device, where the KV
        # cache and weights live (and so the daemon's own resident memory) follows the budget.
        verdict, figures = _soak(duration_s, n_streams, budget_every_s, cancel_share, max_gap_s, model, extra,
                                 DEVICE_BUDGETS, "4G")
    reloads = [e for e in figures["budget_changes"] if e["reloaded"]]
    if len(reloads) < len(figures["budget_changes"]):
        verdict.failures.append(f"only {len(reloads)} of {len(figures['budget_changes'])} budget changes reloaded on the device")
    return verdict, figures | {"device": "RPC0", "reloads": len(reloads)}


def _soak(duration_s: float, n_streams: int, budget_every_s: float, cancel_share: float, max_gap_s: float,
          model: Path | None, extra: tuple[str, ...], budgets: tuple[tuple[str, int], ...],
          final_budget: str | None) -> tuple[Verdict, dict]:
    import psutil

    from sidecar.lifecycle.daemon_process import start_daemon, stop_daemon

    args = ["--parallel", str(n_streams), "--ctx", "512", "--stream-interval-ms", "0", *extra]
    if model:
        args = ["--model", str(model), *args]
    daemon = start_daemon(*args)
    proc = psutil.Process(daemon.process.pid)
    try:
        with daemon.client(timeout_s=300) as client:
            t0 = time.perf_counter()
            refs = references(client, n_streams)
            # Warm-up: every sequence filled to the longest reply once more, so the KV pages all
            # streams will touch are resident before the baseline is taken.
            warm = references(client, n_streams)
            print(f"references and warm-up: {len(refs)} prompts x2 in {time.perf_counter() - t0:.0f} s; "
                  f"warm-up replies {'equal' if warm == refs else 'DIFFER from'} the references")
            rss_baseline = proc.memory_info().rss

            records: list[RequestRecord] = []
            lock = threading.Lock()
            budget_events: list[BudgetEvent] = []
            stop = threading.Event()
            started = time.perf_counter()
            deadline = started + duration_s

            def stream_loop(worker: int) -> None:
                rng = random.Random(SEED + worker)
                while time.perf_counter() < deadline:
                    max_tokens = rng.choice(MAX_TOKENS_CHOICES)
                    cancel = rng.randint(1, max_tokens - 1) if rng.random() < cancel_share else None
                    record = run_request(client, RequestRecord(rng.randrange(len(PROMPTS)), max_tokens, cancel))
                    with lock:
                        records.append(record)

            changer = threading.Thread(target=change_budgets,
                                       args=(client, stop, budget_every_s, started, budget_events, budgets))
            workers = [threading.Thread(target=stream_loop, args=(w,), daemon=True) for w in range(n_streams)]
            changer.start()
            for w in workers:
                w.start()
            hung = 0
            for w in workers:
                # A request is at most 96 tokens: far less than this unless a stream hangs.
                w.join(max(1.0, deadline + 120 - time.perf_counter()))
                hung += w.is_alive()
            stop.set()
            changer.join()
            elapsed = time.perf_counter() - started
            if final_budget is not None:
                from sidecar.api import pb

                client.set_budget(pb.SetBudgetRequest(vram_size=final_budget))
            rss_end = proc.memory_info().rss
    finally:
        stop_daemon(daemon)

    with lock:
        done = list(records)
    verdict = evaluate(done, refs, rss_baseline, rss_end, max_gap_s)
    if hung:
        verdict.failures.append(f"{hung} stream(s) still waiting 120 s after the end: hung")
    verdict.failures += [f"SetBudget at {e.at_s:.0f} s failed: {e.error}" for e in budget_events if e.error]
    tokens = sum(len(r.tokens) for r in done)
    windows = [(started + e.at_s, started + e.at_s + e.call_ms / 1e3) for e in budget_events]
    during, outside = gaps_during(done, windows)
    figures = {
        "duration_s": elapsed, "streams": n_streams, "tokens": tokens, "tokens_per_s": tokens / elapsed,
        "verdict": asdict(verdict) | {"ok": verdict.ok, "rss_growth": rss_growth(rss_baseline, rss_end)},
        "budget_changes": [asdict(e) for e in budget_events],
        # Where the long gaps are: while a SetBudget call was in flight, or elsewhere.
        "gaps_during_budget_calls": {"count": len(during), "p99_s": percentile(during, 99), "max_s": max(during, default=0.0)},
        "gaps_otherwise": {"count": len(outside), "p99_s": percentile(outside, 99), "max_s": max(outside, default=0.0)},
        "finish_reasons": {k: sum(r.finish == k for r in done) for k in sorted({r.finish for r in done})},
    }
    return verdict, figures


def print_figures(verdict: Verdict, figures: dict, max_gap_s: float) -> None:
    changes = figures["budget_changes"]
    reloads = [c for c in changes if c["reloaded"]]
    print(f"\n{figures['streams']} streams for {figures['duration_s']:.0f} s: {verdict.requests} requests, "
          f"{verdict.completed} completed, {verdict.cancelled} cancelled by the soak; "
          f"{figures['tokens']} tokens, {figures['tokens_per_s']:.1f} tok/s in all")
    print("finish reasons: " + ", ".join(f"{k or 'none'} {v}" for k, v in figures["finish_reasons"].items()))
    print(f"budget changes: {len(changes)}, of which reloaded {len(reloads)}"
          + (f", pause ms median {statistics.median(c['pause_ms'] for c in reloads):.0f} max {max(c['pause_ms'] for c in reloads):.0f}"
             if reloads else " (no GPU: placement never changes; `bench/run.py churn` forces reloads)")
          + (f"; SetBudget call ms median {statistics.median(c['call_ms'] for c in changes):.0f}, max {max(c['call_ms'] for c in changes):.0f}"
             if changes else ""))
    print(f"daemon RSS after warm-up {verdict.rss_baseline / 2**20:.1f} MiB, at the end {verdict.rss_end / 2**20:.1f} MiB "
          f"({rss_growth(verdict.rss_baseline, verdict.rss_end):+.2%}, limit {RSS_LIMIT:+.0%})")
    print(f"gap between chunks of a stream: p50 {verdict.gap_p50_s * 1e3:.0f} ms, p99 {verdict.gap_p99_s * 1e3:.0f} ms "
          f"(limit {max_gap_s * 1e3:.0f} ms), max {verdict.gap_max_s * 1e3:.0f} ms")
    d, o = figures["gaps_during_budget_calls"], figures["gaps_otherwise"]
    print(f"  while a SetBudget call was in flight: {d['count']} gaps, p99 {d['p99_s'] * 1e3:.0f} ms, max {d['max_s'] * 1e3:.0f} ms; "
          f"otherwise: p99 {o['p99_s'] * 1e3:.0f} ms, max {o['max_s'] * 1e3:.0f} ms")
    if verdict.ok:
        print("PASS: no stream dropped, no token lost or duplicated, memory and latency within bounds")
    else:
        print(f"FAIL: {len(verdict.failures)} problem(s)")
        for f in verdict.failures[:30]:
            print(f"  {f}")
        if len(verdict.failures) > 30:
            print(f"  ... and {len(verdict.failures) - 30} more")


def options(group) -> None:
    group.add_argument("--duration", type=float, default=None, help="seconds of soak after warm-up (default 300; 30 with --quick)")
    group.add_argument("--streams", type=int, default=16)
    group.add_argument("--budget-every", type=float, default=10.0, help="seconds between budget changes")
    group.add_argument("--cancel-share", type=float, default=0.1, help="share of requests cancelled at a random point")
    group.add_argument("--max-gap-s", type=float, default=2.0, help="fail when the p99 gap between chunks is above this")
    group.add_argument("--device", action="store_true", help="place onto ggml's RPC device: budget changes reload for real")


def scenario(args: argparse.Namespace) -> dict:
    duration = args.duration or (30.0 if args.quick else 300.0)
    print(f"soak: {args.streams} streams, {duration:.0f} s, budget change every {args.budget_every:.0f} s, "
          f"~{args.cancel_share:.0%} of requests cancelled")
    # args.model, not model_path: without --model the daemon picks its own default, as a game's does.
    verdict, figures = soak(duration, args.streams, args.budget_every, args.cancel_share, args.max_gap_s, args.model,
                            args.device)
    print_figures(verdict, figures, args.max_gap_s)
    if not verdict.ok:
        raise ScenarioFailed(f"{len(verdict.failures)} problem(s), the first: {verdict.failures[0]}", figures)
    return figures
