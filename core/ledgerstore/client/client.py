"""The asyncio client: ``ledgerstore.aio.Client``."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Sequence
from typing import Any

from ledgerstore.api import BookieInfo, MetadataStore, PlacementPolicy, Transport
from ledgerstore.client import arguments as args
from ledgerstore.client.bookie_client import BookieClient
from ledgerstore.client.channel import ChannelPool
from ledgerstore.client.health import BookieHealth, HealthChecker
from ledgerstore.client.ledger import LedgerHandle
from ledgerstore.client.log import (
    LedgerSettings,
    LogReader,
    LogWriter,
    fence_and_delete_log,
    list_logs,
    open_log_reader,
    open_log_writer,
    truncate_log,
)
from ledgerstore.client.metrics import CLIENT_METRICS, timed
from ledgerstore.client.passwords import PasswordChecks
from ledgerstore.client.placement import EnsemblePlacement
from ledgerstore.client.read import ReadHandle
from ledgerstore.client.recovery import recover
from ledgerstore.config import ClientConfig, load_client_config
from ledgerstore.errors import (
    BookieUnavailableError,
    InvalidArgumentError,
    LedgerStoreError,
)
from ledgerstore.meta.bookies import BookieRegistry, ClusterManager
from ledgerstore.meta.cluster_check import refuse_missing_sqlite_file, require_cluster
from ledgerstore.meta.ledgers import LedgerManager, LedgerMetadata
from ledgerstore.meta.logs import Position
from ledgerstore.plugins import build, create_metadata_store, notify
from ledgerstore.proto.digest import DIGEST_TYPES, normalize_digest_type

log = logging.getLogger(__name__)


class Client:
    """Creates, opens, reads and deletes ledgers. Use ``async with Client(metadata=URI)``.

    ``metadata`` is a metadata-store URI (``sqlite:///path.db``, ``zk://host:2181/ledgers``,
    ``etcd://host:2379/ledgers``); other keyword arguments override :class:`ClientConfig` fields.
    Starting it on a URI that holds no cluster raises :class:`~ledgerstore.errors.NoClusterError` and creates nothing
    there; only the tools that create or erase a cluster pass ``need_cluster=False``.
    """

    def __init__(self, metadata: str | ClientConfig | None = None, *, config: ClientConfig | None = None,
                 metadata_store: MetadataStore | None = None, transport: Transport | dict[str, Any] | None = None,
                 placement: PlacementPolicy | str | None = None, need_cluster: bool = True, **overrides: Any) -> None:
        if isinstance(metadata, ClientConfig) and config is None:  # Client(config, ...)
            metadata, config = None, metadata
        # ``placement="rack-aware"`` and ``transport={...}`` are config overrides; instances are plugins
        for name, value in (("placement", placement), ("transport", transport)):
            if value is not None and not isinstance(value, PlacementPolicy | Transport):
                overrides[name] = value
        placement = placement if isinstance(placement, PlacementPolicy) else None
        transport = transport if isinstance(transport, Transport) else None
        if config is None:
            if metadata is not None:
                overrides["metadata"] = metadata
            config = load_client_config(None, **overrides)
        elif metadata is not None or overrides:
            raise InvalidArgumentError("pass either config= or metadata=/overrides, not both")
        self.config = config
        self.store: MetadataStore | None = None
        #: a store given by the caller (e.g. wrapped for fault injection) is used instead of one
        #: built from ``config.metadata``; the client still starts and closes it
        self._given_store = metadata_store
        self._need_cluster = need_cluster and metadata_store is None  # a given store is the caller's to set up
        self._started = False
        self._bookie_cache: tuple[float, list[BookieInfo]] = (float("-inf"), [])
        self._endpoints: dict[str, str] = {}
        #: plugin instances given by the caller (tests, embedding) replace the ones the config
        #: names: ``transport`` serves the schemes it declares
        self._given_transport = transport
        self.placement: PlacementPolicy = (
            placement if placement is not None
            else build("placement", config.placement, options=config.placement_options))

    @classmethod
    def from_config(cls, path: str, **overrides: Any) -> Client:
        return cls(config=load_client_config(path, **overrides))

    async def start(self) -> Client:
        if self._started:
            return self
        self.loop = asyncio.get_running_loop()
        uri = self.config.metadata
        if self._need_cluster:
            refuse_missing_sqlite_file(uri)
        self.store = self._given_store or create_metadata_store(uri, **self.config.metadata_options)
        await self.store.start()
        if self._need_cluster:
            try:  # a client joins a cluster and creates nothing where there is none
                await require_cluster(self.store, uri)
            except BaseException:
                await self.store.close()
                raise
        self.ledgers = LedgerManager(self.store, self.config.metadata_read_retry_s)
        #: makes, verifies and upgrades ledgers' password checks (see :mod:`.passwords`)
        self.password_checks = PasswordChecks(self.ledgers, self.config.password_check_cost)
        self.registry = BookieRegistry(self.store, self.config.metadata_read_retry_s)
        #: error counts and quarantines of the bookies; the health checker acts on them
        self.health = BookieHealth()
        self.pool = ChannelPool(self._resolve, self.config.transport, self.config.max_frame_size,
                                transports=() if self._given_transport is None else (self._given_transport,),
                                on_error=self.health.record_error)
        #: typed requests to bookies, for ledger handles and recovery (see :mod:`.context`)
        self.bookie_client = BookieClient(self.pool)
        #: the placement policy under the bookies' health: every new ensemble and replacement
        self.ensemble_placement = EnsemblePlacement(self.placement, self.health)
        cfg = self.config
        self.health_checker = HealthChecker(self.health, self.store, cfg.health_check_interval_s,
                                            cfg.bookie_error_threshold_per_interval, cfg.bookie_quarantine_time_s)
        self.health_checker.start()
        self._started = True
        notify("ledgerstore_client_started", client=self)
        return self

    async def close(self) -> None:
        if not self._started:
            return
        notify("ledgerstore_client_stopping", client=self)
        self._started = False
        await self.health_checker.stop()
        self.health.close()
        await self.pool.close()
        assert self.store is not None
        await self.store.close()

    async def __aenter__(self) -> Client:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- bookies -------------------------------------------------------------------------------

    async def _resolve(self, bookie_id: str) -> str:
        ep = self._endpoints.get(bookie_id)
        if ep is None:
            ep = await self.registry.endpoint_of(bookie_id)
            if ep is None:
                raise BookieUnavailableError(f"bookie {bookie_id} is not registered and has no cookie: unknown address")
            self._endpoints[bookie_id] = ep
        return ep

    async def bookie_infos(self, max_age: float = 1.0) -> list[BookieInfo]:
        """Registered bookies (writable and read-only), cached for ``max_age`` seconds."""
        ts, infos = self._bookie_cache
        # the loop's clock (time.monotonic on a real loop): a simulated run ages the cache in virtual time
        if self.loop.time() - ts > max_age:
            infos = await self.registry.all()
            self._bookie_cache = (self.loop.time(), infos)
            for b in infos:
                self._endpoints[b.bookie_id] = b.endpoint
        return infos

    async def list_bookies(self, read_only: bool | None = None) -> list[BookieInfo]:
        infos = await self.bookie_infos(max_age=0)
        if read_only is None:
            return infos
        return [b for b in infos if b.read_only == read_only]

    def read_order(self, ensemble: Sequence[str], write_set: Sequence[int]) -> list[int]:
        """Indexes of ``write_set`` in the order the placement policy wants its bookies read."""
        return self.placement.reorder_read_sequence(ensemble, write_set, self._bookie_cache[1])

    # --- ledgers -------------------------------------------------------------------------------

    @timed(CLIENT_METRICS.create_seconds)
    async def create_ledger(
        self,
        ensemble: int | None = None,
        write_quorum: int | None = None,
        ack_quorum: int | None = None,
        digest: str | None = None,
        password: bytes = b"",
        custom_metadata: dict[str, str] | None = None,
        bookies: list[str] | None = None,
    ) -> LedgerHandle:
        """Create a ledger on ``ensemble`` bookies and return its writer. ``bookies`` names the
        ensemble explicitly (bypassing the placement policy), e.g. to test one bookie."""
        e = self.config.ensemble if ensemble is None else args.integer("ensemble", ensemble, 1, 1024)
        qw = self.config.write_quorum if write_quorum is None else args.integer("write_quorum", write_quorum, 1, 1024)
        qa = self.config.ack_quorum if ack_quorum is None else args.integer("ack_quorum", ack_quorum, 1, 1024)
        # ours or BookKeeper's spelling
        dt = normalize_digest_type(args.text("digest", digest, optional=True) or self.config.digest)
        if not e >= qw >= qa >= 1:
            raise InvalidArgumentError(f"need ensemble >= write_quorum >= ack_quorum >= 1, got {e}/{qw}/{qa}")
        if dt not in DIGEST_TYPES:
            raise InvalidArgumentError(f"unknown digest {dt!r}; choose one of {', '.join(DIGEST_TYPES)}")
        args.password(password)
        custom = args.string_map("custom_metadata", custom_metadata)
        bookies = args.string_list("bookies", bookies)
        if bookies is not None:
            if len(bookies) != e or len(set(bookies)) != e:
                raise InvalidArgumentError(f"bookies must name {e} distinct bookies, got {bookies}")
            chosen = list(bookies)
        else:
            infos = await self.bookie_infos(max_age=0)
            chosen = self.ensemble_placement.new_ensemble(e, qw, qa, infos)
        lid = await self.ledgers.new_ledger_id()
        md = LedgerMetadata(
            ledger_id=lid, ensemble_size=e, write_quorum=qw, ack_quorum=qa, digest_type=dt,
            password_check=await self.password_checks.make(password), ensembles=[(0, chosen)], custom=custom,
            password=base64.b64encode(password).decode() if self.config.store_password_in_metadata else None,
        )
        md = await self.ledgers.create(md)
        notify("ledgerstore_ledger_created", ledger_id=lid, metadata=md)
        return LedgerHandle(self, md, password)

    @timed(CLIENT_METRICS.open_seconds)
    async def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> ReadHandle:
        """Open a ledger for reading. With ``recovery`` (the default) an open ledger is fenced,
        its tail recovered and it is closed; without, nothing is changed and reads go up to the
        LAC the bookies report."""
        args.ledger_id(ledger_id)
        args.password(password)
        args.flag("recovery", recovery)
        md = await self.password_checks.verify(await self.ledgers.read(ledger_id), password)
        if recovery and not md.is_closed:
            md = await recover(self, md, password)
        handle = ReadHandle(self, md, password)
        if not md.is_closed:
            await handle.read_last_add_confirmed()
        return handle

    @timed(CLIENT_METRICS.delete_seconds)
    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger's metadata; bookies reclaim its space by garbage collection."""
        await self.ledgers.delete(args.ledger_id(ledger_id))
        notify("ledgerstore_ledger_deleted", ledger_id=ledger_id)

    async def list_ledgers(self) -> list[int]:
        return [lid async for lid in self.ledgers.list()]

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        """The metadata of ledger ``ledger_id`` (NoSuchLedgerError if there is none)."""
        return await self.ledgers.read(args.ledger_id(ledger_id))

    async def instance_id(self) -> str | None:
        assert self.store is not None, "the client is not started"
        return await ClusterManager(self.store).instance_id()

    # --- logs (named logs made of ledgers: ledgerstore.client.log) ------------------------------

    async def open_log(
        self,
        name: str,
        *,
        ensemble: int | None = None,
        write_quorum: int | None = None,
        ack_quorum: int | None = None,
        digest: str | None = None,
        password: bytes = b"",
        roll_size_bytes: int | None = None,
        roll_interval_s: float | None = None,
        create: bool = True,
        producer_id: str | None = None,
        producer_ttl_s: float | None = None,
    ) -> LogWriter:
        """Become the leader of log ``name``: recover (fence and close) every ledger of it that is
        not closed (always the last two), create a ledger and
        CAS-append it to the log's list; only then are writes accepted. Rolls to a new ledger
        after ``roll_size_bytes`` of payload or ``roll_interval_s`` seconds (checked on append).
        LogError if the log does not exist and ``create`` is false, or if the list kept changing
        under this writer. ``producer_id`` is the default producer of appends with a ``seq``
        (exactly-once appends, docs/logs.md); ``producer_ttl_s`` forgets producers idle that long."""
        args.text("name", name)
        args.password(password)
        args.flag("create", create)
        args.optional_integer("roll_size_bytes", roll_size_bytes, 1)
        args.positive_number("roll_interval_s", roll_interval_s, optional=True)
        settings = LedgerSettings(ensemble, write_quorum, ack_quorum, digest, password)
        args.positive_number("producer_ttl_s", producer_ttl_s, optional=True)
        return await open_log_writer(self, name, settings, roll_size_bytes=roll_size_bytes,
                                     roll_interval_s=roll_interval_s, create=create, producer_id=producer_id,
                                     producer_ttl_s=producer_ttl_s)

    async def open_log_reader(
        self,
        name: str,
        start: Position | tuple[int, int] | str = "earliest",
        *,
        password: bytes = b"",
        follow: bool = False,
        poll_interval_s: float = 0.5,
        batch_size: int = 1000,
    ) -> LogReader:
        """Read log ``name`` from ``start`` (``"earliest"``, ``"latest"`` or a position) without
        fencing anything. ``follow`` makes ``async for`` wait for new entries (see ``tail()``)."""
        args.text("name", name)
        args.password(password)
        args.flag("follow", follow)
        args.positive_number("poll_interval_s", poll_interval_s)
        args.integer("batch_size", batch_size, 1, 1_000_000)
        return await open_log_reader(self, name, start, password, follow=follow,
                                     poll_interval_s=poll_interval_s, batch_size=batch_size)

    async def list_logs(self) -> list[str]:
        """Names of every log, sorted."""
        return await list_logs(self)

    async def delete_log(self, name: str, password: bytes = b"") -> None:
        """Delete a log and all its ledgers; a writer still leading it is fenced first."""
        args.text("name", name)
        args.password(password)
        await fence_and_delete_log(self, name, password)

    async def truncate_log(self, name: str, before: Position | tuple[int, int] | str) -> list[int]:
        """Delete the whole ledgers of log ``name`` lying entirely before ``before``; returns their ids."""
        args.text("name", name)
        return await truncate_log(self, name, before)

__all__ = ["Client", "LedgerHandle", "ReadHandle", "LedgerStoreError"]
