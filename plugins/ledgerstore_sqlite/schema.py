"""On-disk schema of the sqlite metadata store and the connection set-up every process shares.

Everything here is synchronous and runs on the store's single database thread.

Tables (schema version 1):

``meta(name PRIMARY KEY, value)``
    ``schema_version`` and ``revision``: the global write counter. Every write or delete of a key
    takes the next revision; a key's version is the revision of its last write (like etcd's
    ``mod_revision``), so versions only grow and are never reused, even after delete and re-create.
``kv(key PRIMARY KEY, value BLOB, version, session)``
    The keys. ``session`` is the owning session id of an ephemeral key, ``NULL`` otherwise.
``changes(revision PRIMARY KEY, key, type, ts)``
    One row per revision, appended in the same transaction as the write; watchers poll it.
    Pruned to a bounded window (see :data:`CHANGE_RETENTION_SECONDS`, :data:`CHANGE_RETENTION_ROWS`).
``sessions(id PRIMARY KEY AUTOINCREMENT, expires_at, ttl, pid, created_at)``
    Live sessions; a row whose ``expires_at`` (wall clock) has passed is reaped by any live store.
``counters(name PRIMARY KEY, value)``
    The ``next_id`` allocators.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any

from ledgerstore.errors import MetadataError

SCHEMA_VERSION = 1

#: what one write of a group commit gave: ``(True, its result)`` or ``(False, its exception)``
Outcome = tuple[bool, Any]

#: change rows younger than this many seconds are kept (a watcher stalled longer may miss events)
CHANGE_RETENTION_SECONDS = 300.0
#: at most this many most recent change rows are kept, whatever their age
CHANGE_RETENTION_ROWS = 100_000

_DDL = """
CREATE TABLE IF NOT EXISTS meta (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kv (
    key     TEXT PRIMARY KEY,
    value   BLOB NOT NULL,
    version INTEGER NOT NULL,
    session INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_by_session ON kv(session) WHERE session IS NOT NULL;
CREATE TABLE IF NOT EXISTS changes (
    revision INTEGER PRIMARY KEY,
    key      TEXT NOT NULL,
    type     TEXT NOT NULL,
    ts       REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    expires_at REAL NOT NULL,
    ttl        REAL NOT NULL,
    pid        INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
"""


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction that takes the database's write lock up front.

    ``BEGIN IMMEDIATE`` makes a read-modify-write wait (busy_timeout) for the lock *before* it
    reads, so two processes never both read the old version and then race to write: the loser
    of a deferred transaction would get SQLITE_BUSY_SNAPSHOT at once, without any retry.
    """
    if conn.in_transaction:  # one write of a group commit: the group's transaction and savepoint
        yield conn
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def run_group(conn: sqlite3.Connection, writes: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[Outcome]:
    """Run ``writes`` (functions that each make one :func:`immediate` transaction) in one
    transaction, so they share one commit and its fsync: a group commit. Each runs inside its own
    savepoint, so one that raises (a failed compare-and-set) is undone alone and the others stay.
    An sqlite error (a full disk, a lock held past the busy timeout) undoes the whole group, and
    each write is then run alone, as it would have been without the group. Returns each write's
    ``(True, result)`` or ``(False, exception)``, in order."""
    if len(writes) > 1:
        out: list[Outcome] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for fn, args in writes:
                conn.execute("SAVEPOINT one_write")
                try:
                    result = fn(*args)
                except sqlite3.Error:
                    raise
                except Exception as exc:
                    conn.execute("ROLLBACK TO one_write")
                    out.append((False, exc))
                else:
                    out.append((True, result))
                conn.execute("RELEASE one_write")
            conn.execute("COMMIT")
            return out
        except sqlite3.Error:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
    alone: list[Outcome] = []
    for fn, args in writes:
        try:
            alone.append((True, fn(*args)))
        except Exception as exc:
            alone.append((False, exc))
    return alone


def _switch_to_wal(conn: sqlite3.Connection, busy_timeout: float) -> str:
    """``PRAGMA journal_mode = WAL``, retried: when several processes open a new file at once,
    the switch can report "database is locked" at once instead of waiting on the busy handler."""
    deadline = time.monotonic() + busy_timeout
    delay = 0.005
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def connect(path: str, busy_timeout: float, synchronous: str) -> sqlite3.Connection:
    """Open ``path`` (creating it if new), configure it for multi-process use, create the schema
    and check its version. Raises :class:`MetadataError` naming the path on any failure."""
    conn: sqlite3.Connection | None = None
    try:
        conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        # Reading the header here turns "file is not a database" into an error at start-up.
        conn.execute("PRAGMA schema_version").fetchone()
        mode = _switch_to_wal(conn, busy_timeout)
        if str(mode).lower() != "wal":
            raise MetadataError(
                f"sqlite metadata store {path}: could not switch to WAL journal mode (got {mode!r}); "
                "WAL is needed for several processes to share the file (is it on a network file system?)"
            )
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        with immediate(conn):
            for statement in _DDL.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT OR IGNORE INTO meta(name, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
            )
            conn.execute("INSERT OR IGNORE INTO meta(name, value) VALUES ('revision', 0)")
            found = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()[0]
        if found != SCHEMA_VERSION:
            raise MetadataError(
                f"sqlite metadata store {path}: schema version {found} is not the supported version "
                f"{SCHEMA_VERSION}; use a ledgerstore release that matches this database"
            )
    except sqlite3.Error as exc:
        if conn is not None:
            conn.close()
        raise MetadataError(f"sqlite metadata store {path}: cannot open the database: {exc}") from exc
    except MetadataError:
        if conn is not None:
            conn.close()
        raise
    return conn
