"""Conformance suite for :class:`ledgerstore.api.Transport` backends (over real sockets)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from ledgerstore.api import ServerConnection, Transport
from ledgerstore.errors import BookieUnavailableError, FrameTooLargeError
from ledgerstore.testing.capabilities import declares
from ledgerstore.testing.metadata import run, wait_until

#: what a suite's ``transport_factory`` fixture returns: a new configured transport per call
TransportFactory = Callable[[], Transport]


class EchoHandler:
    """Answers each frame with the same bytes; records connections seen."""

    def __init__(self) -> None:
        self.frames = 0
        self.lost = 0
        #: size of the largest frame handed to the handler
        self.largest = 0
        self.conns: list[ServerConnection] = []

    def frames_received(self, conn: ServerConnection, frames: Sequence[bytes]) -> None:
        if conn not in self.conns:
            self.conns.append(conn)
        for f in frames:
            self.frames += 1
            self.largest = max(self.largest, len(f))
            conn.send(bytes(f))

    def connection_lost(self, conn: ServerConnection) -> None:
        self.lost += 1


class Client:
    """A connection plus the frames it has received, for tests."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.closed: list[BaseException | None] = []
        self.conn: Any = None

    async def connect(self, transport: Transport, address: str) -> Client:
        self.conn = await transport.connect(address, self._on_frames, self.closed.append)
        return self

    def _on_frames(self, frames: Sequence[bytes]) -> None:
        self.received.extend(bytes(f) for f in frames)


