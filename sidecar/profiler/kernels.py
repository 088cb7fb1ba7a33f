"""Timing probe models through llama.cpp's own forward pass (`llama_decode`).

Every figure is the wall time of one `llama_decode` of `batch` new tokens on an empty KV
cache, synchronised: the fastest of several short trials, with their spread recorded. Another
process can only ever slow a trial down, so the fastest is the figure contention cannot bake in,
and a wide spread shows that something interfered. The same code times CPU and GPU
placements: only the model's load parameters differ.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sidecar.profiler.llama_runtime import ensure_backend

LLAMA_SPLIT_MODE_NONE = 0
ALL_LAYERS = 999

_interrupt = threading.local()


class ProbeInterrupted(Exception):
    """A sliced run was told to stop (the daemon got work): the step's figures are thrown away."""


@contextmanager
def interruptible(should_stop: Callable[[], bool]) -> Iterator[None]:
    """Every probe decode on this thread first asks `should_stop`, and raises ProbeInterrupted
    when it says so: a background profile gives the cores back within one decode."""
    previous = getattr(_interrupt, "check", None)
    _interrupt.check = should_stop
    try:
        yield
    finally:
        _interrupt.check = previous


@dataclass(frozen=True)
class RepeatPolicy:
    """How many times one (batch, threads) point is run.

    Runs repeat until `seconds_per_point` is spent and `min_repeats` are done, but never
    more than `max_repeats`. A run longer than a quarter of the budget is itself the
    warm-up-free sample (graph rebuilds cost microseconds next to it); shorter first runs
    are discarded as warm-up.
    """

    seconds_per_point: float = 0.25
    min_repeats: int = 3
    max_repeats: int = 15


