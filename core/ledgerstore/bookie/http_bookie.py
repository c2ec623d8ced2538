"""The bookie's own admin endpoints: health, metrics, info and state, read-only switch, garbage
collection and compaction switches, journal marks, disk files, storage expansion, the runtime
configuration and the sanity test (BookKeeper's ``/api/v1/bookie/*`` and ``/api/v1/config/*``).

Paths, methods and bodies are BookKeeper's (its "Admin REST API" page and the handlers in
``bookkeeper-server/.../server/http/service/``), field for field and of the same JSON types: where
we know more we add fields, never rename one. Where BookKeeper's body is keyed by ids (bookies,
journal marks) and leaves no room for more fields, ``details=true`` answers ledgerstore's richer
body instead (see ``docs/admin-http.md``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from pathlib import Path
from typing import Any

from ledgerstore.api.http import TEXT, HttpError, Request, Response, parse_bool
from ledgerstore.bookie import cookie as cookies
from ledgerstore.bookie.http_routes import Endpoints, Route, bk_bool
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta.bookies import CookieManager
from ledgerstore.stalls import peaks

log = logging.getLogger(__name__)


def bookie_routes(server: Any) -> tuple[list[Route], list[Route]]:
    """The routes of this module bound to ``server`` (an :class:`~ledgerstore.bookie.http.AdminHttpServer`):
    (open routes, GET routes that need credentials like a state change does)."""
    api = BookieEndpoints(server)
    return [
        ("GET", "/heartbeat", api.heartbeat),
        ("GET", "/metrics", api.metrics),
        ("GET", "/api/v1/bookie/info", api.info),
        ("GET", "/api/v1/bookie/stalls", api.stalls),
        ("GET", "/api/v1/bookie/state", api.get_state),
        ("PUT", "/api/v1/bookie/state", api.put_state),
        ("GET", "/api/v1/bookie/list_bookies", api.list_bookies),
        ("GET", "/api/v1/bookie/gc", api.get_gc),
        ("PUT", "/api/v1/bookie/gc", api.put_gc),
        ("GET", "/api/v1/bookie/last_log_mark", api.last_log_mark),
        ("GET", "/api/v1/bookie/is_ready", api.is_ready),
        ("GET", "/api/v1/bookie/state/readonly", api.get_readonly),
        ("PUT", "/api/v1/bookie/state/readonly", api.put_readonly),
        ("GET", "/api/v1/bookie/list_disk_file", api.list_disk_file),
        ("GET", "/api/v1/bookie/gc_details", api.gc_details),
        ("GET", "/api/v1/bookie/gc/suspend_compaction", api.get_suspended),
        ("PUT", "/api/v1/bookie/gc/suspend_compaction", api.suspend_compaction),
        ("PUT", "/api/v1/bookie/gc/resume_compaction", api.resume_compaction),
        ("PUT", "/api/v1/bookie/expand_storage", api.expand_storage),
        ("PUT", "/api/v1/config/server_config", api.put_server_config),
    ], [
        # the configuration may hold secrets; the sanity test writes
        ("GET", "/api/v1/config/server_config", api.get_server_config),
        ("GET", "/api/v1/bookie/sanity", api.sanity),
    ]


class BookieEndpoints(Endpoints):
    """Handlers over the bookie itself."""

    def __init__(self, server: Any) -> None:
        super().__init__(server)
        #: a forced garbage collection is running (one at a time)
        self.gc_running = False

    async def heartbeat(self, req: Request) -> Response:
        return Response(200, TEXT, b"OK\n")

    async def metrics(self, req: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        # engine.stats() and statvfs may touch the disk: keep them off the event loop
        data = await asyncio.to_thread(self.server.metrics.render)
        return Response(200, CONTENT_TYPE_LATEST, data)

    async def info(self, req: Request) -> Response:
        b = self.bookie
        info = dataclasses.asdict(b.info())
        total, used, free = b.disk_usage()
        stats = await asyncio.to_thread(b.engine.stats) if b.engine is not None else None
        from ledgerstore import __version__

        info.update({
            # BookKeeper's BookieInfoService: {"freeSpace", "totalSpace"} in bytes
            "freeSpace": info["free_bytes"],
            "totalSpace": info["total_bytes"],
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

    async def stalls(self, req: Request) -> Response:
        """Per-second peaks of this process's loop lag, journal queue and fsync, checkpoints,
        write-back syncs and GC pauses (:mod:`ledgerstore.stalls`): ``{"now": unix time,
        "peaks": {component: [[second, seconds], ...]}}``."""
        snap = peaks.snapshot()
        return Response.of_json({"now": time.time(),
                                 "peaks": {k: sorted([s, round(v, 6)] for s, v in by.items()) for k, by in snap.items()}})

    def state(self) -> dict[str, Any]:
        """BookKeeper's BookieStateService body plus ``forcedReadOnly``, ``registered``,
        ``journalFailed`` and ``ledgersInLimbo``."""
        st = self.bookie.status()
        return {
            "running": not st.stopping,
            "readOnly": st.read_only,
            "shuttingDown": st.stopping,
            "availableForHighPriorityWrites": st.takes_recovery_adds,
            "forcedReadOnly": st.forced_read_only,
            "registered": st.registered,
            "journalFailed": st.journal_failed,
            "ledgersInLimbo": st.ledgers_in_limbo,
        }

    async def get_state(self, req: Request) -> Response:
        return Response.of_json(self.state())

    async def put_state(self, req: Request) -> Response:
        await self.set_read_only(req)
        return Response.of_json(self.state())

    async def set_read_only(self, req: Request) -> None:
        body = req.json()
        if not isinstance(body, dict) or "readOnly" not in body:
            raise HttpError(400, 'expected a JSON object like {"readOnly": true}')
        await self.bookie.set_read_only(parse_bool(body["readOnly"], "readOnly"))

    async def get_readonly(self, req: Request) -> Response:
        return Response.of_json({"readOnly": self.bookie.read_only})

    async def put_readonly(self, req: Request) -> Response:
        await self.set_read_only(req)
        return Response.of_json({"readOnly": self.bookie.read_only})

    async def is_ready(self, req: Request) -> Response:
        # BookKeeper: 200 with an empty body when ready, 503 otherwise
        st = self.bookie.status()
        ready = st.serving and st.registered
        return Response(200 if ready else 503, TEXT, b"")

    async def list_bookies(self, req: Request) -> Response:
        """BookKeeper's body, ``{"host:port": hostname or null}`` (the hostname only with
        ``print_hostnames=true``); ``type=rw`` (the default, as BookKeeper), ``ro``, or ``all``
        (ours). ``details=true`` answers ``{"bookies": [registration, ...]}`` instead."""
        kind = req.query.get("type", "rw").lower()
        if kind not in ("rw", "ro", "all"):
            raise HttpError(400, f"type={kind!r}: use rw (writable), ro (read-only) or all")
        infos = [i for i in sorted(await self.bookie.registry.all(), key=lambda i: i.bookie_id)
                 if kind == "all" or (kind == "ro") == i.read_only]
        if req.bool_param("details"):
            rows = [{**dataclasses.asdict(i), "state": "read-only" if i.read_only else "writable"} for i in infos]
            return Response.of_json({"bookies": rows})
        hostnames = req.bool_param("print_hostnames")
        return Response.of_json({i.bookie_id: _hostname(i.bookie_id) if hostnames else None for i in infos})

    async def get_gc(self, req: Request) -> Response:
        # BookKeeper answers the flag as a string: "true" / "false"
        return Response.of_json({"is_in_force_gc": bk_bool(self.gc_running)})

    async def put_gc(self, req: Request) -> Response:
        """Collect now; ``major`` / ``minor`` (query or body) force that compaction. BookKeeper's
        body ``{"forceMajor": true, "forceMinor": false}`` works too, with its defaults: a switch
        it leaves out is on (a suspended compaction still does not run)."""
        minor = req.bool_param("minor")
        major = req.bool_param("major")
        if req.body:
            body = req.json()
            if not isinstance(body, dict):
                raise HttpError(400, 'expected a JSON object like {"major": true} or {"forceMajor": true}')
            if {"forceMajor", "forceMinor"} & set(body):
                minor = parse_bool(body.get("forceMinor", True), "forceMinor")
                major = parse_bool(body.get("forceMajor", True), "forceMajor")
            minor = parse_bool(body.get("minor", minor), "minor")
            major = parse_bool(body.get("major", major), "major")
        if self.gc_running:
            raise HttpError(409, "a forced garbage collection is already running; retry when it ends")
        self.gc_running = True
        try:
            result = await self.bookie.gc(minor=minor, major=major)
        finally:
            self.gc_running = False
        return Response.of_json(result)

    async def last_log_mark(self, req: Request) -> Response:
        """BookKeeper's body, one key per journal: ``{"LastLogMark: Journal Id - N(hex.txn)":
        "Pos - offset"}``, the checkpointed mark replay starts from. ``details=true`` answers
        ``{"journal_dir", "durable": {file_id, offset}, "last_log_mark": {file_id, offset}}``."""
        from ledgerstore.bookie.journal import read_mark

        b = self.bookie
        if b.journal is None:
            raise HttpError(503, "the journal is not open yet")
        durable = b.journal.durable_mark()
        checkpointed = await asyncio.to_thread(read_mark, b.journal_dir)
        if not req.bool_param("details"):
            # BookKeeper's GetLastLogMarkService spells the key and value this way, ".txn" included
            key = f"LastLogMark: Journal Id - {checkpointed.file_id}({checkpointed.file_id:x}.txn)"
            return Response.of_json({key: f"Pos - {checkpointed.offset}"})
        return Response.of_json({
            "journal_dir": str(b.journal_dir),
            # written and fsync'd: what acknowledged adds rely on
            "durable": {"file_id": durable.file_id, "offset": durable.offset},
            # the LastLogMark: the storage engine holds everything before it; replay starts here
            "last_log_mark": {"file_id": checkpointed.file_id, "offset": checkpointed.offset},
        })

    async def list_disk_file(self, req: Request) -> Response:
        kind = req.query.get("file_type", "").lower()
        if kind not in ("", "journal", "entrylog", "index"):
            raise HttpError(400, f"file_type={kind!r}: use journal, entrylog or index (or leave it out for all)")
        listing = await asyncio.to_thread(_disk_files, self.bookie.journal_dir, self.bookie.ledger_dirs)
        return Response.of_json({f"{k} files": " ".join(v) for k, v in listing.items() if kind in ("", k)})

    async def gc_details(self, req: Request) -> Response:
        return Response.of_json([self.bookie.compaction.details(self.gc_running)])

    def suspension(self) -> dict[str, str]:
        """BookKeeper's body: the switches as strings, ``"true"`` / ``"false"``."""
        c = self.bookie.compaction
        return {"isMajorGcSuspended": bk_bool(c.suspend_major), "isMinorGcSuspended": bk_bool(c.suspend_minor)}

    async def get_suspended(self, req: Request) -> Response:
        return Response.of_json(self.suspension())

    def switch_compaction(self, req: Request, major_key: str, minor_key: str, suspend: bool) -> Response:
        body = req.json()
        if not isinstance(body, dict) or not ({major_key, minor_key} & set(body)):
            raise HttpError(400, f'expected a JSON object like {{"{major_key}": true, "{minor_key}": true}}')
        c = self.bookie.compaction
        if parse_bool(body.get(major_key, False), major_key):
            c.suspend_major = suspend
        if parse_bool(body.get(minor_key, False), minor_key):
            c.suspend_minor = suspend
        return Response.of_json(self.suspension())

    async def suspend_compaction(self, req: Request) -> Response:
        return self.switch_compaction(req, "suspendMajor", "suspendMinor", True)

    async def resume_compaction(self, req: Request) -> Response:
        return self.switch_compaction(req, "resumeMajor", "resumeMinor", False)

    async def expand_storage(self, req: Request) -> Response:
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
            b.ownership.cookie = cookie
            cookies.write_local(cookies.cookie_dirs(b.journal_dir, wanted), cookie)
            await CookieManager(b.store).put(b.bookie_id, {**cookie, "endpoint": b.advertised})
            log.info("storage expanded with %s; set ledger_dirs = %s in the config and restart", added, dirs)
        return Response.of_json({"added": added, "ledger_dirs": [str(d) for d in wanted], "restart_needed": bool(added)})

    async def get_server_config(self, req: Request) -> Response:
        return Response.of_json(_redacted(dataclasses.asdict(self.bookie.config)))

    async def put_server_config(self, req: Request) -> Response:
        body = req.json()
        if not isinstance(body, dict) or not body:
            raise HttpError(400, 'expected a JSON object of settings, e.g. {"disk_usage_threshold": 0.9}')
        # BookKeeper's names for the same settings (same units) name ours
        body = {BOOKKEEPER_SETTINGS.get(k, k): v for k, v in body.items()}
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

    async def sanity(self, req: Request) -> Response:
        # BookKeeper's sanity test: write entries to a ledger on this bookie alone, read them back
        b = self.bookie
        client = await self.server.client()
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


