from array import array
from collections.abc import Iterable, Sequence
from typing import Any

def record_heads(ledger_id: int, entries: Iterable[tuple[int, Any]]) -> list[tuple[int, bytes, Any, int]]: ...
def append_run(
    records: list[tuple[int, bytes, Any, int]], i: int, buf: bytearray, size: int, limit: int, wbs: int, base: int,
    spp: int, cur_no: int, slots: array[int], last: int,
) -> tuple[int, int, int]: ...
def cut_records(
    raw: bytes, start: int, ledger_id: int, wanted: Sequence[tuple[int, int, int]], results: list[Any]
) -> tuple[int, list[tuple[int, int, int, str | None]]]: ...
