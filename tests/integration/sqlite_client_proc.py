"""A metadata client process for the sqlite server tests.

``python sqlite_client_proc.py DB MODE TTL``: opens ``sqlite://DB`` (MODE ``server``: through the
metadata server, ``direct``: the file itself), creates the ephemeral key ``/client/eph`` and the key
``/client/before``, prints ``ready <session>`` and waits for commands on stdin:

- ``pause``: write ``/client/during``, but stop this very process (SIGSTOP) in the middle of that
  write: through the server, after half of the request's frame went out; directly, inside the
  write transaction (holding the file's write lock). After SIGCONT the write completes and
  ``acked <version>`` is printed.
- ``check``: print ``eph <version or none>`` for ``/client/eph`` as this client sees it (retried
  while the store reconnects).
- ``quit`` (or end of input): close the store and exit.

Session events are printed as ``event lost`` / ``event restored``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from ledgerstore.api import Versioned
from ledgerstore.errors import MetadataError
from ledgerstore_sqlite import SqliteMetadataStore


def _stop_self() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def _pause_inside_next_write(store: SqliteMetadataStore) -> None:
    if store._remote is not None:
        writer = store._remote._writer
        assert writer is not None
        write = writer.write

        def half_then_stop(data: bytes) -> None:
            if b"/client/during" not in data:  # a ping
                write(data)
                return
            writer.write = write  # type: ignore[method-assign]
            write(data[: len(data) // 2])  # a Unix socket sends at once when its buffer is empty
            _stop_self()
            write(data[len(data) // 2 :])

        writer.write = half_then_stop  # type: ignore[method-assign]
    else:
        conn = store._conn
        assert conn is not None

        def stop_in_transaction(sql: str) -> None:
            if sql.startswith("INSERT INTO kv"):  # after BEGIN IMMEDIATE: the write lock is held
                conn.set_trace_callback(None)
                _stop_self()

        conn.set_trace_callback(stop_in_transaction)


async def _get_retrying(store: SqliteMetadataStore, key: str, timeout: float = 30.0) -> Versioned | None:
    """``get``, retried while the store reconnects to a restarted server."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await store.get(key)
        except MetadataError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)


async def main(db: str, mode: str, ttl: float) -> None:
    store = SqliteMetadataStore(f"sqlite://{db}", session_ttl=ttl, busy_timeout=60,
                                server="require" if mode == "server" else "never")
    store.add_session_listener(lambda event: print(f"event {event.value}", flush=True))
    await store.start()
    try:
        await store.put_ephemeral("/client/eph", b"mine")
        await store.put("/client/before", b"1")
        print(f"ready {store._remote.session if store._remote else store._session_id}", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if line in ("", "quit"):
                return
            if line == "pause":
                _pause_inside_next_write(store)
                version = await store.put("/client/during", b"2")
                print(f"acked {version}", flush=True)
            elif line == "check":
                got = await _get_retrying(store, "/client/eph")
                print(f"eph {got.version if got else 'none'}", flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
