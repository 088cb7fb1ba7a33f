"""Screenshots do not stall dialogue: a CPU encoder runs in its own process beside the decode loop.

The projector is SigLIP-shaped (gemma3 head, 1152 wide) but cut to 4 blocks at 672 px, so one
encode takes seconds on two cores: long enough that a stream stalled behind it shows a gap of
that length, short enough for CI. Weights are random; what is tested is timing and lifecycle.
"""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
from PIL import Image

from support.daemons import start_daemon, stop_daemon
from support.no_early_stop import grpc_eog_ids, grpc_sampling
from sidecar.api import pb
from sidecar.engine.image_encodes import split_threads

GREEDY = pb.SamplingParams(temperature=0.0)
STORY = "Tell me a very long story about a lighthouse keeper and the sea, with many chapters."


def screenshot_1440p(seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (1440, 2560, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=80)
    return out.getvalue()


@pytest.fixture(scope="module")
def beside_daemon(tmp_path_factory: pytest.TempPathFactory):
    from sidecar.testmodels.projector import write_siglip_projector

    projector = write_siglip_projector(tmp_path_factory.mktemp("beside") / "siglip4.gguf", n_layer=4, image_size=672)
    running = start_daemon("--mmproj", str(projector), "--no-websocket", "--no-http", "--parallel", "4")
    yield running
    stop_daemon(running)


@pytest.fixture(scope="module")
def no_end(beside_daemon) -> pb.SamplingParams:
    """Greedy with the end-of-generation tokens banned: a reply runs its whole max_tokens."""
    with beside_daemon.client(timeout_s=120) as c:
        return grpc_sampling(grpc_eog_ids(c), temperature=0.0)


def _workers(daemon) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(daemon.process.pid).children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "encode_worker" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:  # gone between the listing and the look
            continue
    return found


def _wait_for_worker(daemon, timeout_s: float = 60.0) -> psutil.Process:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = _workers(daemon)
        if workers:
            return workers[0]
        time.sleep(0.1)
    raise AssertionError("no vision worker process beside the daemon")


class Stream(threading.Thread):
    """One long Generate stream, recording when each chunk arrived. `sampling` bans the
    end-of-generation tokens: the stream is surely still running while the screenshot encodes.
    `stop()` closes it (a cancel) once the test has seen what it needs: run to its max_tokens it
    went on for 10-15 s after the encode, a core's worth of the suite's time for nothing."""

    def __init__(self, client, sampling: pb.SamplingParams) -> None:
        super().__init__(daemon=True)
        self._client = client
        self._sampling = sampling
        self._enough = threading.Event()
        self.arrivals: list[float] = []
        self.error: grpc.RpcError | None = None

    def run(self) -> None:
        request = pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=STORY)]),
                                     max_tokens=1500, sampling=self._sampling)
        chunks = self._client.generate(request)
        try:
            for _ in chunks:
                self.arrivals.append(time.perf_counter())
                if self._enough.is_set():
                    break
        except grpc.RpcError as e:
            self.error = e
        finally:
            chunks.close()  # cancels the call

    def stop(self) -> None:
        self._enough.set()
        self.join(timeout=60)


def test_the_thread_split_never_runs_more_threads_than_the_cap() -> None:
    assert split_threads(2, 2, decoding=True) == split_threads(2, 1, decoding=True)
    assert (split_threads(2, 2, decoding=True).encoder, split_threads(2, 2, decoding=True).per_pass) == (1, 1)
    assert split_threads(2, 2, decoding=False).encoder == 2  # alone, the encoder takes every thread
    eight = split_threads(8, 4, decoding=True)
    assert (eight.encoder, eight.per_pass) == (4, 4)
    assert split_threads(8, 2, decoding=True).encoder == 6
    assert split_threads(1, 1, decoding=True).encoder == 1  # one thread: they can only take turns


