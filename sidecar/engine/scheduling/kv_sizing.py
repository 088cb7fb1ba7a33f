"""How many KV sequences the engine should hold next, as data: the pool's state and the crowd in,
the operation to perform out. Pure: no llama.cpp, no clock (the caller says how long it has been
quiet); kv_resizing.py performs what these return on the engine's context.

The rules (kv_demand.py says why the KV follows the crowd): grow to cover the crowd in one step,
shrink after a quiet spell, give back what a lowered RAM budget no longer allows; and which of
them applies at each of the loop's three points: after admission, when the loop is idle, and
before admission when the ceiling is below what is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.engine.scheduling.slot import Slot

# Quiet this long (nothing running or waiting) and the sequences beyond the start are given back.
SHRINK_IDLE_S = 30.0


def grown_count(allocated: int, ceiling: int, busy: int, waiting: int) -> int | None:
    """Sequences to grow to when every allocated one is busy and requests wait: enough for all of
    them at once, rounded up to a power of two (a crowd arriving in waves resizes once or twice,
    not once per NPC), at most `ceiling`. None: no growth."""
    if waiting <= 0 or busy < allocated or allocated >= ceiling:
        return None
    want = busy + waiting
    n = allocated
    while n < want:
        n *= 2
    return min(n, ceiling)


def shrunk_count(allocated: int, start: int, quiet_s: float) -> int | None:
    """Sequences to shrink to after `quiet_s` with nothing running; None: stay."""
    return start if allocated > start and quiet_s >= SHRINK_IDLE_S else None


def ceiling_count(slots: list[Slot], ceiling: int) -> int | None:
    """Sequences to shrink to when more are allocated than the ceiling: down to it, or to just
    above the highest busy sequence (its reply goes on where it is); None: nothing to give back."""
    n = max(ceiling, max((s.seq + 1 for s in slots if s.busy), default=0))
    return n if n < len(slots) else None


@dataclass(frozen=True)
class PoolState:
    """What the decisions read of the sequence pool (kv_demand.SequencePool)."""

    allocated: int
    ceiling: int  # the most the KV may hold now (EngineConfig.n_seq, moved by a RAM budget)
    start: int  # what it shrinks back to
    growing: bool  # a bigger context is being made beside the loop
    grown_ready: bool  # ... and is made (or failed): the next look takes it
    grow_beside: bool  # EngineConfig.grow_beside: make a bigger context beside the loop


@dataclass(frozen=True)
class SwapInGrown:
    """Take the context made beside the loop: the streams pause only for the copy of their cells."""


@dataclass(frozen=True)
class GrowBeside:
    """Start making a context of `sequences` in a thread beside the loop."""

    sequences: int


@dataclass(frozen=True)
class Resize:
    """Make a context of `sequences` in place (every stream pauses for it); the sequences beyond
    it are idle, and their sessions go to host memory first."""

    sequences: int


@dataclass(frozen=True)
class ParkBeyond:
    """Move the caches of the idle sequences at or past `ceiling` to host memory, so none is
    admitted to or is a session's home while the busy ones around them finish."""

    ceiling: int


KvSizing = SwapInGrown | GrowBeside | Resize | ParkBeyond


def after_admission(pool: PoolState, busy: int, blocked: int) -> KvSizing | None:
    """After admission left `blocked` requests waiting only because every sequence is busy: a
    bigger context made beside the loop is taken once ready, else growth starts (beside, or in
    place). None: the size stays."""
    if pool.grown_ready:
        return SwapInGrown()
    if pool.growing:
        return None  # still being made: the crowd waits for it, or for a sequence to free
    grow = grown_count(pool.allocated, pool.ceiling, busy, blocked)
    if grow is None:
        return None
    return GrowBeside(grow) if pool.grow_beside else Resize(grow)


def when_quiet(pool: PoolState, quiet_s: float) -> Resize | None:
    """With nothing running or waiting for `quiet_s`: back to the start's size once quiet long
    enough. Never while a bigger context is being made (it is taken first)."""
    if pool.growing:
        return None
    n = shrunk_count(pool.allocated, pool.start, quiet_s)
    return Resize(n) if n is not None else None


def to_ceiling(pool: PoolState, slots: list[Slot]) -> list[KvSizing]:
    """Before admission, when a RAM budget lowered the ceiling below what is allocated: park the
    idle sequences beyond it, then shrink down to it, or to just above the highest busy sequence
    (a streaming reply is never cut for memory; the rest go as those replies end)."""
    if pool.allocated <= pool.ceiling:
        return []
    operations: list[KvSizing] = [ParkBeyond(pool.ceiling)]
    n = ceiling_count(slots, pool.ceiling)
    if n is not None:
        operations.append(Resize(n))
    return operations
