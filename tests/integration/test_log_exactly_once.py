"""Exactly-once log appends over real bookie processes: producers and sequences, duplicates that
write nothing, the producer table rebuilt by a new leader (from snapshots and recovered ledgers),
old logs read unchanged, and a producer process killed with SIGKILL that resends from 0."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ledgerstore
from ledgerstore.aio import Client, LogRecord, Position
from ledgerstore.client.log.entry import FORMAT_KEY
from ledgerstore.client.log.producers import SNAPSHOT_KEY
from ledgerstore.cluster import LocalCluster
from ledgerstore.errors import InvalidArgumentError
from ledgerstore.meta.logs import LogManager
from ledgerstore.proto import speedups

PRODUCER = str(Path(__file__).with_name("log_producer_proc.py"))
PW = b"pw"


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 300))


async def records(client: Client, name: str) -> list[LogRecord]:
    reader = await client.open_log_reader(name, password=PW)
    return [r async for r in reader.records()]


async def ledger_ids(client: Client, name: str) -> list[int]:
    md = await LogManager(client.store).read(name)  # type: ignore[arg-type]
    assert md is not None
    return md.ledger_ids


def test_a_duplicate_sequence_writes_nothing_and_resolves_to_the_original_position(
        shared_cluster: LocalCluster) -> None:
    async def go() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            w = await client.open_log("eo-dup", password=PW, producer_id="p1")
            assert w.last_seq is None
            first = await w.append(b"a", seq=0)
            second = await w.append(b"b", seq=5)  # gaps are allowed
            assert await w.append(b"a again", seq=0) == first
            assert await w.append(b"b again", seq=5) == second
            assert w.last_seq == 5 and w.last_seq_of("p1") == 5 and w.last_seq_of("other") is None
            with pytest.raises(InvalidArgumentError, match="sequence 3 is below its highest stored sequence 5 but is not in the log"):
                await w.append(b"never", seq=3)
            plain = await w.append(b"plain")  # no sequence: no dedup
            await w.close()
            got = await records(client, "eo-dup")
            assert [(r.payload, r.producer_id, r.seq) for r in got] == [
                (b"a", "p1", 0), (b"b", "p1", 5), (b"plain", None, None)]
            assert [r.position for r in got] == [first, second, plain]
            reader = await client.open_log_reader("eo-dup", password=PW)
            assert [p async for _, p in reader] == [b"a", b"b", b"plain"]  # the plain iteration is unchanged

    run(go())


def test_a_duplicate_of_an_in_flight_sequence_resolves_with_the_originals_outcome(
        shared_cluster: LocalCluster) -> None:
    async def go() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            w = await client.open_log("eo-inflight", password=PW, producer_id="p")
            original = w.append_async(b"x", seq=7)
            again = w.append_async(b"x", seq=7)
            batch = w.append_many_async([b"m0", b"m1", b"m2"], first_seq=10)
            middle = w.append_async(b"m1", seq=11)  # inside the in-flight batch
            assert await original == await again
            last = await batch
            assert await middle == Position(last.ledger_id, last.entry_id - 1)
            await w.close()
            assert [r.payload for r in await records(client, "eo-inflight")] == [b"x", b"m0", b"m1", b"m2"]

    run(go())


def test_a_sequence_skipped_while_a_higher_one_is_in_flight_is_refused(shared_cluster: LocalCluster) -> None:
    async def go() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            w = await client.open_log("eo-skipped", password=PW, producer_id="p")
            await w.append(b"5", seq=5)
            twenty = w.append_async(b"20", seq=20)
            with pytest.raises(InvalidArgumentError, match="sequence 12 was skipped: this writer already sent sequence 20"):
                await w.append(b"12", seq=12)
            await twenty
            await w.close()
            assert [r.seq for r in await records(client, "eo-skipped")] == [5, 20]

    run(go())


def test_append_many_skips_the_front_already_stored_and_multiplexes_producers(shared_cluster: LocalCluster) -> None:
    async def go() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            w = await client.open_log("eo-many", password=PW)
            await w.append_many([b"a0", b"a1", b"a2"], first_seq=0, producer_id="a")
            await w.append_many([b"b0"], first_seq=0, producer_id="b")
            end = await w.append_many([b"a1", b"a2", b"a3", b"a4"], first_seq=1, producer_id="a")
            assert await w.append_many([b"a0", b"a1"], first_seq=0, producer_id="a") == Position(end.ledger_id, 1)
            assert (w.last_seq_of("a"), w.last_seq_of("b"), w.last_seq) == (4, 0, None)
            await w.close()
            got = [(r.producer_id, r.seq) for r in await records(client, "eo-many")]
            assert got == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("a", 3), ("a", 4)]

    run(go())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"seq": -1}, "seq must be between 0"),
    ({"seq": True}, "seq must be an int"),
    ({"seq": 1, "producer_id": ""}, "producer_id must not be empty"),
    ({"seq": 1, "producer_id": "x" * 256}, "at most 255"),
    ({"seq": 1}, "needs a producer"),
    ({"producer_id": "p"}, "without a seq"),
    ({"seq": 2**63, "producer_id": "p"}, "seq must be between 0 and 9223372036854775807"),  # was written
    ({"seq": 2**64, "producer_id": "p"}, "seq must be between 0"),  # was a struct.error
    ({"seq": 1.0, "producer_id": "p"}, "seq must be an int"),
    ({"seq": 1, "producer_id": ["p"]}, "producer_id must be a string, not list"),  # was "payload must be bytes"
])
def test_bad_sequences_and_producer_ids_get_one_line_errors(shared_cluster: LocalCluster, kwargs: dict[str, object],
                                                             message: str) -> None:
    async def go() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            w = await client.open_log("eo-bad", password=PW)
            with pytest.raises(InvalidArgumentError, match=message) as info:
                await w.append(b"x", **kwargs)  # type: ignore[arg-type]
            assert "\n" not in str(info.value)
            assert await w.append(b"still usable", seq=1, producer_id="p")  # the writer keeps working
            await w.close()

    run(go())


def test_a_payload_that_is_not_bytes_is_refused_on_every_append_path(shared_cluster: LocalCluster) -> None:
    async def go() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            w = await client.open_log("eo-bad-payload", password=PW, producer_id="p")
            await w.append(b"0", seq=0)
            calls = [lambda: w.append("text"),  # type: ignore[arg-type]
                     lambda: w.append("text", seq=1),  # type: ignore[arg-type]  # a known producer's next sequence
                     lambda: w.append(7, seq=1, producer_id="new"),  # type: ignore[arg-type]  # a new producer
                     lambda: w.append_many([b"ok", "text"], first_seq=1)]  # type: ignore[list-item]
            for call in calls:
                with pytest.raises(InvalidArgumentError, match="must be bytes, not (str|int)$"):
                    await call()
            assert w.last_seq == 0
            assert await w.append(b"1", seq=1) == Position(w.ledger_id, 1)  # nothing was sent, nothing skipped
            await w.close()

    run(go())


@pytest.mark.parametrize("path", ["compiled", "pure"])
def test_sequenced_entries_are_the_documented_bytes_on_both_hot_paths(shared_cluster: LocalCluster, path: str) -> None:
    fast = speedups.load()
    if path == "compiled" and fast is None:
        pytest.skip("the compiled hot path is not built (scripts/setup.sh builds it)")

    async def go() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            w = await client.open_log(f"eo-bytes-{path}", password=PW, producer_id="ab")
            await w.append(b"a", seq=258)
            await w.append_many([b"b", bytearray(b"c")], first_seq=259)
            await w.append(memoryview(b"d"), seq=300, producer_id="other")
            await w.append(b"e")
            await w.close()
            lh = await client.open_ledger(w.ledger_id, PW, recovery=False)
            raw = [e.payload for e in await lh.read(0, 4)]
            # flags 0x02, the id's length, the id, the sequence as a LEB128 varint (258 = 0x82 0x02)
            assert raw == [b"\x02\x02ab\x82\x02a", b"\x02\x02ab\x83\x02b", b"\x02\x02ab\x84\x02c",
                           b"\x02\x05other\xac\x02d", b"\x00e"]
            got = await records(client, f"eo-bytes-{path}")
            assert [(r.payload, r.producer_id, r.seq) for r in got] == [
                (b"a", "ab", 258), (b"b", "ab", 259), (b"c", "ab", 260), (b"d", "other", 300), (b"e", None, None)]

    saved = speedups.compiled
    speedups.compiled = fast if path == "compiled" else None
    try:
        run(go())
    finally:
        speedups.compiled = saved


def test_a_new_leader_rebuilds_the_table_from_snapshots_and_the_ledgers_nobody_closed(
        shared_cluster: LocalCluster) -> None:
    async def go() -> None:
        async with Client(metadata=shared_cluster.metadata) as c1, Client(metadata=shared_cluster.metadata) as c2:
            w = await c1.open_log("eo-rebuild", password=PW, producer_id="p")
            for seq in range(40):
                await w.append(b"%03d" % seq, seq=seq)
                if seq in (10, 20):
                    await w.roll()
            await w.flush()  # the rolls' closes (and their snapshots) are done
            w2 = await c2.open_log("eo-rebuild", password=PW, producer_id="p")  # takes over: w never closed
            assert w2.last_seq == 39
            ids = await ledger_ids(c2, "eo-rebuild")
            metas = [await c2.ledger_metadata(lid) for lid in ids]
            assert all(m.custom[FORMAT_KEY] == "2" for m in metas)
            assert [SNAPSHOT_KEY in m.custom for m in metas] == [True, True, False, False]  # each roll's close
            assert await w2.append(b"again", seq=39) == (await w2.append(b"again", seq=39))
            assert (await w2.append(b"040", seq=40)).ledger_id == w2.ledger_id
            old = await w2.append(b"resent", seq=3)  # found in the log
            await w2.close()
            got = await records(c2, "eo-rebuild")
            assert [r.seq for r in got] == list(range(41))
            assert got[3].position == old
            w3 = await c1.open_log("eo-rebuild", password=PW, producer_id="p")  # from w2's close snapshot
            assert w3.last_seq == 40
            await w3.close()

    run(go())


def test_an_old_log_opens_unchanged_and_raw_ledgers_in_it_are_stepped_over(shared_cluster: LocalCluster) -> None:
    async def go() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            logs = LogManager(client.store)  # type: ignore[arg-type]
            md = await logs.get_or_create("eo-old")
            lh = await client.create_ledger(3, 2, 2, password=PW)  # as an older release wrote it: no marker
            await lh.append_many([b"\x01old", b"\x00raw"])
            await lh.close()
            await logs.write(md.with_ledger(lh.ledger_id))
            w = await client.open_log("eo-old", password=PW, producer_id="p")
            assert w.last_seq is None
            await w.append(b"new", seq=0)
            await w.close()
            got = await records(client, "eo-old")
            assert [(r.payload, r.seq) for r in got] == [(b"\x01old", None), (b"\x00raw", None), (b"new", 0)]
            raw = await client.create_ledger(3, 2, 2, password=PW)  # a raw ledger after it (a Spark stream's)
            await raw.append(b"raw")
            await raw.close()
            await logs.write((await logs.read("eo-old")).with_ledger(raw.ledger_id))  # type: ignore[union-attr]
            w = await client.open_log("eo-old", password=PW, producer_id="p")
            assert w.last_seq == 0  # stepped over the raw ledger to the sequenced one before it
            assert await w.append(b"new", seq=0) == got[2].position
            await w.close()

    run(go())


def test_entries_with_the_earlier_fixed_size_sequence_read_back_and_rebuild_the_table(
        shared_cluster: LocalCluster) -> None:
    # a log written by a release before the varint sequence: flags 0x01 and 8 sequence bytes
    def fixed(header: bytes, seq: int, payload: bytes) -> bytes:
        return b"\x01" + header[1:] + seq.to_bytes(8, "big") + payload

    async def go() -> None:
        async with Client(metadata=shared_cluster.metadata) as c1, Client(metadata=shared_cluster.metadata) as c2:
            w = await c1.open_log("eo-fixed", password=PW, producer_id="p")
            w._encode = fixed  # type: ignore[method-assign]
            for seq in range(5):
                await w.append(b"%d" % seq, seq=seq + 300)
            await w.flush()
            w2 = await c2.open_log("eo-fixed", password=PW, producer_id="p")  # takes over: w never closed
            assert w2.last_seq == 304  # rebuilt from the fixed-size entries
            assert await w2.append(b"again", seq=302) == Position(w.ledger_id, 2)
            await w2.append(b"5", seq=305)  # written in the current format after them
            await w2.close()
            lh = await c2.open_ledger(w2.ledger_id, PW, recovery=False)
            assert (await lh.read(0, 0))[0].payload == b"\x02\x01p\xb1\x025"
            got = await records(c2, "eo-fixed")
            assert [(r.payload, r.producer_id, r.seq) for r in got] == [
                (b"%d" % i, "p", i + 300) for i in range(6)]

    run(go())


def test_producer_expiry_forgets_idle_producers_and_gives_up_their_dedup(shared_cluster: LocalCluster) -> None:
    async def go() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            w = await client.open_log("eo-ttl", password=PW, producer_id="idle")
            await w.append(b"0", seq=0)
            await w.close()  # the snapshot records when "idle" last appended
            await asyncio.sleep(0.3)
            kept = await client.open_log("eo-ttl", password=PW, producer_id="idle")  # no TTL: remembered
            assert kept.last_seq == 0
            await kept.close()
            w = await client.open_log("eo-ttl", password=PW, producer_id="idle", producer_ttl_s=0.2)
            assert w.last_seq is None  # forgotten: what expiry gives up
            await w.append(b"0", seq=0)  # so a resend is written again
            await w.close()
            assert [r.seq for r in await records(client, "eo-ttl")] == [0, 0]
            with pytest.raises(InvalidArgumentError, match="producer_ttl_s"):
                await client.open_log("eo-ttl", password=PW, producer_ttl_s=0)

    run(go())


def test_the_sync_api_appends_with_sequences_and_reads_records(shared_cluster: LocalCluster) -> None:
    with ledgerstore.Client(metadata=shared_cluster.metadata) as client:
        w = client.open_log("eo-sync", password=PW, producer_id="s")
        first = w.append(b"0", seq=0)
        assert w.append(b"0", seq=0) == first
        w.append_many([b"1", b"2"], first_seq=1)
        assert w.last_seq == 2 and w.last_seq_of("s") == 2
        w.close()
        reader = client.open_log_reader("eo-sync", password=PW)
        for rec in reader.records():
            assert rec.seq == 0
            break  # what it read ahead stays in the cursor
        assert [(p, s) for (_, p), s in zip(reader, (1, 2), strict=True)] == [(b"1", 1), (b"2", 2)]


def test_a_producer_killed_mid_stream_resends_from_zero_and_the_log_holds_each_sequence_once(
        shared_cluster: LocalCluster) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen([sys.executable, PRODUCER, shared_cluster.metadata, "eo-kill", "2000"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert first.stdout is not None
        acked = -1
        deadline = time.monotonic() + 120
        while acked < 300 and time.monotonic() < deadline:  # mid-stream: some acknowledged, more in flight
            line = first.stdout.readline()
            assert line, first.stderr.read() if first.stderr else ""
            if line.startswith("ack "):
                acked = int(line.split()[1])
        assert acked >= 300
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
            first.wait(30)
    second = subprocess.run([sys.executable, PRODUCER, shared_cluster.metadata, "eo-kill", "2000"],
                            capture_output=True, text=True, env=env, timeout=240)
    assert second.returncode == 0, second.stderr
    resumed = next(line for line in second.stdout.splitlines() if line.startswith("open "))
    assert int(resumed.split()[2]) >= acked  # the new leader found at least what was acknowledged

    async def check() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            got = await records(client, "eo-kill")
            assert [r.seq for r in got] == list(range(2000))
            assert all(r.payload == b"entry-%d" % r.seq for r in got)

    run(check())
