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

The row's value is the slowest backend's auditor pass (the pass that expired BookKeeper
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

from ledgerstore.api import MetadataStore
from ledgerstore.cluster import start_metadata_server_process, stop_process
from ledgerstore.config import AutoRecoveryConfig
from ledgerstore.meta import layout
from ledgerstore.meta.bookies import ClusterManager
from ledgerstore.meta.ledgers import LedgerManager, LedgerMetadata
from ledgerstore.plugins import create_metadata_store
from ledgerstore.recovery.auditor import Auditor
from ledgerstore.testing.metadata import LargestChildrenAnswer
from ledgerstore.testing.servers import EtcdServer, ServerHarnessError, ZooKeeperServer

#: (key, name, metric, unit, target, op) of each row, in the table's order
ROWS = (
    ("metadata_scale", "100,000 ledgers per metadata backend (sqlite server, ZooKeeper, etcd): create, open, list, "
     "auditor pass, GC pass", "slowest backend's auditor pass", "s", 60.0, "<="),
)
KEYS = tuple(spec[0] for spec in ROWS)
METADATA_LEDGERS = 100_000
METADATA_LEDGERS_TINY = 2_000
BACKENDS = ("sqlite", "zookeeper", "etcd")
#: creates in flight while the store is filled
CREATE_WINDOW = 256


def load() -> str:
    """The load averages over 1, 5 and 15 minutes."""
    return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def run(tiny: bool, wants: Callable[..., bool], rows: dict[str, Any], extra: dict[str, Any], tmp: Path) -> None:
    """Run the scale rows ``wants`` asks for, filling their ``rows`` entries."""
    if wants("metadata_scale"):
        r = rows["metadata_scale"]
        r.load_before = load()
        n = METADATA_LEDGERS_TINY if tiny else METADATA_LEDGERS
        per_backend = {b: asyncio.run(_metadata_scale(b, n, tmp / f"meta-{b}")) for b in BACKENDS}
        largest = max(d["largest_children_answer"] for d in per_backend.values())
        r.details = {"ledgers": n, "backends": per_backend, "largest_children_answer": largest,
                     "limit_children_answer": layout.MAX_LEVEL_CHILDREN}
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
