"""Reading measured figures at any point: the profile's kernel series and overheads, interpolated
over batch, shape, weight type and threads. Pure functions of the HardwareModel."""

from __future__ import annotations

import math

from sidecar.model_info.ggml_types import bits_per_weight, known_type
from sidecar.planner.hardware_model import ON_GPU, HardwareModel, KernelPoint


def _lerp_log(x: float, x0: float, x1: float, y0: float, y1: float) -> float:
    """y at x, linear in log x and log y between (x0, y0) and (x1, y1)."""
    if x1 == x0 or y0 <= 0 or y1 <= 0:
        return y0
    w = math.log(x / x0) / math.log(x1 / x0)
    return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))


def series_seconds(series: tuple[KernelPoint, ...], batch: float, unit_bytes: float, unit_flops: float) -> float:
    """Time of a unit reading `unit_bytes` and computing `unit_flops` at `batch` tokens, from one
    measured series (one op, shape, type, thread count; sorted by batch).

    The probe's own time, bytes and FLOPs are interpolated at `batch` (log-log between measured
    batches; linear in batch beyond the largest, where kernels are compute-bound), then scaled
    by the larger of the bytes and FLOPs ratios.
    """
    first, last = series[0], series[-1]
    if batch <= first.batch:
        p = first
        t, w, f = p.seconds, p.weight_bytes, p.flops * batch / p.batch
    elif batch >= last.batch:
        p = last
        t, w, f = p.seconds * batch / p.batch, p.weight_bytes, p.flops * batch / p.batch
    else:
        hi = next(i for i, p in enumerate(series) if p.batch >= batch)
        a, b = series[hi - 1], series[hi]
        t = _lerp_log(batch, a.batch, b.batch, a.seconds, b.seconds)
        w = _lerp_log(batch, a.batch, b.batch, a.weight_bytes, b.weight_bytes)
        f = _lerp_log(batch, a.batch, b.batch, a.flops, b.flops)
    ratio = max(unit_bytes / w if w > 0 else 0.0, unit_flops / f if f > 0 else 0.0)
    return t * ratio


def _nearest_type(available: set[str], wanted: str) -> str:
    if wanted in available:
        return wanted
    bits = bits_per_weight(wanted) if known_type(wanted) else 4.5
    return min(available, key=lambda t: (abs(math.log(bits_per_weight(t) / bits)) if known_type(t) else 9, t))


def _active_params(series: tuple[KernelPoint, ...]) -> float:
    p = series[0]
    return p.flops / (2.0 * p.batch) if p.batch else 1.0


def measured_seconds(hw: HardwareModel, op: str, device: str, weight_type: str, batch: float,
                      threads: int, busy: bool, unit_bytes: float, unit_flops: float,
                      unit_params: float) -> float | None:
    """A unit's time from the profile's series of `op` on `device`, or None when nothing of that
    op was measured there.

    The series of the nearest weight type (bits per weight) are used; shapes are interpolated
    in log of active parameters per token (`unit_params`), threads in log of the count. A busy
    request without busy figures takes the idle one times the machine's busy slowdown.
    """
    keys = [k for k in hw.kernel_series if k[0] == op and k[1] == device and k[5] == busy]
    if not keys and busy:
        # No busy figure for this op: its idle figure, slowed by the machine's busy factor.
        idle = measured_seconds(hw, op, device, weight_type, batch, threads, False, unit_bytes, unit_flops,
                                 unit_params)
        return None if idle is None else idle * hw.cpu.busy_slowdown
    if not keys:
        return None
    wtype = _nearest_type({k[3] for k in keys}, weight_type)
    keys = [k for k in keys if k[3] == wtype]
    thread_counts = sorted({k[4] for k in keys})
    if device == ON_GPU:
        thread_counts = thread_counts[-1:]

    def at_threads(t: int) -> float:
        shapes = [hw.kernel_series[k] for k in keys if k[4] == t]
        sized = sorted(((_active_params(s), s) for s in shapes), key=lambda x: x[0])
        estimates = [(size, series_seconds(s, batch, unit_bytes, unit_flops)) for size, s in sized]
        if unit_params <= estimates[0][0] or len(estimates) == 1:
            return estimates[0][1]
        if unit_params >= estimates[-1][0]:
            return estimates[-1][1]
        hi = next(i for i, (size, _) in enumerate(estimates) if size >= unit_params)
        (s0, t0), (s1, t1) = estimates[hi - 1], estimates[hi]
        return _lerp_log(unit_params, s0, s1, t0, t1)

    if threads <= thread_counts[0]:
        return at_threads(thread_counts[0])
    if threads >= thread_counts[-1]:
        return at_threads(thread_counts[-1])
    hi = next(i for i, t in enumerate(thread_counts) if t >= threads)
    t0, t1 = thread_counts[hi - 1], thread_counts[hi]
    return _lerp_log(threads, t0, t1, at_threads(t0), at_threads(t1))


def measured_overhead(hw: HardwareModel, kind: str, device: str, tokens: int, threads: int) -> float | None:
    """The profile's LAYER_OVERHEAD or GRAPH_OVERHEAD at `tokens` and `threads`, or None when absent.

    Linear in batch between measured points (overheads can be near zero, so not log-log) and
    linear in tokens past the largest; threads interpolate in log of the count.
    """
    keys = sorted(k[2] for k in hw.overhead_series if k[0] == kind and k[1] == device)
    if not keys:
        return None

    def at(t: int) -> float:
        series = hw.overhead_series[(kind, device, t)]
        if tokens <= series[0].batch:
            return series[0].seconds
        if tokens >= series[-1].batch:
            return series[-1].seconds * tokens / series[-1].batch
        hi = next(i for i, p in enumerate(series) if p.batch >= tokens)
        a, b = series[hi - 1], series[hi]
        # Overheads can be ~0 at some points: interpolate linearly, not in log space.
        w = math.log(tokens / a.batch) / math.log(b.batch / a.batch)
        return a.seconds + w * (b.seconds - a.seconds)

    if device == ON_GPU or threads >= keys[-1]:
        return at(keys[-1])
    if threads <= keys[0]:
        return at(keys[0])
    hi = next(i for i, t in enumerate(keys) if t >= threads)
    t0, t1 = keys[hi - 1], keys[hi]
    w = math.log(threads / t0) / math.log(t1 / t0)
    return at(t0) + w * (at(t1) - at(t0))
