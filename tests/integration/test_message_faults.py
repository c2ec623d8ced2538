"""Randomized message-fault runs: a writer whose messages to one bookie are lost, late or
duplicated is paused (everything it sends and receives held), two recoverers fence and close its
ledger through faults of their own (lost fence answers, lost or late recovery reads), and then
the writer wakes up. After every run the protocol invariants of DESIGN.md are checked.

The seed decides every fault and every step (and the placement of replacement bookies); the
run waits on the fault rules (``wait_hits``) and on the writer's futures, never on sleeps. Which
of the two concurrent recoverers closes the ledger is a race: the invariants hold either way.
A failure prints the seed, the schedule and what happened:
``LEDGERSTORE_FAULT_SEED=<seed> pytest tests/integration/test_message_faults.py`` replays it;
``LEDGERSTORE_FAULT_SEEDS=<n>`` runs seeds 1..n (default 20); the ``nightly`` tox env runs 500.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Literal

import pytest

from ledgerstore.aio import Client, LedgerHandle
from ledgerstore.cluster import LocalCluster
from ledgerstore.errors import LedgerFencedError, LedgerStoreError
from ledgerstore.plugins import create_metadata_store
from ledgerstore.proto.codec import Op
from ledgerstore.testing.faults import FaultInjector, FaultRule, FaultyMetadataStore, FrameInfo
from tests.integration.invariants import check_closed_ledger, fault_seeds, payload_of

pytestmark = pytest.mark.slow

SEEDS = fault_seeds(20)
BOOKIES = 5  # E = 3 and two spares, so a writer cut off from the bookies can still change its ensemble
PASSWORD = b"pw"
#: a recoverer's lost fence or read answer costs this long
RECOVERY_TIMEOUTS = {"read_timeout_s": 1.5, "add_timeout_s": 3.0}
#: the writer's add timeout when it is to notice lost messages (and replace the bookie)
DETECT_TIMEOUT_S = 1.5
#: ... and when it is not: a lost add stays pending until the writer learns it was fenced
STALL_TIMEOUT_S = 120.0
#: the longest any one step may take before the run is declared stuck
STEP_DEADLINE_S = 30.0


@dataclasses.dataclass(frozen=True)
class Rule:
    """One seeded fault rule. ``bookie`` is an index into the ledger's ensemble at the moment the
    rule is installed (ensemble changes may have replaced bookies by then)."""

    action: Literal["drop", "delay", "hold", "duplicate"]
    bookie: int
    direction: Literal["request", "response"]
    op: Op
    times: int | None = None
    seconds: float = 0.0

    def install(self, faults: FaultInjector, ensemble: Sequence[str],
                match: Callable[[FrameInfo], bool] | None = None) -> FaultRule:
        bookie = ensemble[self.bookie]
        if self.action == "delay":
            return faults.delay(bookie, self.seconds, direction=self.direction, ops={self.op}, match=match,
                                times=self.times)
        add: Callable[..., FaultRule] = getattr(faults, self.action)
        return add(bookie, direction=self.direction, ops={self.op}, match=match, times=self.times)

    def __str__(self) -> str:
        times = "" if self.times is None else f" x{self.times}"
        late = f" {self.seconds:.3f}s" if self.action == "delay" else ""
        return f"{self.action} {self.op.name} {self.direction}s of ensemble[{self.bookie}]{times}{late}"


def install(rules: Sequence[Rule], faults: FaultInjector, ensemble: Sequence[str]) -> None:
    """Install ``rules``, those that take a bounded number of frames first (the first rule that
    matches a frame takes it: an unbounded one ahead would starve them)."""
    for rule in sorted(rules, key=lambda r: r.times is None):
        rule.install(faults, ensemble)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Everything one seed decides."""

    seed: int
    write_quorum: int
    ack_quorum: int
    ensemble: tuple[int, ...]  # cluster indexes of the bookies the ledger is created on
    detect: bool  # the writer times out lost adds (and changes its ensemble) instead of waiting
    partitioned: bool  # in the pause the writer is only cut off from the bookies: it may change its ensemble
    batches: tuple[tuple[int, bool], ...]  # phase 1: (entries, sent with append_many)
    writer_rules: tuple[Rule, ...]  # phase 1 faults, installed before the first batch
    late_batch: int | None  # phase 1 batch whose answers from ensemble[late_bookie] come after the next batch's
    late_bookie: int
    tail: int  # entries that reach the bookies just before the pause; their answers are held
    tail_many: bool  # the tail is sent with append_many
    tail_rule: Rule | None  # the tail's frame to one bookie lost or held until the writer resumes
    paused: int  # entries the paused writer tries to send (held)
    recoverer_rules: tuple[tuple[Rule, ...], tuple[Rule, ...]]
    responses_first: bool  # on resume, held answers reach the writer before its held requests go
    first_waits: bool  # recoverer 1 is paused just before its close until recoverer 2 closed the ledger

    @classmethod
    def from_seed(cls, seed: int) -> Schedule:
        rnd = random.Random(seed)
        qw, qa = rnd.choice([(2, 2), (3, 2)])
        ensemble = tuple(rnd.sample(range(BOOKIES), 3))
        detect = rnd.random() < 0.4
        # a lost add or answer blocks an entry of Qw = Qa until the writer notices the loss
        batches = tuple((rnd.randint(1, 40), rnd.random() < 0.3) for _ in range(rnd.randint(2, 4)))
        w = rnd.randrange(3)  # the one bookie whose messages go wrong in phase 1
        losses = [Rule("drop", w, "request", Op.ADD_BATCH, rnd.randint(1, 3)),
                  Rule("drop", w, "response", Op.ADD_BATCH, rnd.randint(1, 3))]
        menu = [
            Rule("delay", w, "response", Op.ADD_BATCH, rnd.randint(1, 5), rnd.uniform(0.005, 0.05)),
            Rule("duplicate", w, "request", Op.ADD_BATCH, rnd.randint(1, 3)),
            Rule("duplicate", w, "response", Op.ADD_BATCH, rnd.randint(1, 3)),
        ]
        if detect:  # a loss the writer notices: it replaces the bookie (the one spare) by ensemble change
            writer_rules = (rnd.choice(losses), *rnd.sample(menu, rnd.randint(0, 1)))
        else:
            writer_rules = tuple(rnd.sample(menu + losses if qw > qa else menu, rnd.randint(0, 2)))
        late_batch = rnd.randrange(len(batches) - 1) if rnd.random() < 0.5 else None
        late_bookie = rnd.choice([i for i in range(3) if i != w])  # w's answers may all be lost
        t = rnd.randrange(3)
        tail_rule = rnd.choice([None,
                                Rule("drop", t, "request", Op.ADD_BATCH, 1),
                                Rule("hold", t, "request", Op.ADD_BATCH, 1),
                                Rule("drop", t, "response", Op.ADD_BATCH, 1)])
        partitioned = detect and rnd.random() < 0.5
        return cls(seed, qw, qa, ensemble, detect, partitioned, batches, writer_rules, late_batch, late_bookie,
                   rnd.randint(1, 12), rnd.random() < 0.3, tail_rule, rnd.randint(0, 6),
                   (cls._recoverer_rules(rnd, qw), cls._recoverer_rules(rnd, qw)), rnd.random() < 0.5,
                   rnd.random() < 0.5)

    @staticmethod
    def _recoverer_rules(rnd: random.Random, qw: int) -> tuple[Rule, ...]:
        """Faults between one recoverer and one bookie: every write quorum keeps enough others
        to fence and read, so recovery can finish."""
        r = rnd.randrange(3)
        menu = [
            Rule("drop", r, "request", Op.READ_LAC),  # that bookie is never fenced by this recoverer
            Rule("drop", r, "response", Op.READ_LAC),  # fenced, but the recoverer does not hear it
            Rule("delay", r, "response", Op.READ_LAC, None, rnd.uniform(0.01, 0.2)),
            Rule("delay", r, "response", Op.READ, None, rnd.uniform(0.005, 0.05)),
            Rule("drop", r, "response", Op.READ, rnd.randint(1, 2)),
        ]
        if qw == 3:  # two others still acknowledge a re-replicated entry
            menu.append(Rule("drop", r, "response", Op.ADD, rnd.randint(1, 2)))
        return tuple(rnd.sample(menu, rnd.randint(0, 2)))

    def describe(self) -> str:
        phase1 = ", ".join(f"{n}{' (append_many)' if many else ''}" for n, many in self.batches)
        rec = ["; ".join(map(str, rules)) or "none" for rules in self.recoverer_rules]
        late = "none" if self.late_batch is None else f"batch {self.late_batch} from ensemble[{self.late_bookie}]"
        return (f"seed {self.seed}: E=3 Qw={self.write_quorum} Qa={self.ack_quorum} on bookies {list(self.ensemble)}, "
                f"writer {'detects losses' if self.detect else 'waits out losses'}, "
                f"{'cut off from the bookies' if self.partitioned else 'paused'} while it is recovered\n"
                f"  phase 1 batches [{phase1}]; faults: {'; '.join(map(str, self.writer_rules)) or 'none'}; "
                f"late answers: {late}\n"
                f"  tail of {self.tail} entries (answers held), tail fault: {self.tail_rule or 'none'}; "
                f"{self.paused} entries held in the pause\n"
                f"  recoverer 1: {rec[0]}\n  recoverer 2: {rec[1]}\n"
                f"  {'recoverer 1 paused before its close until 2 closed' if self.first_waits else 'recoverers race'}\n"
                f"  resume: {'answers first' if self.responses_first else 'requests first'}\n"
                f"  replay: LEDGERSTORE_FAULT_SEED={self.seed} pytest tests/integration/test_message_faults.py")


