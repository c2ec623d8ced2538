"""ledgerstore: Apache BookKeeper's replicated-log protocol in Python.

The synchronous client is :class:`ledgerstore.Client`; the asyncio one is
:class:`ledgerstore.aio.Client`. Errors live in :mod:`ledgerstore.errors`, plugin interfaces in
:mod:`ledgerstore.api`, conformance suites in :mod:`ledgerstore.testing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ledgerstore.hookspecs import hookimpl

__version__ = "0.1.0"

if TYPE_CHECKING:
    from ledgerstore.client.sync import Client, LedgerHandle, LogReader, LogWriter, ReadHandle, call_timeout

__all__ = ["Client", "LedgerHandle", "LogReader", "LogWriter", "ReadHandle", "call_timeout", "hookimpl", "__version__"]
_SYNC_NAMES = frozenset(__all__) - {"hookimpl", "__version__"}


def __getattr__(name: str) -> Any:  # lazy: importing ledgerstore stays cheap for plugins
    if name in _SYNC_NAMES:
        from ledgerstore.client import sync

        return getattr(sync, name)
    raise AttributeError(f"module 'ledgerstore' has no attribute {name!r}")
