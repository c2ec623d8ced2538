"""Where a client reaches the sqlite metadata server: its Unix socket (same machine) or its TCP
listener (another host), and how each opens a connection ready for ``hello``.

A Unix socket needs no credentials beyond the file system's (the socket is mode 0600). A TCP
connection proves the shared secret first (:mod:`ledgerstore_sqlite.auth`), bounded by
``connect_timeout``, so a host that went silent is reported in seconds rather than after TCP's
own minutes of retries.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import ssl

from ledgerstore.errors import MetadataError
from ledgerstore_sqlite import auth, protocol
from ledgerstore_sqlite.discovery import format_address

__all__ = ["Endpoint", "TcpEndpoint", "UnixEndpoint"]

#: largest frame accepted during the handshake (an answer holds a 44-character proof)
AUTH_FRAME_LIMIT = 4096

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Endpoint(abc.ABC):
    """A way to the server; ``str()`` names it in messages."""

    @abc.abstractmethod
    async def open(self) -> Streams:
        """A connection on which ``hello`` may be sent. :class:`MetadataError` if the server
        cannot be reached (:class:`~ledgerstore_sqlite.auth.MetadataAuthError` if it refuses
        the credentials)."""


@dataclasses.dataclass(frozen=True)
class UnixEndpoint(Endpoint):
    """The server's Unix socket at ``path``."""

    path: str

    def __str__(self) -> str:
        return self.path

    async def open(self) -> Streams:
        try:
            return await asyncio.open_unix_connection(self.path)
        except OSError as exc:
            raise MetadataError(f"cannot connect to the sqlite metadata server at {self.path}: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class TcpEndpoint(Endpoint):
    """The server's TCP listener at ``host:port``, authenticated with ``secret``; inside TLS when
    ``tls`` is given (the server's certificate must name ``server_hostname``, by default ``host``)."""

    host: str
    port: int
    secret: bytes = dataclasses.field(repr=False)
    connect_timeout: float = 5.0
    tls: ssl.SSLContext | None = None
    server_hostname: str | None = None

    def __str__(self) -> str:
        return format_address(self.host, self.port)

    async def open(self) -> Streams:
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, ssl=self.tls,
                    server_hostname=(self.server_hostname or self.host) if self.tls is not None else None,
                )
                try:
                    await self._authenticate(reader, writer)
                except BaseException:
                    writer.transport.abort()
                    raise
        except TimeoutError:
            raise MetadataError(
                f"the sqlite metadata server at {self} did not accept and authenticate a connection "
                f"within {self.connect_timeout}s"
            ) from None
        except OSError as exc:
            raise MetadataError(f"cannot connect to the sqlite metadata server at {self}: {exc}") from exc
        except asyncio.IncompleteReadError:
            raise MetadataError(
                f"the sqlite metadata server at {self} hung up during authentication (too many clients "
                "authenticating at once, a TLS listener reached without metadata option 'ca_file', or not a "
                "sqlite metadata server)"
            ) from None
        return reader, writer

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            challenge = await protocol.read_frame(reader, AUTH_FRAME_LIMIT)
            request, server_nonce, client_nonce = auth.client_answer(self.secret, challenge)
            writer.write(protocol.encode(request))
            answer = await protocol.read_frame(reader, AUTH_FRAME_LIMIT)
        except protocol.FrameError as exc:
            raise auth.MetadataAuthError(
                f"{self} does not speak the sqlite metadata server's handshake: {exc}"
            ) from None
        auth.verify_server(self.secret, server_nonce, client_nonce, answer)
