"""The bookie's request processor driven directly with encoded frames: no sockets, no bookie
process. A real journal (without fsync) and a real entrylog engine in a temporary directory, a
memory metadata store holding the ledgers, and a connection that records what it is sent."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
import typing
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from ledgerstore import errors
from ledgerstore.bookie.completions import AddCompletion
from ledgerstore.bookie.counters import BookieCounters
from ledgerstore.bookie.disks import disk_usage
from ledgerstore.bookie.journal import Journal
from ledgerstore.bookie.ledger_state import LedgerDescriptors
from ledgerstore.bookie.parts import ServingParts
from ledgerstore.bookie.processor import RequestProcessor
from ledgerstore.bookie.state import BookieState
from ledgerstore.config import BookieConfig, JournalConfig
from ledgerstore.meta.ledgers import LedgerManager, LedgerMetadata
from ledgerstore.proto import codec
from ledgerstore.proto.codec import FLAG_FENCE, FLAG_RECOVERY_ADD, Op, Status
from ledgerstore.proto.digest import DigestManager, master_key, password_check
from ledgerstore_entrylog import EntryLogStorage
from ledgerstore_memory import MemoryMetadataStore, drop_namespace

PASSWORD = b"secret"
KEY = master_key(PASSWORD)


class Conn:
    """A peer: records every frame sent to it and lets a test wait for the n-th."""

    peer = "test-peer"

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self._more = asyncio.Event()

    def send(self, frame: bytes) -> None:
        self.sent.append(frame)
        self._more.set()

    def close(self) -> None:
        pass

    async def answers(self, n: int, timeout: float = 10.0) -> list[codec.Response]:
        async def wait() -> None:
            while len(self.sent) < n:
                self._more.clear()
                await self._more.wait()

        await asyncio.wait_for(wait(), timeout)
        return [codec.decode_response(f) for f in self.sent]


class Rig:
    def __init__(self, processor: RequestProcessor, store: MemoryMetadataStore, journal: Journal[typing.Any]) -> None:
        self.processor = processor
        self.store = store
        self.journal = journal

    async def ledger(self, ledger_id: int, *, password: bytes = PASSWORD) -> DigestManager:
        """Create the ledger's metadata (as a client would before writing) and its signer."""
        await LedgerManager(self.store).create(LedgerMetadata(
            ledger_id=ledger_id, ensemble_size=1, write_quorum=1, ack_quorum=1, digest_type="crc32c",
            password_check=password_check(password), ensembles=[(0, ["b:1"])],
            password=base64.b64encode(password).decode()))
        return DigestManager(ledger_id, "crc32c", password)

    def send(self, conn: Conn, *frames: bytes) -> None:
        self.processor.frames_received(conn, list(frames))


@contextlib.asynccontextmanager
async def make_rig(tmp_path: Path, **settings: Any) -> AsyncIterator[Rig]:
    """A processor serving a fresh engine; ``settings`` are further BookieConfig fields."""
    name = f"processor-{uuid.uuid4().hex}"
    config = BookieConfig(metadata=f"memory://{name}", ledger_dirs=[str(tmp_path / "ledgers")],
                          journal_dir=str(tmp_path / "journal"), journal=JournalConfig(sync=False), **settings)
    state = BookieState("b:1", config.disk_usage_threshold, config.disk_usage_lwm)
    processor = RequestProcessor(config, state, LedgerDescriptors(), BookieCounters())
    store = MemoryMetadataStore(f"memory://{name}")
    await store.start()
    (tmp_path / "ledgers").mkdir()
    engine = EntryLogStorage([tmp_path / "ledgers"])
    engine.open()
    loop = asyncio.get_running_loop()
    parts = ServingParts.build(processor, engine, store, tmp_path / "journal", loop,
                               disk_usage=lambda: disk_usage([tmp_path / "ledgers"]), on_disk_full=lambda: None)
    journal = parts.journal
    journal.replay_into(parts.ledgers)
    processor.attach(parts.ledgers, journal, parts.lookup, None, loop)
    journal.start(loop)
    state.serving = True
    state.registered.set()
    try:
        yield Rig(processor, store, journal)
    finally:
        for t in parts.lookup.tasks():
            t.cancel()
        processor.reads.close()
        journal.close()
        engine.close()
        await store.close()
        drop_namespace(name)