class Writer:
    """Appends the entries of a schedule and records, in the order the futures resolve, what
    was acknowledged and what failed."""

    def __init__(self, handle: LedgerHandle) -> None:
        self.lh = handle
        self.next_entry = 0
        self.acked: list[int] = []
        self.failed: dict[int, BaseException] = {}
        self.futures: list[asyncio.Future[int]] = []
        self.problems: list[str] = []

    def append(self, n: int, many: bool = False) -> list[asyncio.Future[int]]:
        first = self.next_entry
        self.next_entry += n
        lh = self.lh
        if many:
            batches = [range(first, first + n)]
            futs = [lh.append_many_async([payload_of(e) for e in batches[0]])]
        else:
            batches = [range(e, e + 1) for e in range(first, first + n)]
            futs = [lh.append_async(payload_of(e)) for e in range(first, first + n)]
        for ids, fut in zip(batches, futs, strict=True):
            fut.add_done_callback(lambda f, ids=ids: self._done(ids, f))
        self.futures += futs
        return futs

    def _done(self, ids: range, fut: asyncio.Future[int]) -> None:
        exc = fut.exception()
        if exc is None:
            if fut.result() != ids[-1]:
                self.problems.append(f"the add of entries {ids.start}..{ids[-1]} resolved to {fut.result()}")
            self.acked.extend(ids)
        else:
            self.failed.update(dict.fromkeys(ids, exc))

    async def settle(self, futs: Sequence[asyncio.Future[int]], what: str) -> None:
        """Wait (with a deadline) until every future of ``futs`` resolved."""
        if not futs:
            return
        _, pending = await asyncio.wait(futs, timeout=STEP_DEADLINE_S)
        assert not pending, f"{what}: {len(pending)} adds neither acknowledged nor failed after {STEP_DEADLINE_S}s"
        assert not self.problems, f"{what}: {self.problems}"


