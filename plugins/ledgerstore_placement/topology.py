"""Racks and regions from a mapping file, as BookKeeper's ``networkTopologyScriptFileName`` (and
Hadoop's table mapping) give them: the network location of a bookie comes from where it really
is, not from what it says of itself.

The file holds one ``HOST LOCATION`` pair per line; ``#`` starts a comment::

    # host or address        /region/rack
    10.20.1.11               /eu-west/rack-1
    bookie2.example.com      /eu-west/rack-2
    bookie3.example.com:3181 /eu-east/rack-1

A bookie is looked up by its bookie id (``host:port``), then by its host, then by the host of its
registered endpoint, then by each address that host resolves to here. The first match gives its
location; a bookie matched by nothing is on ``default_rack``. The location is the bookie's rack
(as BookKeeper's rack-aware policy uses the whole network location); a location of two levels or
more also names its region, its first level (``/eu-west/rack-1`` is region ``eu-west``).

The file is read again when its modification time changes, so racks can be added while clients run.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Sequence

from ledgerstore.api import BookieInfo
from ledgerstore.errors import ConfigError

__all__ = ["NetworkTopology", "host_of"]

DEFAULT_RACK = "/default-rack"


def host_of(address: str) -> str:
    """The host of ``host:port``, ``scheme://host:port`` or ``[v6]:port``."""
    rest = address.partition("://")[2] or address
    host = rest.rstrip("/").rpartition(":")[0] or rest
    return host.strip("[]")


def _parse(path: str, text: str) -> dict[str, str]:
    table: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].startswith("/"):
            raise ConfigError(
                f"topology file {path!r} line {n}: expected 'HOST /LOCATION' (e.g. '10.0.0.1 /region/rack'), "
                f"got {raw.strip()!r}"
            )
        table[parts[0].lower()] = parts[1].rstrip("/") or "/"
    return table


class NetworkTopology:
    """The locations of a mapping file (see the module docstring)."""

    def __init__(self, path: str, default_rack: str = DEFAULT_RACK) -> None:
        self.path = os.path.expanduser(path)
        self.default_rack = default_rack
        self._mtime = -1.0
        self._table: dict[str, str] = {}
        self._resolved: dict[str, list[str]] = {}
        self._load()

    def _load(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime
            if mtime == self._mtime:
                return
            with open(self.path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise ConfigError(f"topology file {self.path!r} cannot be read: {exc.strerror or exc}") from None
        self._table, self._mtime = _parse(self.path, text), mtime

    def _addresses(self, host: str) -> list[str]:
        if host not in self._resolved:
            try:
                infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
                self._resolved[host] = sorted({str(i[4][0]) for i in infos})
            except OSError:
                self._resolved[host] = []
        return self._resolved[host]

    def location(self, bookie: BookieInfo) -> str:
        """The network location of ``bookie`` (``default_rack`` when the file does not name it)."""
        keys = [bookie.bookie_id, host_of(bookie.bookie_id)]
        if bookie.endpoint:
            keys.append(host_of(bookie.endpoint))
        for key in keys:
            found = self._table.get(key.lower())
            if found:
                return found
        for key in keys[1:]:
            for address in self._addresses(key):
                found = self._table.get(address)
                if found:
                    return found
        return self.default_rack

    def locate(self, bookies: Sequence[BookieInfo]) -> list[BookieInfo]:
        """``bookies`` with their rack (and, for locations of two levels or more, region) from the file."""
        self._load()
        located = []
        for b in bookies:
            where = self.location(b)
            levels = [p for p in where.split("/") if p]
            region = levels[0] if len(levels) >= 2 else b.region
            located.append(dataclasses.replace(b, rack=where, region=region))
        return located
