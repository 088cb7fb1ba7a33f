"""Who made a call, as its transport saw it. Only ReportFrames asks: the frame guard counts the
game's reports alone (sidecar/guard/game_clients.py) and keeps a report allowance per client."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from sidecar.guard.game_clients import Address, normalize_host


@dataclass(frozen=True)
class Caller:
    # One per connection: "grpc ipv4:127.0.0.1:51234", "ws 127.0.0.1:51234", "grpc unix:".
    key: str
    # The client's end of a TCP connection; None over a Unix socket, whose clients all look alike.
    address: Address | None
    # It presented the game token (XLM_SIDECAR_GAME_TOKEN).
    game_token: bool = False


# A call whose transport said nothing of its caller: never the game.
UNKNOWN = Caller("unknown", None)


def grpc_caller(peer: str | None, game_token: bool) -> Caller:
    """From grpc's `context.peer()`: "ipv4:127.0.0.1:51234", "ipv6:[::1]:51234" (its brackets
    sometimes percent-encoded), "unix:..."."""
    peer = peer or ""
    scheme, _, rest = peer.partition(":")
    address = None
    if scheme in ("ipv4", "ipv6"):
        host, _, port = unquote(rest).rpartition(":")
        if port.isdigit():
            address = (normalize_host(host), int(port))
    return Caller(f"grpc {peer}", address, game_token)


def socket_caller(transport: str, remote: object, game_token: bool) -> Caller:
    """From a socket's remote address: (host, port), or (host, port, flow, scope) for IPv6; a path
    or nothing for a Unix socket."""
    if isinstance(remote, tuple) and len(remote) >= 2 and isinstance(remote[1], int):
        address = (normalize_host(str(remote[0])), remote[1])
        return Caller(f"{transport} {address[0]}:{address[1]}", address, game_token)
    return Caller(f"{transport} {remote!r}", None, game_token)
