"""The one table from our typed errors to what each transport says: the gRPC status (which the
WebSocket bridge sends by name), the HTTP status and OpenAI error type, and the retry hint.

Every edge reads this table, so the three ways in refuse the same request the same way, and a
retry hint reaches every client: gRPC's `grpc-retry-pushback-ms` trailer (which gRPC's own retry
policies honour), the bridge's `retryAfterMs` field, HTTP's `Retry-After`. The HTTP statuses are
the ones grpc-gateway maps the gRPC codes to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import grpc

from sidecar import errors


@dataclass(frozen=True)
class Refusal:
    """How one error is told to a caller."""

    grpc_code: grpc.StatusCode
    http_status: int
    openai_type: str
    message: str
    # Milliseconds after which trying again may work; None when retrying the same request is futile.
    retry_after_ms: int | None
    # Not one of our typed errors: a bug, which the edge logs with its traceback.
    unexpected: bool
    # Retrying is futile (the daemon is shutting down): gRPC clients are told so by a pushback
    # of -1, which ends their retry policy at once.
    futile: bool = False
    # OpenAI's own error code where it has one for this refusal; else the gRPC name in lower case.
    openai_code: str | None = None

    @property
    def grpc_pushback(self) -> str | None:
        """The `grpc-retry-pushback-ms` trailer (gRFC A6): a delay, or -1 for "do not retry"."""
        if self.futile:
            return "-1"
        return None if self.retry_after_ms is None else str(self.retry_after_ms)

    @property
    def code_name(self) -> str:
        """The gRPC status name ("INVALID_ARGUMENT"), as the bridge's frames and logs carry it."""
        return self.grpc_code.name

    @property
    def http_code(self) -> str:
        """The `code` of HTTP's error object."""
        return self.openai_code or self.code_name.lower()

    @property
    def retry_after_header(self) -> str | None:
        """HTTP's Retry-After, in whole seconds (at least 1)."""
        return None if self.retry_after_ms is None else str(max(1, math.ceil(self.retry_after_ms / 1000)))


# (our error, gRPC code, HTTP status, OpenAI error type, OpenAI code or None); the first match
# wins, so subclasses first.
_TABLE: list[tuple[type[errors.SidecarError], grpc.StatusCode, int, str, str | None]] = [
    (errors.ContextLengthExceeded, grpc.StatusCode.INVALID_ARGUMENT, 400, "invalid_request_error", "context_length_exceeded"),
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT, 400, "invalid_request_error", None),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED, 429, "rate_limit_error", None),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND, 404, "not_found_error", None),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED, 403, "permission_error", None),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION, 400, "invalid_request_error", None),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE, 503, "server_error", None),
    (errors.Unimplemented, grpc.StatusCode.UNIMPLEMENTED, 501, "server_error", None),
    (errors.ModelLoadError, grpc.StatusCode.FAILED_PRECONDITION, 400, "invalid_request_error", None),
    (errors.EngineFailure, grpc.StatusCode.INTERNAL, 500, "server_error", None),
]


def refusal_for(error: BaseException) -> Refusal:
    """How to tell a caller about `error`; INTERNAL / 500 for anything we did not type."""
    message = str(error) or type(error).__name__
    retry = getattr(error, "retry_after_ms", None)
    for kind, code, status, openai_type, openai_code in _TABLE:
        if isinstance(error, kind):
            return Refusal(code, status, openai_type, message, retry, unexpected=False,
                           futile=isinstance(error, errors.ShuttingDown), openai_code=openai_code)
    return Refusal(grpc.StatusCode.INTERNAL, 500, "server_error", message, None,
                   unexpected=not isinstance(error, errors.SidecarError))
