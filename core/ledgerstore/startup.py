"""Start-up checks shared by the bookie and the standalone: each failure becomes one line that
says what was asked, what was found and what to do, before anything (a cookie, a registration)
is written."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import socket
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ledgerstore.api import MetadataStore
from ledgerstore.errors import LedgerStoreError, MetadataError
from ledgerstore.meta import layout
from ledgerstore.plugins import create_metadata_store

log = logging.getLogger(__name__)

#: loggers of metadata client libraries that print a line per reconnect attempt; silenced while a
#: process connects at start, where the final error already says what failed
NOISY_CLIENT_LOGGERS = ("kazoo", "kazoo.client", "kazoo.protocol.connection", "aetcd", "grpc", "grpc._cython")


class StartupError(LedgerStoreError):
    """A process could not start: a directory, a port or the metadata store is not usable."""


def prepare_dirs(dirs: Iterable[tuple[str, Path]]) -> None:
    """Create every directory and prove it writable; raise StartupError naming the option and the
    path on the first that is a file, cannot be created or cannot be written."""
    for option, path in dirs:
        if path.exists() and not path.is_dir():
            raise StartupError(f"{option} {path} is a file, not a directory; point {option} at a directory")
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except NotADirectoryError:
            raise StartupError(f"{option} {path}: a parent of it is a file, not a directory") from None
        except OSError as exc:
            raise StartupError(f"{option} {path} is not writable ({exc.strerror}); fix its permissions or "
                               f"choose another directory") from None


def port_holder(port: int) -> str | None:
    """``"pid 1234 (python3)"`` for the process listening on TCP ``port`` on this machine, when
    /proc tells (Linux, and a process we may inspect); else None."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(fields[9])
        except OSError:
            continue
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in wanted for fd in os.listdir(f"/proc/{pid}/fd")):
                with open(f"/proc/{pid}/comm") as fh:
                    return f"pid {pid} ({fh.read().strip()})"
        except OSError:
            continue
    return None


def address_in_use(what: str, address: str, port: int) -> StartupError:
    holder = port_holder(port)
    by = f" by {holder}" if holder else ""
    return StartupError(f"cannot listen on {address} ({what}): port {port} is already in use{by}; "
                        f"stop that process or choose another port")


def listen_error(what: str, address: str, port: int, exc: OSError) -> StartupError:
    """The one-line error for a failed bind of ``address``."""
    if exc.errno == errno.EADDRINUSE:
        return address_in_use(what, address, port)
    return StartupError(f"cannot listen on {address} ({what}): {exc.strerror or exc}")


def check_port_free(what: str, host: str, port: int) -> None:
    """Raise StartupError if ``host:port`` cannot be bound now (a port another process holds)."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
    except OSError as exc:
        raise listen_error(what, f"{host}:{port}", port, exc) from None
    finally:
        s.close()


@contextlib.contextmanager
def quiet_client_libraries() -> Iterator[None]:
    """Silence the metadata client libraries' per-attempt reconnect logs for the duration."""
    saved = {name: logging.getLogger(name).level for name in NOISY_CLIENT_LOGGERS}
    for name in NOISY_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


async def start_metadata_store(uri: str, options: dict[str, Any], retry_s: float) -> MetadataStore:
    """Start the metadata store at ``uri`` and read from it once, retrying failures with backoff
    for ``retry_s`` seconds (a store that is restarting, sqlite's "database is locked" while other
    bookies compact); past that, one StartupError line names the store and the last failure."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + retry_s
    delay = 0.1
    warned = False
    while True:
        store: MetadataStore = create_metadata_store(uri, **options)
        try:
            with quiet_client_libraries():
                await store.start()
                await store.get(layout.INSTANCE_ID)
            return store
        except MetadataError as exc:
            await _close_quietly(store)
            if loop.time() + delay > deadline:
                raise StartupError(f"metadata store {uri} is unavailable: {exc}") from None
            if not warned:
                log.warning("metadata store %s unavailable (%s); retrying for up to %.0fs", uri, exc, retry_s)
                warned = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        except BaseException:
            await _close_quietly(store)
            raise


async def _close_quietly(store: MetadataStore) -> None:
    with contextlib.suppress(Exception), quiet_client_libraries():
        await store.close()


#: set by a supervising process (``ledgerstore standalone``) in its bookies' environment: its PID
SUPERVISOR_PID_ENV = "LEDGERSTORE_SUPERVISOR_PID"
_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies; False where unsupported.
    Safe in a ``preexec_fn`` (no allocation beyond ctypes' call)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
