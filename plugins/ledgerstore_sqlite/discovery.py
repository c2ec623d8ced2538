"""How a client finds the sqlite metadata server of a database file, and how a server claims it;
and the ``host:port`` addresses of its TCP listener.

The server holds an exclusive ``flock`` on ``<db>.lock`` for its whole life and writes its
socket's path into that file. A process that can take a shared lock on it knows no server runs
(a socket file left by a killed server is stale, not live); one that cannot reads the socket path.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import os
import tempfile
import time

from ledgerstore.errors import ConfigError, MetadataError

__all__ = ["format_address", "is_wildcard", "live_socket", "lock_path", "parse_address", "socket_path_for",
           "take_lock"]

#: how long a starting server retries its lock while a client probes it
_LOCK_RETRY_S = 2.0


def lock_path(db_path: str) -> str:
    """The file whose exclusive flock marks a live server for ``db_path``."""
    return db_path + ".lock"


def socket_path_for(db_path: str) -> str:
    """``<db>.sock`` next to the database, or a name in the temporary directory when that path is
    too long for a Unix socket address (108 bytes on Linux)."""
    path = db_path + ".sock"
    if len(os.fsencode(path)) <= 100:
        return path
    digest = hashlib.sha256(os.fsencode(db_path)).hexdigest()[:20]
    return os.path.join(tempfile.gettempdir(), f"ledgerstore-meta-{digest}.sock")


def live_socket(db_path: str, wait_s: float = 2.0) -> str | None:
    """The socket of the server serving ``db_path``, or ``None`` when no server holds its lock."""
    try:
        fd = os.open(lock_path(db_path), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            else:
                fcntl.flock(fd, fcntl.LOCK_UN)
                return None
            # Locked: a server lives. It writes its socket path right after taking the lock.
            text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            if text:
                return text
            if time.monotonic() > deadline:
                raise MetadataError(
                    f"a sqlite metadata server holds {lock_path(db_path)} but published no socket within {wait_s}s"
                )
            time.sleep(0.02)
    finally:
        os.close(fd)


def take_lock(path: str) -> int:
    """Hold an exclusive flock on ``path`` (a server's life-long lock); returns its descriptor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + _LOCK_RETRY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            # A client probing for a server holds a shared lock for an instant; a live server
            # holds it for good.
            if time.monotonic() > deadline:
                owner = os.pread(fd, 4096, 0).decode(errors="replace").strip()
                os.close(fd)
                raise MetadataError(
                    f"another sqlite metadata server already serves {path.removesuffix('.lock')} "
                    f"(socket {owner or 'not yet published'}); stop it first or connect to it"
                ) from None
            time.sleep(0.02)


def parse_address(text: str, what: str = "address") -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` (``[v6]:PORT`` for an IPv6 address); port 0 lets a
    server pick a free one. :class:`ConfigError` in one line for anything else."""
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"{what} {text!r}: write an IPv6 address in brackets, e.g. [::1]:4181")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"{what} {text!r} is not HOST:PORT with a port in 0..65535, e.g. 10.0.0.5:4181")
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_wildcard(host: str) -> bool:
    """Whether binding ``host`` listens on every interface (``0.0.0.0``, ``::``, ``*``)."""
    if host in ("", "*"):
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False
