"""Ledger password checks on the client: making one at create, verifying one at open, and
rewriting an old or weak one by compare-and-set once its password is known to be right.

The check itself (a salted scrypt hash that names its own parameters) is made and verified by
:mod:`ledgerstore.proto.digest`; this module adds what a long-lived client needs around it: the
key derivation runs off the event loop (it costs tens of milliseconds by design), and a check
verified once is remembered so re-opening a ledger does not pay for it again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
from collections import OrderedDict

from ledgerstore.errors import BadVersionError, UnauthorizedAccessError
from ledgerstore.meta.ledgers import LedgerManager, LedgerMetadata
from ledgerstore.proto.digest import check_needs_upgrade, password_check, verify_password

log = logging.getLogger(__name__)

#: stored checks a client remembers as verified (with the password that matched them)
VERIFIED_CAPACITY = 1024


class PasswordChecks:
    """Makes and verifies the password checks of ledgers for one client."""

    def __init__(self, ledgers: LedgerManager, cost: int | None = None, capacity: int = VERIFIED_CAPACITY) -> None:
        self._ledgers = ledgers
        #: scrypt's N for new checks (None: :data:`ledgerstore.proto.digest.SCRYPT_N`)
        self._cost = cost
        self._capacity = capacity
        #: stored check -> the password it was verified against, least recently used first
        self._verified: OrderedDict[str, bytes] = OrderedDict()

    async def make(self, password: bytes) -> str:
        """A new check for ``password`` (to store in a new ledger's metadata)."""
        check = await asyncio.to_thread(password_check, password, self._cost)
        self._remember(check, password)
        return check

    async def verify(self, md: LedgerMetadata, password: bytes) -> LedgerMetadata:
        """``md`` if ``password`` is the ledger's, else UnauthorizedAccessError. A check in an
        older or weaker form is rewritten by compare-and-set on ``md.version``; the metadata
        returned is then the rewritten one. Losing that race to another writer changes
        nothing: the check is rewritten at a later open."""
        check = md.password_check
        known = self._verified.get(check)
        if known is not None and hmac.compare_digest(known, password):
            self._verified.move_to_end(check)
        elif await asyncio.to_thread(verify_password, check, password):
            self._remember(check, password)
        elif password:
            raise UnauthorizedAccessError(f"wrong password for ledger {md.ledger_id}")
        else:
            raise UnauthorizedAccessError(f"ledger {md.ledger_id} has a password and none was given: pass password=...")
        if not check_needs_upgrade(check, self._cost):
            return md
        candidate = dataclasses.replace(md, password_check=await self.make(password))
        try:
            md = await self._ledgers.write(candidate)
        except BadVersionError:
            return md  # changed meanwhile (a writer closed it, recovery started): next time
        log.info("ledger %d: password check rewritten in the current salted form", md.ledger_id)
        return md

    def _remember(self, check: str, password: bytes) -> None:
        self._verified[check] = password
        self._verified.move_to_end(check)
        while len(self._verified) > self._capacity:
            self._verified.popitem(last=False)