def test_other_conversations_keep_streaming_while_a_screenshot_is_encoded(beside_daemon, no_end) -> None:
    _wait_for_worker(beside_daemon)
    with beside_daemon.client(timeout_s=300) as client:
        stream = Stream(client, no_end)
        stream.start()
        while len(stream.arrivals) < 5:
            time.sleep(0.02)
            assert stream.is_alive(), "the stream ended before the image question was sent"
        asked = time.perf_counter()
        final = list(client.ask_image_stream(pb.AskImageRequest(
            image=pb.Image(encoded=screenshot_1440p()), question="What is on the screen?", max_tokens=4,
            sampling=GREEDY)))[-1].final
        # Streaming still, 1,500 tokens not reached: it neither failed nor ended during the encode.
        assert stream.is_alive() and stream.error is None, stream.error
        stream.stop()
    encode_s = final.image.encode_ms / 1000.0
    assert encode_s > 1.0, f"the encode took {encode_s:.2f} s: too short to show a stall"
    # The encode ran inside [asked, asked + encode_s + start-up]; the stream's chunks during it:
    end = asked + encode_s
    window = [t for t in stream.arrivals if asked + 0.2 <= t <= end]
    gaps = np.diff([asked, *window, min(end, stream.arrivals[-1])])  # a stall may run to the end
    assert len(window) >= 3, f"only {len(window)} chunks of the other stream during a {encode_s:.1f} s encode"
    print(f"longest gap of the other stream: {gaps.max():.2f} s during a {encode_s:.1f} s encode")
    # Relative to the encode, so it scales with the machine: the defect stalled the stream for
    # the whole encode (3.56 s of 3.9 s); a stream that keeps going has gaps of one decode step.
    assert gaps.max() < encode_s / 2, f"the stream stalled {gaps.max():.2f} s during a {encode_s:.1f} s encode"


def test_a_cancelled_screenshot_question_stops_its_encode_at_once(beside_daemon) -> None:
    worker = _wait_for_worker(beside_daemon)
    with beside_daemon.client(timeout_s=300) as client:
        calls = client._stub.AskImage(pb.AskImageRequest(
            image=pb.Image(encoded=screenshot_1440p(seed=1)), question="What now?", max_tokens=4, sampling=GREEDY))
        deadline = time.monotonic() + 30
        while worker.cpu_percent(interval=0.2) < 50:  # the encode has started
            assert time.monotonic() < deadline, "the worker never started encoding"
        calls.cancel()
        cancelled = time.monotonic()
        gone = False
        while time.monotonic() - cancelled < 2.0:
            if not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE:
                gone = True
                break
            time.sleep(0.05)
        assert gone, "the encode went on after its question was cancelled"
        # A fresh worker is ready, and the next question is answered in full.
        fresh = _wait_for_worker(beside_daemon)
        assert fresh.pid != worker.pid
        final = list(client.ask_image_stream(pb.AskImageRequest(
            image=pb.Image(encoded=screenshot_1440p(seed=2)), question="And now?", max_tokens=4,
            sampling=GREEDY)))[-1].final
    assert final.image.image_tokens > 0 and final.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)


def test_a_vision_worker_that_dies_fails_only_its_own_question(beside_daemon, no_end) -> None:
    worker = _wait_for_worker(beside_daemon)
    with beside_daemon.client(timeout_s=300) as client:
        errors: list[grpc.RpcError] = []

        def ask() -> None:
            try:
                list(client.ask_image_stream(pb.AskImageRequest(
                    image=pb.Image(encoded=screenshot_1440p(seed=3)), question="?", max_tokens=4, sampling=GREEDY)))
            except grpc.RpcError as e:
                errors.append(e)

        asking = threading.Thread(target=ask)
        asking.start()
        deadline = time.monotonic() + 30
        while worker.cpu_percent(interval=0.2) < 50:
            assert time.monotonic() < deadline, "the worker never started encoding"
        worker.kill()  # as the OOM killer would
        asking.join(timeout=60)
        assert errors and errors[0].code() == grpc.StatusCode.INTERNAL and "vision worker" in errors[0].details()
        assert "".join(client.chat("Say hello.", max_tokens=8, sampling=no_end)).strip()  # no end at once
        final = list(client.ask_image_stream(pb.AskImageRequest(
            image=pb.Image(encoded=screenshot_1440p(seed=4)), question="Again?", max_tokens=2,
            sampling=GREEDY)))[-1].final
        assert final.image.image_tokens > 0
