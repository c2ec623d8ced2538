"""In-process bookies behind an in-memory transport, and a narrow client context over them: the
fast layer for testing the bookie client, ledger handles and recovery without processes or
sockets. The fault injector wraps these connections exactly as it wraps real ones."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from ledgerstore.api import BookieInfo, Connection, Server, Transport
from ledgerstore.api.transport import FrameHandler, ServerLimits
from ledgerstore.client.bookie_client import BookieClient
from ledgerstore.client.channel import ChannelPool
from ledgerstore.client.health import BookieHealth
from ledgerstore.client.placement import EnsemblePlacement
from ledgerstore.config import ClientConfig
from ledgerstore.errors import BookieUnavailableError
from ledgerstore.meta.ledgers import LedgerManager
from ledgerstore.plugins import create_metadata_store, load_driver
from ledgerstore.proto import codec
from ledgerstore.proto.codec import FLAG_FENCE, FLAG_RECOVERY_ADD, Op, Status
from ledgerstore.proto.digest import ENTRY_HEADER

SCHEME = "mem"


class MemoryBookie:
    """A bookie's request handling reduced to what the protocol requires of it: entries by
    (ledger, entry), the master key, the fenced flag and the LAC carried by stored entries."""

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.entries: dict[tuple[int, int], bytes] = {}
        self.keys: dict[int, bytes] = {}
        self.fenced: set[int] = set()
        self.lac: dict[int, int] = {}
        self.up = True

    def _keyed(self, lid: int, key: bytes) -> bool:
        """Remember the ledger's key on first use; False if another one is presented."""
        return self.keys.setdefault(lid, key) == key

    def _store(self, lid: int, eid: int, data: bytes) -> None:
        self.entries[(lid, eid)] = data
        self.lac[lid] = max(self.lac.get(lid, -1), ENTRY_HEADER.unpack_from(data)[2])

    def answer(self, frame: bytes) -> bytes:
        req = codec.decode_request(frame)
        rid = req.request_id
        if isinstance(req, codec.AddBatchRequest):
            lid = req.ledger_id
            if not self._keyed(lid, req.master_key):
                return codec.encode_add_batch_response(rid, Status.UNAUTHORIZED, lid, [])
            if lid in self.fenced:
                return codec.encode_add_batch_response(rid, Status.OK, lid,
                                                       [(e, Status.FENCED) for e, _ in req.entries])
            for eid, data in req.entries:
                self._store(lid, eid, data)
            return codec.encode_add_batch_all_ok(rid, lid, len(req.entries))
        if isinstance(req, codec.AddRequest):
            lid, eid = req.ledger_id, req.entry_id
            if not self._keyed(lid, req.master_key):
                return codec.encode_add_response(rid, Status.UNAUTHORIZED, lid, eid)
            if lid in self.fenced and not req.flags & FLAG_RECOVERY_ADD:
                return codec.encode_add_response(rid, Status.FENCED, lid, eid)
            self._store(lid, eid, req.entry)
            return codec.encode_add_response(rid, Status.OK, lid, eid)
        if isinstance(req, codec.ReadRequest | codec.ReadLacRequest):
            lid = req.ledger_id
            if req.flags & FLAG_FENCE:
                if not self._keyed(lid, req.master_key):
                    return codec.encode_error_response(Op.READ if isinstance(req, codec.ReadRequest) else Op.READ_LAC,
                                                       rid, Status.UNAUTHORIZED)
                self.fenced.add(lid)
            if isinstance(req, codec.ReadLacRequest):
                if lid not in self.keys:
                    return codec.encode_lac_response(Op.READ_LAC, rid, Status.NO_SUCH_LEDGER, lid, -1, -1)
                return codec.encode_lac_response(Op.READ_LAC, rid, Status.OK, lid, self.lac.get(lid, -1), -1)
            stored = self.entries.get((lid, req.entry_id))
            if stored is None:
                status = Status.NO_SUCH_ENTRY if lid in self.keys else Status.NO_SUCH_LEDGER
                return codec.encode_read_response(rid, status, lid, req.entry_id)
            return codec.encode_read_response(rid, Status.OK, lid, req.entry_id, stored)
        if isinstance(req, codec.ReadMultiRequest):
            lid = req.ledger_id
            items: list[tuple[int, int, bytes]] = [(e, Status.OK, self.entries[(lid, e)]) if (lid, e) in self.entries else
                     (e, Status.NO_SUCH_ENTRY, b"") for e in req.entry_ids]
            return codec.encode_read_multi_response(rid, Status.OK, lid, items)
        if isinstance(req, codec.LongPollLacRequest):
            lid = req.ledger_id
            return codec.encode_lac_response(Op.LONG_POLL_LAC, rid, Status.OK, lid, self.lac.get(lid, -1), -1)
        return codec.encode_error_response(codec.peek_header(frame)[1], rid, Status.BAD_REQUEST)


