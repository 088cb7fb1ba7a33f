"""Everything around serving that starts before the model loads and ends after the last call:
the settings that must agree (token, exposure), one daemon per port or socket, the token file,
the stop signals, and the launching game's death."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
from pathlib import Path

import structlog

from sidecar.errors import InvalidArgument
from sidecar.lifecycle.instance_lock import AlreadyServing, InstanceLock
from sidecar.lifecycle.parent_watch import ParentProcess, watch_parent
from sidecar.lifecycle.runtime_dir import endpoint_name, runtime_dir
from sidecar.service.auth import (
    GAME_TOKEN_ENV,
    TOKEN_ENV,
    Authenticator,
    check_exposure,
    default_token_file,
    generate_token,
    remove_token_file,
    validate_token,
    write_token_file,
)
from sidecar.service.grpc_server import PortInUse
from sidecar.settings import Settings

log = structlog.get_logger("lifecycle")

# When the game is gone nobody waits for the streams still running: cut the grace short so the
# daemon is gone within 2 s of the game (polling takes up to 0.25 s of that).
GRACE_AFTER_PARENT_DEATH_S = 0.5


class DaemonLifecycle:
    """Use as `async with DaemonLifecycle(settings) as lifecycle:` around loading and serving.

    On entry: checks the token and exposure settings (InvalidArgument), takes the port's or
    socket's lock (PortInUse when another daemon holds it; a stale socket file is removed),
    installs SIGINT/SIGTERM handlers and starts watching --parent-pid. `stop` is set by any of
    those; `hurry` by a second signal (skip the rest of the grace period).
    On exit: removes the token file, stops watching, releases the lock.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stop = asyncio.Event()
        self.hurry = asyncio.Event()
        self.stop_reason = ""
        self.grace_s = settings.grace_seconds
        self.serving = False
        self.token: str | None = None
        self.authenticator = Authenticator(None)
        self.token_file: Path | None = None
        self._lock: InstanceLock | None = None
        self._tasks: list[asyncio.Task] = []
        self._signals: list[int] = []

    async def __aenter__(self) -> DaemonLifecycle:
        s = self.settings
        self.token = self._resolve_token()
        self.authenticator = Authenticator(self.token, self._resolve_game_token())
        check_exposure(host=s.host, allow_remote=s.allow_remote, auth_required=self.token is not None, socket_only=s.socket is not None)
        parent = ParentProcess(s.parent_pid) if s.parent_pid is not None else None
        if self.token is not None:  # fail now, not after loading the model, if the token file cannot be written
            _check_token_file_folder(s.token_file.parent if s.token_file else None)
        self._take_lock()
        try:
            self._install_signal_handlers()
            if parent is not None:
                self._tasks.append(asyncio.create_task(watch_parent(parent, self._on_parent_death), name="parent-watch"))
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        loop = asyncio.get_running_loop()
        for sig in self._signals:
            loop.remove_signal_handler(sig)
        self._signals.clear()
        if self.token_file is not None and self.token is not None:
            remove_token_file(self.token_file, self.token)
        if self._lock is not None:
            self._lock.release()

    # -- token -----------------------------------------------------------------------------------

    def _resolve_token(self) -> str | None:
        s = self.settings
        if s.no_auth:
            return None
        if s.token is not None and s.token.get_secret_value():
            return validate_token(s.token.get_secret_value())
        return generate_token()

    def _resolve_game_token(self) -> str | None:
        secret = self.settings.game_token
        if secret is None or not secret.get_secret_value():
            return None
        game_token = validate_token(secret.get_secret_value(), GAME_TOKEN_ENV)
        if game_token == self.token:  # everyone who read the token file would be the game
            raise InvalidArgument(f"{GAME_TOKEN_ENV} must differ from {TOKEN_ENV}")
        return game_token

    def listening(self, port: int) -> Path | None:
        """Mark the daemon as serving and write the token file (it is named after the port, and
        port 0 is only resolved by binding). Returns the token file's path."""
        self.serving = True
        if self._lock is None and self.settings.socket is None:
            # Bound to a port the kernel picked: lock it now, so a daemon later started with that
            # port explicitly learns who holds it, as for any other port.
            with contextlib.suppress(AlreadyServing, OSError):
                lock = InstanceLock(runtime_dir() / f"{endpoint_name(port=port)}.lock", f"port {port}")
                lock.acquire()
                self._lock = lock
        if self.token is None:
            return None
        s = self.settings
        path = s.token_file or default_token_file(port=port, socket_path=s.socket)
        write_token_file(path, self.token)
        self.token_file = path
        return path

    def log_fields(self) -> dict[str, object]:
        """What the "listening" line says about auth: where the token is, never the token."""
        if self.token is None:
            return {"auth": "none"}
        return {"auth": "token", "token_file": str(self.token_file) if self.token_file else None}

    # -- one daemon per endpoint ---------------------------------------------------------------------

    def _take_lock(self) -> None:
        s = self.settings
        if s.socket is not None:
            what = f"unix:{s.socket}"
            name = endpoint_name(socket_path=s.socket)
        elif s.port != 0:
            what = f"port {s.port}"
            name = endpoint_name(port=s.port)
        else:
            return  # the kernel hands out a free port: no one else can have it
        try:
            lock = InstanceLock(_usable_runtime_dir() / f"{name}.lock", what)
            lock.acquire()
        except AlreadyServing as e:
            raise PortInUse(f"cannot listen on {what}: {e}") from None
        except (InvalidArgument, OSError) as e:
            if s.socket is not None:
                # Without the lock a stale socket cannot be told from a live daemon's.
                raise InvalidArgument(f"cannot lock unix:{s.socket}: {e}") from None
            log.warning("no instance lock; the port's own exclusivity still keeps a second daemon out", error=str(e))
            return
        self._lock = lock
        if s.socket is not None:
            try:
                _remove_stale_socket(Path(s.socket))
            except BaseException:
                lock.release()
                self._lock = None
                raise

    # -- stopping -----------------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Begin the graceful stop; asked twice, skip what is left of the grace period."""
        if self.stop.is_set():
            self.hurry.set()
            log.info("stopping now", reason=reason)
            return
        self.stop_reason = reason
        self.stop.set()

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.request_stop, signal.Signals(sig).name)
            except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
                continue
            self._signals.append(sig)

    def _on_parent_death(self) -> None:
        log.info("parent process is gone", parent_pid=self.settings.parent_pid)
        if not self.serving:
            # Still loading the model: nothing to drain and no file written yet, and the load
            # itself cannot be interrupted. A relaunched game must not find us holding the port.
            log.info("stopped")
            os._exit(0)
        self.grace_s = min(self.grace_s, GRACE_AFTER_PARENT_DEATH_S)
        self.request_stop("parent process exited")


def _usable_runtime_dir() -> Path:
    try:
        return runtime_dir()
    except OSError as e:
        raise InvalidArgument(
            f"cannot use the runtime folder for token and lock files ({e}); "
            "set XLM_SIDECAR_RUNTIME_DIR to a folder only you can write, or pass --token-file"
        ) from None


def _check_token_file_folder(folder: Path | None) -> None:
    if folder is None:
        _usable_runtime_dir()
        return
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise InvalidArgument(f"--token-file: cannot create {folder}: {e.strerror or e}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidArgument(f"--token-file: cannot write in {folder}")


def _remove_stale_socket(path: Path) -> None:
    """Remove a socket file left by a daemon that died without cleaning up (we hold the lock, so
    no live daemon owns it). Anything that is not a socket is the user's: refuse to touch it."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise PortInUse(f"cannot listen on unix:{path}: the path exists and is not a socket")
    path.unlink()
    log.info("removed a stale socket", path=str(path))
