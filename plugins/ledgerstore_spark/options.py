"""The connector's options, parsed and validated once from Spark's string-valued option map."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ledgerstore.errors import ConfigError

#: entries per input partition unless ``partitionSize`` says otherwise
DEFAULT_PARTITION_SIZE = 50_000
DECODINGS = ("none", "utf8", "json")


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark hands a case-insensitive map to the data source, but a plain dict in tests: accept both
    if name in options:
        return options[name]
    low = name.lower()
    for k, v in options.items():
        if k.lower() == low:
            return v
    return None


def _int(options: Mapping[str, str], name: str, default: int | None, minimum: int) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"option {name!r} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"option {name!r} must be at least {minimum}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {name!r} must be true or false, got {raw!r}")


@dataclasses.dataclass(frozen=True)
class ConnectorOptions:
    """Every option the ``ledgerstore`` data source understands (names are case-insensitive).

    ``metadata`` (required) is the cluster's metadata URI. A read names either ``log`` or
    ``ledgers`` (comma-separated ledger ids); a write names ``log``.
    """

    metadata: str
    log: str | None = None
    ledgers: tuple[int, ...] = ()
    password: bytes = b""
    partition_size: int = DEFAULT_PARTITION_SIZE
    decode: str = "none"
    starting_position: str = "earliest"
    max_entries_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    ensemble: int | None = None
    write_quorum: int | None = None
    ack_quorum: int | None = None
    digest: str | None = None
    sink_id: str | None = None
    checkpoint_location: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ConnectorOptions:
        metadata = _get(options, "metadata")
        if not metadata:
            raise ConfigError(
                "the ledgerstore data source needs option 'metadata' (the cluster's metadata URI, e.g. "
                "sqlite:///var/lib/ledgerstore/metadata.db, as printed by `ledgerstore standalone`)")
        log = _get(options, "log") or None
        raw_ledgers = _get(options, "ledgers")
        ledgers: tuple[int, ...] = ()
        if raw_ledgers:
            try:
                ledgers = tuple(int(x) for x in raw_ledgers.replace(" ", "").split(",") if x)
            except ValueError:
                raise ConfigError(f"option 'ledgers' must be comma-separated ledger ids, got {raw_ledgers!r}") from None
            if any(x < 0 for x in ledgers):
                raise ConfigError(f"option 'ledgers' has a negative ledger id: {raw_ledgers!r}")
        if log and ledgers:
            raise ConfigError("give either option 'log' or option 'ledgers', not both")
        decode = (_get(options, "decode") or "none").lower()
        if decode not in DECODINGS:
            raise ConfigError(f"option 'decode' must be one of {', '.join(DECODINGS)}, got {decode!r}")
        return cls(
            metadata=metadata,
            log=log,
            ledgers=ledgers,
            password=(_get(options, "password") or "").encode(),
            partition_size=_int(options, "partitionSize", DEFAULT_PARTITION_SIZE, 1) or DEFAULT_PARTITION_SIZE,
            decode=decode,
            starting_position=(_get(options, "startingPosition") or "earliest").strip(),
            max_entries_per_trigger=_int(options, "maxEntriesPerTrigger", None, 1),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            ensemble=_int(options, "ensemble", None, 1),
            write_quorum=_int(options, "writeQuorum", None, 1),
            ack_quorum=_int(options, "ackQuorum", None, 1),
            digest=_get(options, "digest") or None,
            sink_id=_get(options, "sinkId") or None,
            checkpoint_location=_get(options, "checkpointLocation") or None,
        )

    def require_log(self, what: str) -> str:
        if not self.log:
            raise ConfigError(f"{what} needs option 'log' (the name of a ledgerstore log)")
        return self.log


__all__ = ["ConnectorOptions", "DEFAULT_PARTITION_SIZE", "DECODINGS"]
