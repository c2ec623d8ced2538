"""Validation of placement options: typed values, checked once when a policy is built.

Values from TOML arrive typed; values from environment overrides
(``LEDGERSTORE_CLIENT_PLACEMENT_OPTIONS__ENFORCE=false``) arrive as text, so text is parsed too.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

from ledgerstore.errors import ConfigError

__all__ = ["bool_option", "check_known", "float_option", "int_option", "make_random", "str_option"]


def _parse_text(value: Any, kind: type[int] | type[float]) -> Any:
    if isinstance(value, str):
        try:
            return kind(value.strip())
        except ValueError:
            return value
    return value


def check_known(policy: str, options: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """Raise :class:`ConfigError` naming any option ``policy`` does not understand."""
    known = sorted(allowed)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(
            f"placement policy {policy!r} has no option(s) {', '.join(map(repr, unknown))}; "
            f"known options: {', '.join(known)}"
        )


def int_option(policy: str, options: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    """An integer option no smaller than ``minimum``."""
    value = _parse_text(options.get(key, default), int)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"placement policy {policy!r}: {key} must be an integer >= {minimum}, got {value!r}")
    return value


def float_option(
    policy: str, options: Mapping[str, Any], key: str, default: float, low: float, high: float
) -> float:
    """A number in ``(low, high]``."""
    value = _parse_text(options.get(key, default), float)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
        raise ConfigError(f"placement policy {policy!r}: {key} must be a number in ({low}, {high}], got {value!r}")
    return float(value)


def bool_option(policy: str, options: Mapping[str, Any], key: str, default: bool) -> bool:
    """A boolean, or the text true/false/yes/no/1/0."""
    value = options.get(key, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"true", "yes", "1", "false", "no", "0"}:
        return value.strip().lower() in {"true", "yes", "1"}
    raise ConfigError(f"placement policy {policy!r}: {key} must be true or false, got {value!r}")


def str_option(policy: str, options: Mapping[str, Any], key: str) -> str | None:
    """An optional non-empty string."""
    value = options.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"placement policy {policy!r}: {key} must be a non-empty string, got {value!r}")
    return value


def make_random(options: Mapping[str, Any]) -> random.Random:
    """The policy's random source: seeded by the ``seed`` option for reproducible placement."""
    seed = options.get("seed")
    return random.Random(seed) if seed is not None else random.Random()
