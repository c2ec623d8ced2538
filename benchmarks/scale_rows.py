"""The scale rows of the target table (issue 30): ``metadata_scale`` and ``many_ledgers``.

``run_all.py`` registers them (:data:`ROWS`) and calls :func:`run` with its plan; each row fills
its ``Row`` (``settle``, ``details``, ``load_before``) as the other rows do, so ``--repeat``
spreads and the Markdown table treat them alike.

``metadata_scale``: for each metadata backend, a real server (the sqlite metadata server process,
ZooKeeper, etcd; started by ``ledgerstore.testing`` / ``ledgerstore.cluster``), one client store and
the ledger manager on it:

- *create*: N ledgers, each an id from the counter and a create-if-absent of its metadata, 256 in
  flight;
- *open*: the metadata read that opening a ledger does, for each of them (64 in flight,
  ``LedgerManager.read_many``);
- *list*: ``LedgerManager.list()``, the walk down the hierarchical layout's levels, with the
  largest children answer it read (the row fails if any exceeds 10,000 names, ZooKeeper's limit);
- *auditor*: one full check of the real ``Auditor`` (every ledger's metadata read);
- *gc*: the metadata half of a bookie's GC pass (``LedgerManager.missing`` over every ledger id,
  after 1% of the ledgers were deleted; the storage half is the ``gc_reclaim`` row).

``many_ledgers``: 3 bookie processes (``LocalCluster``), one client; a single-ledger
``append_many`` run on them first (the reference, unless the table's own ``write_100b_e3`` row ran
in this run), then 10,000 ledgers created (E=3 Qw=3 Qa=2) and kept open while 1,000,000 adds of
100 B go to them in turn, 100 per ``append_many`` call (the single-ledger row's batch, so the two
differ only in the number of ledgers), at most 10,000 outstanding; twice. The row's value is the
better pass's entries/s over the reference; the bookies' RSS before the ledgers, after the first
pass and after the second give the cost per 1,000 open ledgers and the slope in entries.

The ``metadata_scale`` row's value is the slowest backend's auditor pass (the pass that expired BookKeeper
auditors' ZooKeeper sessions past 1,500 ledgers, PR#2802); every phase's rate and time per
backend is in ``details``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from ledgerstore.aio import Client, LedgerHandle
from ledgerstore.api import MetadataStore
from ledgerstore.bench import WriteOptions, run_writes
from ledgerstore.cluster import LocalCluster, start_metadata_server_process, stop_process
from ledgerstore.config import AutoRecoveryConfig
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta import layout
from ledgerstore.meta.bookies import ClusterManager
from ledgerstore.meta.ledgers import LedgerManager, LedgerMetadata
from ledgerstore.plugins import create_metadata_store
from ledgerstore.proto.digest import SCRYPT_N_RANGE
from ledgerstore.recovery.auditor import Auditor
from ledgerstore.testing.metadata import LargestChildrenAnswer
from ledgerstore.testing.servers import EtcdServer, ServerHarnessError, ZooKeeperServer

#: (key, name, metric, unit, target, op) of each row, in the table's order
ROWS = (
    ("many_ledgers", "10,000 ledgers open at once on 3 bookies (E=3 Qw=3 Qa=2, 100 B), adds spread over them, "
     "one client", "aggregate entries/s / single-ledger append_many", "%", 50.0, ">="),
    ("metadata_scale", "100,000 ledgers per metadata backend (sqlite server, ZooKeeper, etcd): create, open, list, "
     "auditor pass, GC pass", "slowest backend's auditor pass", "s", 120.0, "<="),
)
KEYS = tuple(spec[0] for spec in ROWS)
METADATA_LEDGERS = 100_000
METADATA_LEDGERS_TINY = 2_000
BACKENDS = ("sqlite", "zookeeper", "etcd")
MANY_LEDGERS = 10_000
MANY_LEDGERS_TINY = 300
#: entries per append_many call on each of the many ledgers: the batch of the single-ledger row, so
#: the two rows differ only in the number of ledgers the adds go to
MANY_BATCH = 100
#: entries outstanding at once over all the ledgers (the single-ledger row's throttle)
MANY_THROTTLE = 10_000
#: creates in flight while the store is filled
CREATE_WINDOW = 256


def load() -> str:
    """The load averages over 1, 5 and 15 minutes."""
    return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def run(tiny: bool, wants: Callable[..., bool], rows: dict[str, Any], extra: dict[str, Any], tmp: Path,
        rss_mb: Callable[[int], float], storage: str) -> None:
    """Run the scale rows ``wants`` asks for, filling their ``rows`` entries."""
    if wants("many_ledgers"):
        r = rows["many_ledgers"]
        r.load_before = load()
        cluster = LocalCluster(tmp / "many", bookies=3, port_base=None, storage=storage)
        try:
            cluster.start()
            details = asyncio.run(_many_ledgers(cluster, MANY_LEDGERS_TINY if tiny else MANY_LEDGERS,
                                                4_000 if tiny else 1_000_000, rss_mb, 0.2 if tiny else 1.0))
        finally:
            cluster.stop()
            shutil.rmtree(cluster.data_dir, ignore_errors=True)
        row = rows.get("write_100b_e3")
        if row is not None and row.measured is not None and not row.skipped:
            details["reference"] = {"row": "write_100b_e3", "entries_per_s": row.measured}
        ref = details["reference"]
        details["summary"] = (
            f"{details['ledgers']:,} ledgers: {details['entries_per_s']:,} entries/s against {ref['entries_per_s']:,} "
            f"({ref['row']}); bookie RSS {details['bookie_rss_mb_per_1000_ledgers']} MB per 1,000 open ledgers, "
            f"{details['bookie_rss_mb_per_million_entries']} MB per million entries")
        r.details = details
        r.settle(100 * details["entries_per_s"] / ref["entries_per_s"])
    if wants("metadata_scale"):
        r = rows["metadata_scale"]
        r.load_before = load()
        n = METADATA_LEDGERS_TINY if tiny else METADATA_LEDGERS
        per_backend = {b: asyncio.run(_metadata_scale(b, n, tmp / f"meta-{b}")) for b in BACKENDS}
        largest = max(d["largest_children_answer"] for d in per_backend.values())
        r.details = {"ledgers": n, "backends": per_backend, "largest_children_answer": largest,
                     "limit_children_answer": layout.MAX_LEVEL_CHILDREN,
                     "summary": f"{n:,} ledgers; " + "; ".join(
                         f"{b}: create {d['create_per_s']:,}/s, open {d['open_per_s']:,}/s, list {d['list_s']} s, "
                         f"auditor {d['auditor_s']} s, GC {d['gc_s']} s" for b, d in per_backend.items())
                     + f"; largest children answer {largest:,} (limit {layout.MAX_LEVEL_CHILDREN:,})"}
        r.settle(max(d["auditor_s"] for d in per_backend.values()))
        if largest > layout.MAX_LEVEL_CHILDREN or any(d["listed"] != n for d in per_backend.values()):
            r.passed = False


@contextmanager
def _server(backend: str, workdir: Path) -> Iterator[str]:
    """A real metadata server for ``backend``; yields the URI of an empty namespace on it."""
    workdir.mkdir(parents=True, exist_ok=True)
    if backend == "sqlite":
        db = workdir / "metadata.db"
        proc = start_metadata_server_process(db, workdir / "metadata-server.log")
        try:
            yield f"sqlite://{db}"
        finally:
            stop_process(proc)
            shutil.rmtree(workdir, ignore_errors=True)
    elif backend == "zookeeper":
        with ZooKeeperServer() as zk:
            yield zk.uri("/scale")
    elif backend == "etcd":
        with EtcdServer() as etcd:
            yield etcd.uri("/scale")
    else:
        raise ServerHarnessError(f"no metadata server harness for {backend!r}")


@asynccontextmanager
async def _store(uri: str) -> AsyncIterator[MetadataStore]:
    store: MetadataStore = create_metadata_store(uri)
    await store.start()
    try:
        yield store
    finally:
        await store.close()


def _metadata(ledger_id: int) -> LedgerMetadata:
    # the size of a real ledger's metadata: 3 bookies, a password check, a stored password
    return LedgerMetadata(ledger_id=ledger_id, ensemble_size=3, write_quorum=3, ack_quorum=2, digest_type="crc32c",
                          password_check="scrypt$16384$8$1$" + "s" * 24 + "$" + "h" * 44,
                          ensembles=[(0, ["10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"])],
                          password="cGFzc3dvcmQ=")


async def _metadata_scale(backend: str, n: int, workdir: Path) -> dict[str, Any]:
    with _server(backend, workdir) as uri:
        async with _store(uri) as store:
            await ClusterManager(store).init()
            mgr = LedgerManager(store)
            out: dict[str, Any] = {"layout": (await mgr.ledger_layout()).name.lower()}

            async def create_one() -> int:
                lid = await mgr.new_ledger_id()
                await mgr.create(_metadata(lid))
                return lid

            t0 = time.perf_counter()
            ids: list[int] = []
            for i in range(0, n, CREATE_WINDOW):
                ids += await asyncio.gather(*(create_one() for _ in range(min(CREATE_WINDOW, n - i))))
            out |= _phase("create", n, time.perf_counter() - t0)

            t0 = time.perf_counter()
            opened = sum([md is not None async for _, md in mgr.read_many(ids)])
            out |= _phase("open", opened, time.perf_counter() - t0)

            t0 = time.perf_counter()
            with LargestChildrenAnswer(store) as answers:
                listed = [lid async for lid in LedgerManager(store).list()]
            out |= _phase("list", len(listed), time.perf_counter() - t0)
            out |= {"listed": len(listed), "largest_children_answer": answers.largest}

            auditor = Auditor(store, AutoRecoveryConfig())
            t0 = time.perf_counter()
            await auditor.check(0.0, True)
            out |= _phase("auditor", auditor.stats["ledgers_checked"], time.perf_counter() - t0)

            gone = ids[:: 100]
            await asyncio.gather(*(mgr.delete(lid) for lid in gone))
            t0 = time.perf_counter()
            missing = await mgr.missing(ids)
            out |= _phase("gc", len(ids), time.perf_counter() - t0)
            out["gc_found_deleted"] = len(missing) == len(gone)
            return out


def _phase(name: str, count: int, seconds: float) -> dict[str, Any]:
    return {f"{name}_s": round(seconds, 3), f"{name}_per_s": round(count / seconds) if seconds > 0 else None}


async def _many_ledgers(cluster: LocalCluster, n: int, entries: int, rss_mb: Callable[[int], float],
                        warmup: float = 1.0) -> dict[str, Any]:
    """Single-ledger append_many on the bookies first (the reference when the table's own row
    did not run), then ``n`` ledgers opened at once and ``entries`` adds spread over them twice:
    the bookies' RSS before the ledgers, after the first pass and after the second gives the
    cost per 1,000 open ledgers and the slope in entries."""
    pids = {f"bookie{i}": p.pid for i, p in sorted(cluster.procs.items())}

    def rss() -> float:
        return sum(rss_mb(pid) for pid in pids.values())

    # ledger creation is setup here, not measured: each create's salted scrypt check (20 ms of a
    # core at the default cost, by design) is made at the smallest cost a client may configure
    async with Client(metadata=cluster.metadata, password_check_cost=SCRYPT_N_RANGE[0]) as client:
        single = await run_writes(client, WriteOptions(count=entries, warmup=warmup, ensemble=3, write_quorum=3,
                                                       ack_quorum=2, entry_size=100, batch=MANY_BATCH))
        if single.errors:
            raise LedgerStoreError(f"single-ledger writes failed: {single.first_error}")
        before = rss()
        t0 = time.perf_counter()
        handles: list[LedgerHandle] = []
        for i in range(0, n, CREATE_WINDOW):
            handles += await asyncio.gather(*(client.create_ledger(3, 3, 2, password=b"many")
                                              for _ in range(min(CREATE_WINDOW, n - i))))
        created_s = time.perf_counter() - t0
        first = await _spread_adds(handles, entries)
        after_first = rss()
        second = await _spread_adds(handles, entries)
        after_second = rss()
        await asyncio.gather(*(h.close() for h in handles))
    per_1000 = (after_first - before) / 3 / (n / 1000)
    slope = (after_second - after_first) / 3 / (entries / 1e6)
    return {
        "ledgers": n, "entries_per_pass": entries, "batch_per_ledger": MANY_BATCH, "throttle": MANY_THROTTLE,
        "create_s": round(created_s, 2), "create_per_s": round(n / created_s),
        "entries_per_s": round(max(first, second)), "passes_entries_per_s": [round(first), round(second)],
        "reference": {"row": "single-ledger append_many on the same bookies, just before",
                      "entries_per_s": round(single.entries_per_s)},
        "bookie_rss_mb": {"before_ledgers": round(before / 3, 1), "after_first_pass": round(after_first / 3, 1),
                          "after_second_pass": round(after_second / 3, 1)},
        "bookie_rss_mb_per_1000_ledgers": round(per_1000, 2),
        "bookie_rss_mb_per_million_entries": round(slope, 2),
    }


async def _spread_adds(handles: list[LedgerHandle], entries: int) -> float:
    """``entries`` 100 B adds, ``MANY_BATCH`` at a time to each ledger in turn, at most
    ``MANY_THROTTLE`` outstanding; returns entries/s."""
    payloads = [os.urandom(100)] * MANY_BATCH
    outstanding = 0
    space = asyncio.Event()
    drained = asyncio.Event()
    errors: list[BaseException] = []

    def done(fut: asyncio.Future[int]) -> None:
        nonlocal outstanding
        outstanding -= MANY_BATCH
        if fut.exception() is not None:
            errors.append(fut.exception())  # type: ignore[arg-type]
        if outstanding <= MANY_THROTTLE // 2:
            space.set()
        if outstanding == 0:
            drained.set()

    t0 = time.perf_counter()
    issued = 0
    i = 0
    while issued < entries and not errors:
        if outstanding >= MANY_THROTTLE:
            space.clear()
            await space.wait()
            continue
        fut = handles[i % len(handles)].append_many_async(payloads)
        i += 1
        outstanding += MANY_BATCH
        issued += MANY_BATCH
        fut.add_done_callback(done)
        if i % 100 == 0:
            await asyncio.sleep(0)
    if outstanding:
        drained.clear()
        await drained.wait()
    if errors:
        raise LedgerStoreError(f"adds spread over {len(handles)} ledgers failed: {errors[0]}")
    return issued / (time.perf_counter() - t0)
