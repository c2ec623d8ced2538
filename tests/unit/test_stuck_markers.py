"""A stuck ledger's marker: its reason and failures are stored, old markers still read, the
backoff doubles up to its cap, and a change of bookies lets a worker retry before it ends."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from ledgerstore.errors import NotEnoughBookiesError
from ledgerstore.plugins import create_metadata_store
from ledgerstore.recovery.markers import Marker, UnderReplicationManager, marker_path
from ledgerstore.recovery.stuck import (
    BACKOFF_CAP_S,
    BACKOFF_FIRST_S,
    NO_PASSWORD,
    NOT_ENOUGH_BOOKIES,
    OTHER,
    NoPasswordError,
    backoff_s,
    reason_of,
)


def test_a_marker_written_before_stuck_reasons_existed_reads_as_not_stuck() -> None:
    old = json.dumps({"ledger_id": 7, "missing": ["b:1"], "since": 1.0, "owner": None, "lease_until": 0.0,
                      "pending": [], "last_error": "", "not_before": 0.0, "incarnations": {}}).encode()
    m = Marker.from_bytes(old, 3)
    assert (m.stuck_reason, m.failures, m.version) == ("", 0, 3)


def test_the_stuck_reason_and_failures_survive_a_round_trip() -> None:
    m = Marker(7, ["b:1"], 1.0, last_error="not enough bookies: ...", stuck_reason=NOT_ENOUGH_BOOKIES, failures=4)
    back = Marker.from_bytes(m.to_bytes())
    assert (back.stuck_reason, back.failures, back.last_error) == (NOT_ENOUGH_BOOKIES, 4, "not enough bookies: ...")


def test_the_backoff_doubles_from_its_first_wait_up_to_its_cap() -> None:
    waits = [backoff_s(n) for n in range(1, 12)]
    assert waits[:3] == [BACKOFF_FIRST_S, 2 * BACKOFF_FIRST_S, 4 * BACKOFF_FIRST_S]
    assert max(waits) == BACKOFF_CAP_S == waits[-1]
    assert waits == sorted(waits)
    assert backoff_s(10_000) == BACKOFF_CAP_S


def test_failures_map_to_reasons() -> None:
    assert reason_of(NotEnoughBookiesError("3 needed")) == NOT_ENOUGH_BOOKIES
    assert reason_of(NoPasswordError("no password")) == NO_PASSWORD
    assert reason_of(RuntimeError("bug")) == OTHER


def test_a_stuck_marker_is_claimed_before_its_backoff_ends_only_when_asked(tmp_path: Path) -> None:
    async def main() -> None:
        store = create_metadata_store(f"sqlite://{tmp_path / 'md.db'}")
        await store.start()
        try:
            now = [1000.0]
            urm = UnderReplicationManager(store, clock=lambda: now[0])
            await urm.mark(5, {"b:1"})
            m, _ = await urm.claim(5, "w1", 10.0)
            assert m is not None
            await urm.release(m, "w1", "not enough bookies", now[0] + 60.0, NOT_ENOUGH_BOOKIES, 1)
            got = await store.get(marker_path(5))
            assert got is not None and json.loads(got.value)["stuck_reason"] == NOT_ENOUGH_BOOKIES
            assert (await urm.claim(5, "w2", 10.0))[0] is None
            taken, _ = await urm.claim(5, "w2", 10.0, ignore_backoff=True)
            assert taken is not None and taken.owner == "w2" and taken.failures == 1
            # a live lease is honoured even so
            assert (await urm.claim(5, "w3", 10.0, ignore_backoff=True))[0] is None
        finally:
            await store.close()

    asyncio.run(main())
