"""One request cannot take the whole queue (issue 36, P5): prompts x n is bounded as n is, and a
request's many generations are admitted in turn with other requests' (engine/scheduling/
fair_turns.py), so an NPC's line sent after a big request starts before the big one is done.
Over HTTP with the `openai` package, on a daemon of four sequences; mechanisms only."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import openai
import pytest

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.no_early_stop import http_bias, http_eog_ids
from support.openai_http_support import http_base
from sidecar.backend.requests import GenerationSpec, Job, Prompt
from sidecar.engine.scheduling.fair_turns import fair_order
from sidecar.service.token_controls import MAX_CANDIDATES

SEQUENCES = 4


def job(group: str = "", name: str = "") -> Job:
    return Job(spec=GenerationSpec(prompt=Prompt(text=name or "x"), group=group), sink=lambda event: None)


def busy(group: str) -> SimpleNamespace:
    """A slot whose sequence holds one of `group`'s generations."""
    return SimpleNamespace(active=SimpleNamespace(job=job(group)))


def test_requests_take_turns_and_keep_their_order_within_a_turn() -> None:
    big = [job("big", f"big{i}") for i in range(5)]
    npc, other = job(name="npc"), job("two", "two0")
    waiting = [*big, npc, other, job("two", "two1")]
    order = [j.spec.prompt.text for j in fair_order(waiting, [busy("big"), busy("big"), SimpleNamespace(active=None)])]
    # "big" holds two sequences: its waiting generations have turns 2.. ; the others start at 0.
    assert order == ["npc", "two0", "two1", "big0", "big1", "big2", "big3", "big4"]
    assert fair_order(big, []) == big  # alone, a request keeps its arrival order


@pytest.fixture(scope="module")
def api() -> Iterator[RunningDaemon]:
    running = start_daemon("--no-websocket", "--stream-interval-ms", "0", "--parallel", str(SEQUENCES))
    yield running
    stop_daemon(running)


@pytest.fixture(scope="module")
def client(api: RunningDaemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{http_base(api)}/v1", api_key=api.token, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def no_end(api: RunningDaemon) -> dict[str, float]:
    return http_bias(http_eog_ids(http_base(api), api.token))


@pytest.mark.parametrize("prompts, n", [(16, 16), (2, 9), (MAX_CANDIDATES + 1, 1)])
def test_prompts_times_n_over_the_bound_is_a_clear_400(client: openai.OpenAI, prompts: int, n: int) -> None:
    if prompts > MAX_CANDIDATES:  # past the prompt list's own limit: refused by the body's validation
        with pytest.raises(openai.BadRequestError, match="prompt"):
            client.completions.create(model="x", prompt=["Hello"] * prompts, n=n, max_tokens=1)
        return
    with pytest.raises(openai.BadRequestError, match=f"{prompts} prompts with n {n} ask for {prompts * n} completions; "
                                                     f"at most {MAX_CANDIDATES} per request"):
        client.completions.create(model="x", prompt=["Hello"] * prompts, n=n, max_tokens=1)
    # Token-id prompts count alike, refused before they are detokenized.
    with pytest.raises(openai.BadRequestError, match=f"ask for {prompts * n} completions"):
        client.completions.create(model="x", prompt=[[12, 34]] * prompts, n=n, max_tokens=1)


def test_a_later_npc_starts_before_a_big_request_is_done(client: openai.OpenAI, no_end) -> None:
    """4 prompts x n 4 = 16 generations on 4 sequences: four rounds. In arrival order the NPC sent
    after them waited for 12 to finish; in turns it takes the first sequence that frees."""
    prompts, n, length = 4, 4, 24
    finished_at: list[float] = []
    first_chunk = threading.Event()

    def big() -> None:
        stream = client.completions.create(model="x", prompt=[f"Tale {i}: once upon a time" for i in range(prompts)],
                                           n=n, max_tokens=length, temperature=0.8, seed=3, logit_bias=no_end,
                                           stream=True)
        for chunk in stream:
            first_chunk.set()
            finished_at.extend(time.monotonic() for c in chunk.choices if c.finish_reason)

    worker = threading.Thread(target=big)
    worker.start()
    try:
        assert first_chunk.wait(120)
        stream = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Greet the player."}],
                                                max_tokens=4, logit_bias=no_end, stream=True)
        npc_first = next(time.monotonic() for chunk in stream if chunk.choices and chunk.choices[0].delta.content)
        for _ in stream:
            pass
    finally:
        worker.join(180)
    assert len(finished_at) == prompts * n
    before_npc = sum(1 for t in finished_at if t < npc_first)
    # One round (or two, should the NPC arrive as the first ends) of the big request's generations
    # at most; in arrival order it was 12 of 16.
    assert before_npc <= 2 * SEQUENCES, (before_npc, len(finished_at))
    assert npc_first < max(finished_at)
