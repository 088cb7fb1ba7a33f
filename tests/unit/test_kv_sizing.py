"""The KV's size as data (scheduling/kv_sizing.py): the pool's state and the crowd in, the operation
out; then the engine's side of it (kv_resizing.perform) against a fake context that records what
was done to its cells, with the context made beside the loop a fake too. No llama.cpp."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from sidecar.backend.engine_config import EngineConfig
from sidecar.backend.sessions import SessionStore
from sidecar.engine import kv_demand
from sidecar.engine.kv_demand import SequencePool
from sidecar.engine.kv_resizing import grow_for, perform, shrink_to_ceiling, shrink_when_quiet
from sidecar.engine.scheduling.kv_sizing import (
    SHRINK_IDLE_S,
    GrowBeside,
    ParkBeyond,
    PoolState,
    Resize,
    SwapInGrown,
    after_admission,
    to_ceiling,
    when_quiet,
)
from sidecar.engine.scheduling.slot import Slot

pytestmark = pytest.mark.fast


def pool(allocated: int = 2, ceiling: int = 16, start: int = 2, growing: bool = False, grown_ready: bool = False,
         grow_beside: bool = True) -> PoolState:
    return PoolState(allocated, ceiling, start, growing, grown_ready, grow_beside)


def slots(n: int, busy: set[int] = frozenset()) -> list[Slot]:  # type: ignore[assignment]
    return [Slot(seq, active=object() if seq in busy else None) for seq in range(n)]  # type: ignore[arg-type]


def test_a_crowd_that_finds_every_sequence_busy_grows_beside_the_loop_or_in_place() -> None:
    assert after_admission(pool(), busy=2, blocked=5) == GrowBeside(8)
    assert after_admission(pool(grow_beside=False), busy=2, blocked=5) == Resize(8)
    assert after_admission(pool(ceiling=6), busy=2, blocked=9) == GrowBeside(6)


def test_no_growth_while_a_sequence_is_free_nothing_waits_or_the_ceiling_is_reached() -> None:
    assert after_admission(pool(), busy=1, blocked=3) is None
    assert after_admission(pool(), busy=2, blocked=0) is None
    assert after_admission(pool(allocated=16, start=2), busy=16, blocked=4) is None


def test_a_context_made_beside_is_taken_once_ready_and_not_asked_for_twice() -> None:
    assert after_admission(pool(growing=True, grown_ready=True), busy=2, blocked=5) == SwapInGrown()
    assert after_admission(pool(growing=True), busy=2, blocked=5) is None  # still being made


def test_the_kv_shrinks_back_only_after_a_quiet_spell_and_never_while_growing() -> None:
    assert when_quiet(pool(allocated=8), SHRINK_IDLE_S) == Resize(2)
    assert when_quiet(pool(allocated=8), SHRINK_IDLE_S - 1) is None
    assert when_quiet(pool(allocated=2), 1e9) is None
    assert when_quiet(pool(allocated=8, growing=True), 1e9) is None


def test_a_lowered_ceiling_parks_the_idle_beyond_it_and_keeps_the_busy_ones_streaming() -> None:
    assert to_ceiling(pool(allocated=8, ceiling=8), slots(8)) == []
    assert to_ceiling(pool(allocated=8, ceiling=2), slots(8)) == [ParkBeyond(2), Resize(2)]
    # Sequence 5 streams a reply: the KV shrinks to just above it now, the rest as it ends.
    assert to_ceiling(pool(allocated=8, ceiling=2), slots(8, busy={5})) == [ParkBeyond(2), Resize(6)]
    assert to_ceiling(pool(allocated=8, ceiling=2), slots(8, busy={7})) == [ParkBeyond(2)]


class FakeContext:
    """The context calls kv_resizing and kv_demand make: each sequence's cells as bytes."""

    def __init__(self, n_seq: int, cells: dict[int, bytes] | None = None) -> None:
        self.n_seq = n_seq
        self.cells = dict(cells or {})
        self.closed = False

    def save(self, seq: int) -> bytes:
        return self.cells[seq]

    def restore(self, seq: int, state: bytes) -> None:
        self.cells[seq] = state

    def clear(self, seq: int) -> None:
        self.cells.pop(seq, None)

    def close(self) -> None:
        self.closed = True


