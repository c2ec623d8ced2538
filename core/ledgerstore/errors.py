"""One error hierarchy for the whole project, mirroring BookKeeper's result codes.

Every error says what was asked, what was found and, where it helps, what to do next.
``code`` is the BookKeeper-style status carried on the wire where one applies. A class declares
its status once, in its class statement (``class LedgerFencedError(LedgerStoreError, status=104)``):
that sets ``code`` (which subclasses inherit) and registers the class, so the bookie answers an
exception with :func:`status_for` and a client turns a status back into an exception with
:func:`error_for_status`. ``http=`` likewise declares what the admin HTTP API answers (``http_status``).
No other table of codes exists.

A status decodes to the most derived class of the first class that declared it
(``ProtocolError`` declares 100, its subclass ``BadRequestError`` redeclares it and so decodes it);
an unrelated class may answer with the same status (``InvalidArgumentError``) without decoding it.
"""

from __future__ import annotations

import errno
from typing import Any, ClassVar

#: wire status -> the exception class a client raises for it (filled by class statements)
_BY_CODE: dict[int, type[LedgerStoreError]] = {}

#: what a bookie answers for a failure whose class declares no status (BookKeeper's EIO)
IO_ERROR_STATUS = 101


class LedgerStoreError(Exception):
    """Root of every error raised by ledgerstore."""

    code: ClassVar[int] = -1
    #: the HTTP status the admin API answers this error with (500: the server failed)
    http_status: ClassVar[int] = 500

    def __init_subclass__(cls, *, status: int | None = None, http: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if http is not None:
            cls.http_status = http
        if status is None:
            return
        cls.code = status
        holder = _BY_CODE.get(status)
        if holder is None or issubclass(cls, holder):
            _BY_CODE[status] = cls


# --- configuration and plugins -------------------------------------------------------------


class ConfigError(LedgerStoreError, ValueError):
    """A configuration file or value is invalid; the message names the key and the file."""


class PluginError(LedgerStoreError):
    """A backend could not be found or loaded for a plugin slot."""


class AuthenticationError(LedgerStoreError, http=401):
    """A user's credentials were refused (an unknown user, a wrong password, a SCRAM proof that
    does not verify, or an exchange out of order). The message never holds the password."""


# --- metadata --------------------------------------------------------------------------------


class MetadataError(LedgerStoreError):
    """The metadata store failed or is unreachable."""


class BadVersionError(MetadataError, status=103):
    """A compare-and-set saw another version than the one expected."""


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


class NoClusterError(LedgerStoreError):
    """The metadata store holds no cluster (no instance id): a mistyped URI, or a cluster not yet
    created with ``initnewcluster`` or ``ledgerstore standalone``."""


# --- protocol / bookie ------------------------------------------------------------------------


class ProtocolError(LedgerStoreError, status=100):
    """A frame could not be decoded: truncated, oversized, wrong version or unknown opcode."""


class BadRequestError(ProtocolError, status=100):
    """A request the bookie could not make sense of (BookKeeper's EBADREQ)."""


class FrameTooLargeError(ProtocolError):
    """A frame is larger than the configured maximum frame size."""


class BookieIOError(LedgerStoreError, status=101):
    """The bookie's disks failed it, or its journal or storage is damaged (BookKeeper's EIO)."""


class BookieDiskFullError(BookieIOError):
    """A write found its disk full (ENOSPC, EDQUOT). Unlike a failed fsync, nothing that was
    written before is in doubt: what did not fit stays buffered and the write can be retried once
    space comes back. On the wire it is the EIO of :class:`BookieIOError`."""


def storage_write_error(message: str, exc: OSError) -> BookieIOError:
    """The error for a failed write or create of a storage file: :class:`BookieDiskFullError`
    when the disk is full (retryable), :class:`BookieIOError` otherwise. ``message`` names the
    file and what was asked; the OS's words are appended."""
    cls = BookieDiskFullError if exc.errno in (errno.ENOSPC, errno.EDQUOT) else BookieIOError
    return cls(f"{message}: {exc}")


class UnauthorizedAccessError(LedgerStoreError, status=102, http=403):
    """Wrong password or master key for a ledger."""


class LedgerFencedError(LedgerStoreError, status=104):
    """The ledger was fenced by recovery: the outcome of a pending add is unknown, not failed."""


class BookieReadOnlyError(LedgerStoreError, status=105):
    """The bookie is read-only (its disks are full, or an administrator said so) or not registered: it takes no adds."""


class TooManyRequestsError(LedgerStoreError, status=106):
    """The bookie is past one of its limits (adds in flight, long-poll waiters): ask again later."""


class NoSuchLedgerError(LedgerStoreError, status=402, http=404):
    """The ledger is not known (to the bookie, or to the metadata store)."""


class NoSuchEntryError(LedgerStoreError, status=403, http=404):
    """The entry is not stored (not written yet, or past the ledger's end)."""


class LedgerStateUnknownError(LedgerStoreError, status=507, http=503):
    """The bookie holds the ledger in limbo (it lost data it may have had) and does not have what
    was asked for: it cannot say whether it ever had it. Neither a "yes" nor a "no such entry"
    (BookKeeper's DataUnknownException)."""


class BookieUnavailableError(LedgerStoreError, http=503):
    """A bookie could not be reached or did not answer in time."""


class TimeoutError_(BookieUnavailableError):  # noqa: N801 - avoid shadowing the builtin
    """A request to a bookie timed out."""


# --- client ---------------------------------------------------------------------------------


class NotEnoughBookiesError(LedgerStoreError, http=503):
    """Placement could not find enough bookies that meet the constraints."""


class LedgerClosedError(LedgerStoreError):
    """The ledger is closed: no more adds."""


class LedgerRecoveryError(LedgerStoreError):
    """Recovery could not determine the last entry (too few bookies answered)."""


class DigestMismatchError(LedgerStoreError):
    """An entry's digest does not match its contents: corrupt or written with another password."""


class AddFailedError(LedgerStoreError):
    """An add could not be acknowledged by an ack quorum."""


class InvalidArgumentError(LedgerStoreError, ValueError, status=100, http=400):
    """An argument is outside what the protocol allows (for example E < Qw)."""


class InvalidMetadataError(InvalidArgumentError):
    """Ledger metadata that breaks an invariant (e.g. a fragment naming one bookie twice) was
    about to be written; nothing was written."""


class LedgerExistsError(LedgerStoreError):
    """A ledger with that id already exists."""


class LogError(LedgerStoreError):
    """A log operation failed."""


def error_for_status(status: int, message: str) -> LedgerStoreError:
    """Map a wire status code to the matching exception."""
    cls = _BY_CODE.get(status, LedgerStoreError)
    return cls(message)


def status_for(exc: BaseException) -> int:
    """The wire status a bookie answers ``exc`` with: the status its class declared, else an IO
    error (a failure of the bookie's own disks, or one it did not foresee)."""
    code = exc.code if isinstance(exc, LedgerStoreError) else -1
    return code if code >= 0 else IO_ERROR_STATUS
