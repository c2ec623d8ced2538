"""The synchronous API, generated from the asyncio one, against real bookie processes."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator

import pytest

import ledgerstore
from ledgerstore import aio
from ledgerstore.client import _mirror
from ledgerstore.cluster import LocalCluster
from ledgerstore.errors import LedgerClosedError, LedgerStoreError
from ledgerstore.meta.logs import Position

PW = b"pw"


@pytest.fixture
def client(shared_cluster: LocalCluster) -> Iterator[ledgerstore.Client]:
    with ledgerstore.Client(metadata=shared_cluster.metadata) as c:
        yield c


def _tasks_on_loop() -> set[asyncio.Task[object]]:
    async def others() -> set[asyncio.Task[object]]:
        return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

    return _mirror.run(others())


def test_sync_create_ledger_places_it_on_the_bookies_named(client: ledgerstore.Client,
                                                           shared_cluster: LocalCluster) -> None:
    chosen = [shared_cluster.bookie_id(2), shared_cluster.bookie_id(0)]
    lh = client.create_ledger(2, 2, 2, password=PW, bookies=chosen)
    assert isinstance(lh, ledgerstore.LedgerHandle)
    assert lh.metadata.ensembles == [(0, chosen)]
    lh.close()


def test_sync_read_entry_and_length_match_what_was_written(client: ledgerstore.Client) -> None:
    lh = client.create_ledger(3, 2, 2, password=PW)
    payloads = [b"entry %d" % i for i in range(20)]
    assert lh.append_many(payloads) == 19
    lh.close()
    assert lh.length == sum(map(len, payloads))
    rh = client.open_ledger(lh.ledger_id, PW)
    assert isinstance(rh, ledgerstore.ReadHandle)
    assert rh.read_entry(7).payload == payloads[7]
    assert rh.length == lh.length
    assert [e.payload for e in rh.iter_entries(0, 19, batch=6)] == payloads
    assert [e.payload for e in rh] == payloads


def test_sync_log_writer_flush_waits_for_every_add(client: ledgerstore.Client) -> None:
    with client.open_log("sync-flush", password=PW) as writer:
        assert isinstance(writer, ledgerstore.LogWriter)
        futures = [writer.append_async(b"x%d" % i) for i in range(300)]
        writer.flush()
        assert all(f.done() for f in futures)
        positions = [f.result() for f in futures]
        assert positions == sorted(positions) and writer.last_position == positions[-1]
    client.delete_log("sync-flush", password=PW)


def test_a_sync_call_interrupted_by_its_deadline_leaves_no_task_on_the_loop(client: ledgerstore.Client) -> None:
    lh = client.create_ledger(3, 3, 2, password=PW)
    lh.append(b"only entry")
    rh = client.open_ledger(lh.ledger_id, PW, recovery=False)
    rh.read_last_add_confirmed()  # connections are up: no task below is a connection's
    before = _tasks_on_loop()
    started = time.monotonic()
    with ledgerstore.call_timeout(0.5), pytest.raises(TimeoutError, match="call_timeout"):
        rh.wait_for_lac(rh.last_add_confirmed + 10, timeout=60)  # a long poll nobody answers
    assert time.monotonic() - started < 30
    assert _tasks_on_loop() <= before, "the long poll kept running on the loop after the caller gave up"
    lh.close()


def test_ctrl_c_during_a_blocking_call_cancels_it_on_the_loop(client: ledgerstore.Client) -> None:
    lh = client.create_ledger(3, 3, 2, password=PW)
    lh.append(b"only entry")
    rh = client.open_ledger(lh.ledger_id, PW, recovery=False)
    rh.read_last_add_confirmed()
    before = _tasks_on_loop()
    main = threading.get_ident()
    sent = threading.Event()

    def interrupt_once_the_long_poll_runs() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _tasks_on_loop() - before:
            time.sleep(0.01)
        signal.pthread_kill(main, signal.SIGINT)
        sent.set()

    helper = threading.Thread(target=interrupt_once_the_long_poll_runs)
    # Ctrl-C as a program sees it (a library loaded earlier in this process may have installed
    # its own handler), and not blocked
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    helper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            rh.wait_for_lac(rh.last_add_confirmed + 10, timeout=60)
    finally:
        helper.join(60)
        signal.signal(signal.SIGINT, previous)
    assert sent.is_set()
    assert _tasks_on_loop() <= before, "the long poll kept running on the loop after Ctrl-C"
    lh.close()


def test_the_loop_thread_stops_with_the_last_client_and_its_handles_refuse_work(
        shared_cluster: LocalCluster) -> None:
    others = [t for t in threading.enumerate() if t.name == "ledgerstore-io"]
    assert not others, "a client of an earlier test is still open (its I/O thread runs): this test needs the last one"
    c = ledgerstore.Client(metadata=shared_cluster.metadata)
    lh = c.create_ledger(3, 2, 2, password=PW)
    lh.append(b"before close")
    thread = next(t for t in threading.enumerate() if t.name == "ledgerstore-io")
    c.close()
    thread.join(30)
    assert not thread.is_alive()
    with pytest.raises(LedgerStoreError, match="is closed"):
        lh.append(b"after close")
    with pytest.raises(LedgerStoreError, match="is closed"):
        lh.read_last_add_confirmed()
    c.close()  # a second close is harmless


def test_an_iterator_left_at_its_deadline_stops_reading_ahead(client: ledgerstore.Client) -> None:
    with client.open_log("sync-tail", password=PW) as writer:
        first = writer.append(b"first")
        second = writer.append(b"second")  # makes the first visible: readers stop at the LAC
        reader = client.open_log_reader("sync-tail", password=PW, poll_interval_s=0.05)
        before = _tasks_on_loop()
        got = []
        with ledgerstore.call_timeout(1.0), pytest.raises(TimeoutError):
            for item in reader.tail():  # then waits for entries nobody writes
                got.append(item)
        assert [p for p, _ in got] == [first]
        assert _tasks_on_loop() <= before
        # the reader is still usable and lost nothing
        writer.append(b"third")
        assert reader.wait(30)
        assert [p for p, _ in reader.read_batch()] == [second]
    client.delete_log("sync-tail", password=PW)


def test_a_log_iterator_left_early_loses_nothing_it_read_ahead(client: ledgerstore.Client) -> None:
    with client.open_log("sync-ahead", password=PW) as writer:
        positions = [f.result() for f in [writer.append_async(b"e%d" % i) for i in range(500)]]
    reader = client.open_log_reader("sync-ahead", password=PW, batch_size=100)
    head = []
    for item in reader:
        head.append(item)
        if len(head) == 10:
            break
    assert reader.position == positions[10]
    nxt = reader.read_batch(5)
    assert [p for p, _ in head + nxt + list(reader)] == positions
    client.delete_log("sync-ahead", password=PW)


def test_sync_calls_from_many_threads_at_once_all_complete(client: ledgerstore.Client) -> None:
    lh = client.create_ledger(3, 2, 2, password=PW)
    ids: list[list[int]] = [[] for _ in range(8)]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(50):
                ids[k].append(lh.append(b"t%d-%d" % (k, i)))
                if i % 10 == 0:
                    client.list_bookies()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    everything = sorted(i for per in ids for i in per)
    assert everything == list(range(400))
    assert all(per == sorted(per) for per in ids)  # one thread's adds keep its order
    lh.close()
    with pytest.raises(LedgerClosedError):
        lh.append(b"after close")
    assert len(client.open_ledger(lh.ledger_id, PW).read(0)) == 400


def test_sync_results_are_sync_handles_over_the_async_ones(client: ledgerstore.Client) -> None:
    lh = client.create_ledger(3, 2, 2, password=PW)
    assert isinstance(lh.aio, aio.LedgerHandle) and lh.ledger_id == lh.aio.ledger_id
    assert client.start() is client
    with client.open_log("sync-attrs", password=PW) as writer:
        reader = client.open_log_reader("sync-attrs", password=PW)
        for sync_obj in (lh, writer, reader):
            for attr in type(sync_obj)._attributes:
                assert getattr(sync_obj, attr) == getattr(sync_obj.aio, attr)
        assert isinstance(writer.append(b"p"), Position)
    lh.close()
    client.delete_log("sync-attrs", password=PW)
