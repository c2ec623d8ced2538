"""One ledgerstore client per metadata URI per Python process.

Spark reuses its Python worker processes across tasks, so a client (its metadata session and its
bookie connections) is opened once per worker and reused by every task that worker runs, instead
of once per task.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import ledgerstore
from ledgerstore.errors import LedgerStoreError, MetadataError

T = TypeVar("T")

_lock = threading.Lock()
_clients: dict[str, ledgerstore.Client] = {}


def client_for(metadata: str) -> ledgerstore.Client:
    """The process's client for the cluster at ``metadata`` (opened on first use). MetadataError
    naming the URI and option ``metadata`` if the store cannot be reached or has no backend."""
    with _lock:
        c = _clients.get(metadata)
        if c is None:
            try:
                c = ledgerstore.Client(metadata=metadata)
            except LedgerStoreError as e:
                raise MetadataError(f"cannot open the ledgerstore metadata store {metadata!r} (option 'metadata'): "
                                    f"{e}") from e
            _clients[metadata] = c
        return c


def run(client: ledgerstore.Client, coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine of the client's asyncio API (``client.aio``) on its loop and wait for it."""
    return asyncio.run_coroutine_threadsafe(coro, client.loop).result()


@atexit.register
def close_all() -> None:
    """Close every cached client (at interpreter exit, or when a caller wants a clean slate)."""
    with _lock:
        items = list(_clients.values())
        _clients.clear()
    for c in items:
        try:
            c.close()
        except Exception:  # noqa: BLE001 - best effort at exit: the process is going away anyway
            pass


__all__ = ["client_for", "close_all", "run"]
