"""The bookie's admin HTTP server: health, Prometheus metrics and BookKeeper's admin REST API.

A small HTTP/1.1 server on :func:`asyncio.start_server` (no web framework), started by the bookie
when ``http_port`` is set. Endpoints are listed in ``docs/admin-http.md``; plugins add their own
through the ``ledgerstore_http_routes(bookie)`` hook. Who may call what is decided by
:mod:`ledgerstore.bookie.http_auth` before any handler runs; the cluster-wide and auto-recovery
endpoints live in :mod:`ledgerstore.bookie.http_cluster`. This module is the server (the protocol,
routing, credentials, logging); the route tables and their handlers are grouped per area:
:mod:`~ledgerstore.bookie.http_bookie` (the bookie itself), :mod:`~ledgerstore.bookie.http_ledgers`
(ledgers) and :mod:`~ledgerstore.bookie.http_cluster` (the cluster and auto-recovery).

Robustness rules: a malformed request gets ``400`` and its connection is closed, an unknown path
``404``, a known path with another method ``405``, and a handler's exception ``500`` with a JSON
body; nothing a client sends can stop the server or the bookie behind it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ledgerstore.api.http import JSON, TEXT, Handler, HttpError, Request, Response
from ledgerstore.bookie.http_auth import SECRET_PARAMS, AdminAuth
from ledgerstore.bookie.http_bookie import bookie_routes
from ledgerstore.bookie.http_cluster import cluster_routes
from ledgerstore.bookie.http_ledgers import ledger_routes
from ledgerstore.errors import (
    InvalidArgumentError,
    LedgerStoreError,
)

__all__ = ["JSON", "TEXT", "AdminHttpServer", "Handler", "HttpError", "Request", "Response", "start_admin_http"]

log = logging.getLogger(__name__)
#: one line per request: reads at DEBUG, state changes at INFO, refusals at WARNING; never a header
access_log = logging.getLogger(__name__ + ".access")

#: request line and headers together; BookKeeper's admin requests are tiny
MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024
#: an idle keep-alive connection, or a client trickling a request, is dropped after this
IDLE_TIMEOUT_S = 30.0

READ_METHODS = ("GET", "HEAD")


class AdminHttpServer:
    """The admin HTTP server of one bookie. Use :func:`start_admin_http`."""

    def __init__(self, bookie: Any) -> None:
        from ledgerstore.bookie.metrics import BookieMetrics

        self.bookie = bookie
        self.metrics = BookieMetrics(bookie)
        #: raises ConfigError (the bookie does not start) if the token or TLS files are unusable
        self.auth = AdminAuth(bookie.config.http)
        self.routes: dict[str, dict[str, Handler]] = {}
        #: (method, path) of GET routes that need credentials like a state change does
        self._protected: set[tuple[str, str]] = set()
        #: long operations started by a request and answered at once (decommission, recovery)
        self.background: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._client: Any = None
        self._client_lock = asyncio.Lock()
        self.requests_served = 0
        self._add_builtin_routes()

    # --- routing ---------------------------------------------------------------------------------

    def add_route(self, method: str, path: str, handler: Handler, *, protected: bool = False) -> None:
        """Serve ``method path`` with ``handler``; a later route for the same pair replaces it.

        Every method but GET needs credentials; ``protected`` makes a GET need them too (one that
        writes, like the sanity test, or reveals secrets, like the server configuration)."""
        if not path.startswith("/"):
            raise InvalidArgumentError(f"admin HTTP route {path!r} must start with '/'")
        method = method.upper()
        self.routes.setdefault(path, {})[method] = handler
        if protected:
            self._protected.add((method, path))
        else:
            self._protected.discard((method, path))

    def needs_credentials(self, method: str, path: str) -> bool:
        """Whether ``method path`` changes state (or is protected): never served anonymously."""
        method = "GET" if method == "HEAD" else method
        return method != "GET" or (method, path) in self._protected

    def _add_builtin_routes(self) -> None:
        open_routes, protected = bookie_routes(self)
        for method, path, handler in [*open_routes, *cluster_routes(self)]:
            self.add_route(method, path, handler)
        # ledger data and metadata are the applications', not the operator's: credentials unless opened up
        ledger_reads_protected = not self.bookie.config.http.allow_anonymous_ledger_read
        for method, path, handler in ledger_routes(self):
            self.add_route(method, path, handler, protected=ledger_reads_protected)
        for method, path, handler in protected:
            self.add_route(method, path, handler, protected=True)

    def _add_plugin_routes(self) -> None:
        from ledgerstore.plugins import hooks

        for routes in hooks().hook.ledgerstore_http_routes(bookie=self.bookie):
            for method, path, handler in routes or []:
                self.add_route(method, path, handler)

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (port 0 picks a free one; see :attr:`port`)."""
        self._add_plugin_routes()
        self.metrics.attach()
        try:
            self._server = await asyncio.start_server(self._serve_connection, host, port, limit=MAX_HEAD_BYTES,
                                                      ssl=self.auth.ssl_context)
        except OSError as exc:
            self.metrics.detach()
            raise LedgerStoreError(
                f"bookie {self.bookie.bookie_id}: cannot listen for admin HTTP on {host}:{port}: {exc}; "
                "choose another http_port or set it to 0 to disable the admin server"
            ) from exc
        scheme = "https" if self.auth.ssl_context is not None else "http"
        log.info("admin HTTP on %s://%s:%d (credentials: %s; anonymous reads %s)", scheme, host, self.port,
                 ", ".join(filter(None, ["bearer token" if self.bookie.config.http.token_file else "",
                                         "HTTP Basic" if self.auth.users is not None else "",
                                         "client certificates" if self.auth.client_certificates else ""])) or "none",
                 "allowed" if self.bookie.config.http.allow_anonymous_read else "refused")

    @property
    def port(self) -> int:
        """The port actually listened on."""
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening, drop open connections and close the lazily made client."""
        self.metrics.detach()
        if self._server is not None:
            self._server.close()
        pending = [*self._connections, *self.background]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    # --- the protocol ----------------------------------------------------------------------------

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        peer_name = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "-"
        # non-empty only for a client certificate the configured CA verified
        peercert = writer.get_extra_info("peercert")
        try:
            keep_alive = True
            while keep_alive:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
                except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    return  # the client went away or idled out between requests
                except asyncio.LimitOverrunError:
                    await self._send(writer, Response.error(431, f"request head larger than {MAX_HEAD_BYTES} bytes"), False)
                    return
                try:
                    method, target, headers, keep_alive = _parse_head(head)
                    body = await self._read_body(reader, headers)
                except HttpError as exc:
                    await self._send(writer, Response.error(exc.status, exc.message), False)
                    return
                except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    return
                response = await self._dispatch(method, target, headers, body, peer_name, peercert)
                await self._send(writer, response, keep_alive, head_only=method == "HEAD")
        except asyncio.CancelledError:
            pass
        except Exception:  # the last line of defence: a connection must never take the server down
            log.exception("admin HTTP connection failed")
        finally:
            self._connections.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                pass

    async def _read_body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise HttpError(501, "chunked request bodies are not supported; send Content-Length")
        raw = headers.get("content-length", "0").strip()
        if not raw.isdigit():
            raise HttpError(400, f"bad Content-Length {raw!r}")
        length = int(raw)
        if length > MAX_BODY_BYTES:
            raise HttpError(413, f"request body of {length} bytes exceeds {MAX_BODY_BYTES}")
        if length == 0:
            return b""
        return await asyncio.wait_for(reader.readexactly(length), IDLE_TIMEOUT_S)

    async def _send(self, writer: asyncio.StreamWriter, response: Response, keep_alive: bool,
                    head_only: bool = False) -> None:
        try:
            reason = HTTPStatus(response.status).phrase
        except ValueError:
            reason = "Unknown"
        extra = "".join(f"{name}: {value}\r\n" for name, value in response.headers.items())
        head = (
            f"HTTP/1.1 {response.status} {reason}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n{extra}"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n"
            "Server: ledgerstore-bookie\r\n\r\n"
        ).encode("latin-1")
        try:
            writer.write(head if head_only else head + response.body)
            await writer.drain()
        except ConnectionError:
            pass

    async def _dispatch(self, method: str, target: str, headers: dict[str, str], body: bytes,
                        peer: str = "-", peercert: Any = None) -> Response:
        self.requests_served += 1
        t0 = time.monotonic()
        parts = urlsplit(target)
        path = parts.path.rstrip("/") or "/"
        decision = self.auth.check(path, self.needs_credentials(method, path), headers, peercert)
        if decision.status:
            response = Response.error(decision.status, decision.message)
            if decision.status == 401:
                response.headers["WWW-Authenticate"] = self.auth.challenge
        else:
            response = await self._route(method, path, parts.query, headers, body)
        level = (logging.WARNING if decision.status else
                 logging.DEBUG if method in READ_METHODS else logging.INFO)
        if access_log.isEnabledFor(level):
            access_log.log(level, "%s %s %s -> %d (%d bytes, %.1f ms) by %s%s", peer, method,
                           _loggable(path, parts.query), response.status, len(response.body),
                           (time.monotonic() - t0) * 1000, decision.principal,
                           f": refused, {decision.message}" if decision.status else "")
        return response

    async def _route(self, method: str, path: str, raw_query: str, headers: dict[str, str], body: bytes) -> Response:
        try:
            query = dict(parse_qsl(raw_query, keep_blank_values=True, strict_parsing=False))
        except ValueError as exc:
            return Response.error(400, f"bad query string: {exc}")
        secrets = sorted(SECRET_PARAMS.intersection(query))
        if secrets:
            return Response.error(400, f"query parameter {secrets[0]!r} would put a secret in the URL (URLs end up in "
                                       f"logs and shell histories); send a ledger password in the X-Ledger-Password "
                                       f"header and credentials in the Authorization header")
        by_method = self.routes.get(path)
        if by_method is None:
            return Response.error(404, f"no such endpoint: {path}")
        handler = by_method.get("GET" if method == "HEAD" else method)
        if handler is None:
            return Response.error(405, f"{path} accepts {', '.join(sorted(by_method))}, not {method}")
        request = Request(method, path, query, headers, body, self.bookie)
        try:
            result = handler(request)
            if inspect.isawaitable(result):
                result = await result
        except HttpError as exc:
            return Response.error(exc.status, exc.message)
        except LedgerStoreError as exc:
            return Response.error(exc.http_status, f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            log.exception("admin HTTP handler for %s %s failed", method, path)
            return Response.error(500, f"{type(exc).__name__}: {exc}")
        if isinstance(result, Response):
            return result
        if isinstance(result, tuple) and len(result) == 3:
            status, ctype, data = result
            return Response(int(status), str(ctype), data if isinstance(data, bytes) else str(data).encode())
        log.error("admin HTTP handler for %s %s returned %r, not a Response", method, path, type(result))
        return Response.error(500, f"the handler for {path} returned {type(result).__name__}, not a response")

    # --- a client for the ledger endpoints -------------------------------------------------------

    async def client(self) -> Any:
        """An :class:`ledgerstore.aio.Client` on this bookie's metadata store, made on first use."""
        async with self._client_lock:
            if self._client is None:
                from ledgerstore.aio import Client

                cfg = self.bookie.config
                self._client = await Client(metadata=cfg.metadata, metadata_options=dict(cfg.metadata_options)).start()
            return self._client


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str], bool]:
    """Request line and headers → (method, target, headers lower-cased, keep-alive)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes any byte
        raise HttpError(400, "undecodable request head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise HttpError(400, f"malformed request line {lines[0][:100]!r}")
    method, target, version = parts
    if not method.isalpha() or not method.isupper():
        raise HttpError(400, f"malformed method {method[:20]!r}")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505 if version.startswith("HTTP/") else 400, f"unsupported protocol version {version[:20]!r}")
    if not target.startswith("/"):
        raise HttpError(400, f"request target {target[:100]!r} must be a path")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or " " in name:
            raise HttpError(400, f"malformed header line {line[:100]!r}")
        headers[name.lower()] = value.strip()
    conn = headers.get("connection", "").lower()
    keep_alive = conn != "close" if version == "HTTP/1.1" else conn == "keep-alive"
    return method, target, headers, keep_alive


#: settings the bookie reads on every use, so PUT /api/v1/config/server_config can change them live
def _loggable(path: str, raw_query: str) -> str:
    """``path?query`` for the access log, secret-looking parameter values masked."""
    if not raw_query:
        return path
    pairs = parse_qsl(raw_query, keep_blank_values=True)
    return path + "?" + "&".join(f"{k}={'***' if k.lower() in SECRET_PARAMS else v}" for k, v in pairs)


async def start_admin_http(bookie: Any, host: str, port: int) -> AdminHttpServer:
    """Start the admin HTTP server of ``bookie`` on ``host:port``; ``await server.close()`` stops it."""
    server = AdminHttpServer(bookie)
    await server.start(host, port)
    return server
