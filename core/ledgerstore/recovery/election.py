"""Auditor election on the MetadataStore primitive.

Every candidate puts an ephemeral key ``/underreplication/auditor/candidates/<id>``; the auditor is
the candidate with the smallest id. All candidates agree once they see the same children, and
they watch the prefix to see them change. The store has no ephemeral create-if-absent, and none is
needed: auditing is idempotent, so the short overlap while candidates learn of a change is harmless.
A candidate whose process dies keeps its key until its session expires; then the next id takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time

from ledgerstore.api import MetadataStore, Notification, Subscription
from ledgerstore.errors import LedgerStoreError, NoSuchKeyError
from ledgerstore.recovery.markers import CANDIDATES

log = logging.getLogger(__name__)


class AuditorElection:
    """Stand as a candidate and follow who the auditor is. ``changed`` is set on every change."""

    def __init__(self, store: MetadataStore, candidate_id: str, recheck_s: float = 5.0) -> None:
        if not candidate_id or "/" in candidate_id:
            raise ValueError(f"candidate id must be non-empty and contain no '/': {candidate_id!r}")
        self.store = store
        self.candidate_id = candidate_id
        self.recheck_s = recheck_s
        self.auditor: str | None = None
        self.changed = asyncio.Event()
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()

    @property
    def key(self) -> str:
        return f"{CANDIDATES}/{self.candidate_id}"

    @property
    def is_auditor(self) -> bool:
        return self.auditor == self.candidate_id

    async def start(self) -> None:
        await self._stand()
        self.store.add_session_listener(self._on_session)
        self._sub = await self.store.watch(CANDIDATES, self._on_change)
        await self._evaluate()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="auditor-election")

    async def stop(self) -> None:
        if self._sub is not None:
            self._sub.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(NoSuchKeyError, LedgerStoreError):
            await self.store.delete(self.key)
        self.auditor = None
        self.changed.set()

    async def _stand(self) -> None:
        info = {"id": self.candidate_id, "host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        await self.store.put_ephemeral(self.key, json.dumps(info).encode())

    def _on_change(self, _n: Notification) -> None:
        self._kick.set()

    def _on_session(self, event: str) -> None:
        # the ephemeral key went with the lost session: stand again on the new one
        self._kick.set()

    async def _evaluate(self) -> None:
        children = await self.store.children(CANDIDATES)
        if self.candidate_id not in children:
            await self._stand()
            children = await self.store.children(CANDIDATES)
        new = min(children) if children else None
        if new != self.auditor:
            log.info("auditor is now %s%s", new, " (this process)" if new == self.candidate_id else "")
            self.auditor = new
            self.changed.set()

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.recheck_s)
            self._kick.clear()
            try:
                await self._evaluate()
            except LedgerStoreError as exc:
                log.warning("auditor election: %s", exc)
                await asyncio.sleep(1.0)
