"""VLMOpt on a GPU-type device: the encoder's buffers are on the device only while an image is
encoded, and freed before the answer is decoded.

Measured from the device itself: RPC0's buffers live in the RPC server's process, so its resident
memory is the device's memory in use, sampled every few milliseconds while the daemon answers.
The projector is SigLIP-shaped but cut to 4 blocks at 448 px (about 120 MB of f16 weights), so
the encoder's share stands well above the noise and one encode stays short on two cores.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.daemons import require_rpc
from support.device_helpers import DEVICE_HARDWARE, MIB
from support.no_early_stop import grpc_eog_ids, grpc_sampling
from PIL import Image

from sidecar.api import pb


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sidecar.testmodels.projector import write_siglip_projector

    return write_siglip_projector(tmp_path_factory.mktemp("vlm") / "siglip4.gguf", n_layer=4, image_size=448)


class RssSampler:
    """Resident memory of one process, sampled on a thread until stopped."""

    def __init__(self, pid: int, every_s: float = 0.005) -> None:
        self._proc = psutil.Process(pid)
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)
        self._thread.start()

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.samples.append((time.perf_counter(), self._proc.memory_info().rss))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> list[int]:
        return [rss for t, rss in self.samples if t0 <= t <= t1]


@pytest.fixture(scope="module")
def device_vision(projector: Path) -> Iterator[tuple[RunningDaemon, int]]:
    require_rpc()
    from sidecar.native.ggml_rpc import RpcServerProcess

    with RpcServerProcess(threads=1) as server:
        daemon = start_daemon("--rpc", server.endpoint, "--hardware", DEVICE_HARDWARE, "--budget", "4G",
                              "--mmproj", str(projector), "--ctx", "1024", "--parallel", "1", "--threads", "1",
                              "--no-websocket")
        try:
            yield daemon, server.process.pid
        finally:
            stop_daemon(daemon)


def screenshot() -> bytes:
    pixels = np.random.default_rng(0).integers(0, 255, (720, 1280, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


@pytest.mark.slow
def test_the_encoder_holds_device_memory_only_while_it_encodes(device_vision: tuple[RunningDaemon, int],
                                                               projector: Path) -> None:
    daemon, server_pid = device_vision
    weights = projector.stat().st_size
    with daemon.client(timeout_s=600) as client:
        status = client.status()
        assert status.vision.placement == "gpu_streamed" and status.vision.vlmopt, status.vision
        no_end = grpc_sampling(grpc_eog_ids(client), temperature=0.0)  # an answer comes, and runs its 32 tokens
        sampler = RssSampler(server_pid)
        try:
            time.sleep(0.3)
            sent = time.perf_counter()
            first_token = None
            chunks = 0
            request = pb.AskImageRequest(image=pb.Image(encoded=screenshot()), question="What is on the screen?",
                                         max_tokens=32, sampling=no_end)
            for chunk in client.ask_image_stream(request):
                if chunk.token_ids and first_token is None:
                    first_token = time.perf_counter()
                chunks += 1
            done = time.perf_counter()
            time.sleep(0.3)
        finally:
            sampler.stop()

    assert first_token is not None, "no answer came"
    before = max(sampler.between(0.0, sent))
    encoding = max(sampler.between(sent, first_token))
    decoding = max(sampler.between(first_token + 0.05, done + 0.3))
    print(f"device memory (RPC server RSS): before {before / MIB:.0f} MiB, peak while encoding "
          f"{encoding / MIB:.0f} MiB, peak while decoding {decoding / MIB:.0f} MiB; projector file {weights / MIB:.0f} MiB")
    assert encoding - before > 0.8 * weights, "the encoder's weights never reached the device"
    # Decoding touches fresh KV pages for the image's tokens (a few MiB); an encoder left loaded
    # would hold all of its weights and compute buffer (well above the file's size).
    assert decoding - before < 0.25 * weights, "the encoder's buffers were still on the device while the answer decoded"
