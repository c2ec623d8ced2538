"""The entrylog engine's index file I/O with more ledgers than its ledger cache holds: an evicted
page writes only the slots that changed, index files stay open in a bounded LRU, and neither
loses an entry, whether the process is killed after evictions, the machine crashes after a
checkpoint, or the engine is simply reopened."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.errors import ConfigError
from ledgerstore.plugins import build
from ledgerstore.sim.files import SimFileSystem
from ledgerstore_entrylog import EntryLogStorage
from ledgerstore_entrylog.format import INDEX_HEADER_SIZE

#: pages of 8 slots, two of them cached: a third page evicts one
SMALL = {"page_size": 64, "page_limit_bytes": 128, "flush_entrylog_bytes": 0}


def payload(ledger_id: int, entry_id: int, tag: bytes = b"") -> bytes:
    return b"%d/%d/%s" % (ledger_id, entry_id, tag) * 3


def idx_fds(root: Path) -> list[str]:
    """The index files under ``root`` this process holds open."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)) and target.endswith(".idx"):
            found.append(target)
    return found


@pytest.fixture
def index_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Every pwrite to an index file as (file name, offset, bytes), in order."""
    writes: list[tuple[str, int, int]] = []
    real = os.pwrite

    def counting(fd: int, data: Any, offset: int) -> int:
        n = real(fd, data, offset)
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.endswith(".idx"):
            writes.append((os.path.basename(target), offset, n))
        return n

    monkeypatch.setattr(os, "pwrite", counting)
    return writes


def idx_name(ledger_id: int) -> str:
    return f"{ledger_id:016x}.idx"


# --- the dirty range ------------------------------------------------------------------------------

def test_an_evicted_page_with_one_changed_slot_writes_only_that_slots_bytes(
        tmp_path: Path, index_writes: list[tuple[str, int, int]]) -> None:
    e = EntryLogStorage([tmp_path], **SMALL)
    e.open()
    try:
        e.add_entries(1, [(eid, payload(1, eid)) for eid in range(8)])
        e.flush()
        e.add_entry(1, 3, payload(1, 3, b"again"))  # one slot of a clean page changes
        index_writes.clear()
        for lid in (2, 3):  # two more pages: ledger 1's is the least recently used
            e.add_entry(lid, 0, payload(lid, 0))
        assert [w for w in index_writes if w[0] == idx_name(1)] == [(idx_name(1), INDEX_HEADER_SIZE + 3 * 8, 8)]
        assert e.get_entry(1, 3) == payload(1, 3, b"again")
    finally:
        e.close()


def test_a_batch_added_in_one_call_is_written_whole_by_an_eviction_even_across_pages(
        tmp_path: Path, index_writes: list[tuple[str, int, int]]) -> None:
    """add_entries sets most slots of a page directly, not one call each: the page's dirty
    range still covers all of them, on both pages a batch spans."""
    e = EntryLogStorage([tmp_path], **SMALL)
    e.open()
    try:
        e.add_entries(1, [(eid, payload(1, eid)) for eid in range(2)])
        e.flush()
        index_writes.clear()
        e.add_entries(1, [(eid, payload(1, eid)) for eid in range(2, 11)])  # slots 2..7 of page 0, 0..2 of page 1
        for lid in (2, 3):
            e.add_entry(lid, 0, payload(lid, 0))
        assert sorted(w for w in index_writes if w[0] == idx_name(1)) == [
            (idx_name(1), INDEX_HEADER_SIZE + 2 * 8, 6 * 8),
            (idx_name(1), INDEX_HEADER_SIZE + 64, 3 * 8),
        ]
    finally:
        e.close()
    again = EntryLogStorage([tmp_path], **SMALL)
    again.open()
    try:
        assert again.last_entry_id(1) == 10
        assert [again.get_entry(1, eid) for eid in range(11)] == [payload(1, eid) for eid in range(11)]
    finally:
        again.close()


def test_a_reopened_engine_reads_every_entry_of_pages_written_in_many_small_ranges(tmp_path: Path) -> None:
    """Thirty ledgers in turn, three entries each per turn, through a cache of two pages: every
    page is written a few slots at a time by many evictions, the last ones by the checkpoint."""
    e = EntryLogStorage([tmp_path], max_open_index_files=4, **SMALL)
    e.open()
    try:
        for turn in range(6):
            for lid in range(30):
                e.add_entries(lid, [(eid, payload(lid, eid)) for eid in range(turn * 3, turn * 3 + 3)])
        assert e.stats().extra["dirty_evictions"] > 150
    finally:
        e.close()
    again = EntryLogStorage([tmp_path], **SMALL)
    again.open()
    try:
        for lid in range(30):
            assert again.last_entry_id(lid) == 17
            assert again.get_entries(lid, list(range(18))) == [payload(lid, eid) for eid in range(18)]
    finally:
        again.close()


KILLED_AFTER_EVICTIONS = '''
import sys
from pathlib import Path
from ledgerstore_entrylog import EntryLogStorage
def payload(ledger_id, entry_id):
    return b"%d/%d/" % (ledger_id, entry_id) * 3
e = EntryLogStorage([Path(sys.argv[1])], page_size=64, page_limit_bytes=256, flush_entrylog_bytes=0,
                    max_open_index_files=3)
e.open()
for turn in range(8):
    for lid in range(20):
        e.add_entries(lid, [(eid, payload(lid, eid)) for eid in range(turn * 3, turn * 3 + 3)])
print("ADDED", e.stats().extra["dirty_evictions"], flush=True)
sys.stdin.read()
'''


def test_a_process_killed_after_evictions_keeps_every_entry_whose_index_slot_was_written(tmp_path: Path) -> None:
    """No checkpoint ran: what the engine kept is what its evictions wrote, a few slots at a
    time. Every slot in the index files must lead to its entry (the log data went out before
    the slot), and every page but the four still cached was written."""
    proc = subprocess.Popen([sys.executable, "-c", KILLED_AFTER_EVICTIONS, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ADDED"), line + proc.stderr.read()  # type: ignore[union-attr]
        assert int(line.split()[1]) > 100
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    e = EntryLogStorage([tmp_path], page_size=64, page_limit_bytes=256)
    e.open()
    try:
        kept = 0
        for lid in range(20):
            raw = (tmp_path / "current" / "index").rglob(idx_name(lid))
            data = next(raw).read_bytes()[INDEX_HEADER_SIZE:]
            slots = [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data) - 7, 8)]
            written = [eid for eid, v in enumerate(slots) if v]
            assert written == list(range(len(written))), (lid, written)
            assert e.last_entry_id(lid) == len(written) - 1
            assert e.get_entries(lid, written) == [payload(lid, eid) for eid in written]
            kept += len(written)
        # 480 entries added; at most the 4 cached pages of 8 slots were never written
        assert kept >= 480 - 4 * 8
    finally:
        e.close()


def test_a_checkpoint_makes_durable_the_index_files_evictions_wrote_through_open_handles(tmp_path: Path) -> None:
    """Over files that keep only what was synced at a crash: evictions write through index
    files the cache holds open, the checkpoint syncs them by name, and after a machine crash
    everything added before the checkpoint reads back."""
    root = tmp_path / "ledgers"
    fs = SimFileSystem(random.Random(1), engine_roots=(root,))
    fs.makedirs(root)
    e = EntryLogStorage([root], files=fs, max_open_index_files=8, **SMALL)
    e.open()
    for turn in range(4):
        for lid in range(12):
            e.add_entries(lid, [(eid, payload(lid, eid)) for eid in range(turn * 5, turn * 5 + 5)])
    assert e.stats().extra["dirty_evictions"] > 40
    assert len(e.parts.cache.handles) == 8
    e.flush()
    fs.crash()
    again = EntryLogStorage([root], files=fs, **SMALL)
    again.open()
    try:
        for lid in range(12):
            assert again.get_entries(lid, list(range(20))) == [payload(lid, eid) for eid in range(20)]
    finally:
        again.close()


# --- the open index files -------------------------------------------------------------------------

def test_never_more_index_files_open_than_the_limit_and_an_evicted_one_reopens(tmp_path: Path) -> None:
    e = EntryLogStorage([tmp_path], max_open_index_files=3, **SMALL)
    e.open()
    try:
        most = 0
        for turn in range(4):
            for lid in range(10):
                e.add_entries(lid, [(eid, payload(lid, eid)) for eid in range(turn * 4, turn * 4 + 4)])
                most = max(most, len(idx_fds(tmp_path)))
        assert most == 3
        handles = e.parts.cache.handles
        assert handles.opens > 10  # ledgers whose file was closed to make room were opened again
        for lid in range(10):
            assert e.get_entries(lid, list(range(16))) == [payload(lid, eid) for eid in range(16)]
        assert len(idx_fds(tmp_path)) <= 3
    finally:
        e.close()
    assert idx_fds(tmp_path) == []


def test_a_deleted_ledger_s_index_file_is_closed_and_a_new_one_starts_empty(tmp_path: Path) -> None:
    e = EntryLogStorage([tmp_path], **SMALL)
    e.open()
    try:
        for lid in (1, 2, 3):  # ledger 1's page is evicted: its file is written and held open
            e.add_entries(lid, [(eid, payload(lid, eid)) for eid in range(4)])
        assert any(p.endswith(idx_name(1)) for p in idx_fds(tmp_path))
        e.delete_ledger(1)
        assert not any(p.endswith(idx_name(1)) for p in idx_fds(tmp_path))
        e.add_entry(1, 0, payload(1, 0, b"new"))
        for lid in (2, 3):
            e.add_entry(lid, 4, payload(lid, 4))
        e.flush()
    finally:
        e.close()
    again = EntryLogStorage([tmp_path], **SMALL)
    again.open()
    try:
        assert again.last_entry_id(1) == 0
        assert again.get_entry(1, 0) == payload(1, 0, b"new")
    finally:
        again.close()


@pytest.mark.parametrize("value", [0, -5])
def test_a_non_positive_max_open_index_files_is_a_one_line_config_error(tmp_path: Path, value: int) -> None:
    with pytest.raises(ConfigError) as exc:
        build("storage", "entrylog", [tmp_path], options={"max_open_index_files": value})
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith("storage plugin 'entrylog': ")
    assert "max_open_index_files" in message and ">= 1" in message
