"""Figures known to be disturbed may not talk the planner into fewer threads.

A profile step measured while other processes held part of the cores has its multi-threaded
figures too slow (ggml's threads wait at every op's barrier for the one that was descheduled);
taken at face value they make one thread look faster than two, and the plan would run one thread
on a machine that is quiet most of the time. Such a figure is capped at what the fewer-thread
figure and the speed-up seen on quiet figures of the same profile (same device, batch and
thread counts) predict, or, without any, a modest speed-up of sqrt(t_low / t_high) per thread
ratio. Undisturbed figures are never changed. Pure.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import replace


def _default_ratio(low: int, high: int) -> float:
    return (low / high) ** 0.5


def quiet_ratios(points) -> dict[tuple, float]:
    """Median time ratio high/low threads over undisturbed pairs, by (device, batch, low, high)."""
    series: dict[tuple, dict[int, object]] = defaultdict(dict)
    for p in points:
        series[(p.op, p.device, p.shape, p.weight_type, p.batch, p.busy)][p.threads] = p
    ratios: dict[tuple, list[float]] = defaultdict(list)
    for (_op, device, _shape, _type, batch, _busy), by_threads in series.items():
        counts = sorted(by_threads)
        for i, low in enumerate(counts):
            for high in counts[i + 1:]:
                a, b = by_threads[low], by_threads[high]
                if not a.disturbed and not b.disturbed and a.seconds > 0:
                    ratios[(device, batch, low, high)].append(b.seconds / a.seconds)
    return {k: statistics.median(v) for k, v in ratios.items()}


def cap_disturbed(points: list, key_fields: tuple[str, ...], ratios: dict[tuple, float] | None = None,
                  scale_with_threads: bool = True) -> tuple[list, int]:
    """Points (KernelPoint or OverheadPoint: `threads`, `seconds`, `disturbed`, `device`, `batch`)
    with every disturbed figure capped by the fewer-thread figures of its series (the points that
    agree on `key_fields`). `scale_with_threads` False caps at the fewer-thread figure itself
    (overheads, which do not shrink with threads). Returns (points, how many were capped)."""
    ratios = ratios or {}
    series: dict[tuple, list] = defaultdict(list)
    for p in points:
        series[tuple(getattr(p, f) for f in key_fields)].append(p)
    out: list = []
    changed = 0
    for group in series.values():
        done: list = []
        for p in sorted(group, key=lambda p: p.threads):
            fewer = [q for q in done if q.threads < p.threads]
            if p.disturbed and fewer:
                def predicted(q) -> float:
                    if not scale_with_threads:
                        return q.seconds
                    r = ratios.get((p.device, p.batch, q.threads, p.threads), _default_ratio(q.threads, p.threads))
                    return q.seconds * min(r, 1.0)
                bound = min(predicted(q) for q in fewer)
                if p.seconds > bound:
                    p = replace(p, seconds=bound)
                    changed += 1
            done.append(p)
        out += done
    return out, changed


def fill_deferred(points: list, key_fields: tuple[str, ...], deferred_threads: tuple[int, ...],
                  ratios: dict[tuple, float] | None = None, scale_with_threads: bool = True) -> tuple[list, int]:
    """`points` plus, for every series (points agreeing on `key_fields`) that lacks one of
    `deferred_threads`, an estimate at that thread count from its fewer-thread figures by the same
    rule that caps a disturbed figure, marked disturbed. The background profile defers the thread
    counts whose cores other processes' steady load held (sidecar.profiler.environment): without
    a figure for them the planner could not choose them at all. Returns (points, estimates added)."""
    if not deferred_threads:
        return points, 0
    ratios = ratios or {}
    series: dict[tuple, list] = defaultdict(list)
    for p in points:
        series[tuple(getattr(p, f) for f in key_fields)].append(p)
    added: list = []
    for group in series.values():
        have = {p.threads for p in group}
        for t in sorted(set(deferred_threads) - have):
            fewer = [q for q in group if q.threads < t]
            if not fewer:
                continue

            def predicted(q, t=t) -> float:
                if not scale_with_threads:
                    return q.seconds
                r = ratios.get((q.device, q.batch, q.threads, t), _default_ratio(q.threads, t))
                return q.seconds * min(r, 1.0)
            best = min(fewer, key=predicted)
            added.append(replace(best, threads=t, seconds=predicted(best), disturbed=True))
    return points + added, len(added)
