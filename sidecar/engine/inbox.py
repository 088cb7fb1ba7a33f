"""What other threads hand the engine thread, through its one queue: requests (Job), reloads
(ReloadRequest), calls on the model (ModelCall), and these two signals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from sidecar.backend.requests import Job
from sidecar.engine.model_calls import ModelCall
from sidecar.engine.reload import ReloadRequest


@dataclass(frozen=True)
class ImageReady:
    """The vision worker's reply thread has an image's embeddings: admission may go on."""


@dataclass(frozen=True)
class Stop:
    """close(): finish what runs as cancelled, refuse what waits, end the thread."""


InboxMessage = Union[Job, ReloadRequest, ModelCall, ImageReady, Stop]
