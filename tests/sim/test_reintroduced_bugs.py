"""The random schedules bite: bugs fixed by the correctness issue, put back one at a time with
monkeypatch, are caught by the first few seeds (the seeds and schedules CI runs, unchanged).

Each test names the bug it puts back; the number of seeds is the seeds-to-find measured for that
bug (docs/simulation.md), so a schedule change that stops reaching the interleaving fails here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from ledgerstore.api.storage import StorageEngine
from ledgerstore.bookie import journal, limbo, server
from ledgerstore.bookie.ledger_state import LedgerDescriptors
from ledgerstore.bookie.ledgers import Ledgers
from ledgerstore.client import recovery
from ledgerstore.client.log import writer as log_writer
from ledgerstore.errors import BookieReadOnlyError, LedgerRecoveryError
from ledgerstore.meta import ledgers
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.proto import codec
from ledgerstore.proto.digest import DigestManager
from ledgerstore.sim import FAULT_KINDS, invariants, run_seed, shrink
from ledgerstore_entrylog import compactor
from ledgerstore_entrylog.entrylog import EntryLog, ScannedRecord

#: simulated seconds per seed, as in ``ledgerstore sim --duration 30`` (the measured table)
DURATION = 30.0
#: the seeds each journal bug put back is run for: its seeds-to-find (docs/simulation.md)
JOURNAL_BUGS_SEEDS = {"ack-before-fsync": 57, "replay-drops-last": 23}
#: the seeds the compaction bug put back is run for: its seeds-to-find (docs/simulation.md)
COMPACTION_DROPS_LIVE_SEEDS = 1
#: the seeds limbo switched off is run for: its seeds-to-find (docs/simulation.md)
LIMBO_OFF_SEEDS = 3
#: the checks of the ledger directories' checkpoint marks off: seed 0 (its ledger directory put
#: back as it was 8 s earlier)
STALE_LEDGER_DIR_SEEDS = 1


def _violations(seeds: int, first: int = 0) -> dict[int, list[str]]:
    found = {}
    for seed in range(first, seeds):
        out = run_seed(seed, duration=DURATION)
        if not out.ok:
            found[seed] = out.violations
    return found


async def _write_back_to_the_write_set_only(self: recovery._LedgerRecovery, eid: int, data: bytes) -> None:
    """Issue 14 item 2 put back: a found entry is written back to its write set as it stands and
    needs Qa acks there; a bookie that does not answer is never replaced."""
    md = self.md
    ensemble = self.ensembles[self._fragment_of(eid)][1]
    add = self.ctx.bookie_client.recovery_add
    results = await asyncio.gather(*(add(ensemble[i], md.ledger_id, eid, self.key, data, self.ctx.config.add_timeout_s)
                                     for i in md.write_set(eid)), return_exceptions=True)
    acked = sum(not isinstance(r, BaseException) for r in results)
    if acked < md.ack_quorum:
        raise LedgerRecoveryError(f"recovery of ledger {md.ledger_id}: entry {eid} re-replicated to {acked} bookies")


def test_the_simulation_catches_recovery_that_never_replaces_a_dead_bookie(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery._LedgerRecovery, "_write_back", _write_back_to_the_write_set_only)
    # seeds-to-find 109 since sequenced log entries carry a varint sequence (76 since auto-recovery
    # confirms a replacement's process instance, 12 before): seeds 0..107 do not catch it, and
    # running them all would cost CI a minute, so the test runs seed 108 alone
    found = _violations(109, first=108)
    assert any("could not be recovered with" in v for vs in found.values() for v in vs), found


async def _replace_against_the_old_ensemble(self: recovery._LedgerRecovery, eid: int, idxs: list[int]) -> None:
    """Issue 14 item 3 put back: each replacement is chosen against the ensemble as it was, so
    two replacements chosen at once can be the same bookie."""
    md = self.md
    k = self._fragment_of(eid)
    first, ensemble = self.ensembles[k]
    new = list(ensemble)
    bookies = await self.ctx.bookie_infos(max_age=0)
    self.failed.update(ensemble[i] for i in idxs)
    for i in idxs:
        new[i] = self.ctx.ensemble_placement.replace_bookie(
            ensemble, md.write_quorum, md.ack_quorum, i, bookies, exclude=frozenset(self.failed | self.exclude))
    if first == eid:
        self.ensembles[k] = (eid, new)
    else:
        self.ensembles.insert(k + 1, (eid, new))


def _no_ensemble_check(md: LedgerMetadata) -> None:
    return None


def test_the_simulation_catches_an_ensemble_that_names_a_bookie_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery._LedgerRecovery, "_replace", _replace_against_the_old_ensemble)
    monkeypatch.setattr(ledgers, "check_ensembles", _no_ensemble_check)
    out = run_seed(19, duration=DURATION)  # seeds-to-find 20: seed 19 is the first of 0..19 to catch it
    assert any("names a bookie twice" in v for v in out.violations), out.violations


def test_the_simulation_catches_a_recovered_ledger_that_reports_length_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14 item 9 put back: recovery closes the ledger with the length its metadata had
    (0 for a ledger that was never closed) instead of the payload bytes of entries 0..LAC."""
    close = recovery._LedgerRecovery._close

    async def close_with_the_old_length(self: recovery._LedgerRecovery, last: int, length: int) -> LedgerMetadata:
        return await close(self, last, self.md.length)

    monkeypatch.setattr(recovery._LedgerRecovery, "_close", close_with_the_old_length)
    out = run_seed(0, duration=DURATION)  # seeds-to-find 1: every seed of 0..9 catches it
    assert any("but its metadata says length 0" in v for v in out.violations), out.violations


