"""The client's bookie health check against real bookie processes: a bookie whose requests are
lost is quarantined and left out of new ensembles; ``shell healthcheck -disable`` (the real CLI)
lifts every quarantine and stops quarantining, ``-enable`` turns it back on; with too few other
bookies a quarantined one is still used. Also: a cancelled LAC long poll leaves no request behind."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from ledgerstore.aio import Client
from ledgerstore.client.metrics import CLIENT_METRICS
from ledgerstore.cluster import LocalCluster
from ledgerstore.proto.codec import Op
from ledgerstore.testing.faults import FaultInjector

from .test_cli import shell

#: a short interval and a low threshold, so a test sees several checks in a second
HEALTH = {"health_check_interval_s": 0.2, "bookie_error_threshold_per_interval": 3, "bookie_quarantine_time_s": 600}


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 120))


async def until(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.02)


def quarantined_gauge() -> float:
    """``ledgerstore_client_quarantined_bookies`` as /metrics shows it: the sum over every client of
    this process, so a test reads how it moved, not its value (another test's client may count)."""
    for line in CLIENT_METRICS.render().decode().splitlines():
        if line.startswith("ledgerstore_client_quarantined_bookies "):
            return float(line.split()[1])
    raise AssertionError("ledgerstore_client_quarantined_bookies is missing from the client's metrics")


async def lose_requests_to(client: Client, faults: FaultInjector, bookie: str, n: int = 5) -> None:
    """``n`` LAC reads of ``bookie`` whose requests the network loses: ``n`` timeouts, all within
    one health-check interval."""
    rule = faults.drop(bookie, ops={Op.READ_LAC}, times=n)
    results = await asyncio.gather(*(client.bookie_client.read_lac(bookie, 1, 0.1) for _ in range(n)),
                                   return_exceptions=True)
    assert rule.hits == n and all(isinstance(r, Exception) for r in results), results


async def checks_pass(client: Client, n: int) -> None:
    target = client.health_checker.checks + n
    await until(lambda: client.health_checker.checks >= target, f"{n} more health checks")


async def cli(cluster: LocalCluster, *args: str) -> str:
    return (await asyncio.to_thread(shell, cluster, "healthcheck", *args)).stdout


def test_a_bookie_with_errors_is_quarantined_and_left_out_of_new_ensembles_until_healthcheck_is_disabled(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(4)
    cluster.start()
    victim = cluster.bookie_id(0)

    async def ensembles(client: Client, n: int) -> list[set[str]]:
        out = []
        for _ in range(n):
            lh = await client.create_ledger(3, 2, 2)
            out.append(set(lh.md.current_ensemble))
            await lh.close()
        return out

    async def main() -> None:
        async with Client(metadata=cluster.metadata, **HEALTH) as client:
            faults = FaultInjector().install(client)
            quarantines, in_quarantine = CLIENT_METRICS.bookie_quarantines, quarantined_gauge()
            await lose_requests_to(client, faults, victim)
            await until(lambda: victim in client.health.quarantined, f"{victim} is quarantined")
            assert CLIENT_METRICS.bookie_quarantines == quarantines + 1
            assert quarantined_gauge() == in_quarantine + 1
            # 20 ensembles of 3 among 4 bookies: each would name the victim 3 times in 4 at random
            assert all(victim not in e for e in await ensembles(client, 20))

            assert "health check is disabled" in await cli(cluster, "-disable")
            await until(lambda: not client.health.quarantined, "the quarantine is lifted")
            await lose_requests_to(client, faults, victim)
            await checks_pass(client, 2)
            assert victim not in client.health.quarantined  # a disabled check quarantines nothing
            assert any(victim in e for e in await ensembles(client, 20))

            assert "health check is enabled" in await cli(cluster, "-enable", "true")
            await lose_requests_to(client, faults, victim)
            await until(lambda: victim in client.health.quarantined, f"{victim} is quarantined again")
            assert all(victim not in e for e in await ensembles(client, 10))

    run(main())


def test_a_quarantined_bookie_is_still_used_when_too_few_other_bookies_exist(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(3)
    cluster.start()
    victim = cluster.bookie_id(1)

    async def main() -> None:
        async with Client(metadata=cluster.metadata, **HEALTH) as client:
            faults = FaultInjector().install(client)
            await lose_requests_to(client, faults, victim)
            await until(lambda: victim in client.health.quarantined, f"{victim} is quarantined")
            lh = await client.create_ledger(3, 2, 2)
            assert victim in lh.md.current_ensemble
            await lh.append(b"still writable")
            await lh.close()

    run(main())


def test_a_cancelled_lac_long_poll_leaves_no_request_pending(
        cluster_factory: Callable[..., LocalCluster], caplog: pytest.LogCaptureFixture) -> None:
    cluster = cluster_factory(3)
    cluster.start()

    def in_flight(client: Client) -> int:
        return client.pool.in_flight

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            lh = await client.create_ledger(3, 3, 2)
            await lh.append(b"x")
            rh = await client.open_ledger(lh.ledger_id, recovery=False)
            poll = asyncio.ensure_future(rh.wait_for_lac(rh.last_add_confirmed, timeout=60))
            await until(lambda: in_flight(client) == 3, "the long polls are on all three bookies")
            poll.cancel()
            with pytest.raises(asyncio.CancelledError):
                await poll
            assert in_flight(client) == 0  # nothing is left for the client's close to fail
            await lh.close()

    with caplog.at_level(logging.DEBUG):
        run(main())
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage() or " lost" in r.getMessage()]
