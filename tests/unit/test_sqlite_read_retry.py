"""How long a client's metadata reads retry across an outage is its setting ``metadata_read_retry_s``
(30 s by default): against a real sqlite metadata server that stops, a read of ledger metadata or of
the bookie list gives up within the setting, not after the default, and a bad value is refused in
one line.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from ledgerstore.cluster import start_metadata_server_process, stop_process
from ledgerstore.config import load_client_config
from ledgerstore.errors import ConfigError, MetadataError
from ledgerstore.meta.bookies import BookieRegistry
from ledgerstore.meta.ledgers import LedgerManager
from ledgerstore.meta.retry import DEFAULT_READ_RETRY_S
from ledgerstore.testing.metadata import run
from ledgerstore_sqlite import SqliteMetadataStore

#: the setting under test: far below the default, so a read that waited the default fails the test
RETRY_S = 1.0


def test_reads_give_up_after_the_clients_metadata_read_retry_s_when_the_server_is_gone(tmp_path: Path) -> None:
    assert load_client_config(None, metadata="sqlite:///x.db").metadata_read_retry_s == DEFAULT_READ_RETRY_S
    assert load_client_config(None, metadata="sqlite:///x.db", metadata_read_retry_s=RETRY_S).metadata_read_retry_s \
        == RETRY_S
    db = tmp_path / "meta.db"
    proc = start_metadata_server_process(db, tmp_path / "server.log")

    async def main() -> None:
        store = SqliteMetadataStore(f"sqlite://{db}", server="require", session_ttl=10.0)
        await store.start()
        try:
            ledgers, bookies = LedgerManager(store, RETRY_S), BookieRegistry(store, RETRY_S)
            await ledgers.ledger_layout()  # the server answers (and the layout, read once, is known)
            stop_process(proc, signal.SIGKILL)
            for read in (lambda: ledgers.read(7), bookies.all):
                t0 = time.monotonic()
                with pytest.raises(MetadataError, match="unreachable|lost the connection"):
                    await read()
                # it retried (backing off from 0.05 s), and gave up within the setting, not the default
                assert RETRY_S / 2 <= time.monotonic() - t0 < RETRY_S + 3.0
        finally:
            await store.close()

    try:
        run(main())
    finally:
        stop_process(proc)


@pytest.mark.parametrize(("value", "message"), [
    (0, "'metadata_read_retry_s' must be positive"),
    (-1.5, "'metadata_read_retry_s' must be positive"),
    ("soon", "expected a number"),
    (1e12, "'metadata_read_retry_s' = 1000000000000.0 is too long"),
])
def test_a_bad_metadata_read_retry_s_is_refused_in_one_line(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_client_config(None, metadata="sqlite:///x.db", metadata_read_retry_s=value)
    assert "\n" not in str(err.value)