def run(tmp_path: Path, scenario: Callable[[Rig], Coroutine[Any, Any, None]], **settings: Any) -> None:
    """Run ``scenario`` against a fresh processor on its own event loop (``settings``: further
    BookieConfig fields)."""

    async def main() -> None:
        async with make_rig(tmp_path, **settings) as rig:
            await scenario(rig)

    asyncio.run(main())


def add(rid: int, dm: DigestManager, eid: int, lac: int = -1, *, key: bytes = KEY, flags: int = 0) -> bytes:
    return codec.encode_request(codec.AddRequest(rid, dm.ledger_id, eid, key, dm.sign(eid, lac, b"payload"), flags))


def read(rid: int, lid: int, eid: int, *, key: bytes = b"", flags: int = 0) -> bytes:
    return codec.encode_request(codec.ReadRequest(rid, lid, eid, key, flags))


# --- the dispatch table ----------------------------------------------------------------------------


def test_every_request_type_the_codec_decodes_has_a_handler() -> None:
    decodable = set(codec.request_types().values())
    processor = RequestProcessor(BookieConfig(metadata="memory://x"), BookieState("b:1", 0.95, 0.9),
                                 LedgerDescriptors(), BookieCounters())
    assert set(processor.handlers) == decodable


def test_a_request_before_the_bookie_serves_is_refused_read_only_not_queued(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        dm = await rig.ledger(1)
        rig.processor.state.serving = False
        conn = Conn()
        rig.send(conn, add(7, dm, 0))
        (resp,) = await conn.answers(1)
        assert (resp.op, resp.request_id, resp.status) == (Op.ADD, 7, Status.READ_ONLY)

    run(tmp_path, scenario)


def test_a_malformed_frame_is_answered_bad_request_and_the_next_frame_is_served(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        conn = Conn()
        junk = codec.encode_request(codec.ReadRequest(1, 5, 0))[: codec.HEADER_SIZE + 3]
        rig.send(conn, junk, codec.encode_request(codec.BookieInfoRequest(2)))
        bad, info = await conn.answers(2)
        assert (bad.request_id, bad.status) == (1, Status.BAD_REQUEST)
        assert (info.op, info.request_id, info.status) == (Op.BOOKIE_INFO, 2, Status.OK)
        assert rig.processor.counters.bad_requests == 1

    run(tmp_path, scenario)


def test_bookie_info_tells_the_process_instance_only_when_asked(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        rig.processor.reads.state.instance = 0x5EED
        conn = Conn()
        rig.send(conn, codec.encode_bookie_info(1), codec.encode_bookie_info(2, codec.FLAG_INSTANCE))
        plain, told = await conn.answers(2)
        assert (plain.request_id, plain.instance) == (1, 0)
        assert (told.request_id, told.instance) == (2, 0x5EED)
        assert len(codec.encode_response(plain)) == codec.HEADER_SIZE + 25  # the format before instances

    run(tmp_path, scenario)


# --- adds ----------------------------------------------------------------------------------------------


def test_an_add_is_answered_only_once_its_journal_group_is_durable(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        dm = await rig.ledger(1)
        conn = Conn()
        rig.send(conn, add(1, dm, 0))
        first = await conn.answers(1)  # the first add of a ledger waits for its metadata look-up
        assert (first[0].op, first[0].status, first[0].entry_id) == (Op.ADD, Status.OK, 0)
        before = rig.journal.groups
        rig.send(conn, add(2, dm, 1, 0))
        # the journal answers from its writer thread through the loop: nothing yet, though the
        # engine already holds the entry
        assert len(conn.sent) == 1 and rig.processor.in_flight(conn) == 1
        (_, second) = await conn.answers(2)
        assert (second.request_id, second.status) == (2, Status.OK)
        assert rig.journal.groups > before and rig.processor.in_flight(conn) == 0
        rig.send(conn, codec.encode_request(codec.ReadLacRequest(3, 1)))
        (lac,) = (await conn.answers(3))[2:]
        assert (lac.status, lac.lac, lac.last_entry_id) == (Status.OK, 0, 1)  # type: ignore[attr-defined]

    run(tmp_path, scenario)


def test_a_fenced_ledger_refuses_adds_but_takes_recovery_adds(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        dm = await rig.ledger(3)
        conn = Conn()
        rig.send(conn, add(1, dm, 0))
        await conn.answers(1)
        rig.send(conn, read(2, 3, 0, key=KEY, flags=FLAG_FENCE))
        fenced_read = (await conn.answers(2))[1]
        assert (fenced_read.op, fenced_read.status, fenced_read.entry) == (Op.READ, Status.OK, dm.sign(0, -1, b"payload"))
        rig.send(conn, add(3, dm, 1), add(4, dm, 1, flags=FLAG_RECOVERY_ADD))
        refused, recovery = (await conn.answers(4))[2:]
        assert (refused.request_id, refused.status) == (3, Status.FENCED)
        assert (recovery.request_id, recovery.status) == (4, Status.OK)

    run(tmp_path, scenario)


def test_a_read_only_bookie_refuses_adds_but_takes_recovery_adds_while_its_disks_keep_the_reserve(
        tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        dm = await rig.ledger(8)
        conn = Conn()
        rig.send(conn, add(1, dm, 0))
        await conn.answers(1)
        rig.processor.state.read_only = True
        rig.send(conn, add(2, dm, 1), add(3, dm, 1, flags=FLAG_RECOVERY_ADD))
        refused, recovery = (await conn.answers(3))[1:]
        assert (refused.request_id, refused.status) == (2, Status.READ_ONLY)
        assert (recovery.request_id, recovery.status) == (3, Status.OK)
        assert rig.processor.counters.rejected_adds == {"READ_ONLY": 1}

    run(tmp_path, scenario)


def test_an_add_with_another_master_key_is_refused_unauthorized(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        dm = await rig.ledger(4)
        conn = Conn()
        rig.send(conn, add(1, dm, 0, key=master_key(b"other")))
        (resp,) = await conn.answers(1)
        assert resp.status == Status.UNAUTHORIZED
        rig.send(conn, add(2, dm, 0))
        (_, again) = await conn.answers(2)
        assert again.status == Status.OK, "a refused first key is not recorded"

    run(tmp_path, scenario)


def test_an_add_naming_a_ledger_the_metadata_store_does_not_hold_is_refused(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        conn = Conn()
        rig.send(conn, add(1, DigestManager(99, "crc32c", PASSWORD), 0))
        (resp,) = await conn.answers(1)
        assert resp.status == Status.NO_SUCH_LEDGER
        assert rig.processor.counters.unknown_ledger_claims == 1

    run(tmp_path, scenario)


def test_a_failed_journal_group_answers_its_adds_io_error_with_their_request_ids(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        conn = Conn()
        ok = codec.encode_add_response(42, Status.OK, 1, 5)
        rig.processor.on_journal_failed([None, AddCompletion(conn, ok)], OSError("disk gone"))
        (resp,) = await conn.answers(1)
        assert (resp.op, resp.request_id, resp.status) == (Op.ADD, 42, Status.IO_ERROR)

    run(tmp_path, scenario)


# --- reads and LAC -------------------------------------------------------------------------------------


def test_reads_answer_the_status_their_error_class_declares(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        dm = await rig.ledger(5)
        conn = Conn()
        rig.send(conn, add(1, dm, 0))
        await conn.answers(1)
        rig.send(conn, read(2, 5, 9), read(3, 77, 0),
                 codec.encode_request(codec.ReadMultiRequest(4, 5, (0, 9))))
        # read workers answer in the order their reads finish: matched by request id
        _, no_entry, no_ledger, multi = sorted(await conn.answers(4), key=lambda r: r.request_id)
        assert no_entry.status == errors.NoSuchEntryError.code == Status.NO_SUCH_ENTRY
        assert no_ledger.status == errors.NoSuchLedgerError.code == Status.NO_SUCH_LEDGER
        assert [(e, s) for e, s, _ in multi.items] == [(0, Status.OK), (9, Status.NO_SUCH_ENTRY)]  # type: ignore[misc]

    run(tmp_path, scenario)


class StuckReads:
    """Wraps an engine's reads so that each waits for ``release`` (at most ``limit`` seconds)
    before reading: a read stuck on a cold disk."""

    def __init__(self, engine: Any, limit: float = 5.0) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.released_in_time: list[bool] = []
        self.limit = limit
        self._get_entries = engine.get_entries
        engine.get_entries = self.get_entries

    def get_entries(self, ledger_id: int, entry_ids: Any) -> Any:
        self.started.set()
        self.released_in_time.append(self.release.wait(self.limit))
        return self._get_entries(ledger_id, entry_ids)


async def ledger_with_one_entry(rig: Rig, ledger_id: int) -> tuple[DigestManager, Conn]:
    """A ledger holding entry 0 (added as request 1): its signer and the writer's connection."""
    dm = await rig.ledger(ledger_id)
    conn = Conn()
    rig.send(conn, add(1, dm, 0))
    await conn.answers(1)
    return dm, conn


async def one_entry_then_stuck_reads(rig: Rig, ledger_id: int) -> tuple[DigestManager, Conn, Conn, StuckReads]:
    """A ledger holding entry 0, then reads made to stick: its signer, a writer's connection and
    a reader's."""
    dm, conn = await ledger_with_one_entry(rig, ledger_id)
    return dm, conn, Conn(), StuckReads(rig.processor.ledgers.engine)


def test_an_add_completes_while_a_read_is_stuck_on_the_disk(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        dm, conn, reader, stuck = await one_entry_then_stuck_reads(rig, 8)
        # the read arrives first, in the same batch of frames as the add
        rig.processor.frames_received(reader, [codec.encode_request(codec.ReadMultiRequest(2, 8, (0,)))])
        rig.send(conn, add(3, dm, 1, 0))
        (_, added) = await conn.answers(2, timeout=3.0)
        assert (added.request_id, added.status) == (3, Status.OK)
        assert reader.sent == [] and rig.processor.reads.pending_reads == 1
        stuck.release.set()
        (answer,) = await reader.answers(1)
        assert (answer.request_id, answer.status) == (2, Status.OK)
        assert stuck.released_in_time == [True]  # not by its time limit: the add did not wait for it
        assert rig.processor.reads.pending_reads == 0

    run(tmp_path, scenario)


def test_reads_past_the_bound_of_waiting_reads_are_refused_too_many_requests(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        _, _, reader, stuck = await one_entry_then_stuck_reads(rig, 9)
        rig.send(reader, codec.encode_request(codec.ReadMultiRequest(2, 9, (0,))),
                 codec.encode_request(codec.ReadMultiRequest(3, 9, (0,))))
        (refused,) = await reader.answers(1)
        assert (refused.request_id, refused.status) == (3, Status.TOO_MANY_REQUESTS)
        assert rig.processor.reads.refused_reads == 1
        stuck.release.set()
        (_, served) = await reader.answers(2)
        assert (served.request_id, served.status) == (2, Status.OK)

    run(tmp_path, scenario, num_read_worker_threads=1, max_pending_read_requests_per_thread=1)


def test_without_read_workers_reads_are_served_on_the_loop(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        _, conn = await ledger_with_one_entry(rig, 10)
        rig.send(conn, codec.encode_request(codec.ReadMultiRequest(2, 10, (0,))))
        assert [r.request_id for r in await conn.answers(2)] == [1, 2]  # answered before send returned
        assert rig.processor.reads.executor is None

    run(tmp_path, scenario, num_read_worker_threads=0)


@pytest.mark.parametrize(("settings", "message"), [
    ({"num_read_worker_threads": -1}, "'num_read_worker_threads' = -1 must be >= 0"),
    ({"max_pending_read_requests_per_thread": 0}, "'max_pending_read_requests_per_thread' must be at least 1"),
])
def test_read_worker_settings_out_of_range_are_config_errors(settings: dict[str, int], message: str) -> None:
    problems = BookieConfig(metadata="memory://x", **settings).validate()
    assert any(p.startswith(message) for p in problems), problems


def test_a_long_poll_waiter_is_answered_once_the_lac_passes_what_it_knew(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        dm = await rig.ledger(6)
        conn, poller = Conn(), Conn()
        rig.send(conn, add(1, dm, 0), add(2, dm, 1, 0))
        await conn.answers(2)
        rig.send(poller, codec.encode_request(codec.LongPollLacRequest(10, 6, 0, 60_000)))
        assert poller.sent == [] and rig.processor.waiters.count == 1
        rig.send(conn, add(3, dm, 2, 1))  # carries LAC 1: past what the poller knew
        (woken,) = await poller.answers(1)
        assert (woken.op, woken.request_id, woken.status, woken.lac) == (Op.LONG_POLL_LAC, 10, Status.OK, 1)
        assert rig.processor.waiters.count == 0

    run(tmp_path, scenario)


def test_a_closed_connection_frees_its_long_poll_waiters_unanswered(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        dm = await rig.ledger(7)
        conn, poller = Conn(), Conn()
        rig.send(conn, add(1, dm, 0))
        await conn.answers(1)
        rig.send(poller, *(codec.encode_request(codec.LongPollLacRequest(i, 7, 0, 60_000)) for i in range(3)))
        assert rig.processor.waiters.count == 3
        rig.processor.connection_lost(poller)
        assert rig.processor.waiters.count == 0
        assert poller.sent == []

    run(tmp_path, scenario)


# --- the error registry ----------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [s for s in Status if s not in (Status.OK,)])
def test_each_wire_status_decodes_to_the_error_class_that_declared_it(status: Status) -> None:
    exc = errors.error_for_status(status, "answered")
    assert type(exc).code == status
    assert errors.status_for(exc) == status


@pytest.mark.parametrize("make, status", [
    (lambda: errors.FrameTooLargeError("x"), Status.BAD_REQUEST),  # inherits its base's status
    (lambda: errors.InvalidMetadataError("x"), Status.BAD_REQUEST),
    (lambda: errors.LedgerClosedError("x"), Status.IO_ERROR),  # declares none
    (lambda: OSError("disk"), Status.IO_ERROR),
])
def test_an_error_without_a_status_of_its_own_answers_its_bases_or_io_error(
        make: Callable[[], BaseException], status: Status) -> None:
    assert errors.status_for(make()) == status


def test_a_subclass_redeclaring_its_bases_status_decodes_it_and_an_unrelated_class_does_not() -> None:
    assert type(errors.error_for_status(Status.BAD_REQUEST, "x")) is errors.BadRequestError
    assert type(errors.error_for_status(12345, "x")) is errors.LedgerStoreError


@pytest.mark.parametrize("cls, http", [
    (errors.NoSuchLedgerError, 404), (errors.NoSuchEntryError, 404), (errors.UnauthorizedAccessError, 403),
    (errors.InvalidMetadataError, 400), (errors.TimeoutError_, 503), (errors.NotEnoughBookiesError, 503),
    (errors.ConfigError, 500), (errors.BookieIOError, 500),
])
def test_the_admin_api_answers_an_error_with_the_http_status_its_class_declares(
        cls: type[errors.LedgerStoreError], http: int) -> None:
    assert cls.http_status == http
