"""Which implementation of the per-entry hot loops runs: the compiled one or the pure-Python one.

``ledgerstore.proto._speedups`` (Cython, built with every wheel and by ``scripts/setup.sh``: see
``setup.py``) holds compiled versions of
the codec's and the digest's per-entry loops: signing and framing a writer's batch, the bookie's
ADD_BATCH decode, a READ_MULTI answer's decode, a reader's CRC32C verification and a log writer's
sequenced entries (``client/log/entry.py``). This module is
the one place that chooses: :data:`compiled` is the extension when it was built and
``LEDGERSTORE_PURE_PYTHON`` is unset (or ``0``), else None, and then the pure-Python loops in
``codec.py`` and ``digest.py`` run. Both give the same bytes and the same errors; the tests run
against both. The other compiled modules (a writer's pending adds, the entry log's records) are
built with this one and run only when it does.

:data:`state` says which path runs and, for the pure one, why: ``ledgerstore plugins``,
``ledgerstore --version --verbose``, ``ledgerstore standalone`` and each bookie's start-up log print
it, and a bookie exports it as the ``ledgerstore_hot_path_compiled`` gauge.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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
    def log_entry_varint(self, header: bytes, seq: int, payload: bytes | bytearray | memoryview) -> bytes: ...
    def log_entries_varint(self, header: bytes, first_seq: int,
                           payloads: Iterable[bytes | bytearray | memoryview]) -> list[bytes]: ...


#: the functions :class:`HotPath` declares: a build that lacks one is stale and not used
_FUNCTIONS = tuple(name for name in HotPath.__dict__ if not name.startswith("_") and callable(HotPath.__dict__[name]))


def forced_pure() -> bool:
    """Whether the environment asks for the pure-Python path."""
    return os.environ.get(PURE_PYTHON_ENV, "").strip() not in ("", "0")


@dataclass(frozen=True)
class HotPathState:
    """Which hot path a process runs; ``str()`` gives ``compiled`` or ``pure Python (<why>)``."""

    compiled: bool
    #: why the pure-Python path runs; empty when the compiled one does
    reason: str = ""

    def __str__(self) -> str:
        return "compiled" if self.compiled else f"pure Python ({self.reason})"


def _import() -> tuple[HotPath | None, HotPathState]:
    if forced_pure():
        return None, HotPathState(False, f"{PURE_PYTHON_ENV}={os.environ[PURE_PYTHON_ENV].strip()}")
    try:
        # absent when it was not built: the fallback. Imported by its full name, so that an absent
        # module is a ModuleNotFoundError naming it (``from ... import`` says "cannot import name")
        import ledgerstore.proto._speedups as _speedups
    except ImportError as exc:
        name = f"{__package__}._speedups"
        if isinstance(exc, ModuleNotFoundError) and exc.name == name:
            return None, HotPathState(False, f"{name} is not built; a build without a working C compiler skips it")
        # built for another interpreter, or a symbol missing
        return None, HotPathState(False, f"{name} does not load: {exc}")
    missing = [name for name in _FUNCTIONS if not hasattr(_speedups, name)]
    if missing:  # built from an older checkout: every call must find its compiled twin, or none does
        return None, HotPathState(False, f"{__package__}._speedups is out of date (no {', '.join(missing)}); "
                                         "rebuild it with scripts/setup.sh")
    return _speedups, HotPathState(True)


def load() -> HotPath | None:
    """The compiled extension, or None when it is not built or the environment forces pure Python."""
    return _import()[0]


#: the compiled hot path in use, or None for the pure-Python one
compiled: HotPath | None
#: which hot path this process runs, and why when it is the pure-Python one
state: HotPathState
compiled, state = _import()
