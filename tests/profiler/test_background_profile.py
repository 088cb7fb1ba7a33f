"""The machine profile is measured in the background, never in front of a reply: real probes
(the profiler's seconds-long tiny plan), the real engine on SmolLM2, a real daemon."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from sidecar.api import pb
from sidecar.engine import Engine, EngineConfig, Finished, GenerationSpec, Prompt, SamplingConfig, TextDelta
from sidecar.profiler.background import BackgroundProfiler, EngineActivity
from sidecar.profiler.database import load_profile
from sidecar.profiler.hardware import discover_hardware
from sidecar.profiler.plan import tiny_plan
from support.no_early_stop import engine_eog_ids, engine_sampling, grpc_eog_ids, grpc_sampling
from support.daemons import start_daemon, stop_daemon
from support.daemons import wait_for_event as _events_until

GREEDY = SamplingConfig(temperature=0.0, repeat_penalty=1.0)


def _ask(engine: Engine, text: str, eog: tuple[int, ...]) -> tuple[float, Finished]:
    """(seconds to the first token, the end) of one request. `eog`: the end-of-generation tokens,
    banned, so the request runs its 16 tokens, a first one surely among them (looked up before:
    a lookup here would wait for the engine thread inside the time measured)."""
    first: list[float] = []
    done: list[object] = []
    ended = threading.Event()
    sent = time.monotonic()

    def sink(event: object) -> None:
        if isinstance(event, TextDelta):
            first.append(time.monotonic() - sent) if not first else None
        else:
            done.append(event)
            ended.set()

    engine.submit(GenerationSpec(Prompt(text=text), max_tokens=16, sampling=engine_sampling(GREEDY, eog)), sink)
    assert ended.wait(120)
    assert isinstance(done[0], Finished), done[0]
    return first[0], done[0]


def test_a_slice_that_overlaps_engine_work_is_thrown_away(smollm2_path, tmp_path: Path) -> None:
    engine = Engine(EngineConfig(model_path=smollm2_path, n_ctx=512, threads_decode=2, threads_prefill=2))
    eog = engine_eog_ids(engine)
    asked: list[tuple[float, Finished]] = []
    started = threading.Event()

    def on_progress(done: int, total: int, step: str, discarded: int) -> None:
        # The first slice has just begun: the game speaks now.
        if step and not started.is_set():
            started.set()
            threading.Thread(target=lambda: asked.append(_ask(engine, "Once upon a time", eog)), daemon=True).start()

    landed: list[object] = []
    profiler = None
    try:
        profiler = BackgroundProfiler(
            tiny_plan(), discover_hardware(), tmp_path / "profile.json", EngineActivity(engine),
            on_progress, landed.append, cache_dir=tmp_path / "probes",
        ).start()
        # The first hand-over is what counts; on a busy machine the profiler then stays to measure
        # the deferred thread counts again once it is quiet, so it is stopped here.
        deadline = time.monotonic() + 240
        while not landed and time.monotonic() < deadline and profiler.error is None:
            time.sleep(0.2)
        assert landed or profiler.error, "the background profile never landed"
    finally:
        if profiler is not None:
            profiler.stop()
        engine.close()
    assert profiler.error is None, profiler.error
    assert asked, "no request was made during a slice"
    first_token_s, _ = asked[0]
    assert profiler.discarded >= 1, "the slice the request overlapped was kept"
    # The slice gave the cores back within a probe decode: the reply did not wait for the step.
    assert first_token_s < 2.0, first_token_s
    assert landed and (tmp_path / "profile.json").is_file()
    db = load_profile(tmp_path / "profile.json")
    assert db.entries and all(e.seconds > 0 for e in db.entries)


def test_without_a_profile_the_daemon_starts_on_defaults_and_re_plans_when_measured(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path), "XLM_SIDECAR_BACKGROUND_PROFILE_PLAN": "tiny"}
    daemon = start_daemon("--budget", "0", "--profile", "auto", env=env)  # about the profile: not off
    try:
        ready = next(e for e in daemon.log_lines if e["event"] == "ready")
        assert ready["profile"] == "defaults" and ready["planned"] is True
        with daemon.client(timeout_s=120) as client:
            assert client.status().profile.state == pb.PROFILE_STATE_DEFAULTS
            # Replies come at once on the default plan, while the profile waits for idle time.
            # (The end-of-generation tokens banned: each says something, whatever the model would.)
            no_end = grpc_sampling(grpc_eog_ids(client))
            assert "".join(client.chat("Hello!", max_tokens=8, sampling=no_end)).strip()
            _events_until(daemon, "re-planned with the measured profile", 180)
            status = client.status()
            assert status.profile.state in (pb.PROFILE_STATE_MEASURED, pb.PROFILE_STATE_REFRESHING)
            assert status.profile.source == "background"
            assert status.profile.steps_done == status.profile.steps_total > 0
            assert "".join(client.chat("And again.", max_tokens=8, sampling=no_end)).strip()
        saved = next(e for e in daemon.log_lines if e["event"] == "background profile saved")
        assert Path(saved["path"]).is_file() and Path(saved["path"]).is_relative_to(tmp_path)
    finally:
        stop_daemon(daemon)


class _IdleEngine:
    """EngineActivity's view of an engine that has had nothing to do for a long time (no engine
    is loaded: this test is about the profiler's own threads)."""

    def busy(self) -> bool:
        return False

    def idle_for(self) -> float:
        return 1e9


def test_probe_decodes_run_on_threads_that_end_with_their_slice(tmp_path: Path, monkeypatch) -> None:
    # A thread that ran a multi-threaded llama_decode keeps an OpenMP team until it exits, and
    # while it lives libgomp stops spinning between the engine's passes (sidecar.profiler.
    # slice_thread): so no probe decode may run on the profiler's own long-lived thread, and none
    # on a thread still alive once its slice has returned.
    from sidecar.profiler import kernels

    decoding: list[threading.Thread] = []
    alive_between_slices: list[str] = []
    real = kernels.ProbeSession.decode_seconds

    def recorded(self, n_tokens: int) -> float:
        me = threading.current_thread()
        if me not in decoding:
            decoding.append(me)
        return real(self, n_tokens)

    monkeypatch.setattr(kernels.ProbeSession, "decode_seconds", recorded)

    def on_progress(done: int, total: int, step: str, discarded: int) -> None:
        # Called on the profiler's thread between slices: every earlier slice's thread is gone.
        alive_between_slices.extend(t.name for t in decoding if t.is_alive())

    landed: list[object] = []
    profiler = BackgroundProfiler(
        tiny_plan(), discover_hardware(), tmp_path / "profile.json", _IdleEngine(),  # type: ignore[arg-type]
        on_progress, landed.append, cache_dir=tmp_path / "probes",
    ).start()
    try:
        deadline = time.monotonic() + 240
        while not landed and time.monotonic() < deadline and profiler.error is None:
            time.sleep(0.1)
    finally:
        profiler.stop()
    assert profiler.error is None, profiler.error
    assert landed, "the background profile never landed"
    assert len(decoding) >= 2, "the profile's steps did not each run on a thread of their own"
    assert profiler._thread not in decoding
    assert not alive_between_slices, alive_between_slices
    assert not any(t.is_alive() for t in decoding)
    assert load_profile(tmp_path / "profile.json").entries