class TransportConformance:
    """Subclass and provide ``transport_factory`` (returns a new configured client-side
    transport), ``server_transport_factory`` (the server side; defaults to the same) and
    ``listen_address`` (a URI with port 0, e.g. ``"tcp://127.0.0.1:0"``)."""

    max_frame_size = 1024 * 1024

    @pytest.fixture
    def transport_factory(self) -> TransportFactory:  # pragma: no cover
        raise NotImplementedError("conformance suites need a transport_factory fixture")

    @pytest.fixture
    def server_transport_factory(self, transport_factory: TransportFactory) -> TransportFactory:
        return transport_factory

    @pytest.fixture
    def listen_address(self) -> str:  # pragma: no cover
        raise NotImplementedError("conformance suites need a listen_address fixture")

    def test_echo_in_order_pipelined(self, transport_factory: TransportFactory, server_transport_factory: TransportFactory,
            listen_address: str) -> None:
        async def main() -> None:
            handler = EchoHandler()
            server = await server_transport_factory().serve(listen_address, handler)
            try:
                c = await Client().connect(transport_factory(), server.address)
                frames = [b"frame-%06d" % i + os.urandom(i % 200) for i in range(20000)]
                for i, f in enumerate(frames):
                    c.conn.send(f)
                    if i % 1000 == 999:
                        await c.conn.drain()
                await wait_until(lambda: len(c.received) >= len(frames), timeout=60)
                assert c.received == frames
                await c.conn.close()
            finally:
                await server.close()

        run(main())

    def test_large_frames_up_to_the_limit(self, transport_factory: TransportFactory, server_transport_factory: TransportFactory,
            listen_address: str) -> None:
        async def main() -> None:
            server = await server_transport_factory().serve(listen_address, EchoHandler())
            try:
                c = await Client().connect(transport_factory(), server.address)
                big = os.urandom(self.max_frame_size - 64)
                c.conn.send(big)
                c.conn.send(b"")
                await wait_until(lambda: len(c.received) >= 2, timeout=30)
                assert c.received[0] == big and c.received[1] == b""
                with pytest.raises(FrameTooLargeError):
                    c.conn.send(b"x" * (self.max_frame_size * 2))
                await c.conn.close()
            finally:
                await server.close()

        run(main())

    def test_a_frame_sent_as_parts_arrives_whole(self, transport_factory: TransportFactory,
            server_transport_factory: TransportFactory, listen_address: str) -> None:
        """``send_parts`` (a writer's ADD_BATCH: header, then body) gives the peer the same
        frames as ``send`` of the joined bytes, in order with frames sent whole; parts may be
        views, and a frame over the limit is refused whatever its parts."""
        async def main() -> None:
            server = await server_transport_factory().serve(listen_address, EchoHandler())
            try:
                c = await Client().connect(transport_factory(), server.address)
                body = os.urandom(self.max_frame_size // 2)
                sent: list[bytes] = []
                for i in range(300):
                    parts: list[bytes | memoryview] = [b"head-%04d" % i, memoryview(body)[: (i * 997) % len(body)]]
                    if i % 3 == 0:
                        parts += [b"", os.urandom(i % 50), b"tail"]
                    if i % 5 == 0:
                        c.conn.send(b"whole-%04d" % i)
                        sent.append(b"whole-%04d" % i)
                    c.conn.send_parts(parts)
                    sent.append(b"".join(parts))
                    if i % 20 == 19:
                        await c.conn.drain()
                await wait_until(lambda: len(c.received) >= len(sent), timeout=60)
                assert c.received == sent
                with pytest.raises(FrameTooLargeError):
                    c.conn.send_parts([body, body, body])
                await c.conn.close()
            finally:
                await server.close()

        run(main())

    def test_many_clients_are_independent(self, transport_factory: TransportFactory, server_transport_factory: TransportFactory,
            listen_address: str) -> None:
        async def main() -> None:
            handler = EchoHandler()
            server = await server_transport_factory().serve(listen_address, handler)
            try:
                clients = [await Client().connect(transport_factory(), server.address) for _ in range(8)]
                for i, c in enumerate(clients):
                    for j in range(100):
                        c.conn.send(b"%d:%d" % (i, j))
                await wait_until(lambda: all(len(c.received) == 100 for c in clients), timeout=30)
                for i, c in enumerate(clients):
                    assert c.received == [b"%d:%d" % (i, j) for j in range(100)]
                await clients[0].conn.close()
                await wait_until(lambda: handler.lost >= 1, timeout=10)
                clients[1].conn.send(b"still-there")
                await wait_until(lambda: clients[1].received[-1:] == [b"still-there"], timeout=10)
                for c in clients[1:]:
                    await c.conn.close()
            finally:
                await server.close()

        run(main())

    def test_connect_to_nothing_fails_clearly(self, transport_factory: TransportFactory, server_transport_factory: TransportFactory,
            listen_address: str) -> None:
        async def main() -> None:
            server = await server_transport_factory().serve(listen_address, EchoHandler())
            address = server.address
            await server.close()
            t = transport_factory()
            try:
                c = await Client().connect(t, address)
            except BookieUnavailableError:
                return
            # Connectionless transports (zmq) may "connect" lazily: then nothing may arrive and
            # sending must not hang or crash.
            c.conn.send(b"into the void")
            await asyncio.sleep(0.2)
            assert c.received == []
            await c.conn.close()

        run(main())

    def test_server_close_is_seen_by_client(self, transport_factory: TransportFactory, server_transport_factory: TransportFactory,
            listen_address: str) -> None:
        async def main() -> None:
            server = await server_transport_factory().serve(listen_address, EchoHandler())
            c = await Client().connect(transport_factory(), server.address)
            c.conn.send(b"ping")
            await wait_until(lambda: c.received == [b"ping"])
            await server.close()
            await server.close()  # idempotent
            await c.conn.close()
            assert c.conn.is_closed
            await wait_until(lambda: len(c.closed) == 1)
            with pytest.raises(BookieUnavailableError):
                c.conn.send(b"after close")

        run(main())

    def test_oversized_frame_drops_its_sender_and_others_are_served(
        self, transport_factory: TransportFactory, server_transport_factory: TransportFactory, listen_address: str
    ) -> None:
        """A peer sending a frame over the server's ``max_frame_size`` is refused before the
        frame is buffered: the frame never reaches the handler, and another client connected
        meanwhile is served on. With ``closes_oversized_senders`` (tcp, tcp+tls, and zmq, whose
        client sees libzmq's disconnect of the sender and closes) the sender's client sees its
        connection closed."""

        async def main() -> None:
            handler = EchoHandler()
            server_transport = server_transport_factory()
            server = await server_transport.serve(listen_address, handler)
            try:
                bystander = await Client().connect(transport_factory(), server.address)
                bystander.conn.send(b"before")
                await wait_until(lambda: bystander.received == [b"before"], timeout=10)
                sender_transport = transport_factory()
                # the sending side allows what the server refuses, as a hostile or misconfigured peer would
                sender_transport.max_frame_size = self.max_frame_size * 4
                offender = await Client().connect(sender_transport, server.address)
                offender.conn.send(b"hello")
                await wait_until(lambda: offender.received == [b"hello"], timeout=10)
                offender.conn.send(b"\x00" * (self.max_frame_size * 2))
                if declares(server_transport, "closes_oversized_senders"):
                    await wait_until(lambda: len(offender.closed) == 1, timeout=10)
                    assert offender.conn.is_closed
                    await wait_until(lambda: handler.lost >= 1, timeout=10)
                assert handler.largest <= self.max_frame_size, "the oversized frame reached the handler"
                assert all(len(f) <= self.max_frame_size for f in offender.received)
                bystander.conn.send(b"still-served")
                await wait_until(lambda: bystander.received == [b"before", b"still-served"], timeout=10)
                assert not bystander.closed
                await bystander.conn.close()
                await offender.conn.close()
            finally:
                await server.close()

        run(main())
