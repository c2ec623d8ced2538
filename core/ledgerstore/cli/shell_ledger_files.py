"""``shell ledgermetadata -dumptofile / -restorefromfile``: one ledger's metadata to a file and back.

The file holds the metadata exactly as the ledger manager stores it (``LedgerMetadata.to_bytes``:
versioned JSON), so a dump restores byte for byte. It carries what the store carries, the stored
password check included, so it is created readable by its owner only (mode 0600).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ledgerstore.errors import ConfigError, LedgerExistsError, MetadataError
from ledgerstore.meta.ledgers import LedgerMetadata


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new or truncated ``path`` readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # an existing file keeps its mode through O_CREAT
        f.write(data)


def dump_ledger_metadata(md: LedgerMetadata, path: Path) -> None:
    """Write ``md`` as stored to ``path`` (mode 0600)."""
    write_private(path, md.to_bytes())


def read_dump(path: Path) -> LedgerMetadata:
    """The metadata a dump file holds; ConfigError naming the file when it holds none."""
    try:
        return LedgerMetadata.from_bytes(path.read_bytes())
    except MetadataError as exc:
        raise ConfigError(f"{path} does not hold ledger metadata written by -dumptofile: {exc}") from None


async def restore_ledger_metadata(client: Any, ledger_id: int, path: Path, update: bool) -> LedgerMetadata:
    """Write the metadata of dump ``path`` as ledger ``ledger_id``'s: created when the ledger does
    not exist; when it does, refused (LedgerExistsError) unless ``update``, then replaced by
    compare-and-set against the version just read."""
    md = read_dump(path)
    md.ledger_id = ledger_id
    try:
        return await client.ledgers.create(md)  # type: ignore[no-any-return]
    except LedgerExistsError:
        if not update:
            raise LedgerExistsError(f"ledger {ledger_id} already exists; pass -update to overwrite its metadata") from None
    md.version = (await client.ledgers.read(ledger_id)).version
    return await client.ledgers.write(md)  # type: ignore[no-any-return]
