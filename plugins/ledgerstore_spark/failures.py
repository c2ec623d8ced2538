"""What a Spark user sees when a read or write cannot start: one message that names the problem.

Spark runs a Python data source's planning methods (creating the source, ``partitions()``,
``initialOffset()``, ...) in a Python worker of the driver and shows an exception they raise as
its formatted traceback. A ledgerstore error raised there would arrive with every frame of the
client under it and the chain of the errors it was translated from. :func:`planning` re-raises it
without those, so what Spark shows is a single frame and the message. The messages themselves are
made where the problem is found: :func:`ledgerstore_spark.clients.client_for` (the metadata store)
and :func:`open_for_read` (the ledger and its password).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import ledgerstore
from ledgerstore.errors import LedgerStoreError, NoSuchLedgerError, UnauthorizedAccessError

P = ParamSpec("P")
T = TypeVar("T")


def planning(method: Callable[P, T]) -> Callable[P, T]:
    """Wrap a method Spark calls to plan a job: a ledgerstore error leaves it as its message alone."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(*args, **kwargs)
        except LedgerStoreError as e:
            # the message already says what was asked and what was found; the frames below this
            # one and the errors it was made from are the client's business, not the user's
            raise e.with_traceback(None) from None

    return wrapper


def open_for_read(client: ledgerstore.Client, ledger_id: int, password: bytes) -> ledgerstore.ReadHandle:
    """Open a ledger without recovery; a missing ledger or a wrong or missing password is an error
    that says which ledger and which option to fix."""
    try:
        handle: ledgerstore.ReadHandle = client.open_ledger(ledger_id, password, recovery=False)
        return handle
    except NoSuchLedgerError:
        raise NoSuchLedgerError(f"ledger {ledger_id} does not exist in this cluster "
                                "(list them with `ledgerstore shell listledgers`)") from None
    except UnauthorizedAccessError:
        if not password:
            raise UnauthorizedAccessError(
                f"ledger {ledger_id} has a password and none was given: "
                "add .option('password', ...) with the password its writer used") from None
        raise UnauthorizedAccessError(
            f"option 'password' is not the password of ledger {ledger_id}: "
            "give the password its writer used") from None


__all__ = ["open_for_read", "planning"]
