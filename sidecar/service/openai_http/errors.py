"""OpenAI-style error objects, with the HTTP status that matches the gRPC code of the same error.

Only this module turns our typed errors into HTTP statuses, through the one table of refusals.py, so the
two transports refuse the same request the same way: INVALID_ARGUMENT and FAILED_PRECONDITION are
400, NOT_FOUND 404, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503 (what grpc-gateway maps them to).
"""

from __future__ import annotations

import structlog
from starlette.responses import JSONResponse

from sidecar import errors
from sidecar.service.refusals import refusal_for

log = structlog.get_logger("http")


class HttpRefusal(errors.SidecarError):
    """A refusal that only HTTP has (a wrong token, a body too large, a route that is not there)."""

    def __init__(self, status: int, message: str, kind: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.code = code


class InvalidBody(errors.InvalidArgument):
    """A body that does not validate, with the field it is about (the error object's `param`)."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def unauthenticated() -> HttpRefusal:
    return HttpRefusal(401, "missing or wrong token: send 'Authorization: Bearer <token>' (the client's api_key)",
                       "authentication_error", "invalid_api_key")


def too_large(limit: int, what: str) -> HttpRefusal:
    return HttpRefusal(413, f"the request body is larger than {limit} bytes, the limit {what}",
                       "invalid_request_error", "request_too_large")


def status_for(error: BaseException) -> tuple[int, str, str]:
    """(HTTP status, OpenAI error type, code) for an error, from the one table (refusals.py).
    The code is the gRPC status name in lower case, so a log line reads the same on every edge,
    or OpenAI's own code where the table gives one (context_length_exceeded)."""
    if isinstance(error, HttpRefusal):
        return error.status, error.kind, error.code
    refusal = refusal_for(error)
    return refusal.http_status, refusal.openai_type, refusal.http_code


def error_body(error: BaseException, param: str | None = None) -> tuple[int, dict]:
    status, type_, code = status_for(error)
    if refusal_for(error).unexpected:
        log.exception("unexpected error in an HTTP call", exc_info=error)
    message = str(error) or type(error).__name__
    param = param if param is not None else getattr(error, "param", None)
    return status, {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(error: BaseException, param: str | None = None) -> JSONResponse:
    """The error object with its status, and the retry hint where there is one (a daemon still
    loading: `Retry-After`, as gRPC's pushback trailer and the bridge's retryAfterMs)."""
    status, body = error_body(error, param)
    headers = {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    retry = refusal_for(error).retry_after_header
    if retry is not None:
        headers["Retry-After"] = retry
    return JSONResponse(body, status_code=status, headers=headers or None)
