"""``tcp+tls`` transport: the ``tcp`` transport's framing inside TLS (asyncio's ``ssl`` support).

Options (the ``[transport]`` table), all paths to PEM files:

- server: ``cert_file`` and ``key_file`` (the bookie's certificate chain and private key);
  ``require_client_cert = true`` makes the bookie ask for and verify client certificates against
  ``ca_file``.
- client: ``ca_file`` (CAs trusted to sign bookie certificates; the system store when unset),
  ``client_cert_file`` / ``client_key_file`` (sent when the bookie asks), ``server_hostname``
  (the name checked in the bookie's certificate when it differs from the address' host).

TLS 1.2 is the minimum. Handshakes the bookie refuses (a client without an acceptable
certificate, a protocol error, a client that sends an alert because it does not trust the
bookie's certificate) are counted as ``refused_handshakes`` in ``Server.stats()``. A client that
hangs up mid-handshake without an alert (asyncio's own client does this when it rejects the
bookie's certificate) cannot be told apart from a dropped connection and is not counted.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from typing import Any

from ledgerstore.api import FrameHandler, Server, ServerLimits, option
from ledgerstore.errors import ConfigError

from . import TcpTransport

__all__ = ["TlsTcpTransport"]


class _CountingSSLObject(ssl.SSLObject):
    """Counts handshakes the bookie refuses (no or untrusted client certificate, protocol errors,
    an alert from the client) into its context's ``counters``. asyncio shows a failed handshake
    neither to the protocol nor, outside debug mode, to the loop's exception handler."""

    def do_handshake(self) -> None:
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError:
            ctx = self.context
            if isinstance(ctx, _ServerContext):
                ctx.counters["refused_handshakes"] = ctx.counters.get("refused_handshakes", 0) + 1
            raise


class _ServerContext(ssl.SSLContext):
    """A server SSLContext whose TLS objects count refused handshakes (asyncio never shows them
    to the protocol, only to the loop's exception handler)."""

    counters: dict[str, int]
    sslobject_class = _CountingSSLObject


def _readable_file(option: str, path: Any) -> str:
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise ConfigError(f"transport option {option!r} must be a file path, got {path!r}")
    path = os.path.expanduser(str(path))
    if not os.path.isfile(path):
        raise ConfigError(f"transport option {option!r}: file {path!r} does not exist")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"transport option {option!r}: file {path!r} is not readable by this user")
    return str(path)


def _load_chain(ctx: ssl.SSLContext, cert_opt: str, cert: str, key_opt: str, key: str) -> None:
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"transport options {cert_opt!r} ({cert!r}) and {key_opt!r} ({key!r}): cannot load the "
            f"certificate and private key: {exc}; both must be PEM and belong together"
        ) from exc


def _load_ca(ctx: ssl.SSLContext, ca: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"transport option 'ca_file' ({ca!r}): cannot load CA certificates: {exc}") from exc


class TlsTcpTransport(TcpTransport):
    """TCP with TLS; see the module docstring for the options."""

    schemes = ("tcp+tls",)
    supports_tls = True

    @dataclasses.dataclass(frozen=True)
    class Options(TcpTransport.Options):
        """The ``[transport]`` table of a ``tcp+tls://`` bookie, or a client's ``[transport."tcp+tls"]``."""

        cert_file: str | None = option(None, "server: the bookie's certificate chain (PEM)")
        key_file: str | None = option(None, "server: the private key of cert_file (PEM)")
        require_client_cert: bool = option(False, "server: ask for and verify client certificates against ca_file")
        ca_file: str | None = option(None, "CAs trusted to sign the peer's certificate (PEM)")
        client_cert_file: str | None = option(None, "client: certificate sent when the bookie asks (PEM)")
        client_key_file: str | None = option(None, "client: the private key of client_cert_file (PEM)")
        server_hostname: str | None = option(None, "client: the name checked in the bookie's certificate")

        def __post_init__(self) -> None:
            if bool(self.cert_file) != bool(self.key_file):
                raise ValueError("options 'cert_file' and 'key_file' go together (PEM certificate chain and private "
                                 "key of a tcp+tls server; see docs/transports.md)")
            if self.require_client_cert and not self.ca_file:
                raise ValueError("option 'require_client_cert' needs 'ca_file': the CA that signs client certificates")
            if bool(self.client_cert_file) != bool(self.client_key_file):
                raise ValueError("options 'client_cert_file' and 'client_key_file' go together")

    options: TlsTcpTransport.Options

    def __init__(self, options: TlsTcpTransport.Options | None = None, /, *,
                 max_frame_size: int = 5 * 1024 * 1024, **values: Any) -> None:
        super().__init__(options, max_frame_size=max_frame_size, **values)
        self._client_ctx: ssl.SSLContext | None = None
        self._pending_server_ctx: _ServerContext | None = None
        # Files are read now so a missing or bad one fails at start-up, not at the first connection.
        if self.options.cert_file:
            self._make_server_context()
        self._make_client_context()

    def _make_server_context(self) -> _ServerContext:
        opts = self.options
        if not opts.cert_file or not opts.key_file:
            raise ConfigError(
                "tcp+tls server needs transport options 'cert_file' and 'key_file' "
                "(PEM certificate chain and private key; see docs/transports.md)"
            )
        cert = _readable_file("cert_file", opts.cert_file)
        key = _readable_file("key_file", opts.key_file)
        ctx = _ServerContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.counters = {"refused_handshakes": 0}
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_chain(ctx, "cert_file", cert, "key_file", key)
        if opts.require_client_cert and opts.ca_file:  # Options refuses the one without the other
            _load_ca(ctx, _readable_file("ca_file", opts.ca_file))
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def _make_client_context(self) -> ssl.SSLContext:
        opts = self.options
        if opts.ca_file:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # trusts only the given CAs
            _load_ca(ctx, _readable_file("ca_file", opts.ca_file))
        else:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if opts.client_cert_file and opts.client_key_file:  # Options refuses the one without the other
            _load_chain(ctx, "client_cert_file", _readable_file("client_cert_file", opts.client_cert_file),
                        "client_key_file", _readable_file("client_key_file", opts.client_key_file))
        self._client_ctx = ctx
        return ctx

    def _server_hostname(self, host: str) -> str | None:
        return self.options.server_hostname or host

    def _ssl_server(self) -> ssl.SSLContext:
        return self._pending_server_ctx or self._make_server_context()

    def _ssl_client(self) -> ssl.SSLContext:
        return self._client_ctx or self._make_client_context()

    async def serve(self, address: str, handler: FrameHandler, limits: ServerLimits = ServerLimits()) -> Server:
        ctx = self._make_server_context()
        # the base class asks _ssl_server() for the context before its first await
        self._pending_server_ctx = ctx
        try:
            server = await super().serve(address, handler, limits)
        finally:
            self._pending_server_ctx = None
        counters = getattr(server, "counters", None)
        if isinstance(counters, dict):
            # handshakes refused before this point were counted in the context's own dict
            counters["refused_handshakes"] = ctx.counters.get("refused_handshakes", 0)
            ctx.counters = counters
        return server
