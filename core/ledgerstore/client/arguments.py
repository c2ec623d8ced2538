"""Checks of the arguments of the public client API: a wrong type or value is an
:class:`~ledgerstore.errors.InvalidArgumentError` naming the argument, what was given and what is
allowed, raised before anything is sent or stored (never a bare TypeError from deep inside).

The sync API is generated from the async one (:mod:`ledgerstore.client.sync`), so both check alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ledgerstore.errors import InvalidArgumentError

#: the largest ledger id (ids are signed 64-bit on the wire, as in BookKeeper)
MAX_LEDGER_ID = 2**63 - 1


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def integer(name: str, value: Any, minimum: int, maximum: int = MAX_LEDGER_ID) -> int:
    """``value`` if it is an integer (not a bool) from ``minimum`` to ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer, not {type(value).__name__} {_shown(value)}")
    if not minimum <= value <= maximum:
        raise InvalidArgumentError(f"{name} = {value} is out of range: must be from {minimum} to {maximum}")
    return value


def optional_integer(name: str, value: Any, minimum: int) -> int | None:
    """``value`` if it is None or an integer of at least ``minimum``."""
    return None if value is None else integer(name, value, minimum)


def ledger_id(value: Any, name: str = "ledger_id") -> int:
    """``value`` if it is a ledger id: an integer from 0 to 2**63-1."""
    return integer(name, value, 0)


def password(value: Any, name: str = "password") -> bytes:
    """``value`` if it is a password: bytes (encode text yourself, e.g. ``"pw".encode()``)."""
    if not isinstance(value, bytes):
        hint = f'; encode it, e.g. {name}={value!r}.encode()' if isinstance(value, str) else ""
        raise InvalidArgumentError(f"{name} must be bytes, not {type(value).__name__}{hint}")
    return value


def flag(name: str, value: Any) -> bool:
    """``value`` if it is a bool."""
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be True or False, not {type(value).__name__} {_shown(value)}")
    return value


def text(name: str, value: Any, *, optional: bool = False) -> str | None:
    """``value`` if it is a non-empty string (or None when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"{name} must be a non-empty string, not {type(value).__name__} {_shown(value)}")
    return value


def positive_number(name: str, value: Any, *, optional: bool = False) -> float | None:
    """``value`` if it is a finite number > 0 (or None when ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise InvalidArgumentError(f"{name} must be a positive number, not {_shown(value)}")
    return float(value)


def string_map(name: str, value: Any) -> dict[str, str]:
    """``value`` as a dict if it is None or a mapping of strings to strings."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidArgumentError(f"{name} must be a mapping of strings to strings, not {_shown(value)}")
    return dict(value)


def string_list(name: str, value: Any) -> list[str] | None:
    """``value`` as a list if it is None or a sequence of strings (not one string)."""
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise InvalidArgumentError(f"{name} must be a list of strings, not {_shown(value)}")
    return list(value)
