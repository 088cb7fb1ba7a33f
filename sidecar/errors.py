"""Typed errors. Code inside the daemon raises these; only the transport edge turns them into
status codes (see sidecar.service.refusals), so no one ever parses an error's text."""

from __future__ import annotations


class SidecarError(Exception):
    """Base of every error the daemon reports to a caller. `recoverable` errors concern one
    request; the daemon and every other conversation carry on."""

    recoverable = True


class InvalidArgument(SidecarError):
    """The request (or a flag) is malformed: bad parameters, empty prompt, a budget that is not a size."""


class ContextLengthExceeded(InvalidArgument):
    """The prompt is longer than the daemon takes in one request (--max-prompt-tokens, or the
    context it must fit). OpenAI's clients know it by its own code (context_length_exceeded): a
    plugin trims its history on it instead of showing an error."""


class ResourceExhausted(SidecarError):
    """A limit is reached: too many sessions, a prompt longer than the context, a full queue."""


class NotFound(SidecarError):
    """The request names something the daemon does not have, e.g. an unknown session."""


class PermissionDenied(SidecarError):
    """The caller holds the token but this call is not its to make: frame reports from a client
    that is not the game (sidecar/guard/game_clients.py)."""


class FailedPrecondition(SidecarError):
    """The daemon lacks a part the request needs, e.g. a vision projector."""


class Unavailable(SidecarError):
    """The daemon is draining or reloading and cannot take the request now; retrying later may work."""


class ShuttingDown(Unavailable):
    """The daemon is draining and takes no new work. Retrying the same daemon is futile, so
    clients are told not to (gRPC's pushback of -1): a game's retry policy then gives up at once
    instead of spending its attempts."""

    def __init__(self, message: str = "the daemon is shutting down") -> None:
        super().__init__(message)


class NotReady(Unavailable):
    """The daemon listens but is still getting ready (loading the model): retry after `retry_after_ms`.

    Refused rather than queued: a launcher polls health or WatchState anyway, a load may still fail
    (and a queued call would then hang until it did), and a retry hint is what gRPC's own retry
    policies understand (the `grpc-retry-pushback-ms` trailer)."""

    def __init__(self, message: str, retry_after_ms: int = 500) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class Unimplemented(SidecarError):
    """The API declares this call but this version of the daemon does not do it yet."""


class ModelLoadError(SidecarError):
    """The model file is missing, not a GGUF, truncated, or rejected by llama.cpp. Fatal at start-up."""

    recoverable = False


class EngineFailure(SidecarError):
    """llama.cpp failed in a way that is not the caller's fault (e.g. decode returned an error)."""

    recoverable = False
