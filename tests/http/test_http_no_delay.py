"""The HTTP API's connections send without Nagle's delay (server.py, _listening_socket).

The daemon binds its HTTP socket itself, and asyncio turns TCP_NODELAY on only for sockets made
with proto IPPROTO_TCP, which a hand-bound one is not: every reply on a kept-alive connection then
waited up to 40 ms for the client's delayed ACK of its headers. Checked here on the daemon's own
protocol and listening socket, serving a real request; no daemon or model is needed.
"""

from __future__ import annotations

import asyncio
import socket

import httpx
import uvicorn
from uvicorn.server import ServerState

from sidecar.service.openai_http.server import _HeaderTimedH11, _listening_socket


async def _hello(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _no_delay(sock) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


async def _serve_one(protocol_factory) -> tuple[list, int, list[int]]:
    """Serve one kept-alive connection of two requests: the protocols made, the last status, and
    each protocol's TCP_NODELAY while its connection is open."""
    loop = asyncio.get_running_loop()
    made: list = []
    listening = _listening_socket("127.0.0.1", 0)
    server = await loop.create_server(lambda: made.append(protocol_factory()) or made[-1], sock=listening)
    try:
        port = listening.getsockname()[1]
        async with httpx.AsyncClient() as client:
            for _ in range(2):
                status = (await client.get(f"http://127.0.0.1:{port}/")).status_code
            return made, status, [_no_delay(p.transport.get_extra_info("socket")) for p in made]
    finally:
        server.close()
        await server.wait_closed()


def test_the_daemons_http_connections_have_tcp_nodelay() -> None:
    config = uvicorn.Config(_hello, lifespan="off", log_config=None)
    config.load()
    state = ServerState()
    made, status, no_delay = asyncio.run(_serve_one(lambda: _HeaderTimedH11(config, state, {})))
    assert status == 200
    assert len(made) == 1  # one connection, kept alive across both requests
    assert no_delay[0] != 0

