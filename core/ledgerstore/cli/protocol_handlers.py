"""Running protocol handlers (the ``ledgerstore.protocol`` plugins): build one from a client and
its option table, start it, serve until told to stop, stop it.

Used by ``ledgerstore standalone --kafka-port`` (the handlers run on a thread of their own beside
the cluster's supervisor loop, :class:`HandlerThread`) and by a handler's own command, such as the
Kafka plugin's ``ledgerstore kafka --config kafka.toml`` (:func:`serve`). The interface is
:mod:`ledgerstore.api.protocol`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ledgerstore import plugins
from ledgerstore.api.protocol import ProtocolHandler
from ledgerstore.cli.common import cluster_client
from ledgerstore.client.client import Client
from ledgerstore.errors import ConfigError, LedgerStoreError, PluginError

__all__ = ["HandlerSpec", "HandlerThread", "build_handler", "check_handler_options", "serve"]

#: ``(handler name, option table)``: one protocol handler to run
HandlerSpec = tuple[str, Mapping[str, Any]]


def check_handler_options(name: str, options: Mapping[str, Any]) -> Any:
    """The option table of handler ``name`` parsed into its ``Options``; :class:`ConfigError`
    (one line naming the handler and the option) or :class:`PluginError` (not installed)."""
    cls = plugins.load_driver("protocol", name)
    if not issubclass(cls, ProtocolHandler):
        raise PluginError(f"the protocol handler {name!r} ({cls.__qualname__}) is not a ProtocolHandler")
    return plugins.plugin_options("protocol", name, cls, options)


def build_handler(name: str, client: Any, options: Mapping[str, Any]) -> ProtocolHandler:
    """Handler ``name`` built from a started client and its option table (checked first)."""
    parsed = check_handler_options(name, options)
    handler = plugins.load_driver("protocol", name)(client, parsed)
    assert isinstance(handler, ProtocolHandler)
    return handler


async def serve(metadata: str, specs: Sequence[HandlerSpec], stop: asyncio.Event,
                ready: Callable[[list[ProtocolHandler]], None] | None = None,
                client_options: Mapping[str, Any] | None = None) -> None:
    """Start a client of the cluster at ``metadata``, start every handler of ``specs``, call
    ``ready`` with them, serve until ``stop`` is set, then stop the handlers and the client."""
    for name, options in specs:  # every option table is refused before anything starts
        check_handler_options(name, options)
    async with cluster_client(metadata=metadata, **dict(client_options or {})) as client:
        await serve_with(client, specs, stop, ready)


async def serve_with(client: Client, specs: Sequence[HandlerSpec], stop: asyncio.Event,
                     ready: Callable[[list[ProtocolHandler]], None] | None = None) -> None:
    """:func:`serve` with a started client."""
    started: list[ProtocolHandler] = []
    try:
        for name, options in specs:
            handler = build_handler(name, client, options)
            await handler.start()
            started.append(handler)
        if ready is not None:
            ready(started)
        await stop.wait()
    finally:
        for handler in reversed(started):
            await handler.stop()


class HandlerThread:
    """Protocol handlers served from a thread with its own event loop (``standalone``'s
    supervisor loop is synchronous). :meth:`start` returns once every handler listens, or raises
    the error that stopped them (one line); :meth:`stop` stops them and joins the thread."""

    def __init__(self, metadata: str, specs: Sequence[HandlerSpec]) -> None:
        self.metadata = metadata
        self.specs = list(specs)
        self.handlers: list[ProtocolHandler] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="protocol-handlers", daemon=True)

    def start(self, timeout: float = 60.0) -> list[ProtocolHandler]:
        for name, options in self.specs:
            check_handler_options(name, options)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise LedgerStoreError(f"the protocol handlers did not start within {timeout:.0f}s")
        if self._error is not None:
            if isinstance(self._error, LedgerStoreError | OSError):
                raise self._error
            raise ConfigError(f"a protocol handler failed to start: {type(self._error).__name__}: {self._error}")
        return self.handlers

    def alive(self) -> bool:
        """Whether the handlers' thread still runs."""
        return self._thread.is_alive()

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def on_ready(handlers: list[ProtocolHandler]) -> None:
                self.handlers = handlers
                self._ready.set()

            await serve(self.metadata, self.specs, self._stop, on_ready)

        try:
            asyncio.run(main())
        except BaseException as exc:  # handed to start() (or logged by stop()); the thread ends here
            self._error = exc
        finally:
            self._ready.set()

    def stop(self, timeout: float = 30.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop closed between the check and the call
                pass
        if self._thread.is_alive():
            self._thread.join(timeout)
