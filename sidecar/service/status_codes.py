"""The one place where our typed errors become gRPC status codes (the transport edge)."""

from __future__ import annotations

import grpc

from sidecar import errors

_CODES: list[tuple[type[errors.SidecarError], grpc.StatusCode]] = [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.Unimplemented, grpc.StatusCode.UNIMPLEMENTED),
    (errors.ModelLoadError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.EngineFailure, grpc.StatusCode.INTERNAL),
]


def status_code_for(error: BaseException) -> grpc.StatusCode:
    """The gRPC status code for an error; INTERNAL for anything we did not type."""
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL
