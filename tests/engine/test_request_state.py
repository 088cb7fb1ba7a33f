"""Each request's explicit state (backend/request_state.py), as the engine sets it and status shows
it: why a request waits is data, not five predicates spread over the engine."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sidecar.api import pb
from sidecar.backend.request_state import RequestState
from sidecar.backend.requests import Job
from sidecar.engine import Engine, GenerationSpec, Prompt, SamplingConfig
from sidecar.engine.scheduling.slot import MAX_LISTED, Slot, request_views

from support.engines import Stream, open_engine
from support.no_early_stop import engine_eog_ids, engine_sampling, grpc_sampling

GREEDY = SamplingConfig(temperature=0.0, repeat_penalty=1.0)


def _job(request_id: str, state: RequestState, submitted_at: float) -> Job:
    job = Job(spec=GenerationSpec(prompt=Prompt(text="x"), request_id=request_id), sink=lambda e: None)
    job.state, job.submitted_at = state, submitted_at
    return job


def test_views_list_waiting_requests_oldest_first_and_stay_bounded() -> None:
    waiting = [_job(f"r{i}", RequestState.WAITING_FOR_SEQUENCE, submitted_at=100.0 + i) for i in range(MAX_LISTED + 10)]
    views = request_views([Slot(0)], waiting, now=1000.0)
    assert len(views) == MAX_LISTED
    assert [v.request_id for v in views[:3]] == ["r0", "r1", "r2"]
    assert all(v.state is RequestState.WAITING_FOR_SEQUENCE and v.prompt_tokens == 0 for v in views)
    assert views[0].age_ms == pytest.approx(900_000.0)


def test_a_job_ends_finished_whatever_ends_it() -> None:
    seen = []
    job = Job(spec=GenerationSpec(prompt=Prompt(text="x")), sink=seen.append)
    assert job.state is RequestState.PREPARING
    job.end(ValueError("refused"))
    assert job.state is RequestState.FINISHED and len(seen) == 1


@pytest.fixture(scope="module")
def engine(smollm2_path) -> Iterator[Engine]:
    # One sequence and no room to grow: a second request must wait for it.
    with open_engine(smollm2_path, n_seq=1, max_sessions=4) as e:
        yield e


def _states(engine: Engine) -> dict[str, RequestState]:
    return {v.request_id: v.state for v in engine.snapshot().requests}


def test_status_says_why_each_request_waits(engine: Engine) -> None:
    sampling = engine_sampling(GREEDY, engine_eog_ids(engine))  # the first reply runs its length
    chat = lambda text: Prompt(messages=(("user", text),))  # noqa: E731
    first, other, next_turn = Stream(), Stream(), Stream()
    engine.submit(GenerationSpec(prompt=chat("Tell me a long story."), sampling=sampling, max_tokens=300,
                                 session_id="smith", request_id="first"), first)
    engine.submit(GenerationSpec(prompt=chat("Hello"), sampling=sampling, max_tokens=2, request_id="other"), other)
    engine.submit(GenerationSpec(prompt=chat("And then?"), sampling=sampling, max_tokens=2,
                                 session_id="smith", request_id="next_turn"), next_turn)
    wanted = {"first": RequestState.DECODING, "other": RequestState.WAITING_FOR_SEQUENCE,
              "next_turn": RequestState.WAITING_FOR_TURN}
    seen: dict[str, RequestState] = {}
    deadline = time.monotonic() + 60
    while seen != wanted and time.monotonic() < deadline and not first.done.is_set():
        seen = _states(engine)
        time.sleep(0.005)
    assert seen == wanted
    decoding = next(v for v in engine.snapshot().requests if v.request_id == "first")
    assert decoding.prompt_tokens > 0 and decoding.prompt_tokens_done == decoding.prompt_tokens
    for stream in (first, other, next_turn):
        stream.result()
    deadline = time.monotonic() + 10
    while engine.snapshot().requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.snapshot().requests == ()


def test_status_read_as_a_client_gets_its_first_token_says_decoding(engine: Engine) -> None:
    """The sink runs on the engine thread as each token is sent: what status shows at that moment
    is what a client that holds its first token finds. The views were rebuilt only after the
    pass, so a status call in that window said prefilling (seen once in CI over gRPC)."""
    sampling = engine_sampling(GREEDY, engine_eog_ids(engine))
    seen: list[tuple[RequestState, int] | None] = []

    def first_delta(delta) -> None:
        if not seen:
            view = next((v for v in engine.snapshot().requests if v.request_id == "watched"), None)
            seen.append((view.state, view.tokens_generated) if view is not None else None)

    stream = Stream(on_delta=first_delta)
    engine.submit(GenerationSpec(prompt=Prompt(text="Count from one to ten."), sampling=sampling, max_tokens=4,
                                 request_id="watched"), stream)
    stream.result()
    assert seen and seen[0] is not None, seen
    assert seen[0][0] is RequestState.DECODING and seen[0][1] >= 1, seen


def test_grpc_status_lists_a_streaming_request(client, eog) -> None:
    request = pb.GenerateRequest(prompt="Count from one to one thousand.", max_tokens=400, request_id="counting",
                                 sampling=grpc_sampling(eog, temperature=0.0))
    stream = client.generate(request)
    next(stream)  # the first chunk: it is decoding now
    try:
        listed = {r.request_id: r for r in client.status().requests}
        assert listed["counting"].state == pb.REQUEST_STATE_DECODING
        assert listed["counting"].tokens_generated >= 1 and listed["counting"].age_ms > 0
    finally:
        stream.close()
