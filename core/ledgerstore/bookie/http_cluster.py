"""Cluster-wide admin endpoints any bookie answers from the metadata store: bookie disk usage,
the cluster summary, and BookKeeper's ``/api/v1/autorecovery/*`` (under-replicated ledgers, the
auditor, the lost-bookie delay, the cluster-wide switch, decommissioning and recovering a bookie).

Paths, methods and JSON field names are BookKeeper's (its "Admin REST API" page). The markers and
switches are the ones the shell and the auditor use (:mod:`ledgerstore.recovery.markers`);
decommission and recovery run :mod:`ledgerstore.recovery.admin` in the background, as BookKeeper
runs them, and answer at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ledgerstore.api.http import HttpError, Request, Response, parse_bool
from ledgerstore.bookie.http_routes import Endpoints, Route
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta import layout
from ledgerstore.recovery.admin import decommission_bookie, recover_bookie
from ledgerstore.recovery.markers import UnderReplicationManager

log = logging.getLogger(__name__)


def cluster_routes(server: Any) -> list[Route]:
    """The routes of this module, bound to ``server`` (an :class:`~ledgerstore.bookie.http.AdminHttpServer`)."""
    api = ClusterEndpoints(server)
    ar = "/api/v1/autorecovery"
    return [
        ("GET", "/api/v1/bookie/list_bookie_info", api.list_bookie_info),
        ("GET", "/api/v1/bookie/cluster_info", api.cluster_info),
        ("GET", f"{ar}/list_under_replicated_ledger", api.list_under_replicated),
        ("GET", f"{ar}/who_is_auditor", api.who_is_auditor),
        ("PUT", f"{ar}/trigger_audit", api.trigger_audit),
        ("GET", f"{ar}/lost_bookie_recovery_delay", api.get_lost_bookie_delay),
        ("PUT", f"{ar}/lost_bookie_recovery_delay", api.put_lost_bookie_delay),
        ("GET", f"{ar}/status", api.get_status),
        ("PUT", f"{ar}/status", api.put_status),
        ("PUT", f"{ar}/decommission", api.decommission),
        ("PUT", f"{ar}/bookie", api.recover),
    ]


class ClusterEndpoints(Endpoints):
    """Handlers over the bookie's metadata store (and, for disk figures, its client)."""

    @property
    def markers(self) -> UnderReplicationManager:
        return UnderReplicationManager(self.bookie.store)

    # --- bookies -----------------------------------------------------------------------------

    async def list_bookie_info(self, req: Request) -> Response:

        infos = sorted(await self.bookie.registry.all(), key=lambda i: i.bookie_id)
        out: dict[str, Any] = {i.bookie_id: {"free": i.free_bytes, "total": i.total_bytes} for i in infos}
        out["clusterInfo"] = {"total_free": sum(i.free_bytes for i in infos), "total": sum(i.total_bytes for i in infos)}
        return Response.of_json(out)

    async def cluster_info(self, req: Request) -> Response:

        infos = await self.bookie.registry.all()
        registered = {i.bookie_id for i in infos}
        known = set(await self.bookie.store.children(layout.COOKIES)) | registered
        readonly = sum(1 for i in infos if i.read_only)
        markers = self.markers
        auditor = await markers.auditor()
        return Response.of_json({
            "auditorElected": auditor is not None,
            "auditorId": auditor or "",
            "clusterUnderReplicated": bool(await markers.ledger_ids()),
            "ledgerReplicationEnabled": await markers.is_enabled(),
            "totalBookiesCount": len(known),
            "writableBookiesCount": len(infos) - readonly,
            "readonlyBookiesCount": readonly,
            "unavailableBookiesCount": len(known - registered),
        })

    # --- auto-recovery -----------------------------------------------------------------------

    async def list_under_replicated(self, req: Request) -> Response:

        missing = req.query.get("missingreplica") or None
        excluding = req.query.get("excludingmissingreplica") or None
        found = [m for m in await self.markers.all()
                 if (missing is None or missing in m.missing) and (excluding is None or excluding not in m.missing)]
        if not found:  # BookKeeper answers 404 when nothing is under-replicated
            return Response.error(404, "no under-replicated ledgers")
        if "printmissingreplica" in req.query:  # BookKeeper: present at all, whatever its value
            return Response.of_json({str(m.ledger_id): sorted(m.missing) for m in found})
        return Response.of_json([m.ledger_id for m in found])

    async def who_is_auditor(self, req: Request) -> Response:

        auditor = await self.markers.auditor()
        if auditor is None:
            return Response.error(404, "no auditor is elected: no auto-recovery process is running")
        return Response.of_json({"Auditor": auditor})

    async def trigger_audit(self, req: Request) -> Response:

        markers = self.markers
        await markers.trigger_audit()
        return Response.of_json({"triggered": True, "auditor": await markers.auditor()})

    async def get_lost_bookie_delay(self, req: Request) -> Response:

        override = await self.markers.lost_bookie_delay()
        seconds = self.bookie.config.autorecovery.lost_bookie_recovery_delay_s if override is None else override
        return Response.of_json({"delay_seconds": seconds, "cluster_wide": override is not None})

    async def put_lost_bookie_delay(self, req: Request) -> Response:

        body = req.json()
        seconds = body.get("delay_seconds") if isinstance(body, dict) else None
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise HttpError(400, 'expected a JSON object like {"delay_seconds": 60} with a number >= 0')
        await self.markers.set_lost_bookie_delay(float(seconds))
        return Response.of_json({"delay_seconds": float(seconds), "cluster_wide": True})

    async def get_status(self, req: Request) -> Response:

        return Response.of_json({"enabled": await self.markers.is_enabled()})

    async def put_status(self, req: Request) -> Response:

        raw = req.query.get("enabled")
        if raw is None and req.body:
            body = req.json()
            raw = body.get("enabled") if isinstance(body, dict) else None
        if raw is None:
            raise HttpError(400, "give enabled=true or enabled=false (query parameter or JSON body)")
        markers = self.markers
        await markers.set_enabled(parse_bool(raw, "enabled"))
        return Response.of_json({"enabled": await markers.is_enabled()})

    async def decommission(self, req: Request) -> Response:
        bookie_id = _bookie_src(req)
        settings = self.bookie.config.autorecovery
        return await self._in_background("decommission", bookie_id,
                                         lambda client: decommission_bookie(client, bookie_id, settings))

    async def recover(self, req: Request) -> Response:
        body = req.json()
        if not isinstance(body, dict) or not isinstance(body.get("bookie_src"), list) or len(body["bookie_src"]) != 1:
            raise HttpError(400, 'expected a JSON object like {"bookie_src": ["host:3181"], "delete_cookie": false}: '
                                 "one bookie per request")
        if body.get("bookie_dest"):
            raise HttpError(400, "bookie_dest is not supported: the placement policy chooses the replacements")
        bookie_id = str(body["bookie_src"][0])
        delete_cookie = parse_bool(body.get("delete_cookie", False), "delete_cookie")
        settings = self.bookie.config.autorecovery
        return await self._in_background("recovery", bookie_id, lambda client: recover_bookie(
            client, bookie_id, settings, delete_cookie=delete_cookie))

    async def _in_background(self, what: str, bookie_id: str,
                             work: Callable[[Any], Awaitable[dict[str, Any]]]) -> Response:

        client = await self.server.client()

        async def run() -> None:
            try:
                result = await work(client)
                log.info("%s of bookie %s finished: %s", what, bookie_id, result)
            except asyncio.CancelledError:
                log.warning("%s of bookie %s stopped: the bookie is shutting down", what, bookie_id)
                raise
            except LedgerStoreError as exc:
                log.error("%s of bookie %s failed: %s", what, bookie_id, exc)

        task = asyncio.get_running_loop().create_task(run(), name=f"{what}-{bookie_id}")
        self.server.background.add(task)
        task.add_done_callback(self.server.background.discard)
        return Response.of_json({"message": f"{what} of bookie {bookie_id} started; follow it with "
                                            "list_under_replicated_ledger and the bookie's log", "bookie_src": bookie_id})


def _bookie_src(req: Request) -> str:

    body = req.json()
    src = body.get("bookie_src") if isinstance(body, dict) else None
    if not isinstance(src, str) or ":" not in src:
        raise HttpError(400, 'expected a JSON object like {"bookie_src": "host:3181"}')
    return src
