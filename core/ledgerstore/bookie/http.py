"""The bookie's admin HTTP server: health, Prometheus metrics and BookKeeper's admin REST API.

A small HTTP/1.1 server on :func:`asyncio.start_server` (no web framework), started by the bookie
when ``http_port`` is set. Endpoints are listed in ``docs/admin-http.md``; plugins add their own
through the ``ledgerstore_http_routes(bookie)`` hook. Who may call what is decided by
:mod:`ledgerstore.bookie.http_auth` before any handler runs; the cluster-wide and auto-recovery
endpoints live in :mod:`ledgerstore.bookie.http_cluster`.

Robustness rules: a malformed request gets ``400`` and its connection is closed, an unknown path
``404``, a known path with another method ``405``, and a handler's exception ``500`` with a JSON
body; nothing a client sends can stop the server or the bookie behind it.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import inspect
import logging
import re
import time
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ledgerstore.api.http import JSON, TEXT, Handler, HttpError, Request, Response, parse_bool
from ledgerstore.bookie import cookie as cookies
from ledgerstore.bookie.http_auth import SECRET_PARAMS, AdminAuth
from ledgerstore.bookie.http_cluster import cluster_routes
from ledgerstore.errors import (
    BookieUnavailableError,
    InvalidArgumentError,
    LedgerStoreError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    UnauthorizedAccessError,
)
from ledgerstore.meta.bookies import CookieManager

__all__ = ["JSON", "TEXT", "AdminHttpServer", "Handler", "HttpError", "Request", "Response", "start_admin_http"]

log = logging.getLogger(__name__)
#: one line per request: reads at DEBUG, state changes at INFO, refusals at WARNING; never a header
access_log = logging.getLogger(__name__ + ".access")

#: request line and headers together; BookKeeper's admin requests are tiny
MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024
#: an idle keep-alive connection, or a client trickling a request, is dropped after this
IDLE_TIMEOUT_S = 30.0
#: entries one ``/api/v1/ledger/read`` answers at most
MAX_READ_ENTRIES = 1000

#: the header carrying a ledger password (never the URL: URLs end up in logs and histories)
LEDGER_PASSWORD_HEADER = "x-ledger-password"
READ_METHODS = ("GET", "HEAD")


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
        self._gc_running = False
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
            ("DELETE", "/api/v1/ledger/delete", self._ledger_delete),
            ("GET", "/api/v1/bookie/is_ready", self._is_ready),
            ("GET", "/api/v1/bookie/state/readonly", self._get_readonly),
            ("PUT", "/api/v1/bookie/state/readonly", self._put_readonly),
            ("GET", "/api/v1/bookie/list_disk_file", self._list_disk_file),
            ("GET", "/api/v1/bookie/gc_details", self._gc_details),
            ("GET", "/api/v1/bookie/gc/suspend_compaction", self._get_suspended),
            ("PUT", "/api/v1/bookie/gc/suspend_compaction", self._suspend_compaction),
            ("PUT", "/api/v1/bookie/gc/resume_compaction", self._resume_compaction),
            ("PUT", "/api/v1/bookie/expand_storage", self._expand_storage),
            ("PUT", "/api/v1/config/server_config", self._put_server_config),
        ]:
            self.add_route(method, path, handler)
        # GETs that need credentials: the configuration may hold secrets; the sanity test writes
        self.add_route("GET", "/api/v1/config/server_config", self._get_server_config, protected=True)
        self.add_route("GET", "/api/v1/bookie/sanity", self._sanity, protected=True)
        for method, path, handler in cluster_routes(self):
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
                response.headers["WWW-Authenticate"] = 'Bearer realm="ledgerstore-admin"'
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
        await self._set_read_only(req)
        return Response.of_json(self._state())

    async def _set_read_only(self, req: Request) -> None:
        body = req.json()
        if not isinstance(body, dict) or "readOnly" not in body:
            raise HttpError(400, 'expected a JSON object like {"readOnly": true}')
        await self.bookie.set_read_only(parse_bool(body["readOnly"], "readOnly"))

    async def _get_readonly(self, req: Request) -> Response:
        return Response.of_json({"readOnly": self.bookie.read_only})

    async def _put_readonly(self, req: Request) -> Response:
        await self._set_read_only(req)
        return Response.of_json({"readOnly": self.bookie.read_only})

    async def _is_ready(self, req: Request) -> Response:
        # BookKeeper: 200 with an empty body when ready, 503 otherwise
        b = self.bookie
        ready = b._serving and b._registered_event.is_set() and not b._stopped.is_set()
        return Response(200 if ready else 503, TEXT, b"")

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
            minor = parse_bool(body.get("minor", minor), "minor")
            major = parse_bool(body.get("major", major), "major")
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
        password = ledger_password(req)
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

    async def _ledger_delete(self, req: Request) -> Response:
        # an administrator's delete, as BookKeeper's: no ledger password (the caller is authenticated)
        lid = req.int_param("ledger_id")
        client = await self.client()
        await client.delete_ledger(lid)
        return Response.of_json({"ledger_id": lid, "deleted": True})

    async def _list_disk_file(self, req: Request) -> Response:
        kind = req.query.get("file_type", "").lower()
        if kind not in ("", "journal", "entrylog", "index"):
            raise HttpError(400, f"file_type={kind!r}: use journal, entrylog or index (or leave it out for all)")
        listing = await asyncio.to_thread(_disk_files, self.bookie.journal_dir, self.bookie.ledger_dirs)
        return Response.of_json({f"{k} files": " ".join(v) for k, v in listing.items() if kind in ("", k)})

    async def _gc_details(self, req: Request) -> Response:
        return Response.of_json([self.bookie.compaction.details(self._gc_running)])

    def _suspension(self) -> dict[str, bool]:
        c = self.bookie.compaction
        return {"isMajorGcSuspended": c.suspend_major, "isMinorGcSuspended": c.suspend_minor}

    async def _get_suspended(self, req: Request) -> Response:
        return Response.of_json(self._suspension())

    def _switch_compaction(self, req: Request, major_key: str, minor_key: str, suspend: bool) -> Response:
        body = req.json()
        if not isinstance(body, dict) or not ({major_key, minor_key} & set(body)):
            raise HttpError(400, f'expected a JSON object like {{"{major_key}": true, "{minor_key}": true}}')
        c = self.bookie.compaction
        if parse_bool(body.get(major_key, False), major_key):
            c.suspend_major = suspend
        if parse_bool(body.get(minor_key, False), minor_key):
            c.suspend_minor = suspend
        return Response.of_json(self._suspension())

    async def _suspend_compaction(self, req: Request) -> Response:
        return self._switch_compaction(req, "suspendMajor", "suspendMinor", True)

    async def _resume_compaction(self, req: Request) -> Response:
        return self._switch_compaction(req, "resumeMajor", "resumeMinor", False)

    async def _expand_storage(self, req: Request) -> Response:
        body = req.json() if req.body else {}
        dirs = body.get("ledger_dirs") if isinstance(body, dict) else None
        if not isinstance(dirs, list) or not all(isinstance(d, str) and d for d in dirs):
            raise HttpError(400, 'expected a JSON object like {"ledger_dirs": ["/data1/ledgers", "/data2/ledgers"]}: '
                                 "the bookie's directories after the expansion")
        b = self.bookie
        wanted = [Path(d).resolve() for d in dirs]
        added, cookie = await asyncio.to_thread(plan_expansion, b, wanted)
        if added:
            # the running bookie checks that its cookie files stay the ones it runs with: it
            # adopts the new cookie and the files change with no await in between
            ownership = getattr(b, "ownership", None)
            if ownership is not None:
                ownership.cookie = cookie
            cookies.write_local(cookies.cookie_dirs(b.journal_dir, wanted), cookie)
            await CookieManager(b.store).put(b.bookie_id, {**cookie, "endpoint": b.advertised})
            log.info("storage expanded with %s; set ledger_dirs = %s in the config and restart", added, dirs)
        return Response.of_json({"added": added, "ledger_dirs": [str(d) for d in wanted], "restart_needed": bool(added)})

    async def _get_server_config(self, req: Request) -> Response:
        return Response.of_json(_redacted(dataclasses.asdict(self.bookie.config)))

    async def _put_server_config(self, req: Request) -> Response:
        body = req.json()
        if not isinstance(body, dict) or not body:
            raise HttpError(400, 'expected a JSON object of settings, e.g. {"disk_usage_threshold": 0.9}')
        unknown = sorted(set(body) - RUNTIME_SETTINGS)
        if unknown:
            raise HttpError(400, f"{', '.join(map(repr, unknown))} cannot be changed on a running bookie; these can: "
                                 f"{', '.join(sorted(RUNTIME_SETTINGS))} (change the others in the config file and restart)")
        cfg = self.bookie.config
        changed: dict[str, Any] = {}
        for key, raw in body.items():
            kind = type(getattr(cfg, key))
            if isinstance(raw, bool) or not isinstance(raw, int | float | str):
                raise HttpError(400, f"{key}={raw!r} is not a {kind.__name__}")
            try:
                changed[key] = kind(raw)
            except ValueError:
                raise HttpError(400, f"{key}={raw!r} is not a {kind.__name__}") from None
        problems = dataclasses.replace(cfg, **changed).validate()
        if problems:
            raise HttpError(400, "; ".join(problems))
        for key, value in changed.items():  # the bookie reads these on every use
            setattr(cfg, key, value)
        log.info("runtime settings changed through the admin API: %s", changed)
        return Response.of_json({"updated": changed})

    async def _sanity(self, req: Request) -> Response:
        # BookKeeper's sanity test: write entries to a ledger on this bookie alone, read them back
        b = self.bookie
        client = await self.client()
        count = req.int_param("entries", 10)
        try:
            passed = await asyncio.wait_for(sanity_test(client, b.bookie_id, count), req.int_param("timeout", 30))
            error = ""
        except (LedgerStoreError, TimeoutError) as exc:
            passed, error = False, f"{type(exc).__name__}: {exc}"
        out: dict[str, Any] = {"passed": passed, "readOnly": b.read_only}
        if error:
            out["error"] = error
        return Response.of_json(out)


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
RUNTIME_SETTINGS = frozenset({
    "disk_usage_threshold", "disk_usage_lwm", "disk_check_interval_ms", "minor_compaction_threshold",
    "major_compaction_threshold", "minor_compaction_interval_s", "major_compaction_interval_s",
})
_SECRET_KEY = re.compile(r"pass|secret|credential|auth_data|private|token(?!_file)", re.IGNORECASE)


def _redacted(value: Any) -> Any:
    """The configuration with the values of secret-looking keys replaced (file names stay)."""
    if isinstance(value, dict):
        return {k: "(redacted)" if _SECRET_KEY.search(str(k)) and not str(k).endswith("_file") and v
                else _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


def ledger_password(req: Request) -> bytes:
    """The ledger password a request carries in ``X-Ledger-Password`` (b"" without one)."""
    # header values were decoded as latin-1: encoding back gives the bytes the client sent
    return req.headers.get(LEDGER_PASSWORD_HEADER, "").encode("latin-1")


def _loggable(path: str, raw_query: str) -> str:
    """``path?query`` for the access log, secret-looking parameter values masked."""
    if not raw_query:
        return path
    pairs = parse_qsl(raw_query, keep_blank_values=True)
    return path + "?" + "&".join(f"{k}={'***' if k.lower() in SECRET_PARAMS else v}" for k, v in pairs)


def _disk_files(journal_dir: Path, ledger_dirs: list[Path]) -> dict[str, list[str]]:
    from ledgerstore.bookie.journal import journal_files

    out: dict[str, list[str]] = {"journal": [p.name for _, p in journal_files(journal_dir)], "entrylog": [], "index": []}
    for d in ledger_dirs:
        for p in sorted(d.rglob("*")):
            if p.is_file() and p.name != cookies.COOKIE_FILE:
                out["entrylog" if p.suffix == ".log" else "index"].append(str(p.relative_to(d)))
    return out


def plan_expansion(bookie: Any, wanted: list[Path]) -> tuple[list[str], dict[str, Any]]:
    """BookKeeper's expand_storage, first half: check that the resolved ``wanted`` directories
    keep every current one and that the new ones are empty, create the new ones, and return them
    with the cookie naming all of them (to be written to every directory and the metadata store;
    the bookie uses the new directories once its config names them and it restarts)."""
    current = [d.resolve() for d in bookie.ledger_dirs]
    missing = [str(d) for d in current if d not in wanted]
    if missing:
        raise HttpError(400, f"ledger_dirs must keep the bookie's current directories; missing {missing}")
    new = [d for d in wanted if d not in current]
    busy = [str(d) for d in new if d.exists() and any(d.iterdir())]
    if busy:
        raise HttpError(409, f"new ledger directories must be empty: {busy}")
    local = cookies.read_local(cookies.cookie_dirs(bookie.journal_dir, bookie.ledger_dirs))
    if local is None:
        raise HttpError(409, "this bookie's directories hold no cookie to expand")
    if not new:
        return [], local
    for d in new:
        d.mkdir(parents=True, exist_ok=True)
    return [str(d) for d in new], {**local, "ledger_dirs": [str(d) for d in wanted]}


async def sanity_test(client: Any, bookie_id: str, count: int) -> bool:
    """Write ``count`` entries to a ledger on ``bookie_id`` alone, read them back, delete it."""
    lh = await client.create_ledger(1, 1, 1, password=b"sanity", bookies=[bookie_id])
    try:
        payloads = [b"sanity-%d" % i for i in range(count)]
        await asyncio.gather(*(lh.append_async(p) for p in payloads))
        await lh.close()
        reader = await client.open_ledger(lh.ledger_id, b"sanity", recovery=False)
        return [e.payload for e in await reader.read(0, count - 1)] == payloads if count else True
    finally:
        await client.delete_ledger(lh.ledger_id)


async def start_admin_http(bookie: Any, host: str, port: int) -> AdminHttpServer:
    """Start the admin HTTP server of ``bookie`` on ``host:port``; ``await server.close()`` stops it."""
    server = AdminHttpServer(bookie)
    await server.start(host, port)
    return server
