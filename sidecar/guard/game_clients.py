"""Which client is the game: only the game's frame reports steer the guard.

Any client with the daemon's token may call ReportFrames, and the token file gives that token to
every tool of the user's. Reports of "every frame late" from one that is not the game slowed the
NPCs to 0.31x of their speed and took the idle scheduling class for good; its clean reports undid
the game's (issue 36). So a report counts only from:

- the watched process (--parent-pid, else the daemon's parent: the game that launched it), known
  by the connection the report came on: over TCP the process that holds the client end of it (the
  socket whose local address is the caller's and whose remote address is the daemon's end), as
  psutil sees sockets (/proc on Linux, the TCP table on Windows, libproc on macOS); or
- a client that presented the game token (XLM_SIDECAR_GAME_TOKEN, which the launcher gives the
  game only): for a game on a Unix socket (whose clients all look alike), one that reports from a
  helper process, or one that did not launch the daemon.

Nothing else is trusted, not even "the first client that reports": on a Unix socket it cannot be
told from the next, and the first may as well be the tool. Everyone else is refused
(PERMISSION_DENIED) and changes nothing.
"""

from __future__ import annotations

import ipaddress
import os
import time

import psutil
import structlog

log = structlog.get_logger("guard")

# A verdict holds this long per client address. The client end of a connection stays its process's
# while the connection lasts; an address freed and taken again by another process within this time
# would need the game to drop its connection and the other to bind that very port meanwhile.
VERDICT_TTL_S = 10.0
# Lookups read every TCP socket of the machine (a few milliseconds): a flood of new connections
# must not turn them into a busy core. A client past this is told to come back (RESOURCE_EXHAUSTED);
# the game, known already, is not looked up again.
LOOKUPS_PER_S = 5.0
_MAX_VERDICTS = 1024

Address = tuple[str, int]


def normalize_host(host: str) -> str:
    """An IP address in one spelling: no brackets or zone, an IPv4-mapped IPv6 address as IPv4."""
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return host
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def _address(addr) -> Address | None:
    return (normalize_host(addr.ip), addr.port) if addr else None


class GameClients:
    """Tells whether a client address is the game's. `lookup` reads the machine's sockets: call it
    off the event loop; the rest is cheap."""

    def __init__(self, game_pid: int | None) -> None:
        self._game: psutil.Process | None = None
        if game_pid and game_pid != os.getpid():
            try:
                self._game = psutil.Process(game_pid)
            except (psutil.Error, ValueError):
                self._game = None
        self._verdicts: dict[Address, tuple[bool, float]] = {}
        self._lookups, self._lookups_at = LOOKUPS_PER_S, time.monotonic()
        self._warned = False

    @property
    def game_pid(self) -> int | None:
        return self._game.pid if self._game is not None else None

    def known(self, address: Address, now: float) -> bool | None:
        """The verdict on this address if a recent lookup gave one."""
        hit = self._verdicts.get(address)
        return hit[0] if hit is not None and now - hit[1] < VERDICT_TTL_S else None

    def may_look_up(self, now: float) -> bool:
        self._lookups = min(LOOKUPS_PER_S, self._lookups + (now - self._lookups_at) * LOOKUPS_PER_S)
        self._lookups_at = now
        if self._lookups < 1.0:
            return False
        self._lookups -= 1.0
        return True

    def remember(self, address: Address, verdict: bool, now: float) -> None:
        if len(self._verdicts) >= _MAX_VERDICTS:
            self._verdicts = {a: v for a, v in self._verdicts.items() if now - v[1] < VERDICT_TTL_S}
            if len(self._verdicts) >= _MAX_VERDICTS:
                self._verdicts.clear()
        self._verdicts[address] = (verdict, now)

    def lookup(self, address: Address) -> bool:
        """Whether the watched process holds the client end of the daemon's connection from
        `address`. Blocking (psutil reads the socket tables)."""
        game = self._game
        if game is None:
            return False
        try:
            if not game.is_running():  # gone, or its pid reused by another process
                return False
            ours = {_address(c.laddr) for c in psutil.Process().net_connections("tcp") if _address(c.raddr) == address}
            if not ours:
                return False
            return any(_address(c.laddr) == address and _address(c.raddr) in ours for c in game.net_connections("tcp"))
        except psutil.AccessDenied as e:
            if not self._warned:  # once: the game's reports will say so each time
                log.warning("cannot see the game's connections: its frame reports need XLM_SIDECAR_GAME_TOKEN",
                            pid=game.pid, error=str(e))
                self._warned = True
            return False
        except psutil.Error:
            return False