class FakeEngine(SimpleNamespace):
    """What kv_resizing reads and writes of the engine, with a fake context."""

    def __init__(self, allocated: int, n_seq: int, grow_beside: bool = True) -> None:
        config = EngineConfig(model_path=Path("unused.gguf"), n_seq=n_seq, n_seq_start=allocated,
                              grow_beside=grow_beside)
        engine_slots = [Slot(seq, cached=[seq + 1]) for seq in range(allocated)]
        super().__init__(config=config, pool=SequencePool(config), slots=engine_slots, model=object(),
                         sessions=SessionStore(max_sessions=8, max_saved_bytes=1 << 20),
                         ctx=FakeContext(allocated, {s.seq: b"kv-%d" % s.seq for s in engine_slots}),
                         woken=threading.Event())

    def wake(self) -> None:
        self.woken.set()


@pytest.fixture
def fake_contexts(monkeypatch):
    """kv_demand's context_for, made fake: a context of n sequences, recorded."""
    made: list[int] = []

    def context_for(model, config, n):
        made.append(n)
        return FakeContext(n)

    monkeypatch.setattr(kv_demand, "context_for", context_for)
    return made


def test_growth_beside_the_loop_swaps_every_cached_sequence_into_the_bigger_context(fake_contexts) -> None:
    engine = FakeEngine(allocated=2, n_seq=16)
    for slot in engine.slots:
        slot.active = object()
    old = engine.ctx
    assert grow_for(engine, blocked=3) is False  # begun beside the loop: nothing free yet
    assert engine.woken.wait(5) and fake_contexts == [8]
    assert grow_for(engine, blocked=3) is True  # ready: taken between two passes
    assert engine.ctx is not old and old.closed
    assert engine.ctx.cells == {0: b"kv-0", 1: b"kv-1"}
    assert [s.seq for s in engine.slots] == list(range(8)) and engine.pool.allocated == 8
    assert engine.pool.resizes == 1


def test_growth_in_place_and_a_quiet_shrink_keep_what_the_kept_sequences_hold(fake_contexts, monkeypatch) -> None:
    engine = FakeEngine(allocated=2, n_seq=8, grow_beside=False)
    for slot in engine.slots:
        slot.active = object()
    assert grow_for(engine, blocked=1) is True and engine.pool.allocated == 4 and fake_contexts == [4]
    assert engine.ctx.cells == {0: b"kv-0", 1: b"kv-1"}
    for slot in engine.slots:
        slot.active = None
    engine.pool.quiet_since -= SHRINK_IDLE_S
    shrink_when_quiet(engine)
    assert engine.pool.allocated == 2 and fake_contexts == [4, 2]
    assert engine.ctx.cells == {0: b"kv-0", 1: b"kv-1"}


def test_a_lowered_ceiling_evicts_the_idle_sessions_beyond_it_to_host_memory(fake_contexts) -> None:
    engine = FakeEngine(allocated=4, n_seq=4)
    session = engine.sessions.open("smith")
    session.seq, engine.slots[3].session_id = 3, "smith"
    engine.pool.ceiling = 2
    shrink_to_ceiling(engine)
    assert engine.pool.allocated == 2 and fake_contexts == [2]
    assert session.seq is None and session.saved_state == b"kv-3" and session.saved_tokens == [4]  # comes back when it speaks again
    assert engine.ctx.cells == {0: b"kv-0", 1: b"kv-1"}


def test_a_context_that_could_not_be_made_beside_leaves_the_size_as_it_was(monkeypatch) -> None:
    def fails(model, config, n):
        raise MemoryError("no room for the KV")

    monkeypatch.setattr(kv_demand, "context_for", fails)
    engine = FakeEngine(allocated=2, n_seq=16)
    for slot in engine.slots:
        slot.active = object()
    perform(engine, GrowBeside(8))
    assert engine.woken.wait(5)
    assert grow_for(engine, blocked=3) is False  # the failure is taken (and logged), nothing changes
    assert engine.pool.allocated == 2 and not engine.pool.growing
