"""The cookie check a bookie makes at start-up, before it writes anything (BookKeeper's
``LegacyCookieValidation``): its directories' cookie, the cluster's cookie for its id and its
configuration must agree; a bookie new to the cluster (no cookie anywhere, empty directories)
writes a fresh one. The cookie files themselves are :mod:`ledgerstore.bookie.cookie`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ledgerstore.api import MetadataStore
from ledgerstore.bookie import cookie as cookies
from ledgerstore.bookie.dirlock import LOCK_FILE
from ledgerstore.config import BookieConfig
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta.bookies import ClusterManager, CookieManager, compare_cookies

log = logging.getLogger(__name__)


class CookieOutcome(NamedTuple):
    """What the cookie check found."""

    #: the cluster's instance id
    instance_id: str
    #: the cookie the bookie runs with
    cookie: dict[str, Any]
    #: the cookie was first written by this start: a new bookie, holding nothing yet
    fresh: bool = False
    #: the directories had no cookie and the metadata store's was written back to them (with
    #: ``data_integrity_checking_enabled``): the bookie lost its data and must check it
    restamped: bool = False


async def validate_cookie(store: MetadataStore, config: BookieConfig, bookie_id: str, advertised: str,
                          journal_dir: Path, ledger_dirs: Sequence[Path]) -> CookieOutcome:
    """Check (or, for a new bookie, write) the cookie; returns the cluster's instance id, the
    cookie the bookie runs with and how it was found. Raises LedgerStoreError saying what differs
    and what to do."""
    cluster = ClusterManager(store)
    iid = await cluster.instance_id()
    if iid is None:
        if not config.auto_init_cluster:
            raise LedgerStoreError(
                f"the metadata store {config.metadata} holds no cluster; run "
                f"'ledgerstore shell --metadata {config.metadata} initnewcluster' first"
            )
        iid = await cluster.init()
    dirs = cookies.cookie_dirs(journal_dir, list(ledger_dirs))
    expected = {
        "bookie_id": bookie_id,
        "instance_id": iid,
        "journal_dir": str(journal_dir.resolve()),
        "ledger_dirs": [str(d.resolve()) for d in ledger_dirs],
        "layout": 1,
    }
    mgr = CookieManager(store)
    remote = await mgr.get(bookie_id)
    where = f"bookie {bookie_id}"
    if config.data_integrity_checking_enabled and remote is not None:
        replaced = _restamp_replaced_dirs(dirs, remote, expected, where)
        if replaced is not None:
            if remote.get("endpoint") != advertised:
                await mgr.put(bookie_id, {**replaced, "endpoint": advertised})
            return CookieOutcome(iid, replaced, restamped=True)
    local = cookies.read_local(dirs)
    if local is None and remote is None:
        if any(_has_data(d) for d in ledger_dirs):
            raise LedgerStoreError(
                f"{where}: its directories hold data but no cookie; refusing to adopt them. "
                "Format them (ledgerstore shell bookieformat) if the data is not needed."
            )
        fresh = {**expected, cookies.INCARNATION: cookies.new_incarnation()}
        cookies.write_local(dirs, fresh)
        await mgr.put(bookie_id, {**fresh, "endpoint": advertised})
        return CookieOutcome(iid, fresh, fresh=True)
    if local is None and remote is not None and config.data_integrity_checking_enabled \
            and not any(_has_data(d) for d in ledger_dirs):
        # BookKeeper's DataIntegrityCookieValidation: the disks were wiped or replaced under this
        # identity; the cookie is stamped back and the bookie starts with its ledgers in limbo
        stamped = {k: v for k, v in remote.items() if k != "endpoint"}
        compare_cookies({**expected, cookies.INCARNATION: stamped.get(cookies.INCARNATION)}, stamped,
                        where + " (configuration)")
        cookies.write_local(dirs, stamped)
        if remote.get("endpoint") != advertised:
            await mgr.put(bookie_id, {**stamped, "endpoint": advertised})
        return CookieOutcome(iid, stamped, restamped=True)
    if local is None:
        raise LedgerStoreError(
            f"{where}: the cluster has a cookie for this bookie but its directories have none: its disks were "
            "wiped or replaced. Decommission/recover the old bookie (its data is gone) and delete its cookie, "
            "or restore the directories."
        )
    if remote is None:
        raise LedgerStoreError(
            f"{where}: its directories have a cookie but the cluster has none for it "
            f"(instance {local.get('instance_id')}); this metadata store may be another cluster's"
        )
    compare_cookies(local, {k: v for k, v in remote.items() if k != "endpoint"}, where)
    if cookies.INCARNATION in local:
        expected[cookies.INCARNATION] = local[cookies.INCARNATION]
    compare_cookies(local, expected, where + " (configuration)")
    if remote.get("endpoint") != advertised:
        await mgr.put(bookie_id, {**local, "endpoint": advertised})
    return CookieOutcome(iid, local)


def _restamp_replaced_dirs(dirs: list[Path], remote: dict[str, Any], expected: dict[str, Any],
                           where: str) -> dict[str, Any] | None:
    """Some directories, not all, lost their cookie and hold nothing (a disk replaced under a
    bookie that kept its others): with ``data_integrity_checking_enabled`` the cookie the other
    directories and the metadata store agree on is written back to them, and the bookie starts
    with its ledgers in limbo. Returns that cookie, or None when this is not the case."""
    missing = [d for d in dirs if not (d / cookies.COOKIE_FILE).exists()]
    if not missing or len(missing) == len(dirs) or any(_has_data(d) for d in missing):
        return None
    local = cookies.read_local([d for d in dirs if d not in missing])
    if local is None:
        return None
    compare_cookies(local, {k: v for k, v in remote.items() if k != "endpoint"}, where)
    if cookies.INCARNATION in local:
        expected = {**expected, cookies.INCARNATION: local[cookies.INCARNATION]}
    compare_cookies(local, expected, where + " (configuration)")
    log.warning("%s: no cookie in %s (replaced or wiped); stamping it back, the bookie's ledgers go in limbo",
                where, ", ".join(str(d) for d in missing))
    cookies.write_local(missing, local)
    return local


def _has_data(d: Path) -> bool:
    return d.exists() and any(p.name not in (cookies.COOKIE_FILE, LOCK_FILE) for p in d.iterdir())