class _MemoryConnection(Connection):
    def __init__(self, bookie: MemoryBookie, on_frames: Callable[[Sequence[bytes]], None],
                 on_close: Callable[[BaseException | None], None]) -> None:
        self._bookie = bookie
        self._on_frames = on_frames
        self._on_close = on_close
        self._closed = False
        self._loop = asyncio.get_running_loop()

    def send(self, frame: bytes) -> None:
        if self._closed:
            raise BookieUnavailableError(f"connection to {self._bookie.bookie_id} is closed")
        if self._bookie.up:  # a bookie that is down never answers (the channel times out)
            answer = self._bookie.answer(frame)
            self._loop.call_soon(lambda: None if self._closed else self._on_frames([answer]))

    async def drain(self) -> None:
        return None

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._on_close(None)

    @property
    def is_closed(self) -> bool:
        return self._closed


class MemoryTransport(Transport):
    """``mem://<bookie id>`` reaches the in-process bookie of that id."""

    schemes = (SCHEME,)

    def __init__(self, bookies: dict[str, MemoryBookie], **options: Any) -> None:
        super().__init__(**options)
        self.bookies = bookies

    async def connect(self, address: str, on_frames: Callable[[Sequence[bytes]], None],
                      on_close: Callable[[BaseException | None], None]) -> Connection:
        bookie = self.bookies.get(address.partition("://")[2])
        if bookie is None:
            raise BookieUnavailableError(f"no in-process bookie at {address}")
        return _MemoryConnection(bookie, on_frames, on_close)

    async def serve(self, address: str, handler: FrameHandler, limits: ServerLimits = ServerLimits()) -> Server:
        raise NotImplementedError("in-process bookies are not served over a transport")


@dataclasses.dataclass
class MemoryContext:
    """A :class:`ledgerstore.client.context.ClientContext` over in-process bookies (and the
    ``pool`` and ``loop`` the fault injector installs on)."""

    config: ClientConfig
    ledgers: LedgerManager
    ensemble_placement: EnsemblePlacement
    pool: ChannelPool
    bookie_client: BookieClient
    loop: asyncio.AbstractEventLoop
    bookies: dict[str, MemoryBookie]

    async def bookie_infos(self, max_age: float = 1.0) -> list[BookieInfo]:
        return [BookieInfo(b, f"{SCHEME}://{b}") for b, bk in self.bookies.items() if bk.up]

    def read_order(self, ensemble: Sequence[str], write_set: Sequence[int]) -> list[int]:
        return list(write_set)


async def memory_context(tmp_path: Path, n_bookies: int = 3, *, names: Sequence[str] = (),
                         **config: Any) -> MemoryContext:
    """``n_bookies`` in-process bookies ``b0..`` (or named ``names``) and a context over them; ledger metadata in a
    sqlite file under ``tmp_path``. Close with ``await ctx.pool.close(); await ctx.ledgers.store.close()``."""
    uri = f"sqlite:///{tmp_path / 'metadata.db'}"
    cfg = ClientConfig(metadata=uri, **config)
    store = create_metadata_store(uri)
    await store.start()
    bookies = {b: MemoryBookie(b) for b in (names or [f"b{i}" for i in range(n_bookies)])}

    async def resolve(bookie_id: str) -> str:
        return f"{SCHEME}://{bookie_id}"

    pool = ChannelPool(resolve, {}, cfg.max_frame_size, reconnect_backoff=0.0,
                       transports=(MemoryTransport(bookies),))
    placement = load_driver("placement", cfg.placement)(**cfg.placement_options)
    return MemoryContext(cfg, LedgerManager(store), EnsemblePlacement(placement, BookieHealth()), pool, BookieClient(pool),
                         asyncio.get_running_loop(), bookies)


def run_in_memory(tmp_path: Path, test: Callable[[MemoryContext], Awaitable[None]], names: Sequence[str] = (),
                  **config: Any) -> None:
    """Run ``test`` on a fresh :func:`memory_context` (closed afterwards), within 60 s."""

    async def main() -> None:
        ctx = await memory_context(tmp_path, names=names, **config)
        try:
            await test(ctx)
        finally:
            await ctx.pool.close()
            await ctx.ledgers.store.close()

    asyncio.run(asyncio.wait_for(main(), 60))
