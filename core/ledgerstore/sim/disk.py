"""How a simulated bookie's ledger disk misbehaves: failed writes and flipped bits.

The simulated bookies run the production entry-log engine (``ledgerstore_entrylog``) on their
machine's :class:`~ledgerstore.sim.files.SimFileSystem`, the journal's files beside it; a crash
keeps only what was synced, in the engine's files as in the journal's. :class:`DiskFaults` is what
the disk does to the engine's files for a while: the file system consults it at each write
(which then fails with EIO, or ENOSPC, which the bookie takes for a full disk) and at each read
of an entry log (which then comes back with one bit flipped: the record's CRC32C fails, the
bookie answers with an error and the client reads the entry from another replica).
"""

from __future__ import annotations

import dataclasses
import errno
import random
from typing import Protocol


class _Disk(Protocol):
    generation: int
    flipped: int
    failed: int


@dataclasses.dataclass
class DiskFaults:
    """How a bookie's ledger disk misbehaves for a while: each write of the engine's files fails
    with probability ``write_error`` (ENOSPC when ``full``, else EIO), each read of an entry log
    comes back with one bit flipped with probability ``flip``."""

    write_error: float = 0.0
    full: bool = False
    flip: float = 0.0
    rng: random.Random = dataclasses.field(default_factory=lambda: random.Random(0))
    #: only the process of the bookie running on the disk then (its generation) meets the
    #: faults: a restarted bookie replays its journal on a disk that works (None: every process)
    generation: int | None = None

    def _on(self, disk: _Disk) -> bool:
        return self.generation is None or self.generation == disk.generation

    def maybe_fail_write(self, disk: _Disk, name: str) -> None:
        """Raise the OSError a failing write meets, with probability ``write_error``."""
        if self.write_error and self._on(disk) and self.rng.random() < self.write_error:
            disk.failed += 1
            code = errno.ENOSPC if self.full else errno.EIO
            raise OSError(code, f"{errno.errorcode[code]} (simulated)", name)

    def maybe_flip(self, raw: bytes, disk: _Disk) -> bytes:
        """``raw`` with one bit flipped, with probability ``flip``."""
        if not (self.flip and raw and self._on(disk) and self.rng.random() < self.flip):
            return raw
        bit = self.rng.randrange(len(raw) * 8)
        flipped = bytearray(raw)
        flipped[bit // 8] ^= 1 << (bit % 8)
        disk.flipped += 1
        return bytes(flipped)
