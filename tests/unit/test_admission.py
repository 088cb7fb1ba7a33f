"""Admission as data in, data out: waiting requests, sequences and sessions in; who started where,
who waits and why (Job.state), what was evicted. No llama.cpp: the KV cells are a fake that
records what was done to them, and starting a request is a fake of the engine's `start`."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest

from sidecar.backend.engine_config import EngineConfig
from sidecar.backend.request_state import RequestState
from sidecar.backend.requests import Finished, FinishReason, GenerationSpec, Job, Prompt
from sidecar.backend.sessions import SessionStore
from sidecar.engine.admission import Admission
from sidecar.engine.image_encodes import ImageEncodes
from sidecar.engine.kv_demand import SequencePool
from sidecar.engine.prefix.prefix_cache import PrefixCache
from sidecar.engine.prefix.prefix_sharing import PrefixSharing
from sidecar.engine.scheduling.slot import Slot
from sidecar.errors import InvalidArgument

pytestmark = pytest.mark.fast


class FakeKv:
    """The KV cells admission touches: an evicted session's state saved, its cells cleared."""

    def __init__(self) -> None:
        self.saved: list[int] = []
        self.cleared: list[int] = []

    def save(self, seq: int) -> bytes:
        self.saved.append(seq)
        return b"kv-of-%d" % seq

    def clear(self, seq: int) -> None:
        self.cleared.append(seq)


class Scheduler:
    """An Admission over `n_seq` sequences, a fake KV, and a `start` that binds the request as the
    engine does (its session's cache in the sequence, the request active) or refuses it."""

    def __init__(self, n_seq: int, refuse: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        config = EngineConfig(model_path=Path("unused.gguf"), n_seq=n_seq)
        self.config = config
        self.sessions = SessionStore(max_sessions=8, max_saved_bytes=1 << 20)
        self.pool = SequencePool(config)
        self.admission = Admission(self.sessions, PrefixSharing(PrefixCache(0), 1024), ImageEncodes(wake=lambda: None),
                                   self.pool, context_tokens=lambda prompt: [])
        self.slots = [Slot(seq) for seq in range(n_seq)]
        self.kv = FakeKv()
        self.waiting: deque[Job] = deque()
        self.started: list[tuple[str, int]] = []
        self.refuse = refuse
        self.blocked = 0
        self.ends: dict[str, object] = {}  # each request's last event

    def start(self, job: Job, slot: Slot) -> None:
        if job.spec.request_id in self.refuse:
            raise InvalidArgument("refused at start")
        sid = job.spec.session_id
        if sid:
            self.sessions.open(sid).seq = slot.seq
        slot.session_id = sid
        slot.active = SimpleNamespace(job=job, prompt_tokens=[1, 2, 3])  # type: ignore[assignment]
        job.state = RequestState.PREFILLING
        self.started.append((job.spec.request_id, slot.seq))

    def submit(self, request_id: str, session_id: str = "") -> Job:
        job = Job(spec=GenerationSpec(prompt=Prompt(messages=(("user", "hi"),)), request_id=request_id,
                                      session_id=session_id), sink=lambda event: self.ends.setdefault(request_id, event))
        job.state = RequestState.WAITING_FOR_SEQUENCE
        self.waiting.append(job)
        return job

    def admit(self) -> None:
        admitted = self.admission.admit(self.waiting, self.slots, self.kv, self.config, self.start, lambda job: [5, 6, 7])
        self.waiting, self.blocked = admitted.waiting, admitted.blocked

    def finish(self, seq: int) -> None:
        self.slots[seq].active = None



def test_requests_start_in_arrival_order_and_the_rest_wait_for_a_sequence() -> None:
    s = Scheduler(n_seq=2)
    jobs = [s.submit(f"r{i}") for i in range(3)]
    s.admit()
    assert s.started == [("r0", 0), ("r1", 1)]  # the lowest free sequences, in arrival order
    assert [j.spec.request_id for j in s.waiting] == ["r2"]
    assert jobs[2].state is RequestState.WAITING_FOR_SEQUENCE
    assert s.blocked == 1  # a bigger KV would start it
    s.finish(0)
    s.admit()
    assert ("r2", 0) in s.started and not s.waiting


def test_a_sessions_next_turn_waits_for_its_turn_and_asks_for_no_new_sequence() -> None:
    s = Scheduler(n_seq=2)
    s.submit("first", "smith")
    s.admit()
    next_turn = s.submit("next", "smith")
    other = s.submit("other")
    s.admit()
    assert next_turn.state is RequestState.WAITING_FOR_TURN
    assert other.state is RequestState.PREFILLING and ("other", 1) in s.started
    assert s.blocked == 0  # every sequence is busy, but a new one would not start the smith's turn
    s.finish(0)
    s.admit()
    assert ("next", 0) in s.started  # back in the sequence that holds the smith's conversation


def test_a_cancelled_request_ends_before_it_starts() -> None:
    s = Scheduler(n_seq=1)
    job = s.submit("gone")
    job.cancel()
    s.admit()
    assert not s.started and not s.waiting and job.state is RequestState.FINISHED
    end = s.ends["gone"]
    assert isinstance(end, Finished) and end.reason is FinishReason.CANCELLED


def test_an_idle_session_goes_to_host_memory_when_every_free_sequence_holds_one() -> None:
    s = Scheduler(n_seq=1)
    s.submit("a1", "alice")
    s.admit()
    s.slots[0].cached = [9, 9, 9]
    s.finish(0)
    s.submit("b1", "bob")
    s.admit()
    assert s.kv.saved == [0] and 0 in s.kv.cleared  # alice's cells saved, then the sequence freed
    alice = s.sessions.get("alice")
    assert alice is not None and alice.saved_state == b"kv-of-0" and alice.saved_tokens == [9, 9, 9]
    assert alice.seq is None and ("b1", 0) in s.started


def test_a_request_refused_at_start_ends_and_the_next_one_gets_the_sequence() -> None:
    s = Scheduler(n_seq=1, refuse={"bad"})
    bad, good = s.submit("bad"), s.submit("good")
    s.admit()
    assert bad.state is RequestState.FINISHED and isinstance(s.ends["bad"], InvalidArgument)
    assert good.state is RequestState.PREFILLING and s.started == [("good", 0)]


def test_no_request_starts_beyond_a_lowered_ceiling() -> None:
    s = Scheduler(n_seq=2)
    s.pool.ceiling = 1  # a RAM budget lowered while both sequences are allocated
    s.submit("first")
    s.admit()
    second = s.submit("second")
    s.admit()
    assert s.started == [("first", 0)]
    assert second.state is RequestState.WAITING_FOR_SEQUENCE  # sequence 1 is free, but past the ceiling


def test_the_loop_may_sleep_only_when_nothing_waiting_could_start() -> None:
    s = Scheduler(n_seq=1)
    assert not s.admission.admissible(s.waiting, s.slots)
    s.submit("r0")
    assert s.admission.admissible(s.waiting, s.slots)
    s.admit()
    s.submit("r1")
    assert not s.admission.admissible(s.waiting, s.slots)  # waits for the busy sequence
