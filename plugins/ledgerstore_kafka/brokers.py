"""The live brokers of one cluster and which of them leads each partition.

Each broker holds a lease in the metadata store: the ephemeral key ``/kafka/brokers/<node id>``
holding its advertised address, bound to its metadata session. A broker that stops deletes it;
one killed with -9 loses it when its session expires (the store's session timeout, 10 s by
default for the embedded sqlite store). Every broker reads the keys again each
``refresh_s`` and assigns partition ``p`` of topic ``t`` to the live broker ``b`` with the highest
BLAKE2b hash of ``"t-p-b"`` (rendezvous hashing), so every broker computes the same leaders from the same
leases, the partitions spread evenly, and a lost broker's partitions, and only those, go to the
others. The leader becomes the partition log's writer on first use (``open_log`` fences
the previous writer), so a deposed broker's next append fails and is answered
``NOT_LEADER_OR_FOLLOWER``; a broker also answers that, without touching the log, for a
partition it no longer leads. Group coordination goes to the live broker with the lowest id.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from typing import Any

from ledgerstore.errors import LedgerStoreError

__all__ = ["BROKERS_KEY", "BrokerRegistry"]

log = logging.getLogger(__name__)

#: where the brokers' leases live in the metadata store
BROKERS_KEY = "/kafka/brokers"


class BrokerRegistry:
    """This broker's lease, and the live brokers as the leases say."""

    def __init__(self, store: Any, node_id: int, refresh_s: float = 1.0) -> None:
        self.store = store
        self.node_id = node_id
        self.refresh_s = refresh_s
        #: node id -> advertised (host, port), this broker included once started
        self.live: dict[int, tuple[str, int]] = {}
        self.own: tuple[str, int] = ("127.0.0.1", 0)
        #: how many times this broker found its lease gone and took it again (each time, the
        #: others may have taken its roles meanwhile: what it holds for them is stale)
        self.lease_generation = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def _key(self) -> str:
        return f"{BROKERS_KEY}/{self.node_id}"

    async def start(self, host: str, port: int) -> None:
        """Take the lease and read the others'; keep reading them in the background."""
        self.own = (host, port)
        self.live = {self.node_id: self.own}
        await self.store.put_ephemeral(self._key, json.dumps([host, port]).encode())
        await self.refresh()
        self._task = asyncio.create_task(self._refresh_loop())

    async def refresh(self) -> None:
        """Read the leases once; take ours again if it is gone (the session expired while this
        broker was cut off or paused: it rejoins, as a Kafka broker registers again)."""
        live: dict[int, tuple[str, int]] = {}
        for child in await self.store.children(BROKERS_KEY):
            if not child.isdigit():
                continue
            got = await self.store.get(f"{BROKERS_KEY}/{child}")
            if got is not None:
                host, port = json.loads(got.value)
                live[int(child)] = (str(host), int(port))
        if self.node_id not in live:
            log.warning("this Kafka broker's lease (%s) was gone: taking it again", self._key)
            await self.store.put_ephemeral(self._key, json.dumps(list(self.own)).encode())
            self.lease_generation += 1
        live[self.node_id] = self.own  # node ids are unique; this broker answers for its own
        if sorted(live) != sorted(self.live):
            log.info("Kafka brokers now %s", ", ".join(str(n) for n in sorted(live)))
        self.live = live

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except (LedgerStoreError, OSError, TimeoutError, ValueError, TypeError) as exc:
                # the store is away, or a lease does not parse: keep the last view, try again
                log.warning("reading the Kafka brokers' leases: %s: %s", type(exc).__name__, exc)

    def leader(self, topic: str, partition: int) -> int:
        """The node id leading ``partition`` of ``topic``: the live broker with the highest
        hash of ``"<topic>-<partition>-<node id>"`` (rendezvous hashing: when a broker goes, only
        its partitions move; when one comes, it takes about its share from each)."""
        key = f"{topic}-{partition}-"
        return max(self.live or [self.node_id], key=lambda node: (_weight(f"{key}{node}"), node))

    def coordinator(self) -> int:
        """The node id coordinating every consumer group."""
        return min(self.live, default=self.node_id)

    def address(self, node_id: int) -> tuple[str, int]:
        """Where clients reach ``node_id``."""
        return self.live.get(node_id, self.own)

    async def stop(self) -> None:
        """Stop reading and give the lease up."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(LedgerStoreError):
            await self.store.delete(self._key)


def _weight(key: str) -> int:
    """A well-mixed 64-bit hash (CRC32 is not: keys differing in their last byte rank alike)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
