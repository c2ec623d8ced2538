"""``shell readledger -bookie B``: a ledger's entries as one bookie holds them (BookKeeper's
``readledger -b``), to check that bookie's copy rather than the ledger.

Only the entries whose write set names the bookie are asked for, straight from it (one
READ_MULTI per batch, no fallback to other replicas), and each answer is verified against the
ledger's digest. An entry it should hold and does not, or holds damaged, is a row saying so.
"""

from __future__ import annotations

from typing import Any

from ledgerstore.errors import DigestMismatchError, LedgerStoreError

#: entries asked for in one request (as the client's own reads batch them)
BATCH = 2_000


def entries_on(md: Any, bookie_id: str, first: int, last: int) -> list[int]:
    """The entry ids in ``first..last`` whose write set includes ``bookie_id``."""
    wanted = []
    for start, end, ensemble in md.fragment_ranges():
        lo, hi = max(first, start), min(last, end)
        for eid in range(lo, hi + 1):
            if any(ensemble[i] == bookie_id for i in md.write_set(eid)):
                wanted.append(eid)
    return wanted


async def read_from_bookie(client: Any, rh: Any, bookie_id: str, first: int, last: int) -> list[dict[str, Any]]:
    """Rows ``{entry_id, status, entry}`` (``entry`` the verified Entry, or None) for every entry
    of ``first..last`` the bookie should hold. LedgerStoreError when it holds no fragment of the
    ledger at all."""
    md = rh.md
    if bookie_id not in md.bookies():
        raise LedgerStoreError(f"bookie {bookie_id} holds no fragment of ledger {md.ledger_id} "
                               f"(its bookies: {', '.join(sorted(md.bookies()))})")
    wanted = entries_on(md, bookie_id, first, last)
    timeout = client.config.read_timeout_s
    answers: dict[int, tuple[int, bytes]] = {}
    for i in range(0, len(wanted), BATCH):
        for eid, status, data in await client.bookie_client.read_multi(bookie_id, md.ledger_id, wanted[i:i + BATCH],
                                                                       timeout):
            answers[eid] = (status, bytes(data))
    rows = []
    for eid in wanted:
        status, data = answers.get(eid, (-1, b""))
        row: dict[str, Any] = {"entry_id": eid, "status": "missing", "entry": None}
        if status == 0:
            try:
                row.update(status="ok", entry=rh.digest.verify(data, eid))
            except DigestMismatchError as exc:
                row["status"] = f"damaged: {exc}"
        rows.append(row)
    return rows
