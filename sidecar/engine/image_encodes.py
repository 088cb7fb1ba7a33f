"""Screenshots encoded beside the decode loop, not in it (CPU encoders; see encode_worker.py).

A request with an image waits in the engine's queue, holding no sequence, while the vision worker
encodes its image; every other conversation keeps decoding meanwhile, on the threads the split
below leaves it. When the embeddings arrive the request is admitted like any other and its image
is fed into its own sequence. A cancelled question kills the worker mid-encode. Engine thread
only, but for `_done`, which the worker's reply thread calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from sidecar.backend.requests import Job
from sidecar.errors import SidecarError
from sidecar.vision.encode_worker import EncodeRequest
from sidecar.vision.encoder import EncodedImage, EncoderStats
from sidecar.vision.encoder_process import EncoderProcess, Outcome, merged_stats
from sidecar.vision.encoder_settings import EncoderSettings


@dataclass(frozen=True)
class ThreadSplit:
    encoder: int  # threads the encoder runs with
    per_pass: int  # most threads one forward pass may use while it runs


def split_threads(cap: int, decode_threads: int, decoding: bool) -> ThreadSplit:
    """Share `cap` CPU threads (the plan's most, under the game's cap) between one encode and the
    decode loop, never running more threads than the cap together while both have work.

    Nobody decoding: the encoder takes every thread (a conversation that starts during the encode
    gets one, the only oversubscription allowed). Otherwise decode keeps its one-token tier's
    threads, up to half the cap, and the encoder gets the rest. Measured on 2 cores with a
    SigLIP-class encoder (1440p screenshot) beside one stream: 1 + 1 threads kept the stream at
    34% of its solo speed with 75 ms gaps and encoded in 1.8x the solo time; 2 encoder threads
    beside 1 decode thread encoded in 1.48x but left the stream 28% (the encoder's memory traffic,
    not only its threads, slows decode). Oversubscribing also takes cores from the game.
    """
    cap = max(1, cap)
    if not decoding:
        return ThreadSplit(encoder=cap, per_pass=1)
    keep = max(1, min(decode_threads, cap // 2))
    return ThreadSplit(encoder=max(1, cap - keep), per_pass=keep)


class ImageEncodes:
    """The queue of images waiting for the vision worker, and the one it is encoding."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._process = EncoderProcess()
        self.settings: EncoderSettings | None = None
        self._model_path: Path | None = None
        self._text_n_embd = 0
        self.stats = EncoderStats()
        self._current: Job | None = None
        self._split: ThreadSplit | None = None

    def configure(self, settings: EncoderSettings | None, model_path: Path, text_n_embd: int) -> None:
        """Encoders that run on the CPU come here (None: none, or it runs in the loop on a GPU).
        An encode in flight finishes with the settings it started with."""
        self.settings, self._model_path, self._text_n_embd = settings, model_path, text_n_embd
        if settings is not None:
            self._process.prestart()

    def wants(self, job: Job) -> bool:
        return self.settings is not None and job.spec.asks_about_image and job.spec.image is not None

    def pending(self, job: Job) -> bool:
        """The job's image is not encoded yet: it must not be admitted."""
        return self.wants(job) and job.encoded is None

    def has_work(self, waiting: Iterable[Job]) -> bool:
        """An encode runs, or an image waits for one: the engine must keep polling."""
        return self._current is not None or any(self.pending(j) for j in waiting)

    def per_pass_threads(self, threads: int) -> int:
        """`threads` for a forward pass, under the split while an encode runs."""
        split = self._split
        return min(threads, split.per_pass) if split is not None and self._current is not None else threads

    def poll(self, waiting: Iterable[Job], cap: int, decode_threads: int, decoding: bool) -> None:
        """Stop a cancelled encode, and start the next image when the worker is free."""
        current = self._current
        if current is not None and current.cancelled:
            self._process.cancel()
            self._current = None
        if self._current is not None:
            return
        job = next((j for j in waiting if self.pending(j) and not j.cancelled), None)
        if job is None:
            return
        self._split = split_threads(cap, decode_threads, decoding)
        settings = self.settings
        request = EncodeRequest(self._model_path, self._text_n_embd, _with_threads(settings, self._split.encoder), job.spec.image)
        self._current = job
        self._process.start(request, lambda outcome, stats: self._done(job, outcome, stats, settings))

    def _done(self, job: Job, outcome: Outcome, stats: EncoderStats | None, settings: EncoderSettings) -> None:
        # Reply thread: publish, then wake the engine. The engine reads job.encoded only after it
        # sees _current cleared or the wake-up, and a reference assignment is atomic.
        self.stats = merged_stats(self.stats, stats, settings.resident)
        job.encoded = outcome
        if self._current is job:
            self._current = None
        self._wake()

    def take(self, job: Job) -> EncodedImage:
        """The job's embeddings; raises what the encode raised."""
        outcome = job.encoded
        if isinstance(outcome, SidecarError):
            raise outcome
        return outcome

    def worker_bytes(self) -> int:
        return self._process.resident_bytes() if self.settings is not None else 0

    def close(self) -> None:
        self._current = None
        self._process.close()


def _with_threads(settings: EncoderSettings, threads: int) -> EncoderSettings:
    return replace(settings, threads=threads)
