"""Conformance suite for :class:`ledgerstore.api.ProtocolHandler` plugins (``ledgerstore.protocol``).

A handler's tests subclass :class:`ProtocolHandlerConformance` and provide:

- ``handler_name``: the entry-point name (``"kafka"``);
- a ``metadata_uri`` fixture: the metadata URI of a running cluster (real bookie processes);
- ``bad_options``: option tables the handler must refuse, each with a fragment of the message;
- optionally :meth:`ProtocolHandlerConformance.probe`: one real request and its answer, so the
  suite checks the handler still serves (the default only connects).

Each case drives the handler with ``asyncio.run``: build it through the entry point, start it on
127.0.0.1 port 0, and stop it, so the suite needs no pytest plugin.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, TypeVar

import pytest

from ledgerstore.aio import Client
from ledgerstore.api.protocol import HandlerHealth, ProtocolHandler
from ledgerstore.cli.protocol_handlers import build_handler, check_handler_options
from ledgerstore.errors import ConfigError
from ledgerstore.plugins import describe_plugins

T = TypeVar("T")


class ProtocolHandlerConformance:
    """Subclass with ``handler_name``, a ``metadata_uri`` fixture and ``bad_options``."""

    handler_name: ClassVar[str] = ""
    #: option tables the handler must refuse, with a fragment its one-line message must contain
    bad_options: ClassVar[list[tuple[dict[str, Any], str]]] = [({"port": -1}, "port"), ({"no_such_option": 1}, "no_such_option")]

    @pytest.fixture
    def metadata_uri(self) -> str:  # pragma: no cover - must be overridden
        raise NotImplementedError("the protocol handler suite needs a metadata_uri fixture (a running cluster)")

    def good_options(self) -> dict[str, Any]:
        """The option table the suite starts the handler with (127.0.0.1, any free port)."""
        return {"host": "127.0.0.1", "port": 0}

    async def probe(self, host: str, port: int) -> None:
        """One exchange that proves the handler serves; raise (or fail an assert) if it does not.
        The default connects and closes; override it with a real request of the protocol."""
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
        writer.close()
        await writer.wait_closed()

    def run(self, metadata_uri: str, body: Callable[[ProtocolHandler], Awaitable[T]],
            options: Mapping[str, Any] | None = None) -> T:
        """Start a client and the handler, run ``body(handler)``, stop both."""

        async def main() -> T:
            async with Client(metadata=metadata_uri) as client:
                handler = build_handler(self.handler_name, client, options or self.good_options())
                await handler.start()
                try:
                    return await body(handler)
                finally:
                    await handler.stop()

        return asyncio.run(main())

    def test_handler_is_listed_in_the_protocol_group(self) -> None:
        rows = [p for p in describe_plugins() if p.slot == "protocol" and p.name == self.handler_name]
        assert len(rows) == 1, f"no entry point {self.handler_name!r} in ledgerstore.protocol"
        assert rows[0].error == ""

    def test_starts_answers_health_and_stops_cleanly(self, metadata_uri: str) -> None:
        async def body(handler: ProtocolHandler) -> tuple[str, int]:
            host, port = handler.address
            assert port > 0
            health = handler.health()
            assert isinstance(health, HandlerHealth) and health.ok, health
            assert "\n" not in health.detail
            await self.probe(host, port)
            return host, port

        host, port = self.run(metadata_uri, body)
        with pytest.raises(OSError):  # the listener is gone once stop() returned
            socket.create_connection((host, port), timeout=2).close()

    def test_stop_twice_is_harmless(self, metadata_uri: str) -> None:
        async def body(handler: ProtocolHandler) -> None:
            await handler.stop()
            assert not handler.health().ok

        self.run(metadata_uri, body)

    def test_bad_options_are_refused_in_one_line(self) -> None:
        for options, fragment in self.bad_options:
            with pytest.raises(ConfigError) as info:
                check_handler_options(self.handler_name, options)
            message = str(info.value)
            assert "\n" not in message and fragment in message, message

    def test_a_port_in_use_is_an_error(self, metadata_uri: str) -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            options = {**self.good_options(), "port": taken.getsockname()[1]}
            with pytest.raises(OSError):
                self.run(metadata_uri, lambda handler: asyncio.sleep(0), options)

    def test_survives_clients_sending_garbage(self, metadata_uri: str) -> None:
        async def body(handler: ProtocolHandler) -> None:
            host, port = handler.address
            bystander_r, bystander_w = await asyncio.open_connection(host, port)
            for garbage in (os.urandom(64), b"\xff" * 4096, b"\x00\x00\x00\x10\x00", b"GET / HTTP/1.1\r\n\r\n"):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(garbage)
                await writer.drain()
                writer.write_eof()
                try:  # the handler answers with an error or closes; either way the read ends
                    await asyncio.wait_for(reader.read(), 10)
                except ConnectionError:
                    pass
                writer.close()
            assert handler.health().ok
            await self.probe(host, port)
            bystander_w.close()
            await bystander_w.wait_closed()
            del bystander_r

        self.run(metadata_uri, body)

    def test_metrics_lines_are_prometheus_text(self, metadata_uri: str) -> None:
        async def body(handler: ProtocolHandler) -> list[str]:
            await self.probe(*handler.address)
            return handler.metrics_lines()

        lines = self.run(metadata_uri, body)
        samples = [line for line in lines if not line.startswith("#")]
        assert samples, "a handler reports at least one metric"
        for line in samples:
            name, _, value = line.rpartition(" ")
            assert name.startswith(f"ledgerstore_{self.handler_name}_"), line
            float(value)
