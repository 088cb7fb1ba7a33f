"""When a measured figure can be trusted: the load other processes put on the CPUs meanwhile.

llama.cpp's CPU threads meet at a barrier after every op, so a kernel on `t` threads is slowed
badly as soon as other processes need part of the cores those threads run on: one busy-loop on
one of two cores makes a two-thread decode slower than a one-thread one. A figure is disturbed
when others used a real share of a core and our threads plus theirs did not fit the machine.
Pure functions of recorded figures.
"""

from __future__ import annotations

# Others using less than this many cores on average (a quarter core: a browser tab, a shell)
# leave multi-threaded figures within the run-to-run spread.
DISTURBED_CORES = 0.25


def others_cores(load: float, logical_cores: int) -> float:
    """The cores other processes kept busy, from their share of all CPUs."""
    return max(0.0, load) * max(1, logical_cores)


def step_disturbed(load: float, logical_cores: int) -> bool:
    """Whether a step measured under `load` should be taken again when the machine is quiet
    (its figures for the most threads, the machine's cores, are disturbed)."""
    return others_cores(load, logical_cores) >= DISTURBED_CORES


def entry_disturbed(load: float, threads: int, logical_cores: int) -> bool:
    """Whether a figure on `threads` threads, measured under `load`, is known to be too slow: our
    threads and theirs did not fit the cores (with DISTURBED_CORES of slack, so one thread beside
    a busy loop on the other of two cores, measured at 1.02 cores, is not disturbed)."""
    others = others_cores(load, logical_cores)
    return others >= DISTURBED_CORES and threads + others > logical_cores + DISTURBED_CORES


def disturbed_share(db) -> float:
    """Share of a profile's kernel entries known disturbed (0 for a quiet profile)."""
    logical = db.hardware.logical_cores
    entries = [e for e in db.entries if e.op in ("attn_qkvo", "ffn", "moe_experts")]
    if not entries:
        return 0.0
    return sum(entry_disturbed(e.load, e.threads, logical) for e in entries) / len(entries)


def profile_disturbed(db) -> bool:
    """A profile to measure again: any kernel figure disturbed or thread count deferred, or
    (profiles from before per-step load sampling) the whole run's contention above what the
    quiet threshold allows."""
    if disturbed_share(db) > 0 or getattr(db, "deferred_threads", ()):
        return True
    return step_disturbed(db.contention, db.hardware.logical_cores)
