"""Cross-origin requests (CORS): off unless the daemon is told which web origins may call it.

Any web page the player visits can send requests to a port on 127.0.0.1. Without CORS headers
the browser lets the page send only "simple" requests and hides the replies; the launch token
(which a page cannot know) or, on a daemon without one, the refusal of every request with a
browser `Origin` keeps such a page from driving the model. `--cors-origin ORIGIN` names the web
UIs (a mod's browser overlay, a local tool at http://localhost:8080) that may: their preflight is
answered and their replies carry Access-Control-Allow-Origin, so the browser hands them over. No
wildcard: "*" would extend that to every page on the web (settings refuses it at launch).
Credentials (cookies) are never allowed: the token travels as a bearer header the page sends.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sidecar.service.openai_http.errors import HttpRefusal, error_response

ALLOWED_METHODS = "GET, POST, DELETE, OPTIONS"
ALLOWED_HEADERS = "authorization, content-type, x-session-id"
# What a page's script may read besides the safelisted headers: the session echoed, the clamp,
# the retry hint of a daemon still loading.
EXPOSED_HEADERS = "X-Session-Id, X-Max-Tokens-Clamped, Retry-After"
# Seconds a browser may reuse a preflight's answer (Chromium keeps at most 7200).
PREFLIGHT_MAX_AGE_S = 600


class CorsPolicy:
    """The web origins (exact: scheme, host and port, as browsers send them) that may call."""

    def __init__(self, origins: Iterable[str] = ()) -> None:
        self.origins = frozenset(origins)

    def allows(self, origin: str | None) -> bool:
        return origin is not None and origin in self.origins

    def wrap(self, app: ASGIApp) -> ASGIApp:
        # Around the app even with no origin allowed: a preflight is then told so (403), not 405.
        return _Cors(app, self)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


class _Cors:
    """ASGI middleware around the whole app, so errors and event streams carry the headers too."""

    def __init__(self, app: ASGIApp, policy: CorsPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = _header(scope, b"origin") if scope["type"] == "http" else None
        if origin is None:
            await self.app(scope, receive, send)
            return
        allowed = self.policy.allows(origin)
        if scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method") is not None:
            await self._preflight(origin, allowed)(scope, receive, send)
            return
        if not allowed:  # no headers: the browser keeps the reply from the page
            await self.app(scope, receive, send)
            return

        async def send_allowed(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *_headers(origin)]}
            await send(message)

        await self.app(scope, receive, send_allowed)

    @staticmethod
    def _preflight(origin: str, allowed: bool) -> Response:
        if not allowed:
            return error_response(HttpRefusal(403, f"the origin {origin!r} may not call this daemon (--cors-origin names "
                                                   "the ones that may)", "permission_error", "forbidden"))
        response = Response(status_code=204, headers={
            "Access-Control-Allow-Methods": ALLOWED_METHODS,
            "Access-Control-Allow-Headers": ALLOWED_HEADERS,
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
        })
        response.raw_headers.extend(_headers(origin))
        return response


def _headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin"),
            (b"access-control-expose-headers", EXPOSED_HEADERS.encode("latin-1"))]
