from collections.abc import Iterable
from typing import Any

def record_heads(ledger_id: int, entries: Iterable[tuple[int, Any]]) -> list[tuple[int, bytes, Any, int]]: ...
