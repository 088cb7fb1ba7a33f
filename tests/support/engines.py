"""One engine factory and one sink collector, for the tests that drive an Engine in this process.

The defaults are what those tests need to compare tokens: pinned threads for decode and prefill
(two, or the worker's share of the cores: worker_threads.py) and no thread governor (llama.cpp
gives the same tokens only for the same thread count and batch layout: README, "Tests on any
machine"). A test passes what it is about (n_seq, the prompt limit, a prefix cache...).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sidecar.backend.requests import TextDelta
from sidecar.engine import Engine, EngineConfig, Finished, GenerationSpec
from sidecar.errors import SidecarError
from support.worker_threads import PINNED

DEFAULTS = dict(n_ctx=1024, threads_decode=PINNED, threads_prefill=PINNED, adaptive_threads=False)


def engine_config(path: Path, **changes: object) -> EngineConfig:
    return EngineConfig(model_path=path, **{**DEFAULTS, **changes})  # type: ignore[arg-type]


@contextmanager
def open_engine(path: Path, **changes: object) -> Iterator[Engine]:
    """An engine on `path` (engine_config's defaults with `changes`), closed at the end: a
    module's fixture is `with open_engine(smollm2_path, n_seq=2) as e: yield e`."""
    engine = Engine(engine_config(path, **changes))
    try:
        yield engine
    finally:
        engine.close()


class Stream:
    """The sink of one request: collects its text deltas and its end; `done` is set at the end.
    `on_delta` sees each delta as it arrives (to cancel, to time)."""

    def __init__(self, on_delta: Callable[[TextDelta], None] | None = None) -> None:
        self.deltas: list[TextDelta] = []
        self.end: object = None
        self.done = threading.Event()
        self._on_delta = on_delta

    def __call__(self, event: object) -> None:
        if isinstance(event, TextDelta):
            self.deltas.append(event)
            if self._on_delta is not None:
                self._on_delta(event)
        else:
            self.end = event
            self.done.set()

    @property
    def text(self) -> str:
        return "".join(d.text for d in self.deltas)

    @property
    def tokens(self) -> list[int]:
        return [t for d in self.deltas for t in d.token_ids]

    def result(self, timeout: float = 300) -> Finished:
        """The request's Finished; its error raised if it ended in one."""
        assert self.done.wait(timeout), "the engine never finished the request"
        if isinstance(self.end, SidecarError):
            raise self.end
        assert isinstance(self.end, Finished), self.end
        return self.end


def run(engine: Engine, spec: GenerationSpec, on_delta: Callable[[TextDelta], None] | None = None,
        timeout: float = 300) -> tuple[list[TextDelta], Finished]:
    """Submit `spec` and wait for its end: its deltas and its Finished (an error is raised)."""
    stream = Stream(on_delta)
    engine.submit(spec, stream)
    return stream.deltas, stream.result(timeout)
