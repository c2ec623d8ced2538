"""The ledger endpoints of the admin API (BookKeeper's ``/api/v1/ledger/*``): list, metadata,
read and delete. Reads open the ledger without recovery: looking at a ledger never fences its
writer. A ledger password travels in a header, never in the URL.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from ledgerstore.api.http import HttpError, Request, Response
from ledgerstore.bookie.http_routes import Endpoints, Route
from ledgerstore.errors import NoSuchLedgerError
from ledgerstore.meta.ledgers import LedgerManager

#: entries one ``/api/v1/ledger/read`` answers at most (BookKeeper's page size too)
MAX_READ_ENTRIES = 1000
#: ledgers per ``page`` of ``/api/v1/ledger/list?print_metadata=true`` (BookKeeper's batch size)
LIST_PAGE_SIZE = 100
#: the header carrying a ledger password (never the URL: URLs end up in logs and histories)
LEDGER_PASSWORD_HEADER = "x-ledger-password"


def ledger_routes(server: Any) -> list[Route]:
    """The routes of this module, bound to ``server`` (an :class:`~ledgerstore.bookie.http.AdminHttpServer`)."""
    api = LedgerEndpoints(server)
    return [
        ("GET", "/api/v1/ledger/list", api.ledger_list),
        ("GET", "/api/v1/ledger/metadata", api.ledger_metadata),
        ("GET", "/api/v1/ledger/read", api.ledger_read),
        ("DELETE", "/api/v1/ledger/delete", api.ledger_delete),
    ]


class LedgerEndpoints(Endpoints):
    """Handlers over the metadata store and a client of the cluster."""

    async def ledger_list(self, req: Request) -> Response:
        """BookKeeper's body: ``{"ledger id": null, ...}``; with ``print_metadata=true`` each value
        is the ledger's metadata as a JSON string, or as an object with ``decode_meta=true``;
        ``page=N`` (with ``print_metadata``) answers the N-th hundred, as BookKeeper.
        ``limit=N`` (ours) stops after N ledgers."""
        with_md = req.bool_param("print_metadata")
        decode = req.bool_param("decode_meta")
        page = req.int_param("page", 0) if with_md else 0
        limit = req.int_param("limit", 0)
        first, last = ((page - 1) * LIST_PAGE_SIZE, page * LIST_PAGE_SIZE) if page > 0 else (0, -1)
        mgr = LedgerManager(self.bookie.store)
        ids: list[int] = []
        index = 0
        async for lid in mgr.list():
            index += 1
            if index <= first or (last >= 0 and index > last):
                continue
            ids.append(lid)
            if limit and len(ids) >= limit:
                break
        out: dict[str, Any] = {}
        for lid in ids:
            if not with_md:
                out[str(lid)] = None
                continue
            try:
                md = (await mgr.read(lid)).to_dict()
            except NoSuchLedgerError:
                continue  # deleted while listing
            out[str(lid)] = md if decode else json.dumps(md)
        return Response.of_json(out)

    async def ledger_metadata(self, req: Request) -> Response:
        """BookKeeper's body: ``{"ledger id": metadata}``."""
        lid = req.int_param("ledger_id")
        md = await LedgerManager(self.bookie.store).read(lid)
        return Response.of_json({str(lid): md.to_dict()})

    async def ledger_read(self, req: Request) -> Response:
        """BookKeeper's body: ``{"entry id": "payload as US-ASCII text", ...}`` (bytes outside
        ASCII become U+FFFD, as Java's decoder does). ``details=true`` answers ``{"ledger_id",
        "last_add_confirmed", "entries": [{entry_id, length, data_base64, text}]}``, byte-exact."""
        lid = req.int_param("ledger_id")
        first = req.int_param("first", req.int_param("start_entry_id", 0))
        page = req.int_param("page", 0)
        password = ledger_password(req)
        client = await self.server.client()
        # no recovery: an administrator looking at a ledger must not fence its writer
        handle = await client.open_ledger(lid, password=password, recovery=False)
        lac = handle.last_add_confirmed
        if page > 0:  # BookKeeper's pages are thousands of entries: page 1 is 0..999
            first = max(first, (page - 1) * MAX_READ_ENTRIES)
        default_last = min(lac, first + MAX_READ_ENTRIES - 1)
        last = req.int_param("last", req.int_param("end_entry_id", default_last))
        if last == -1:  # BookKeeper's "up to the end"
            last = default_last
        if first < 0:
            raise HttpError(400, f"first={first} must be >= 0")
        if last - first + 1 > MAX_READ_ENTRIES:
            raise HttpError(400, f"asked for {last - first + 1} entries; at most {MAX_READ_ENTRIES} per request")
        if last > lac:
            raise HttpError(404, f"ledger {lid}: entry {last} is beyond the last add confirmed ({lac})")
        entries = await handle.read(first, last) if last >= first else []
        if not req.bool_param("details"):
            body = {"Entries for page: ": str(page)} if page > 0 else {}  # BookKeeper's key, spelled so
            body.update({str(e.entry_id): e.payload.decode("ascii", "replace") for e in entries})
            return Response.of_json(body)
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

    async def ledger_delete(self, req: Request) -> Response:
        # an administrator's delete, as BookKeeper's: no ledger password (the caller is authenticated)
        lid = req.int_param("ledger_id")
        client = await self.server.client()
        await client.delete_ledger(lid)
        return Response.of_json({"ledger_id": lid, "deleted": True})


def ledger_password(req: Request) -> bytes:
    """The ledger password a request carries in ``X-Ledger-Password`` (b"" without one)."""
    # header values were decoded as latin-1: encoding back gives the bytes the client sent
    return req.headers.get(LEDGER_PASSWORD_HEADER, "").encode("latin-1")