@pytest.fixture(scope="module")
def message_cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    cluster = LocalCluster(tmp_path_factory.mktemp("message-faults"), bookies=BOOKIES, port_base=None)
    cluster.start()
    yield cluster
    cluster.stop()


#: seeds that found a broken invariant: they fail until the core is fixed, then xfail(strict) fails
KNOWN_BROKEN: dict[int, str] = {}


@pytest.mark.parametrize("seed", [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BROKEN[s]))
                                  if s in KNOWN_BROKEN else s for s in SEEDS])
def test_lost_late_and_held_messages_keep_the_invariants(message_cluster: LocalCluster, seed: int) -> None:
    """A writer paused (or cut off) after losing, delaying and duplicating messages, recovered by
    two recoverers with faults of their own, then resumed: no acknowledgement beyond the closed
    last entry, acknowledgements in order, recoverers that agree, a closed ledger that does not
    change, and every entry readable with Qa copies (see ``check_closed_ledger``)."""
    schedule = Schedule.from_seed(seed)
    trace = Trace()
    try:
        asyncio.run(asyncio.wait_for(run(message_cluster, schedule, trace), 180))
    except Exception as exc:
        raise AssertionError(f"{schedule.describe()}\n{type(exc).__name__}: {exc}\n{trace}") from exc


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition()`` holds (the step's deadline: then fail, saying ``what``)."""
    deadline = asyncio.get_running_loop().time() + STEP_DEADLINE_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"waited {STEP_DEADLINE_S}s for {what}"
        await asyncio.sleep(0.01)


@dataclasses.dataclass
class Trace:
    """What a run did, for the failure message."""

    notes: list[str] = dataclasses.field(default_factory=list)
    injectors: dict[str, FaultInjector] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        lines = ["what happened:", *(f"  {n}" for n in self.notes), "last fault events:"]
        lines += [f"  {name}: {inj.events[-25:]}" for name, inj in self.injectors.items()]
        return "\n".join(lines)


async def run(cluster: LocalCluster, s: Schedule, trace: Trace) -> None:
    uri = cluster.metadata
    store = FaultyMetadataStore(create_metadata_store(uri))
    r1_store = FaultyMetadataStore(create_metadata_store(uri))
    wfaults, rfaults = FaultInjector(), (FaultInjector(), FaultInjector())
    trace.injectors.update({"writer": wfaults, "recoverer 1": rfaults[0], "recoverer 2": rfaults[1]})
    note = trace.notes.append
    add_timeout = DETECT_TIMEOUT_S if s.detect else STALL_TIMEOUT_S
    placement = {"placement_options": {"seed": s.seed}}  # replacements too are the seed's choice
    async with (Client(metadata=uri, metadata_store=store, add_timeout_s=add_timeout, **placement) as wc,
                Client(metadata=uri, metadata_store=r1_store, **RECOVERY_TIMEOUTS) as r1,
                Client(metadata=uri, **RECOVERY_TIMEOUTS) as r2,
                Client(metadata=uri) as checker):
        wfaults.install(wc)
        for client, faults in zip((r1, r2), rfaults, strict=True):
            faults.install(client)
        lh = await wc.create_ledger(3, s.write_quorum, s.ack_quorum, password=PASSWORD,
                                    bookies=[cluster.bookie_id(i) for i in s.ensemble])
        writer = Writer(lh)

        # 1. the writer writes while its messages to one bookie are lost, late or duplicated
        install(s.writer_rules, wfaults, lh.md.current_ensemble)
        late: FaultRule | None = None
        for i, (n, many) in enumerate(s.batches):
            if i == s.late_batch:
                late = wfaults.hold(lh.md.current_ensemble[s.late_bookie], direction="response",
                                    ops={Op.ADD_BATCH}, times=1)
            writer.append(n, many)
            if late is not None and i == (s.late_batch or 0) + 1:
                await late.wait_hits(1)
                late.release()  # batch late_batch's answer arrives after this batch was sent
            if i != s.late_batch:
                await writer.settle(writer.futures, f"phase 1 batch {i}")
        assert not writer.failed, f"phase 1: adds failed with a spare bookie at hand: {writer.failed}"
        wfaults.clear()
        note(f"phase 1: entries 0..{writer.next_entry - 1} acknowledged; fragments {lh.md.ensembles}")

        # 2. the tail reaches the bookies, but the writer is paused before it hears back
        ensemble = list(lh.md.current_ensemble)
        floors = {b: wc.pool.get(b).next_rid() for b in ensemble}  # answers to older requests are not the tail's
        tail_rule = s.tail_rule.install(wfaults, ensemble) if s.tail_rule is not None else None
        paused_answers = wfaults.hold(direction="response", match=lambda i: i.message is None
                                      or i.message.request_id > floors.get(i.bookie, 0))
        first_tail = writer.next_entry
        writer.append(s.tail, s.tail_many)
        targets = {ensemble[i] for e in range(first_tail, writer.next_entry) for i in lh.md.write_set(e)}
        if tail_rule is not None and tail_rule.bookie in targets:
            await tail_rule.wait_hits(1)  # the tail's frame to that bookie (or its answer) is lost or held
            targets.discard(tail_rule.bookie)
        await paused_answers.wait_hits(len(targets))  # every other bookie stored the tail
        paused_requests = wfaults.hold(direction="request")
        # a paused writer does not change its ensemble either; one cut off from the bookies may try
        paused_metadata = None if s.partitioned else store.hold_writes(10**6)
        writer.append(s.paused)
        note(f"tail {first_tail}..{first_tail + s.tail - 1} stored by {sorted(targets)}, answers held; "
             f"entries {first_tail + s.tail}..{writer.next_entry - 1} held in the pause")

        # 3. two recoverers, each with its own faults, fence and close the ledger concurrently
        for rules, faults in zip(s.recoverer_rules, rfaults, strict=True):
            install(rules, faults, ensemble)
        acks_before_close = len(writer.acked)
        if s.first_waits:
            # recoverer 1 marks the ledger, fences and reads it, then stops before its closing CAS
            reading = rfaults[0].delay(None, 0.0, ops={Op.READ})  # counts its recovery reads, delays nothing
            before_close = r1_store.hold_writes(1, key=lambda _: reading.hits > 0)
            first = asyncio.ensure_future(r1.open_ledger(lh.ledger_id, PASSWORD))
            await until(lambda: before_close.hits > 0 or first.done(), "recoverer 1 to reach its close")
            h2 = await r2.open_ledger(lh.ledger_id, PASSWORD)
            before_close.release()
            h1 = await first
            note(f"recoverer 1 held {before_close.hits} metadata write(s) until recoverer 2 closed the ledger")
        else:
            h1, h2 = await asyncio.gather(r1.open_ledger(lh.ledger_id, PASSWORD),
                                          r2.open_ledger(lh.ledger_id, PASSWORD))
        closed = await checker.ledger_metadata(lh.ledger_id)
        last = closed.last_entry_id
        note(f"recovered: closed at {last}, fragments {closed.ensembles}; {acks_before_close} acknowledged before")
        assert closed.is_closed, f"recovery left the ledger {closed.state.value}"
        assert h1.last_add_confirmed == h2.last_add_confirmed == last, (
            f"recoverers diverge: {h1.last_add_confirmed} and {h2.last_add_confirmed}, metadata says {last}")

        # 4. the writer wakes up: what it held goes out, what was held for it arrives, it writes on
        if paused_metadata is not None:
            paused_metadata.release()
        for held in (paused_answers, paused_requests) if s.responses_first else (paused_requests, paused_answers):
            held.release()
        if tail_rule is not None:
            tail_rule.release()
        wfaults.clear()
        woke = writer.append(1)
        await writer.settle(writer.futures, "after the writer resumed")
        exc = woke[0].exception()
        late_acks = writer.acked[acks_before_close:]
        note(f"resumed: the next add got {exc!r}; acknowledged after the close: {late_acks}")
        assert exc is not None, f"the resumed writer had entry {writer.next_entry - 1} acknowledged after recovery"
        if not s.detect:  # nothing timed out: the writer can only have learnt it was fenced
            assert isinstance(exc, LedgerFencedError), f"the resumed writer got {exc!r}, not LedgerFencedError"
        assert all(e <= last for e in late_acks), (
            f"acknowledged after the ledger was closed at {last}: {[e for e in late_acks if e > last]}")
        try:
            await asyncio.wait_for(lh.close(), STEP_DEADLINE_S)
        except LedgerStoreError as err:
            assert isinstance(err, LedgerFencedError), f"the resumed writer's close raised {err!r}"
        after = await checker.ledger_metadata(lh.ledger_id)
        assert (after.version, after.last_entry_id, after.ensembles) == (closed.version, last, closed.ensembles), (
            f"the closed ledger changed after the writer resumed: {closed} -> {after}")

        # 5. the invariants of the closed ledger
        await check_closed_ledger(checker, lh.ledger_id, PASSWORD, writer.acked, failure=f"closed at {last}")
