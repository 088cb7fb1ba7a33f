"""OpenAI-style error objects, with the HTTP status that matches the gRPC code of the same error.

Only this module turns our typed errors into HTTP statuses, as status_codes does for gRPC, so the
two transports refuse the same request the same way: INVALID_ARGUMENT and FAILED_PRECONDITION are
400, NOT_FOUND 404, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503 (what grpc-gateway maps them to).
"""

from __future__ import annotations

import structlog
from starlette.responses import JSONResponse

from sidecar import errors
from sidecar.service.status_codes import status_code_for

log = structlog.get_logger("http")


class HttpRefusal(errors.SidecarError):
    """A refusal that only HTTP has (a wrong token, a body too large, a route that is not there)."""

    def __init__(self, status: int, message: str, kind: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.code = code


def unauthenticated() -> HttpRefusal:
    return HttpRefusal(401, "missing or wrong token: send 'Authorization: Bearer <token>' (the client's api_key)",
                       "authentication_error", "invalid_api_key")


def too_large(limit: int, what: str) -> HttpRefusal:
    return HttpRefusal(413, f"the request body is larger than {limit} bytes, the limit {what}",
                       "invalid_request_error", "request_too_large")


# (our error, HTTP status, OpenAI error type); the first match wins.
_STATUS: list[tuple[type[errors.SidecarError], int, str]] = [
    (errors.InvalidArgument, 400, "invalid_request_error"),
    (errors.FailedPrecondition, 400, "invalid_request_error"),
    (errors.NotFound, 404, "not_found_error"),
    (errors.ResourceExhausted, 429, "rate_limit_error"),
    (errors.Unavailable, 503, "server_error"),
    (errors.Unimplemented, 501, "server_error"),
]


def status_for(error: BaseException) -> tuple[int, str, str]:
    """(HTTP status, OpenAI error type, code) for an error; 500 for anything we did not type.
    The code is the gRPC status name in lower case, so a log line reads the same on both edges."""
    if isinstance(error, HttpRefusal):
        return error.status, error.kind, error.code
    for kind, status, type_ in _STATUS:
        if isinstance(error, kind):
            return status, type_, status_code_for(error).name.lower()
    return 500, "server_error", "internal"


def error_body(error: BaseException, param: str | None = None) -> tuple[int, dict]:
    status, type_, code = status_for(error)
    if status == 500 and not isinstance(error, errors.SidecarError):
        log.exception("unexpected error in an HTTP call", exc_info=error)
    message = str(error) or type(error).__name__
    return status, {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(error: BaseException, param: str | None = None) -> JSONResponse:
    status, body = error_body(error, param)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)
