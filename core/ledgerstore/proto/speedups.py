"""Which implementation of the per-entry hot loops runs: the compiled one or the pure-Python one.

``ledgerstore.proto._speedups`` (Cython, built by ``scripts/setup.sh``) holds compiled versions of
the codec's and the digest's per-entry loops: signing and framing a writer's batch, the bookie's
ADD_BATCH decode, a READ_MULTI answer's decode and a reader's CRC32C verification. This module is
the one place that chooses: :data:`compiled` is the extension when it was built and
``LEDGERSTORE_PURE_PYTHON`` is unset (or ``0``), else None, and then the pure-Python loops in
``codec.py`` and ``digest.py`` run. Both give the same bytes and the same errors; the tests run
against both.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

#: set to 1 to run the pure-Python hot loops even when the extension is built
PURE_PYTHON_ENV = "LEDGERSTORE_PURE_PYTHON"


class HotPath(Protocol):
    """The functions of the compiled extension (``_speedups.pyi`` types them)."""

    HARDWARE_CRC: bool

    def crc32c(self, data: bytes | bytearray | memoryview, value: int = 0) -> int: ...
    def crc32c_batch_items(self, ledger_id: int, first_entry_id: int, lac: int,
                           payloads: Iterable[bytes | bytearray | memoryview]) -> list[bytes]: ...
    def crc32c_item(self, ledger_id: int, entry_id: int, lac: int, payload: bytes | bytearray | memoryview) -> bytes: ...
    def batch_max_lac(self, ledger_id: int, entries: Iterable[tuple[int, bytes | bytearray | memoryview]]) -> int | None: ...
    def add_batch_entries(self, frame: bytes, pos: int, count: int) -> list[tuple[int, bytes]]: ...
    def read_multi_items(self, frame: bytes, pos: int, count: int) -> list[tuple[int, int, bytes]]: ...
    def read_multi_section(self, items: Iterable[tuple[int, int, bytes]]) -> bytes: ...
    def crc32c_verify_into(self, ledger_id: int, items: Iterable[Sequence[Any]], out: dict[int, Any],
                           entry_type: type[tuple[Any, ...]]) -> None: ...


def forced_pure() -> bool:
    """Whether the environment asks for the pure-Python path."""
    return os.environ.get(PURE_PYTHON_ENV, "").strip() not in ("", "0")


def load() -> HotPath | None:
    """The compiled extension, or None when it is not built or the environment forces pure Python."""
    if forced_pure():
        return None
    try:
        from ledgerstore.proto import _speedups  # absent when it was not built: the fallback
    except ImportError:
        return None
    return _speedups


#: the compiled hot path in use, or None for the pure-Python one
compiled: HotPath | None = load()