RUNTIME_SETTINGS = frozenset({
    "disk_usage_threshold", "disk_usage_lwm", "disk_check_interval_ms", "minor_compaction_threshold",
    "major_compaction_threshold", "minor_compaction_interval_s", "major_compaction_interval_s",
})
#: BookKeeper's ``bk_server.conf`` names of the runtime settings, accepted by ``PUT server_config``
BOOKKEEPER_SETTINGS = {
    "diskUsageThreshold": "disk_usage_threshold", "diskUsageLwmThreshold": "disk_usage_lwm",
    "diskCheckInterval": "disk_check_interval_ms", "minorCompactionThreshold": "minor_compaction_threshold",
    "majorCompactionThreshold": "major_compaction_threshold", "minorCompactionInterval": "minor_compaction_interval_s",
    "majorCompactionInterval": "major_compaction_interval_s",
}
_SECRET_KEY = re.compile(r"pass|secret|credential|auth_data|private|token(?!_file)", re.IGNORECASE)


def _redacted(value: Any) -> Any:
    """The configuration with the values of secret-looking keys replaced (file names stay)."""
    if isinstance(value, dict):
        return {k: "(redacted)" if _SECRET_KEY.search(str(k)) and not str(k).endswith("_file") and v
                else _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


def _hostname(bookie_id: str) -> str:
    """The host part of a ``host:port`` bookie id (BookKeeper prints the resolved host name;
    resolving here would make a listing wait on DNS)."""
    return bookie_id.rsplit(":", 1)[0].strip("[]")


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
