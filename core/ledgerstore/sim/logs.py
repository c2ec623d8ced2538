"""Logs in the simulation: two log writers that take a log over from each other, readers, and
the log invariants.

Two processes (``log-a`` and ``log-b``) lead the log ``sim`` by turns: each opens it as a
writer (which fences its ledgers and recovers every one that is not closed), appends for a
drawn stint with a drawn pipelining window, rolling to a new ledger every few hundred bytes,
and stops at its first failure (a takeover fences it) or the end of the stint. A reader
(``log-reader``) reads the log from the start at drawn times. Faults of their own hit these
processes: failed metadata writes (which land on rolls' creates, list appends and closes),
partitions and lossy links to a bookie, held links and pauses.

Exactly-once appends: both writer processes append for one application producer
(:data:`PRODUCER`) with sequences. A writer resumes after its takeover from the application's
checkpoint (the highest sequence it saw acknowledged without a hole), often from an earlier one
(a producer that crashed and resends), resends a sequence whose acknowledgement is late (a retry
after a timeout: a duplicate of one in flight), and now and then an old acknowledged one. Every
fifth append carries no sequence.

Invariants: acknowledgements reach each writer in log order; at every change of the ledger
list only the newest two ledgers may be open (a log never rolls past a ledger that failed to
close); after a final takeover every ledger of the log is closed, every acknowledged append
reads back through a log reader with its payload, in log order, and what every reader saw
during the run is a prefix of the final log. Every acknowledged ``(producer, seq)`` appears in
the final log exactly once, at the position acknowledged (a duplicate resolves to the same one),
and each producer's sequences increase along the log; a resend never meets "not in the log".
"""

from __future__ import annotations

import asyncio
import functools
import random
from typing import Protocol

from ledgerstore.client.client import Client
from ledgerstore.client.log import LogWriter
from ledgerstore.client.log.entry import LogRecord
from ledgerstore.errors import InvalidArgumentError, LedgerStoreError, MetadataError
from ledgerstore.meta.logs import LogMetadata, Position, log_path
from ledgerstore.sim.metadata import _Watch
from ledgerstore.sim.network import LinkFaults
from ledgerstore.sim.world import World

LOG = "sim"
PASSWORD = b"sim-log"
WRITERS = ("log-a", "log-b")
READER = "log-reader"
#: the share of runs with log writers and readers
LOG_RUNS = 0.5
#: the application producer both writer processes append for (a takeover keeps the producer)
PRODUCER = "app"
#: a sequenced append not resolved after this long is sent again (the application's timeout)
RESEND_AFTER_S = 2.0
#: the fault kinds of the main schedule these processes also meet
LOG_FAULTS = ("partition", "lossy-link", "hold-link", "metadata-fail", "metadata-fail", "pause-writer")
#: the fault (and directed scenario) of a log writer process that restarts at the end of a stint
#: without closing its writer, and reopens the log as a new client; the share of stints it ends
RESTART = "client-restart"
RESTARTS = 0.1


class RunView(Protocol):
    """What a workload sees of the run it is part of (``ledgerstore.sim.runner``'s run)."""

    world: World
    duration: float
    kinds: tuple[str, ...]
    #: the directed scenario the run is (None: random faults)
    scenario: str | None

    @property
    def healed(self) -> bool:
        """Whether the world was healed at the end of the run (no fault starts after that)."""
        ...

    def violation(self, text: str, name: str | None = None) -> None:
        """Record a broken invariant (``name``: which; by default the text's first word)."""
        ...