class ProbeSession:
    """One probe model loaded with a context that can decode up to `max_batch` tokens."""

    def __init__(self, path: Path, max_batch: int, gpu_index: int | None = None) -> None:
        import llama_cpp

        ensure_backend()
        self._llama = llama_cpp
        model_params = llama_cpp.llama_model_default_params()
        if gpu_index is None:
            model_params.n_gpu_layers = 0
        else:
            model_params.n_gpu_layers = ALL_LAYERS
            model_params.split_mode = LLAMA_SPLIT_MODE_NONE
            model_params.main_gpu = gpu_index
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load probe {path}")
        ctx_params = llama_cpp.llama_context_default_params()
        # One micro-batch holds the whole batch, so one decode is one graph evaluation.
        ctx_params.n_ctx = max(256, -(-max_batch // 256) * 256)
        ctx_params.n_batch = max_batch
        ctx_params.n_ubatch = max_batch
        ctx_params.n_seq_max = 1
        if gpu_index is None:
            # Otherwise a CUDA build ships CPU-resident weights to the GPU for batches of 32
            # and more, and "CPU" figures would time PCIe streaming instead.
            ctx_params.op_offload = False
        self._ctx = llama_cpp.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise RuntimeError(f"llama.cpp could not create a context for {path}")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(max_batch, 0, 1)
        self._max_batch = max_batch
        for i in range(max_batch):
            self._batch.token[i] = i % 256
            self._batch.pos[i] = i
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
            # Outputs for every token: with only the last one requested, llama.cpp drops the
            # other rows before the last layer's FFN, and a one-layer probe would time a
            # batch of one whatever the batch size.
            self._batch.logits[i] = 1

    def set_threads(self, threads: int) -> None:
        """Use `threads` CPU threads for every following decode."""
        self._llama.llama_set_n_threads(self._ctx, threads, threads)

    def decode_seconds(self, n_tokens: int) -> float:
        """Wall seconds of one forward pass over `n_tokens` new tokens from an empty cache."""
        if not 1 <= n_tokens <= self._max_batch:
            raise ValueError(f"batch {n_tokens} outside 1..{self._max_batch}")
        check = getattr(_interrupt, "check", None)
        if check is not None and check():
            raise ProbeInterrupted("probe interrupted")
        llama = self._llama
        llama.llama_memory_clear(self._memory, True)
        self._batch.n_tokens = n_tokens
        start = time.perf_counter()
        rc = llama.llama_decode(self._ctx, self._batch)
        llama.llama_synchronize(self._ctx)
        elapsed = time.perf_counter() - start
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for batch {n_tokens}")
        return elapsed

    def close(self) -> None:
        """Free the batch, context and model (idempotent)."""
        if self._ctx:
            self._llama.llama_batch_free(self._batch)
            self._llama.llama_free(self._ctx)
            self._llama.llama_model_free(self._model)
            self._ctx = None
            self._model = None

    def __enter__(self) -> ProbeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _samples(session: ProbeSession, batch: int, policy: RepeatPolicy) -> list[float]:
    first = session.decode_seconds(batch)
    samples = [] if first < policy.seconds_per_point / 4 else [first]
    min_repeats = policy.min_repeats if not samples else 1
    while len(samples) < policy.max_repeats and not (
        len(samples) >= min_repeats and sum(samples) >= policy.seconds_per_point
    ):
        samples.append(session.decode_seconds(batch))
    return samples


def median_seconds(session: ProbeSession, batch: int, policy: RepeatPolicy) -> float:
    """Median wall time of repeated decodes of `batch` tokens, following `policy` (for ratios
    of two conditions measured side by side, where both medians see the same noise)."""
    return statistics.median(_samples(session, batch, policy))


def fastest_seconds(session: ProbeSession, batch: int, policy: RepeatPolicy) -> tuple[float, float]:
    """(fastest, spread) of repeated decodes of `batch` tokens: spread = (median - fastest) / fastest."""
    samples = _samples(session, batch, policy)
    fastest = min(samples)
    return fastest, (statistics.median(samples) - fastest) / fastest if fastest > 0 else 0.0


# More threads taking this many times as long as fewer threads is not the kernel: it is
# another process holding a core while ggml's thread pool waits at every op's barrier.
CONTENTION_SLOWDOWN = 2.0
CONTENTION_RETRIES = 2
CONTENTION_PAUSE_S = 0.2


def _recheck_contended(
    session: ProbeSession,
    results: dict[tuple[int, int], float],
    batches: tuple[int, ...],
    threads: tuple[int, ...],
    policy: RepeatPolicy,
) -> int:
    # Measure suspicious points again a little later and keep the best median: a busy
    # neighbour only ever slows a run down. A kernel that really is slower with more threads
    # measures the same again, so nothing real is hidden. Returns the points re-measured.
    rechecked = 0
    for i, t in enumerate(threads[1:], start=1):
        for b in batches:
            fewer = min(results[(b, f)] for f in threads[:i])
            tries = 0
            while results[(b, t)] > CONTENTION_SLOWDOWN * fewer and tries < CONTENTION_RETRIES:
                time.sleep(CONTENTION_PAUSE_S)
                session.set_threads(t)
                session.decode_seconds(1)
                results[(b, t)] = min(results[(b, t)], fastest_seconds(session, b, policy)[0])
                tries += 1
            rechecked += tries > 0
    return rechecked


def time_probe(
    path: Path,
    batches: tuple[int, ...],
    threads: tuple[int, ...],
    policy: RepeatPolicy,
    gpu_index: int | None = None,
    spreads: dict[tuple[int, int], float] | None = None,
) -> dict[tuple[int, int], float]:
    """Fastest seconds per (batch, threads) for one probe file; each point's spread goes into
    `spreads` when given.

    Each thread count starts with an untimed batch-1 decode, which pages the weights in
    and starts ggml's thread pool, so the first timed point does not pay for either.
    Points where more threads look far slower than fewer are measured again (see
    CONTENTION_SLOWDOWN).
    """
    results: dict[tuple[int, int], float] = {}
    threads = tuple(sorted(threads))
    with ProbeSession(path, max(batches), gpu_index) as session:
        for t in threads:
            session.set_threads(t)
            session.decode_seconds(1)
            for b in batches:
                results[(b, t)], spread = fastest_seconds(session, b, policy)
                if spreads is not None:
                    spreads[(b, t)] = max(spreads.get((b, t), 0.0), round(spread, 4))
        _recheck_contended(session, results, batches, threads, policy)
    return results
