"""What the admin API's route tables are made of: a route is ``(method, path, handler)``, and each
area's handlers (:mod:`~ledgerstore.bookie.http_bookie`, :mod:`~ledgerstore.bookie.http_ledgers`,
:mod:`~ledgerstore.bookie.http_cluster`) are methods of one :class:`Endpoints` object per server."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ledgerstore.api.http import Request, Response

Route = tuple[str, str, Callable[[Request], Awaitable[Response]]]


class Endpoints:
    """Handlers of one area, bound to ``server`` (an :class:`~ledgerstore.bookie.http.AdminHttpServer`)
    and so to its bookie."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.bookie = server.bookie


def bk_bool(flag: bool) -> str:
    """A flag as BookKeeper's handlers write it where they serialize ``Boolean.toString``:
    ``"true"`` / ``"false"``, strings, not JSON booleans."""
    return "true" if flag else "false"
