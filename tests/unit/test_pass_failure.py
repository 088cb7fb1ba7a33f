"""A forward pass that raised (replies.end_after_failed_pass): every request in a sequence ends
with the error and its sequence is emptied, a prefix it was computing for others is let go, and
idle sequences, their sessions' cells and the requests still waiting are left alone. Fakes for
the context and the samplers; no llama.cpp."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sidecar.backend.requests import GenerationSpec, Job
from sidecar.backend.text_stream import TextStream
from sidecar.engine.prefix.prefix_cache import PrefixCache
from sidecar.engine.prefix.prefix_sharing import PrefixSharing
from sidecar.engine.replies import end_after_failed_pass
from sidecar.engine.scheduling.slot import ActiveRequest, Slot
from sidecar.errors import EngineFailure

pytestmark = pytest.mark.fast


class Cells:
    def __init__(self) -> None:
        self.cleared: list[int] = []

    def clear(self, seq: int) -> None:
        self.cleared.append(seq)


def bound(seq: int, events: list, tokens: list[int]) -> tuple[Slot, ActiveRequest]:
    job = Job(spec=GenerationSpec(prompt="hi", max_tokens=4, request_id=f"r{seq}"), sink=events.append)
    sampler = SimpleNamespace(closed=False)
    sampler.close = lambda: setattr(sampler, "closed", True)
    active = ActiveRequest(job=job, prompt_tokens=tokens, cached_tokens=0, sampler=sampler,  # type: ignore[arg-type]
                           stream=TextStream(()), session=None, conversation=[], prompt_text="hi")
    return Slot(seq, cached=tokens[:2], session_id=f"npc{seq}", active=active), active


def test_every_request_in_a_sequence_ends_with_the_error_and_its_cells_go() -> None:
    events: list = []
    busy0, a0 = bound(0, events, [1, 2, 3, 4])
    busy2, a2 = bound(2, events, [5, 6, 7])
    idle = Slot(1, cached=[9, 9, 9], session_id="resting")
    cells, error = Cells(), EngineFailure("internal error: the pass raised")
    ended = end_after_failed_pass([busy0, idle, busy2], PrefixSharing(PrefixCache(0), 1), cells, error)
    assert ended == 2 and events == [error, error]
    assert cells.cleared == [0, 2] and busy0.cached == [] and busy2.cached == []
    assert busy0.active is None and busy2.active is None and a0.sampler.closed and a2.sampler.closed
    assert idle.cached == [9, 9, 9] and idle.session_id == "resting"  # a resting NPC keeps its cache


def test_a_prefix_in_flight_is_let_go_so_the_requests_waiting_for_it_prefill_on_their_own() -> None:
    events: list = []
    sharing = PrefixSharing(PrefixCache(1 << 20), 1)
    slot, active = bound(0, events, list(range(40)))
    sharing.produce(active, active.prompt_tokens, 32)
    assert active.share_at == 32
    end_after_failed_pass([slot], sharing, Cells(), EngineFailure("boom"))
    other = bound(1, events, list(range(40)))[1]
    sharing.produce(other, other.prompt_tokens, 32)  # no longer in flight: the next one computes it
    assert other.share_at == 32


def test_a_failed_pass_with_nothing_bound_ends_nothing() -> None:
    cells = Cells()
    assert end_after_failed_pass([Slot(0), Slot(1, cached=[3])], PrefixSharing(PrefixCache(0), 1), cells,
                                 EngineFailure("boom")) == 0
    assert cells.cleared == []
