"""Local security: a token per launch that every call must carry, and who may connect at all.

The token comes from XLM_SIDECAR_TOKEN, set by the launching game, or is generated per launch.
Either way the daemon writes it to an owner-only token file named after its port or socket, so
tools on the same machine (`xlm-sidecar status`) find it; anyone who can read that file could
also read the daemon's environment, so the file exposes nothing new. Transports carry the token
as gRPC metadata `authorization: Bearer <token>` or, on the WebSocket bridge, as that header or
a first frame. This module has no transport imports: the client uses it too.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import re
import secrets
import tempfile
from pathlib import Path

from sidecar.errors import InvalidArgument
from sidecar.lifecycle.runtime_dir import endpoint_name, runtime_dir

TOKEN_ENV = "XLM_SIDECAR_TOKEN"
GAME_TOKEN_ENV = "XLM_SIDECAR_GAME_TOKEN"
METADATA_KEY = "authorization"
BEARER_PREFIX = "Bearer "
MIN_TOKEN_LENGTH = 16
# Visible ASCII only: the token travels in HTTP headers and gRPC metadata.
_TOKEN_PATTERN = re.compile(r"[!-~]+")


def generate_token(nbytes: int = 32) -> str:
    """A fresh random token (256 bits, URL-safe text). Never with a leading "-": pasted after
    `--token`, argparse would take it for an option (1 token in 64 did, a test's CLI call too)."""
    while True:
        token = secrets.token_urlsafe(nbytes)
        if not token.startswith("-"):
            return token


def validate_token(token: str, name: str = TOKEN_ENV) -> str:
    """The token, or InvalidArgument when it is too short to be secret or cannot travel in a header."""
    if len(token) < MIN_TOKEN_LENGTH or not _TOKEN_PATTERN.fullmatch(token):
        raise InvalidArgument(
            f"{name} must be at least {MIN_TOKEN_LENGTH} visible ASCII characters without spaces"
        )
    return token


class Authenticator:
    """Decides whether a presented token is the daemon's. With no token, everything is let in
    (`--no-auth`, local development only).

    The game token (XLM_SIDECAR_GAME_TOKEN, optional) is let in too, and marks its holder as the
    game: its frame reports steer the guard from any process (sidecar/guard/game_clients.py). It is
    never written to the token file, so the tools that read that file are not the game."""

    def __init__(self, token: str | None, game_token: str | None = None) -> None:
        self._token = token.encode() if token is not None else None
        self._game_token = game_token.encode() if game_token is not None else None

    @property
    def required(self) -> bool:
        return self._token is not None

    def accepts(self, presented: str | None) -> bool:
        """Constant-time comparison, so response timing does not leak the token's prefix."""
        if self._token is None:
            return True
        return _same(presented, self._token) or self.is_game(presented)

    def accepts_header(self, value: str | None) -> bool:
        """Whether an `authorization` header/metadata value carries the token ("Bearer <token>")."""
        return self.accepts(token_from_header(value))

    def is_game(self, presented: str | None) -> bool:
        """Whether `presented` is the game token."""
        return self._game_token is not None and _same(presented, self._game_token)

    def is_game_header(self, value: str | bytes | None) -> bool:
        return self.is_game(token_from_header(value))


def _same(presented: str | None, token: bytes) -> bool:
    if not isinstance(presented, str):
        return False
    return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), token)


def token_from_header(value: str | bytes | None) -> str | None:
    """The token in an "authorization: Bearer <token>" value; None if absent or another scheme."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def token_from_auth_frame(value: str) -> str:
    """The token in a WebSocket {"auth": ...} frame: the token itself, or "Bearer <token>" in any
    case, as gRPC metadata and the Authorization header take it (clients reuse one string)."""
    scheme, space, rest = value.strip().partition(" ")
    if space and scheme.lower() == "bearer":
        return rest.strip()
    return value


def bearer(token: str) -> str:
    """The metadata/header value a client sends."""
    return BEARER_PREFIX + token


# -- who may connect --------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(*, host: str, allow_remote: bool, auth_required: bool, socket_only: bool) -> None:
    """InvalidArgument unless the listening setup is one we allow: loopback, or a remote-reachable
    address explicitly asked for with --allow-remote and protected by a token."""
    if allow_remote and not auth_required:
        raise InvalidArgument("--allow-remote needs a token: it cannot be combined with --no-auth")
    # --host may list several addresses (127.0.0.1,::1): loopback only if every one is.
    remote = [h.strip() for h in host.split(",") if not is_loopback(h.strip())]
    if not socket_only and not allow_remote and remote:
        raise InvalidArgument(
            f"--host {', '.join(remote)} accepts calls from other machines; pass --allow-remote to mean it "
            "(a token is then required), or listen on 127.0.0.1"
        )


# -- token files -----------------------------------------------------------------------------------


def default_token_file(port: int | None = None, socket_path: str | os.PathLike[str] | None = None) -> Path:
    """Where a daemon on this port (or socket) writes its token: <runtime dir>/<endpoint>.token."""
    return runtime_dir() / f"{endpoint_name(port, socket_path)}.token"


def write_token_file(path: Path, token: str) -> None:
    """Write atomically with owner-only permissions: readers see the old file or the whole new one,
    and the token is never readable by others, not even for a moment."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".token-", dir=path.parent)  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(token + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_token_file(path: Path, token: str) -> None:
    """Remove the file if it still holds this token (a newer daemon may have replaced it)."""
    with contextlib.suppress(OSError):
        if path.read_text(encoding="ascii").strip() == token:
            path.unlink()


def read_token_file(path: str | os.PathLike[str]) -> str:
    return Path(path).read_text(encoding="ascii").strip()


def find_token(address: str, token_file: str | os.PathLike[str] | None = None) -> str | None:
    """The token a client should send to the daemon at `address`: from `token_file` if given, else
    XLM_SIDECAR_TOKEN, else the daemon's default token file for that port or socket. None when
    there is none (a daemon started with --no-auth needs none)."""
    if token_file is not None:
        return read_token_file(token_file)
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    try:
        socket_path, port = parse_address(address)
        path = default_token_file(port, socket_path)
        return read_token_file(path) if path.is_file() else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def parse_address(address: str) -> tuple[str | None, int | None]:
    """(socket path, None) for "unix:PATH" / "unix://PATH", (None, port) for "host:port"."""
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        if path.startswith("//"):
            path = path[2:]
        return path, None
    _, _, port = address.rpartition(":")
    return None, int(port)