def test_the_simulation_catches_a_read_only_bookie_that_refuses_recovery_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14 item 6 put back: a read-only bookie refuses recovery adds like any add, so with
    bookies of a ledger's last fragment read-only (and too few writable ones to replace them)
    the ledger cannot be closed until the disks are freed."""
    check_add = Ledgers.check_add

    def refuse_when_read_only(self: Ledgers, ledger_id: int, key: bytes, flags: int) -> None:
        if self.state.read_only:
            raise BookieReadOnlyError("the bookie is read-only")
        check_add(self, ledger_id, key, flags)

    monkeypatch.setattr(Ledgers, "check_add", refuse_when_read_only)
    out = run_seed(3, duration=DURATION)  # seeds-to-find 4 (seed 3)
    assert any("read-only, " in v and "could not be recovered with" in v for v in out.violations), out.violations


def test_the_simulation_catches_a_new_leader_that_does_not_rebuild_the_producer_table(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28 put back: a new leader of a log starts with an empty producer table (neither the
    snapshots nor the recovered ledgers are read), so a producer that resends from an earlier
    sequence after a takeover writes those sequences again. Seeds-to-find 2: seed 1 is the first
    of 0..59 that catches it (then 4, 5)."""

    async def empty_table(client: object, md: object, password: bytes, table: object) -> None:
        return None

    monkeypatch.setattr(log_writer, "rebuild_table", empty_table)
    found = _violations(2)
    assert any("(a duplicate was written)" in v for vs in found.values() for v in vs), found


async def _answer_before_the_fsync(self: journal.Journal[Any]) -> None:
    """Put back in the journal's group commit (``Journal._commit_on_loop``): a group is answered
    as soon as it is written, before its fsync returns."""
    assert self._commit_delay is not None
    while True:
        if self._queue.empty():
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
            self._wake = None
        group = self._drain(self.max_group_bytes)
        self._write(group.bufs, group.size)
        self._answer(group.tokens, group.started)  # the bug: acknowledged before it is durable
        await asyncio.sleep(self._commit_delay())
        self._sync(group.size, group.records)


def _first_failing(seeds: int) -> tuple[int, list[str]]:
    """The first seed of 0..seeds-1 that breaks an invariant, and what it broke."""
    for seed in range(seeds):
        out = run_seed(seed, duration=DURATION)
        if not out.ok:
            return seed, out.violations
    return -1, []


def test_the_simulation_catches_a_journal_that_acknowledges_before_the_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bookie crashing between a journal write and its fsync loses entries it acknowledged:
    one acknowledged entry is then on fewer than Qa bookies of its write set."""
    monkeypatch.setattr(journal.Journal, "_commit_on_loop", _answer_before_the_fsync)
    seed, violations = _first_failing(JOURNAL_BUGS_SEEDS["ack-before-fsync"])
    assert any("of its write set" in v for v in violations), (seed, violations)


def test_the_simulation_catches_a_journal_replay_that_drops_the_last_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put back in ``Journal.replay``: the last record after the LastLogMark is not applied, so
    a restarted bookie forgets the last entry it acknowledged before its crash."""
    replay = journal.Journal.replay

    def drop_the_last(self: journal.Journal[Any], apply: Callable[[journal.Record], None]) -> int:
        held: list[journal.Record] = []
        n = replay(self, held.append)
        for rec in held[:-1]:
            apply(rec)
        return max(0, n - 1)

    monkeypatch.setattr(journal.Journal, "replay", drop_the_last)
    seed, violations = _first_failing(JOURNAL_BUGS_SEEDS["replay-drops-last"])
    # the forgotten entry: on fewer than Qa bookies of its write set, or (seed 22, where the
    # other copy was on a bookie auto-recovery re-replicates) on no replica the reader can find
    assert any("of its write set" in v or "no replica of ledger" in v for v in violations), (seed, violations)



