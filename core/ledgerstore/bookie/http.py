"""The bookie's admin HTTP server: health, Prometheus metrics and a BookKeeper-style admin API.

A small HTTP/1.1 server on :func:`asyncio.start_server` (no web framework), started by the bookie
when ``http_port`` is set. Endpoints are listed in ``docs/admin-http.md``; plugins add their own
through the ``ledgerstore_http_routes(bookie)`` hook.

Robustness rules: a malformed request gets ``400`` and its connection is closed, an unknown path
``404``, a known path with another method ``405``, and a handler's exception ``500`` with a JSON
body; nothing a client sends can stop the server or the bookie behind it.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ledgerstore.errors import (
    BookieUnavailableError,
    InvalidArgumentError,
    LedgerStoreError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    UnauthorizedAccessError,
)

log = logging.getLogger(__name__)

#: request line and headers together; BookKeeper's admin requests are tiny
MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024
#: an idle keep-alive connection, or a client trickling a request, is dropped after this
IDLE_TIMEOUT_S = 30.0
#: entries one ``/api/v1/ledger/read`` answers at most
MAX_READ_ENTRIES = 1000

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


class HttpError(Exception):
    """Raised by a handler to answer with ``status`` and a JSON ``{"error": message}`` body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclasses.dataclass
class Request:
    """One parsed request, handed to route handlers (built-in and plugin ones alike)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    bookie: Any

    def json(self) -> Any:
        """The body parsed as JSON; :class:`HttpError` 400 if it is not JSON."""
        if not self.body:
            raise HttpError(400, "this request needs a JSON body")
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HttpError(400, f"the body is not valid JSON: {exc}") from None

    def int_param(self, name: str, default: int | None = None) -> int:
        """Query parameter ``name`` as an int; 400 if missing (without default) or not a number."""
        raw = self.query.get(name)
        if raw is None or raw == "":
            if default is None:
                raise HttpError(400, f"query parameter {name!r} is required")
            return default
        try:
            return int(raw)
        except ValueError:
            raise HttpError(400, f"query parameter {name}={raw!r} is not an integer") from None

    def bool_param(self, name: str, default: bool = False) -> bool:
        """Query parameter ``name`` as a boolean (true/false/1/0/yes/no)."""
        raw = self.query.get(name)
        if raw is None or raw == "":
            return default
        return _parse_bool(raw, f"query parameter {name}")


@dataclasses.dataclass
class Response:
    """What a handler returns (plugin handlers may return a ``(status, content_type, body)`` tuple)."""

    status: int = 200
    content_type: str = JSON
    body: bytes = b""

    @classmethod
    def of_json(cls, data: Any, status: int = 200) -> Response:
        return cls(status, JSON, (json.dumps(data, indent=2, default=str) + "\n").encode())

    @classmethod
    def error(cls, status: int, message: str) -> Response:
        return cls.of_json({"error": message, "status": status}, status)


Handler = Callable[[Request], "Awaitable[Response | tuple[int, str, bytes]] | Response | tuple[int, str, bytes]"]


def _parse_bool(raw: Any, what: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(raw, str) and raw.lower() in ("false", "0", "no", "off"):
        return False
    raise HttpError(400, f"{what}={raw!r} is not a boolean (true or false)")


def _status_for(exc: LedgerStoreError) -> int:
    if isinstance(exc, NoSuchLedgerError | NoSuchEntryError):
        return 404
    if isinstance(exc, UnauthorizedAccessError):
        return 403
    if isinstance(exc, InvalidArgumentError):
        return 400
    if isinstance(exc, BookieUnavailableError | NotEnoughBookiesError):
        return 503
    return 500


class AdminHttpServer:
    """The admin HTTP server of one bookie. Use :func:`start_admin_http`."""

    def __init__(self, bookie: Any) -> None:
        from ledgerstore.bookie.metrics import BookieMetrics

        self.bookie = bookie
        self.metrics = BookieMetrics(bookie)
        self.routes: dict[str, dict[str, Handler]] = {}
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._client: Any = None
        self._client_lock = asyncio.Lock()
        self._gc_running = False
        self.requests_served = 0
        self._add_builtin_routes()

    # --- routing ---------------------------------------------------------------------------------

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        """Serve ``method path`` with ``handler``; a later route for the same pair replaces it."""
        if not path.startswith("/"):
            raise InvalidArgumentError(f"admin HTTP route {path!r} must start with '/'")
        self.routes.setdefault(path, {})[method.upper()] = handler

    def _add_builtin_routes(self) -> None:
        for method, path, handler in [
            ("GET", "/heartbeat", self._heartbeat),
            ("GET", "/metrics", self._metrics),
            ("GET", "/api/v1/bookie/info", self._info),
            ("GET", "/api/v1/bookie/state", self._get_state),
            ("PUT", "/api/v1/bookie/state", self._put_state),
            ("GET", "/api/v1/bookie/list_bookies", self._list_bookies),
            ("GET", "/api/v1/bookie/gc", self._get_gc),
            ("PUT", "/api/v1/bookie/gc", self._put_gc),
            ("GET", "/api/v1/bookie/last_log_mark", self._last_log_mark),
            ("GET", "/api/v1/ledger/list", self._ledger_list),
            ("GET", "/api/v1/ledger/metadata", self._ledger_metadata),
            ("GET", "/api/v1/ledger/read", self._ledger_read),
        ]:
            self.add_route(method, path, handler)

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
            self._server = await asyncio.start_server(self._serve_connection, host, port, limit=MAX_HEAD_BYTES)
        except OSError as exc:
            self.metrics.detach()
            raise LedgerStoreError(
                f"bookie {self.bookie.bookie_id}: cannot listen for admin HTTP on {host}:{port}: {exc}; "
                "choose another http_port or set it to 0 to disable the admin server"
            ) from exc
        log.info("admin HTTP on http://%s:%d", host, self.port)

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
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
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
                response = await self._dispatch(method, target, headers, body)
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
        head = (
            f"HTTP/1.1 {response.status} {reason}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n"
            "Server: ledgerstore-bookie\r\n\r\n"
        ).encode("latin-1")
        try:
            writer.write(head if head_only else head + response.body)
            await writer.drain()
        except ConnectionError:
            pass

    async def _dispatch(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Response:
        self.requests_served += 1
        parts = urlsplit(target)
        path = parts.path.rstrip("/") or "/"
        try:
            query = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
        except ValueError as exc:
            return Response.error(400, f"bad query string: {exc}")
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
            return Response.error(_status_for(exc), f"{type(exc).__name__}: {exc}")
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

    # --- built-in endpoints ----------------------------------------------------------------------

    async def _heartbeat(self, req: Request) -> Response:
        return Response(200, TEXT, b"OK\n")

    async def _metrics(self, req: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        # engine.stats() and statvfs may touch the disk: keep them off the event loop
        data = await asyncio.to_thread(self.metrics.render)
        return Response(200, CONTENT_TYPE_LATEST, data)

    async def _info(self, req: Request) -> Response:
        b = self.bookie
        info = dataclasses.asdict(b.info())
        total, used, free = b._disk_usage()
        stats = await asyncio.to_thread(b.engine.stats) if b.engine is not None else None
        from ledgerstore import __version__

        info.update({
            "version": __version__,
            "instance_id": b.instance_id,
            "listen": b.config.listen,
            "storage": b.config.storage,
            "journal_dir": str(b.journal_dir),
            "ledger_dirs": [str(d) for d in b.ledger_dirs],
            "used_bytes": used,
            "started_at": b.started_at,
            "uptime_seconds": round(time.time() - b.started_at, 3) if b.started_at else 0.0,
            "storage_stats": dataclasses.asdict(stats) if stats is not None else None,
        })
        return Response.of_json(info)

    def _state(self) -> dict[str, Any]:
        b = self.bookie
        j = b.journal
        return {
            "running": not b._stopped.is_set(),
            "readOnly": b.read_only,
            "forcedReadOnly": b.forced_read_only,
            "registered": b._registered_event.is_set(),
            "journalFailed": j is not None and j.failed is not None,
        }

    async def _get_state(self, req: Request) -> Response:
        return Response.of_json(self._state())

    async def _put_state(self, req: Request) -> Response:
        body = req.json()
        if not isinstance(body, dict) or "readOnly" not in body:
            raise HttpError(400, 'expected a JSON object like {"readOnly": true}')
        await self.bookie.set_read_only(_parse_bool(body["readOnly"], "readOnly"))
        return Response.of_json(self._state())

    async def _list_bookies(self, req: Request) -> Response:
        kind = req.query.get("type", "all").lower()
        if kind not in ("rw", "ro", "all"):
            raise HttpError(400, f"type={kind!r}: use rw (writable), ro (read-only) or all")
        infos = await self.bookie.registry.all()
        rows = []
        for info in sorted(infos, key=lambda i: i.bookie_id):
            if (kind == "rw" and info.read_only) or (kind == "ro" and not info.read_only):
                continue
            d = dataclasses.asdict(info)
            d["state"] = "read-only" if info.read_only else "writable"
            rows.append(d)
        return Response.of_json({"bookies": rows})

    async def _get_gc(self, req: Request) -> Response:
        return Response.of_json({"is_in_force_gc": self._gc_running})

    async def _put_gc(self, req: Request) -> Response:
        minor = req.bool_param("minor")
        major = req.bool_param("major")
        if req.body:
            body = req.json()
            if not isinstance(body, dict):
                raise HttpError(400, 'expected a JSON object like {"major": true}')
            minor = _parse_bool(body.get("minor", minor), "minor")
            major = _parse_bool(body.get("major", major), "major")
        if self._gc_running:
            raise HttpError(409, "a forced garbage collection is already running; retry when it ends")
        self._gc_running = True
        try:
            result = await self.bookie.gc(minor=minor, major=major)
        finally:
            self._gc_running = False
        return Response.of_json(result)

    async def _last_log_mark(self, req: Request) -> Response:
        from ledgerstore.bookie.journal import read_mark

        b = self.bookie
        if b.journal is None:
            raise HttpError(503, "the journal is not open yet")
        durable = b.journal.durable_mark()
        checkpointed = await asyncio.to_thread(read_mark, b.journal_dir)
        return Response.of_json({
            "journal_dir": str(b.journal_dir),
            # written and fsync'd: what acknowledged adds rely on
            "durable": {"file_id": durable.file_id, "offset": durable.offset},
            # the LastLogMark: the storage engine holds everything before it; replay starts here
            "last_log_mark": {"file_id": checkpointed.file_id, "offset": checkpointed.offset},
        })

    async def _ledger_list(self, req: Request) -> Response:
        from ledgerstore.meta.ledgers import LedgerManager

        with_md = req.bool_param("print_metadata")
        limit = req.int_param("limit", 0)
        mgr = LedgerManager(self.bookie.store)
        ids: list[int] = []
        async for lid in mgr.list():
            ids.append(lid)
            if limit and len(ids) >= limit:
                break
        out: dict[str, Any] = {"count": len(ids), "ledgers": ids}
        if with_md:
            mds: dict[str, Any] = {}
            for lid in ids:
                try:
                    mds[str(lid)] = (await mgr.read(lid)).to_dict()
                except NoSuchLedgerError:
                    continue  # deleted while listing
            out["metadata"] = mds
        return Response.of_json(out)

    async def _ledger_metadata(self, req: Request) -> Response:
        from ledgerstore.meta.ledgers import LedgerManager

        lid = req.int_param("ledger_id")
        md = await LedgerManager(self.bookie.store).read(lid)
        return Response.of_json(md.to_dict())

    async def _ledger_read(self, req: Request) -> Response:
        lid = req.int_param("ledger_id")
        first = req.int_param("first", req.int_param("start_entry_id", 0))
        password = req.query.get("password", "").encode()
        client = await self.client()
        # no recovery: an administrator looking at a ledger must not fence its writer
        handle = await client.open_ledger(lid, password=password, recovery=False)
        lac = handle.last_add_confirmed
        default_last = min(lac, first + MAX_READ_ENTRIES - 1)
        last = req.int_param("last", req.int_param("end_entry_id", default_last))
        if first < 0:
            raise HttpError(400, f"first={first} must be >= 0")
        if last - first + 1 > MAX_READ_ENTRIES:
            raise HttpError(400, f"asked for {last - first + 1} entries; at most {MAX_READ_ENTRIES} per request")
        if last > lac:
            raise HttpError(404, f"ledger {lid}: entry {last} is beyond the last add confirmed ({lac})")
        entries = await handle.read(first, last) if last >= first else []
        rows = []
        for e in entries:
            row: dict[str, Any] = {"entry_id": e.entry_id, "length": len(e.payload),
                                   "data_base64": base64.b64encode(e.payload).decode()}
            try:
                row["text"] = e.payload.decode("utf-8")
            except UnicodeDecodeError:
                pass
            rows.append(row)
        return Response.of_json({"ledger_id": lid, "last_add_confirmed": lac, "entries": rows})


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


async def start_admin_http(bookie: Any, host: str, port: int) -> AdminHttpServer:
    """Start the admin HTTP server of ``bookie`` on ``host:port``; ``await server.close()`` stops it."""
    server = AdminHttpServer(bookie)
    await server.start(host, port)
    return server