class LogWorkload:
    """The log writers and readers of one run (:meth:`start` with the run, :meth:`finish` after
    the heal), and the log invariants."""

    def __init__(self, run: RunView) -> None:
        self.run = run
        self.world = run.world
        self.loop = run.world.loop
        self.rng = run.world.rng_for("logs")
        #: every acknowledged append: position -> payload
        self.acked: dict[Position, bytes] = {}
        #: what each reader saw, in the order it saw it
        self.reads: list[list[tuple[Position, bytes]]] = []
        #: a writer process may append while set (cleared while it is paused)
        self.awake = {w: asyncio.Event() for w in WRITERS}
        self.tasks: list[asyncio.Task[None]] = []
        self.stats = {"log_sessions": 0, "log_acked": 0, "log_reads": 0}
        self._watch: _Watch | None = None
        self._open_seen = False
        self.enabled = False
        #: the writer process that led the log last
        self.leader: str | None = None
        #: every acknowledged (producer, seq) and the position it was acknowledged at
        self.acked_seqs: dict[tuple[str, int], Position] = {}
        #: the application's checkpoint: every sequence up to it was acknowledged
        self.checkpoint = -1
        self.stats.update(log_dup_sent=0, log_resumed_back=0)

    # --- running -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the writers, the reader and their faults (if the run's fault kinds allow them),
        in half of the runs (the other half costs what a run without logs did)."""
        # the log and worker code draw from the random module (duelling writers back off by a
        # random time): seeded per run, the draws replay with the seed
        random.seed(self.world.rng_for("global-random").getrandbits(64))
        self.enabled = self.rng.random() < LOG_RUNS or self.run.scenario == RESTART
        if not self.enabled:
            return
        server = self.world.meta
        self._watch = _Watch(server, log_path(LOG), lambda _n: self._check_open())
        server.watches.append(self._watch)
        d = self.run.duration
        for name in WRITERS:
            self.awake[name].set()
            client = await self.world.client(name).start()
            self.tasks.append(self.loop.create_task(self._lead(name, client, d), name=name))
        reader = await self.world.client(READER).start()
        self.tasks.append(self.loop.create_task(self._read_now_and_then(reader, d), name=READER))
        kinds = [k for k in LOG_FAULTS if k in self.run.kinds]
        if kinds:
            self.tasks.append(self.loop.create_task(self._faults(kinds, d), name="log-faults"))

    async def _lead(self, name: str, client: Client, until: float) -> None:
        rng = self.world.rng_for(f"logs.{name}")
        await asyncio.sleep(rng.uniform(0.0, until / 3))
        while self.loop.time() < until:
            await self.awake[name].wait()
            ens = rng.randint(3, min(4, len(self.world.bookies)))
            qw = rng.randint(2, ens)
            qa = rng.randint(max(1, qw - 1), qw)
            try:
                w = await asyncio.wait_for(client.open_log(
                    LOG, ensemble=ens, write_quorum=qw, ack_quorum=qa, password=PASSWORD,
                    roll_size_bytes=rng.choice((60, 150, 400)), producer_id=PRODUCER), 60)
            except (LedgerStoreError, TimeoutError) as exc:
                self.world.trace("log.open_failed", f"{name} {type(exc).__name__}")
                await asyncio.sleep(rng.uniform(0.5, 3.0))
                continue
            self.stats["log_sessions"] += 1
            self.leader = name
            self.world.trace("log.leader", f"{name} ledger {w.ledger_id}")
            stint = self.loop.time() + rng.uniform(5.0, 30.0)
            if await self._append(name, w, rng, min(stint, until)):
                client = await self._restart(name, client)
            await asyncio.sleep(rng.uniform(2.0, 20.0))

    def _restarts(self, name: str) -> bool:
        """Whether the process ``name`` restarts at the end of this stint (drawn from a generator
        of its own, so runs where it does not are as they were)."""
        if self.run.scenario is not None:
            return self.run.scenario == RESTART
        draw = self.world.rng_for(f"logs.{name}.restarts.{self.stats['log_sessions']}").random()
        return RESTART in self.run.kinds and draw < RESTARTS

    async def _restart(self, name: str, client: Client) -> Client:
        """The process ``name`` exits with its log writer open (its client stops, its session
        ends) and starts again as a new client, which reopens the log."""
        self.world.trace("log.restart", name)
        await client.close()
        return await self.world.client(name).start()

    async def _append(self, name: str, w: LogWriter, rng: random.Random, until: float) -> bool:
        """Append for a stint; True if the process then restarts without closing ``w``."""
        window = rng.choice((1, 2, 8))
        gap = rng.choice((0.1, 0.2, 0.4))
        srng = self.world.rng_for(f"logs.seq.{name}.{self.stats['log_sessions']}")
        acked: list[Position] = []
        futures: list[asyncio.Future[Position]] = []
        #: sequenced appends not resolved yet: seq -> (future, when sent, resent already)
        waiting: dict[int, tuple[asyncio.Future[Position], float, bool]] = {}
        seq = self._resume_from(w, srng)
        i = 0
        while self.loop.time() < until and w.error is None:
            await self.awake[name].wait()
            futures = [f for f in futures if not f.done()]
            self._resend_late(name, w, waiting, acked)
            if len(futures) >= window:
                await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
                continue
            if i % 5 == 4:
                payload = f"{self.world.seed}:{name}:{self.stats['log_sessions']}:{i}".encode()
                fut = w.append_async(payload)
                fut.add_done_callback(functools.partial(self._acked, name, acked, payload))
            else:
                stored = w.last_seq  # what this writer knows is stored: a resend may only go back
                if srng.random() < 0.05 and stored is not None:
                    self._send_seq(name, w, srng.randint(0, stored), acked)  # an old acknowledged one
                fut = self._send_seq(name, w, seq, acked)
                waiting[seq] = (fut, self.loop.time(), False)
                seq += 1
            i += 1
            futures.append(fut)
            await asyncio.sleep(rng.expovariate(1 / gap))
        if w.error is not None:
            self.world.trace("log.writer_failed", f"{name} {type(w.error).__name__}")
            return False
        if self._restarts(name):
            return True
        try:
            await asyncio.wait_for(w.close(), 60)
            self.world.trace("log.closed", f"{name} at {w.last_position}")
        except (LedgerStoreError, TimeoutError) as exc:
            self.world.trace("log.close_failed", f"{name} {type(exc).__name__}")
        return False

    def _resume_from(self, w: LogWriter, rng: random.Random) -> int:
        """Where a writer taking over resumes the application's sequences: after its checkpoint
        (what it saw acknowledged), or from earlier (a producer resending after a crash), or
        after the log's ``last_seq``."""
        draw = rng.random()
        if draw < 0.4:
            start = self.checkpoint + 1
        elif draw < 0.8:
            start = max(0, self.checkpoint + 1 - rng.randint(1, 30))
            self.stats["log_resumed_back"] += 1
        else:
            last = w.last_seq
            start = 0 if last is None else last + 1
        self.world.trace("log.resume", f"{PRODUCER} from {start} (checkpoint {self.checkpoint}, last {w.last_seq})")
        return start

    def _send_seq(self, name: str, w: LogWriter, seq: int, acked: list[Position]) -> asyncio.Future[Position]:
        fut = w.append_async(self._payload(seq), seq=seq)
        fut.add_done_callback(functools.partial(self._seq_acked, name, acked, seq))
        return fut

    @staticmethod
    def _payload(seq: int) -> bytes:
        return f"{PRODUCER}:{seq}".encode()

    def _resend_late(self, name: str, w: LogWriter, waiting: dict[int, tuple[asyncio.Future[Position], float, bool]],
                     acked: list[Position]) -> None:
        """Send again, once, every sequenced append not resolved after :data:`RESEND_AFTER_S`
        (the application timed out; the original is still in flight)."""
        now = self.loop.time()
        for s, (fut, sent, resent) in list(waiting.items()):
            if fut.done():
                del waiting[s]
            elif not resent and now - sent >= RESEND_AFTER_S:
                waiting[s] = (fut, sent, True)
                self.stats["log_dup_sent"] += 1
                self._send_seq(name, w, s, acked)

    def _seq_acked(self, name: str, acked: list[Position], seq: int, fut: asyncio.Future[Position]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if isinstance(exc, InvalidArgumentError):
            self.run.violation(f"log: {name} resending {PRODUCER} seq {seq} was refused: {exc}")
            return
        if exc is not None:
            return
        pos = fut.result()
        key = (PRODUCER, seq)
        first = self.acked_seqs.setdefault(key, pos)
        if first != pos:
            self.run.violation(f"log: {PRODUCER} seq {seq} acknowledged at {first} and again at {pos} "
                               "(a duplicate was written)")
        while (PRODUCER, self.checkpoint + 1) in self.acked_seqs:
            self.checkpoint += 1
        if not acked or pos > acked[-1]:  # a duplicate resolves to an older position: no order to check
            self._acked(name, acked, self._payload(seq), fut)
        else:
            self.acked[pos] = self.acked.get(pos, self._payload(seq))

    def _acked(self, name: str, acked: list[Position], payload: bytes, fut: asyncio.Future[Position]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        pos = fut.result()
        if acked and pos <= acked[-1]:
            self.run.violation(f"log: {name} saw {pos} acknowledged after {acked[-1]} (acks out of log order)")
        acked.append(pos)
        if pos in self.acked and self.acked[pos] != payload:
            self.run.violation(f"log: position {pos} acknowledged twice, to {self.acked[pos]!r} and {payload!r}")
        self.acked[pos] = payload
        self.stats["log_acked"] += 1

    async def _read_now_and_then(self, client: Client, until: float) -> None:
        rng = self.world.rng_for(f"logs.{READER}")
        while True:
            await asyncio.sleep(rng.uniform(3.0, 15.0))
            if self.loop.time() >= until:
                return
            seen: list[tuple[Position, bytes]] = []
            self.reads.append(seen)
            try:
                await asyncio.wait_for(self._read_all(client, seen), 60)
            except (LedgerStoreError, TimeoutError) as exc:
                self.world.trace("log.read_failed", f"{len(seen)} read, {type(exc).__name__}")
            self.stats["log_reads"] += 1

    @staticmethod
    async def _read_all(client: Client, into: list[tuple[Position, bytes]]) -> None:
        async with await client.open_log_reader(LOG, "earliest", password=PASSWORD) as r:
            async for pos, payload in r:
                into.append((pos, payload))

    @staticmethod
    async def _read_records(client: Client, into: list[LogRecord]) -> None:
        async with await client.open_log_reader(LOG, "earliest", password=PASSWORD) as r:
            async for rec in r.records():
                into.append(rec)

    async def _faults(self, kinds: list[str], until: float) -> None:
        rng = self.world.rng_for("logs.faults")
        net = self.world.net
        later = self.loop.call_later
        bookies = [b.name for b in self.world.bookies]
        procs = [*WRITERS, READER]
        while True:
            await asyncio.sleep(rng.expovariate(1 / 3.0))
            if self.loop.time() > until * 0.9 or self.run.healed:
                return
            kind = rng.choice(kinds)
            hold = rng.uniform(0.1, 10.0)
            pair = (rng.choice(procs), rng.choice(bookies))
            a, b = pair if rng.random() < 0.5 else (pair[1], pair[0])
            self.world.trace("log.fault", f"{kind} {a}->{b} {hold:.3f}s")
            if kind == "metadata-fail":  # a flaky store for one writer: rolls meet failed creates, appends, closes
                target = self.leader if self.leader is not None and rng.random() < 0.8 else rng.choice(WRITERS)
                flaky = (target, rng.choice((0.2, 0.5)), min(hold + 2.0, until - self.loop.time()))
                self.world.meta.fail_writes_for(*flaky)
            elif kind == "pause-writer":
                self._pause(rng.choice(WRITERS), hold * 2)
            elif kind == "hold-link":
                if (pair not in net.held_links):
                    net.hold_link(*pair)
                    later(hold, net.release_link, *pair)
            elif kind == "partition":
                net.partition(a, b, one_way=rng.random() < 0.5)
                later(hold, net.reconnect, a, b)
            else:
                net.set_faults(a, b, LinkFaults(max_delay=rng.choice((0.05, 0.5)), drop=rng.choice((0.01, 0.1, 0.5)),
                                                reorder=0.1))
                later(hold, net.clear_faults, a, b)

    def _pause(self, name: str, hold: float) -> None:
        net = self.world.net
        if name in net.held or self.run.healed:
            return
        self.world.trace("log.pause", f"{name} {hold:.3f}s")
        net.hold(name)
        self.awake[name].clear()
        self.loop.call_later(hold, self._wake, name)

    def _wake(self, name: str) -> None:
        self.world.net.release(name)
        self.awake[name].set()

    # --- checking ----------------------------------------------------------------------------------

    def _log(self) -> LogMetadata | None:
        cur = self.world.meta.data.get(log_path(LOG))
        return None if cur is None else LogMetadata.from_bytes(cur[0], cur[1])

    def _check_open(self) -> None:
        """At every change of the ledger list: no ledger but the newest two is open."""
        md = self._log()
        if md is None or self._open_seen:
            return
        for lid in md.ledger_ids[:-2]:
            lmd = self.world.meta.ledger(lid)
            if lmd is not None and not lmd.is_closed:
                self._open_seen = True  # once per run: every later change would repeat it
                self.run.violation(f"log: ledger {lid} is {lmd.state} although later ledgers follow it "
                                   f"({md.ledger_ids}): the log rolled past a ledger that was not closed")
                return

    async def finish(self) -> None:
        """After the heal: stop the workload, take the log over once more, and check it."""
        if not self.enabled:
            return
        for name in WRITERS:
            self._wake(name)
        for t in self.tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self._watch is not None:
            self._watch.cancel()
        if self._log() is None:
            return
        client = await self.world.client("log-final").start()
        for _ in range(10):
            try:
                w = await asyncio.wait_for(client.open_log(LOG, password=PASSWORD), 120)
                await w.close()
                break
            except (LedgerStoreError, TimeoutError) as exc:
                self.world.trace("log.final_open_failed", type(exc).__name__)
                await asyncio.sleep(2.0)
        else:
            self.run.violation("log: no writer could take the log over on a healthy cluster")
            return
        md = self._log()
        assert md is not None
        for lid in md.ledger_ids:
            lmd = self.world.meta.ledger(lid)
            if lmd is None or not lmd.is_closed:
                self.run.violation(f"log: ledger {lid} is {None if lmd is None else lmd.state} after a takeover "
                                   "on a healthy cluster")
        records: list[LogRecord] = []
        try:
            await asyncio.wait_for(self._read_records(client, records), 300)
        except (LedgerStoreError, MetadataError, TimeoutError) as exc:
            self.run.violation(f"log: reading the whole log failed after {len(records)} entries: {exc!r}")
        self.check([(r.position, r.payload) for r in records])
        self.check_sequences(records)

    def check_sequences(self, final: list[LogRecord]) -> None:
        """Exactly once: each producer's sequences increase along the final log, and every
        acknowledged (producer, seq) is there, at the position it was acknowledged at."""
        at: dict[tuple[str, int], Position] = {}
        last: dict[str, int] = {}
        for rec in final:
            if rec.producer_id is None or rec.seq is None:
                continue
            prev = last.get(rec.producer_id, -1)
            if rec.seq <= prev:
                self.run.violation(f"log: {rec.producer_id} seq {rec.seq} at {rec.position} follows seq {prev} "
                                   "(stored twice, or out of sequence order)")
                return
            last[rec.producer_id] = rec.seq
            at[(rec.producer_id, rec.seq)] = rec.position
        missing = sorted(k for k, pos in self.acked_seqs.items() if at.get(k) != pos)
        if missing:
            k = missing[0]
            self.run.violation(f"log: {len(missing)} acknowledged sequences are not in the final log where they "
                               f"were acknowledged, first {k} (acknowledged at {self.acked_seqs[k]}, found at "
                               f"{at.get(k)})")
        self.stats["log_seqs"] = len(at)

    def check(self, final: list[tuple[Position, bytes]]) -> None:
        """The final log against every acknowledged append and every reader's view."""
        positions = [p for p, _ in final]
        if positions != sorted(set(positions)):
            self.run.violation("log: the final log is not in strictly increasing position order")
        got = dict(final)
        lost = [p for p, payload in self.acked.items() if got.get(p) != payload]
        if lost:
            lost.sort()
            self.run.violation(f"log: {len(lost)} acknowledged appends do not read back through the log, first "
                               f"{lost[0]} (reads {got.get(lost[0])!r}, acknowledged {self.acked[lost[0]]!r})")
        for i, seen in enumerate(self.reads):
            if seen != final[:len(seen)]:
                at = next((j for j, (a, b) in enumerate(zip(seen, final, strict=False)) if a != b),
                          min(len(seen), len(final)))
                self.run.violation(f"log: reader {i} saw {len(seen)} entries that are not a prefix of the final "
                                   f"log (they differ at index {at})")
        self.stats["log_final"] = len(final)
        self.stats["log_ledgers"] = len({p.ledger_id for p in positions})
        self.world.trace("log.checked", f"{len(final)} entries, {len(self.acked)} acknowledged")
