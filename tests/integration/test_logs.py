"""Named logs over real bookie processes: leadership by fencing + CAS, rolling, truncation, tailing.

Writers that must be separate processes (a takeover while writing, kill -9) run
``log_writer_proc.py``; its stdout is drained by a thread so it never blocks on a full pipe.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ledgerstore.aio import Client, Position
from ledgerstore.cluster import LocalCluster
from ledgerstore.errors import InvalidArgumentError, LedgerFencedError, LogError, NoSuchLedgerError
from ledgerstore.meta.ledgers import LedgerState

WRITER = str(Path(__file__).with_name("log_writer_proc.py"))
PW = b"pw"


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 300))


async def read_all(client: Client, name: str, start: object = "earliest") -> list[tuple[Position, bytes]]:
    reader = await client.open_log_reader(name, start, password=PW)  # type: ignore[arg-type]
    return [item async for item in reader]


async def ledger_states(client: Client, ids: list[int]) -> list[LedgerState]:
    return [(await client.ledger_metadata(lid)).state for lid in ids]


async def log_ledgers(client: Client, name: str) -> list[int]:
    from ledgerstore.meta.logs import LogManager

    md = await LogManager(client.store).read(name)  # type: ignore[arg-type]
    assert md is not None
    return md.ledger_ids


class WriterProcess:
    """``log_writer_proc.py`` with its output collected line by line on a thread."""

    def __init__(self, metadata: str, name: str, roll_size: int, tag: str) -> None:
        self.proc = subprocess.Popen([sys.executable, WRITER, metadata, name, str(roll_size), tag],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def acks(self) -> list[tuple[Position, bytes]]:
        with self._cond:
            lines = list(self.lines)
        out = []
        for line in lines:
            if line.startswith("ack "):
                _, pos, seq = line.split()
                out.append((Position.parse(pos), b"%s-%08d" % (self.tag_bytes, int(seq))))
        return out

    @property
    def tag_bytes(self) -> bytes:
        return self.proc.args[-1].encode()  # type: ignore[index]

    def wait_for_acks(self, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while sum(1 for x in self.lines if x.startswith("ack ")) < n:
                if self.proc.poll() is not None and not self._thread.is_alive():
                    err = self.proc.stderr.read() if self.proc.stderr else ""  # type: ignore[union-attr]
                    pytest.fail(f"writer process exited early ({self.proc.returncode}): {self.lines[-5:]} {err}")
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"writer process printed fewer than {n} acks in {timeout}s")
                self._cond.wait(min(left, 1.0))

    def finish(self, timeout: float = 120) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            self.kill()
        self._thread.join(30)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._thread.join(30)


def test_10000_entries_across_rolled_ledgers_read_back_in_order_and_truncate(shared_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            writer = await client.open_log("rolling", ensemble=3, write_quorum=2, ack_quorum=2, password=PW,
                                           roll_size_bytes=20_000)
            payloads = [b"%06d-" % i + os.urandom(93) for i in range(10_000)]
            resolved: list[Position] = []
            futs = []
            for i, p in enumerate(payloads):
                fut = writer.append_async(p)
                fut.add_done_callback(lambda f: resolved.append(f.result()))
                futs.append(fut)
                if i >= 200:
                    await futs[i - 200]  # a window of 200 in flight; rolls happen meanwhile
            positions = await asyncio.gather(*futs)
            await writer.flush()  # let a roll in progress finish: its previous ledger gets closed
            assert resolved == positions, "acknowledgements must arrive in position order"
            assert all(a < b for a, b in zip(positions, positions[1:], strict=False)), "positions strictly increase"
            ledgers = await log_ledgers(client, "rolling")
            assert len(ledgers) >= 3, ledgers
            for lid in ledgers[:-1]:  # a ledger rolls only once it holds the roll size
                assert (await client.ledger_metadata(lid)).length >= 20_000
            assert sorted({p.ledger_id for p in positions}) == [lid for lid in ledgers if
                                                               lid in {p.ledger_id for p in positions}]
            # only the last ledger is open at any time
            states = await ledger_states(client, ledgers)
            assert all(s is LedgerState.CLOSED for s in states[:-1]), states
            assert states[-1] is LedgerState.OPEN
            await writer.close()
            assert (await ledger_states(client, ledgers))[-1] is LedgerState.CLOSED

            got = await read_all(client, "rolling")
            assert [p for p, _ in got] == positions
            assert [d for _, d in got] == payloads
            # the same entries, in batches, give the same positions
            reader = await client.open_log_reader("rolling", "earliest", password=PW)
            batched: list[tuple[Position, bytes]] = []
            while batch := await reader.read_batch(777):
                assert len(batch) <= 777
                batched.extend(batch)
            assert batched == got

            middle = positions[5_000]
            assert [p for p, _ in await read_all(client, "rolling", middle)] == positions[5_000:]
            assert [p for p, _ in await read_all(client, "rolling", str(middle))] == positions[5_000:]

            before_ids = [lid for lid in ledgers if lid < middle.ledger_id]
            assert before_ids, "the middle position should not be in the first ledger"
            dropped = await client.truncate_log("rolling", before=middle)
            assert dropped == before_ids
            assert await log_ledgers(client, "rolling") == [lid for lid in ledgers if lid >= middle.ledger_id]
            for lid in before_ids:
                with pytest.raises(NoSuchLedgerError):
                    await client.ledger_metadata(lid)
            # the ledger holding the truncation point stays whole; "earliest" starts at the point
            whole = await read_all(client, "rolling", Position(middle.ledger_id, 0))
            assert whole[0][0] == Position(middle.ledger_id, 0)
            assert [p for p, _ in await read_all(client, "rolling")] == positions[5_000:]
            with pytest.raises(LogError, match="truncated"):
                await client.open_log_reader("rolling", positions[0], password=PW)
            assert await client.truncate_log("rolling", before=middle) == []  # idempotent

    run(main())


def test_second_writer_takes_over_from_a_writing_process(shared_cluster: LocalCluster) -> None:
    first = WriterProcess(shared_cluster.metadata, "takeover", 10_000, "w1")
    try:
        first.wait_for_acks(3_000)

        async def take_over() -> tuple[list[Position], list[int], list[LedgerState]]:
            async with Client(metadata=shared_cluster.metadata) as client:
                second = await client.open_log("takeover", ensemble=3, write_quorum=2, ack_quorum=2, password=PW)
                acked: list[Position] = []
                futs = [second.append_async(b"w2-%08d" % i) for i in range(300)]
                for f in futs:
                    f.add_done_callback(lambda f: acked.append(f.result()))
                assert await asyncio.gather(*futs) == acked
                ledgers = await log_ledgers(client, "takeover")
                states = await ledger_states(client, ledgers)
                await second.close()
                return acked, ledgers, states

        second_acks, ledgers, states = run(take_over())
        assert first.finish() == 0
    finally:
        first.kill()

    lines = first.lines
    first_fail = next(i for i, x in enumerate(lines) if x.startswith("fail "))
    assert lines[first_fail].split()[1] == "LedgerFencedError", lines[first_fail]
    assert not any(x.startswith("ack ") for x in lines[first_fail:]), "an acknowledgement came after a failure"
    assert lines[-1] == "next LedgerFencedError", lines[-1]
    assert len(ledgers) >= 3, "the first writer should have rolled before the takeover"
    assert all(s is LedgerState.CLOSED for s in states[:-1]), "only the last ledger may be open"
    assert states[-1] is LedgerState.OPEN

    async def check() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            log = await read_all(client, "takeover")
            where = dict(log)
            positions = [p for p, _ in log]
            assert positions == sorted(positions) and len(set(positions)) == len(positions)
            first_acks = first.acks()
            assert len(first_acks) >= 3_000
            for pos, payload in first_acks:
                assert where.get(pos) == payload, f"acknowledged entry {pos} lost or changed"
            # the first writer's entries keep their order; all come before the second writer's
            w1 = [(p, d) for p, d in log if d.startswith(b"w1-")]
            assert [d for _, d in w1] == sorted(d for _, d in w1)
            assert max(p for p, _ in w1) < min(second_acks)
            w2 = [p for p, d in log if d.startswith(b"w2-")]
            assert w2 == second_acks, "the surviving writer's log order must equal its acknowledgement order"
            assert [d for p, d in log if d.startswith(b"w2-")] == [b"w2-%08d" % i for i in range(300)]

    run(check())


def test_writer_killed_with_sigkill_then_a_new_writer_finds_every_acknowledged_entry(
        shared_cluster: LocalCluster) -> None:
    first = WriterProcess(shared_cluster.metadata, "crash", 30_000, "k1")
    try:
        first.wait_for_acks(5_000)
    finally:
        first.kill()  # SIGKILL mid-stream: adds and maybe a roll in flight
    acked = first.acks()
    assert len(acked) >= 5_000

    async def main() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            writer = await client.open_log("crash", ensemble=3, write_quorum=2, ack_quorum=2, password=PW,
                                           create=False)
            after = await writer.append(b"after the crash")
            ledgers = await log_ledgers(client, "crash")
            states = await ledger_states(client, ledgers)
            assert all(s is LedgerState.CLOSED for s in states[:-1]), states
            await writer.close()
            log = await read_all(client, "crash")
            where = dict(log)
            for pos, payload in acked:
                assert where.get(pos) == payload, f"acknowledged entry {pos} lost or changed"
            k1 = [d for _, d in log if d.startswith(b"k1-")]
            assert k1 == sorted(k1), "the killed writer's entries are out of order"
            assert k1[: len(acked)] == [d for _, d in acked], "the acknowledged entries are not a prefix"
            assert log[-1] == (after, b"after the crash")
            assert max(p for p, _ in acked) < after

    run(main())


def test_tailing_reader_sees_new_entries_including_across_a_roll(shared_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(metadata=shared_cluster.metadata) as wc, Client(metadata=shared_cluster.metadata) as rc:
            writer = await wc.open_log("tail", password=PW)
            await writer.append(b"before the reader")
            reader = await rc.open_log_reader("tail", "latest", password=PW, poll_interval_s=0.2)
            seen: list[tuple[Position, bytes]] = []
            progress = asyncio.Event()

            async def follow() -> None:
                async for item in reader.tail():
                    seen.append(item)
                    progress.set()

            task = asyncio.create_task(follow())

            async def until_seen(pos: Position, limit: float = 10.0) -> None:
                deadline = time.monotonic() + limit
                while pos not in {p for p, _ in seen}:
                    progress.clear()
                    await asyncio.wait_for(progress.wait(), max(0.01, deadline - time.monotonic()))

            sent = [await writer.append(b"a%d" % i) for i in range(20)]
            # the newest entry of an open ledger is confirmed by the next add: the 19th is visible
            await until_seen(sent[18])
            first_ledger = writer.ledger_id
            await writer.roll()
            assert writer.ledger_id != first_ledger
            sent += [await writer.append(b"b%d" % i) for i in range(20)]
            await until_seen(sent[38])  # across the roll
            await writer.close()  # closing confirms the last entry too
            await until_seen(sent[39])
            # "latest" is after the last *confirmed* entry: the writer's newest entry before the
            # reader opened was not confirmed yet, so the reader may start with it
            early = [d for _, d in seen[: len(seen) - 40]]
            assert early in ([], [b"before the reader"]), early
            got = seen[len(early):]
            assert [p for p, _ in got] == sent
            assert [d for _, d in got] == [b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(20)]
            assert {p.ledger_id for p, _ in got[:20]} == {first_ledger}
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    run(main())


def test_concurrent_opens_leave_one_leader_and_no_orphan_ledgers(shared_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(metadata=shared_cluster.metadata) as a, Client(metadata=shared_cluster.metadata) as b:
            before = set(await a.list_ledgers())
            wa, wb = await asyncio.gather(a.open_log("duel", password=PW), b.open_log("duel", password=PW))
            ledgers = await log_ledgers(a, "duel")
            created = set(await a.list_ledgers()) - before
            assert created == set(ledgers), "a ledger that lost the CAS must be deleted"
            assert len(ledgers) == 2
            leader, loser = (wa, wb) if wa.ledger_id == ledgers[-1] else (wb, wa)
            assert (await leader.append(b"leader")).ledger_id == ledgers[-1]
            with pytest.raises(LedgerFencedError):
                await loser.append(b"loser")
            with pytest.raises(LedgerFencedError):
                await loser.append(b"still the loser")  # sticky: the writer does not recover
            await loser.close()
            await leader.close()
            assert [d for _, d in await read_all(a, "duel")] == [b"leader"]

    run(main())


def test_roll_by_time_and_in_process_takeover_fails_the_old_writer(shared_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(metadata=shared_cluster.metadata) as c1, Client(metadata=shared_cluster.metadata) as c2:
            old = await c1.open_log("timed", password=PW, roll_interval_s=0.2)
            first = old.ledger_id
            positions = []
            deadline = time.monotonic() + 30
            while old.ledger_id == first or len(await log_ledgers(c1, "timed")) < 3:
                positions.append(await old.append(b"t"))
                await asyncio.sleep(0.02)
                assert time.monotonic() < deadline, "the writer never rolled by time"
            new = await c2.open_log("timed", password=PW)
            with pytest.raises(LedgerFencedError):
                await old.append(b"too late")
            p = await new.append(b"new leader")
            assert p > positions[-1]
            await new.close()
            await old.close()
            log = await read_all(c2, "timed")
            assert [x for x, _ in log][: len(positions)] == positions

    run(main())


def test_sync_api_lists_writes_reads_and_deletes_logs(shared_cluster: LocalCluster) -> None:
    import ledgerstore

    with ledgerstore.Client(metadata=shared_cluster.metadata) as client:
        with client.open_log("sync-log", password=PW) as writer:
            assert isinstance(writer, ledgerstore.LogWriter)
            first = writer.append(b"x" * 100)
            assert isinstance(first, Position)
            rest = [f.result(30) for f in [writer.append_async(b"y" * 100) for _ in range(49)]]
            assert writer.roll() != first.ledger_id
            rest += [f.result(30) for f in [writer.append_async(b"z" * 100) for _ in range(50)]]
        positions = [first, *rest]
        assert positions == sorted(positions) and len({p.ledger_id for p in positions}) == 2
        assert "sync-log" in client.list_logs()
        reader = client.open_log_reader("sync-log", password=PW, batch_size=30)
        assert isinstance(reader, ledgerstore.LogReader)
        head = []
        for item in reader:  # stop mid-batch: the rest must not be lost
            head.append(item)
            if len(head) == 10:
                break
        assert [p for p, _ in head + list(reader)] == positions
        ledgers = list(dict.fromkeys(p.ledger_id for p in positions))
        client.delete_log("sync-log", password=PW)
        assert "sync-log" not in client.list_logs()
        assert not set(ledgers) & set(client.list_ledgers())
        with pytest.raises(LogError, match="does not exist"):
            client.open_log("sync-log", password=PW, create=False)
        with pytest.raises(InvalidArgumentError):
            client.open_log("bad/name")