def _forget_fences_on_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fences not restored after a restart: the bookie reads every ledger's key and LAC back from
    its storage engine at start-up, but not its fenced flag (the journal's replay fences the
    ledger in the engine, which the bookie's rules no longer consult)."""
    load = LedgerDescriptors.load

    def forgetful(self: LedgerDescriptors, engine: StorageEngine) -> None:
        load(self, engine)
        self.fenced.clear()

    monkeypatch.setattr(LedgerDescriptors, "load", forgetful)


def test_the_simulation_catches_a_bookie_that_forgets_its_fences_on_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    _forget_fences_on_restart(monkeypatch)
    out = run_seed(26, duration=DURATION)  # seeds-to-find 27 (seed 26) in the random schedules
    assert invariants.FENCE_IS_DURABLE in out.broken, out.violations


def test_a_directed_fence_restart_catches_forgotten_fences_and_shrinks_to_a_short_trace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fence, crash and restart the fenced bookies, wake the old writer: every seed catches the
    bug; shrinking keeps that invariant broken and leaves a trace of at most 200 lines, which
    the printed command replays."""
    _forget_fences_on_restart(monkeypatch)
    shrunk = shrink(0, duration=DURATION, scenario="fence-restart")
    assert shrunk.invariant == invariants.FENCE_IS_DURABLE
    assert len(shrunk.outcome.trace) <= 200, "\n".join(shrunk.outcome.trace)
    replay = run_seed(0, duration=shrunk.duration, scenario="fence-restart", skip=shrunk.skip, shape=shrunk.shape)
    assert replay.trace_hash == shrunk.outcome.trace_hash
    assert "--scenario fence-restart" in shrunk.command(bookies=5, faults=FAULT_KINDS, scenario="fence-restart")


def test_the_simulation_catches_a_writer_that_piggybacks_its_last_pushed_entry_as_the_lac(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A piggybacked LAC past the acknowledged prefix: the writer signs each entry with the id of
    the entry before it (the last one it pushed) as the LAC, acknowledged or not."""
    signer = codec.item_signer

    def last_pushed(digest: DigestManager) -> Callable[[int, int, bytes], bytes]:
        sign = signer(digest)
        return lambda entry_id, lac, payload: sign(entry_id, max(lac, entry_id - 1), payload)

    monkeypatch.setattr(codec, "item_signer", last_pushed)
    out = run_seed(0, duration=DURATION)  # seeds-to-find 1: any pipelined writer sends it at once
    assert invariants.LAC_WITHIN_ACKED in out.broken, out.violations


def _drop_the_first_live_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put back in ``Compactor._copy_live``: the first record of each batch that the index still
    points at is taken for dead and not copied forward, so once the old log is deleted its slot
    points at a log that is gone (the copying itself is the production code's)."""
    copy_live = compactor.Compactor._copy_live

    def drop_first_live(self: compactor.Compactor, lg: EntryLog, batch: list[ScannedRecord],
                        moved: list[tuple[int, int, int, int]]) -> None:
        st, cache, base = self._state, self._cache, lg.log_id << 32
        with st.lock:
            live = [i for i, rec in enumerate(batch) if (led := st.ledgers.get(rec.ledger_id)) is not None
                    and cache.slot(led, rec.entry_id) == (base | rec.offset) + 1]
        copy_live(self, lg, batch[: live[0]] + batch[live[0] + 1 :] if live else batch, moved)

    monkeypatch.setattr(compactor.Compactor, "_copy_live", drop_first_live)


def test_the_simulation_catches_a_compaction_that_drops_a_live_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put back in the entry-log engine's compactor: a live entry is not copied forward before
    its log is deleted, so the bookie no longer holds an entry it acknowledged: one acknowledged
    entry is then on fewer than Qa bookies of its write set."""
    _drop_the_first_live_record(monkeypatch)
    seed, violations = _first_failing(COMPACTION_DROPS_LIVE_SEEDS)
    assert any("of its write set" in v for v in violations), (seed, violations)


def test_the_simulation_catches_a_wiped_bookie_voting_no_such_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32 put back: a bookie wiped mid-run under its old identity is not put in limbo (as
    with ``data_integrity_checking_enabled = false``), so its "no such entry" for entries it
    acknowledged and lost closes a ledger short."""
    monkeypatch.setattr(server, "lost_data", lambda *args, **kwargs: None)
    found = _violations(LIMBO_OFF_SEEDS)  # seeds-to-find 3 (seed 2: the wipe at the recovery of L1)
    assert any("were acknowledged to the writer but the ledger was closed at" in v
               for vs in found.values() for v in vs), found


def test_the_simulation_catches_a_ledger_directory_restored_from_an_older_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32's detection put back to the journal alone: a bookie whose ledger directory was put
    back as an older copy (or wiped keeping its cookie) while its journal stayed does not compare
    the directory's checkpoint mark with the journal's, so it serves what the copy holds and never
    repairs the rest: acknowledged entries end on fewer than Qa bookies of their write set."""
    monkeypatch.setattr(limbo, "_ledger_dirs_out_of_step", lambda *args, **kwargs: None)
    seed, violations = _first_failing(STALE_LEDGER_DIR_SEEDS)
    assert any("of its write set" in v for v in violations), (seed, violations)
