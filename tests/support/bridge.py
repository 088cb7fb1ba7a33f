"""A blocking test client for the WebSocket bridge, and the requests the transport tests share:
a call that surely runs long (COUNTING), one-thread daemons (ONE_THREAD)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

from websockets.sync.client import ClientConnection, connect

from support.no_early_stop import default_eog_ids, http_bias

TERMINAL = ("end", "result", "error")
# Test daemons decode with one thread: on a small machine shared with other work, llama.cpp's
# threads spin-waiting for each other can slow decoding a hundredfold, and these tests are about
# the transports, not speed.
ONE_THREAD = ("--threads", "1")
# A call that is surely still running when a test cancels it or sends SIGTERM: the model's
# end-of-generation tokens banned (no_early_stop.py), it runs to max_tokens whatever it would say.
# (Greedy without a repeat penalty SmolLM2 also goes on counting here for hundreds of tokens on
# the CPUs tried, but that is a prediction, and another CPU's kernels may round to an end.)
# Every daemon these tests start serves the default model, so its ids are the ones to ban.
LONG_PROMPT = "Here is a very long list of every number from 1 to 1000:\n1\n2\n3\n"
NO_END = http_bias(default_eog_ids())  # SamplingParams.logitBias in the JSON mapping
COUNTING = {"prompt": LONG_PROMPT, "sampling": {"temperature": 0, "repeatPenalty": 1, "logitBias": NO_END}}


class BridgeClient:
    """A blocking test client for the bridge: send frames, read frames, run whole calls."""

    def __init__(self, url: str, token: str | None, *, header: bool = True, **kwargs: object) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token and header else None
        self.ws: ClientConnection = connect(url, additional_headers=headers, open_timeout=60, max_size=None, **kwargs).__enter__()
        self._stash: list[dict] = []

    def __enter__(self) -> BridgeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.ws.close()

    def send(self, frame: dict | str | bytes) -> None:
        self.ws.send(json.dumps(frame) if isinstance(frame, dict) else frame)

    def recv(self, timeout: float = 120) -> dict:
        if self._stash:
            return self._stash.pop(0)
        return json.loads(self.ws.recv(timeout=timeout))

    def frames_of(self, call_id: object, timeout: float = 120) -> Iterator[dict]:
        """Frames of one call up to and including its terminal frame; others are kept for later."""
        deadline = time.monotonic() + timeout
        kept = []
        try:
            while True:
                for i, frame in enumerate(self._stash):
                    if frame.get("id") == call_id and type(frame.get("id")) is type(call_id):
                        self._stash.pop(i)
                        break
                else:
                    frame = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
                    if frame.get("id") != call_id or type(frame.get("id")) is not type(call_id):
                        kept.append(frame)
                        continue
                yield frame
                if any(k in frame for k in TERMINAL):
                    return
        finally:
            self._stash.extend(kept)

    def call(self, method: str, request: dict | None = None, call_id: object = "c", **extra: object) -> list[dict]:
        frame = {"id": call_id, "method": method, **extra}
        if request is not None:
            frame["request"] = request
        self.send(frame)
        return list(self.frames_of(call_id))


def status_over_bridge(client: BridgeClient) -> dict:
    [frame] = client.call("GetStatus", call_id="status")
    return frame["result"]


def wait_until_idle(client: BridgeClient, timeout_s: float = 30.0) -> dict:
    """Poll until no request occupies a sequence; returns the last status."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = status_over_bridge(client)
        if status["throughput"]["requestsActive"] == 0 or time.monotonic() > deadline:
            return status
        time.sleep(0.1)
