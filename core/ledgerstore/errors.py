"""One error hierarchy for the whole project, mirroring BookKeeper's result codes.

Every error says what was asked, what was found and, where it helps, what to do next.
``code`` is the BookKeeper-style status carried on the wire where one applies.
"""

from __future__ import annotations


class LedgerStoreError(Exception):
    """Root of every error raised by ledgerstore."""

    code: int = -1


# --- configuration and plugins -------------------------------------------------------------


class ConfigError(LedgerStoreError, ValueError):
    """A configuration file or value is invalid; the message names the key and the file."""


class PluginError(LedgerStoreError):
    """A backend could not be found or loaded for a plugin slot."""


# --- metadata --------------------------------------------------------------------------------


class MetadataError(LedgerStoreError):
    """The metadata store failed or is unreachable."""


class BadVersionError(MetadataError):
    """A compare-and-set saw another version than the one expected."""

    code = 103


class NoSuchKeyError(MetadataError, KeyError):
    """A metadata key that must exist does not."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain message
        return str(self.args[0]) if self.args else "no such key"


class KeyExistsError(BadVersionError):
    """A create-if-absent found the key already there."""


class SessionExpiredError(MetadataError):
    """The metadata session (ZooKeeper session, etcd lease, sqlite lease) was lost."""


class CookieMismatchError(LedgerStoreError):
    """A bookie's on-disk cookie differs from the one registered in the cluster."""


class InstanceIdMismatchError(CookieMismatchError):
    """A bookie's data belongs to another cluster instance."""


# --- protocol / bookie ------------------------------------------------------------------------


class ProtocolError(LedgerStoreError):
    """A frame could not be decoded: truncated, oversized, wrong version or unknown opcode."""

    code = 100


class BadRequestError(ProtocolError):
    code = 100


class FrameTooLargeError(ProtocolError):
    """A frame is larger than the configured maximum frame size."""


class BookieIOError(LedgerStoreError):
    code = 101


class UnauthorizedAccessError(LedgerStoreError):
    """Wrong password or master key for a ledger."""

    code = 102


class LedgerFencedError(LedgerStoreError):
    """The ledger was fenced by recovery: the outcome of a pending add is unknown, not failed."""

    code = 104


class BookieReadOnlyError(LedgerStoreError):
    code = 105


class TooManyRequestsError(LedgerStoreError):
    code = 106


class NoSuchLedgerError(LedgerStoreError):
    code = 402


class NoSuchEntryError(LedgerStoreError):
    code = 403


class BookieUnavailableError(LedgerStoreError):
    """A bookie could not be reached or did not answer in time."""


class TimeoutError_(BookieUnavailableError):  # noqa: N801 - avoid shadowing the builtin
    """A request to a bookie timed out."""


# --- client ---------------------------------------------------------------------------------


class NotEnoughBookiesError(LedgerStoreError):
    """Placement could not find enough bookies that meet the constraints."""


class LedgerClosedError(LedgerStoreError):
    """The ledger is closed: no more adds."""


class LedgerRecoveryError(LedgerStoreError):
    """Recovery could not determine the last entry (too few bookies answered)."""


class DigestMismatchError(LedgerStoreError):
    """An entry's digest does not match its contents: corrupt or written with another password."""


class AddFailedError(LedgerStoreError):
    """An add could not be acknowledged by an ack quorum."""


class InvalidArgumentError(LedgerStoreError, ValueError):
    """An argument is outside what the protocol allows (for example E < Qw)."""


class InvalidMetadataError(InvalidArgumentError):
    """Ledger metadata that breaks an invariant (e.g. a fragment naming one bookie twice) was
    about to be written; nothing was written."""


class LedgerExistsError(LedgerStoreError):
    """A ledger with that id already exists."""


class LogError(LedgerStoreError):
    """A log operation failed."""


_BY_CODE: dict[int, type[LedgerStoreError]] = {
    100: BadRequestError,
    101: BookieIOError,
    102: UnauthorizedAccessError,
    104: LedgerFencedError,
    105: BookieReadOnlyError,
    106: TooManyRequestsError,
    402: NoSuchLedgerError,
    403: NoSuchEntryError,
}


def error_for_status(status: int, message: str) -> LedgerStoreError:
    """Map a wire status code to the matching exception."""
    cls = _BY_CODE.get(status, LedgerStoreError)
    return cls(message)
