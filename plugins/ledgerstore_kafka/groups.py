"""Consumer groups: membership, generations, assignments and committed offsets.

One coordinator (this broker) serves every group. Membership lives in memory, as in Kafka, where
members rejoin a new coordinator; what must outlive the broker is kept in the ledgerstore log
:data:`GROUPS_LOG`, one JSON entry per change, and rebuilt from it on first use:

- ``{"v": 1, "group": "g", "generation": 7}``: the group's generation after a rebalance, so a
  restarted broker never hands out a generation a member of the old one still holds;
- ``{"v": 1, "group": "g", "offsets": [["topic", 0, 42, "metadata"], ...]}``: one OffsetCommit.

A commit is answered once its entry is acknowledged by the log (its ack quorum).

The rebalance protocol is Kafka's: a JoinGroup starts a rebalance and waits; the other members
learn of it from their next Heartbeat (``REBALANCE_IN_PROGRESS``) and rejoin; once every member
has rejoined (or the ones that did not were dropped for their session timeout, checked every
:data:`REBALANCE_TICK_S`), a new generation begins and every waiting JoinGroup is answered. The
leader (the longest-standing member) gets every member's metadata and sends the assignment in its
SyncGroup, which the other members' SyncGroups wait for. A member not heard from within its
session timeout is dropped, which starts a rebalance too (static membership is not served).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from typing import Any

from ledgerstore.aio import LogWriter
from ledgerstore.errors import LedgerStoreError
from ledgerstore_kafka.group_messages import JoinGroupRequest, OffsetCommitRequest, SyncGroupRequest

__all__ = ["GROUPS_LOG", "GroupCoordinator", "JoinResult"]

log = logging.getLogger(__name__)

#: the log holding every group's generations and committed offsets (not a ``kafka-`` topic log)
GROUPS_LOG = "kafka_groups"

# Kafka's error codes for groups
NONE, COORDINATOR_NOT_AVAILABLE, ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL = 0, 15, 22, 23
INVALID_GROUP_ID, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS = 24, 25, 27
#: how often a JoinGroup waiting for the other members checks for members past their session timeout
REBALANCE_TICK_S = 0.5


@dataclasses.dataclass
class Member:
    member_id: str
    protocols: list[tuple[str, bytes]]
    session_timeout_s: float
    rebalance_timeout_s: float
    generation: int = 0
    last_seen: float = dataclasses.field(default_factory=time.monotonic)


@dataclasses.dataclass
class Group:
    name: str
    generation: int = 0
    protocol_type: str = ""
    protocol: str = ""
    leader: str = ""
    members: dict[str, Member] = dataclasses.field(default_factory=dict)
    assignments: dict[str, bytes] | None = None
    synced: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    #: members whose JoinGroup waits for the rebalance to complete (non-empty: a rebalance is on)
    joining: dict[str, asyncio.Future[None]] = dataclasses.field(default_factory=dict)
    offsets: dict[tuple[str, int], tuple[int, str | None]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class JoinResult:
    error: int
    generation: int = -1
    protocol: str = ""
    leader: str = ""
    member_id: str = ""
    members: list[tuple[str, bytes]] = dataclasses.field(default_factory=list)


class GroupCoordinator:
    """Every consumer group of this broker, persisted in :data:`GROUPS_LOG`."""

    def __init__(self, client: Any, password: bytes) -> None:
        self.client = client
        self.password = password
        self.groups: dict[str, Group] = {}
        self._writer: LogWriter | None = None
        self._opening = asyncio.Lock()

    async def _log(self) -> LogWriter:
        async with self._opening:
            if self._writer is None or self._writer.error is not None:
                writer = await self.client.open_log(GROUPS_LOG, password=self.password)
                self.groups = {}
                reader = await self.client.open_log_reader(GROUPS_LOG, "earliest", password=self.password)
                try:
                    while batch := await reader.read_batch(1000):
                        for _, payload in batch:
                            self._replay(json.loads(payload))
                finally:
                    await reader.close()
                self._writer = writer
            return self._writer

    def _replay(self, record: dict[str, Any]) -> None:
        group = self._group(record["group"])
        if "generation" in record:
            group.generation = max(group.generation, int(record["generation"]))
        for topic, partition, offset, metadata in record.get("offsets", []):
            group.offsets[(topic, partition)] = (offset, metadata)

    def _group(self, name: str) -> Group:
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = Group(name)
        return group

    async def _append(self, record: dict[str, Any]) -> None:
        writer = await self._log()
        await writer.append(json.dumps({"v": 1, **record}, separators=(",", ":")).encode())

    async def _new_generation(self, group: Group) -> None:
        group.generation += 1
        group.assignments = None
        group.synced.set()  # members waiting for the previous generation's assignment stop waiting
        group.synced = asyncio.Event()
        group.leader = next(iter(group.members), "")
        await self._append({"group": group.name, "generation": group.generation})

    async def _expire(self, group: Group) -> None:
        now = time.monotonic()
        gone = [m for m in group.members.values() if now - m.last_seen > m.session_timeout_s]
        for member in gone:
            log.info("group %r: member %r not heard from in %.0fs, dropped", group.name, member.member_id,
                     member.session_timeout_s)
            del group.members[member.member_id]
        if gone and not group.joining:
            await self._new_generation(group)

    async def join(self, req: JoinGroupRequest, client_id: str | None) -> JoinResult:
        """Join (or rejoin) a group. Every JoinGroup starts a rebalance, which completes, and
        answers every waiting JoinGroup with the new generation, once every member has rejoined
        or the ones that did not were dropped for their session timeout."""
        if not req.group_id:
            return JoinResult(INVALID_GROUP_ID)
        await self._log()
        group = self._group(req.group_id)
        if group.members and req.protocol_type != group.protocol_type:
            return JoinResult(INCONSISTENT_GROUP_PROTOCOL)
        member = group.members.get(req.member_id)
        if req.member_id and member is None:
            return JoinResult(UNKNOWN_MEMBER_ID)
        if member is None:
            member_id = f"{client_id or 'consumer'}-{uuid.uuid4()}"
            member = Member(member_id, req.protocols, req.session_timeout_ms / 1000, req.rebalance_timeout_ms / 1000)
        if not _common_protocols(group, member, req.protocols):
            return JoinResult(INCONSISTENT_GROUP_PROTOCOL)
        member.protocols = req.protocols
        member.last_seen = time.monotonic()
        group.members[member.member_id] = member
        group.protocol_type = req.protocol_type
        if member.member_id in group.joining:  # a resend: the older JoinGroup gets no answer
            group.joining.pop(member.member_id).cancel()
        done = group.joining[member.member_id] = asyncio.get_running_loop().create_future()
        await self._maybe_complete(group)
        while not done.done():
            await asyncio.wait([done], timeout=REBALANCE_TICK_S)
            for waiting in group.joining:  # a member waiting here is alive
                group.members[waiting].last_seen = time.monotonic()
            await self._expire(group)
            await self._maybe_complete(group)
        done.result()  # cancelled: a newer JoinGroup of this member took its place
        members = []
        if member.member_id == group.leader:
            members = [(m.member_id, dict(m.protocols)[group.protocol]) for m in group.members.values()]
        return JoinResult(NONE, group.generation, group.protocol, group.leader, member.member_id, members)

    async def _maybe_complete(self, group: Group) -> None:
        if not group.joining or any(m not in group.joining for m in group.members):
            return
        first = next(iter(group.members.values()))
        group.protocol = next(n for n, _ in first.protocols if all(n in dict(m.protocols)
                                                                   for m in group.members.values()))
        await self._new_generation(group)
        for m in group.members.values():
            m.generation = group.generation
        joining, group.joining = group.joining, {}
        for fut in joining.values():
            if not fut.done():
                fut.set_result(None)

    def _check(self, group: Group | None, generation: int, member_id: str) -> int:
        if group is None or member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        member = group.members[member_id]
        member.last_seen = time.monotonic()
        if generation != group.generation:
            return ILLEGAL_GENERATION
        if member.generation != group.generation or group.joining:
            return REBALANCE_IN_PROGRESS
        return NONE

    async def sync(self, req: SyncGroupRequest) -> tuple[int, bytes]:
        group = self.groups.get(req.group_id)
        error = self._check(group, req.generation, req.member_id)
        if error != NONE or group is None:
            return error, b""
        if req.member_id == group.leader:
            group.assignments = dict(req.assignments)
            group.synced.set()
        if group.assignments is None:
            synced = group.synced
            member = group.members[req.member_id]
            try:
                await asyncio.wait_for(synced.wait(), member.rebalance_timeout_s)
            except TimeoutError:
                return REBALANCE_IN_PROGRESS, b""
            finally:
                member.last_seen = time.monotonic()  # waiting here, it was alive
            if group.assignments is None or req.generation != group.generation:
                return REBALANCE_IN_PROGRESS, b""
        return NONE, group.assignments.get(req.member_id, b"")

    async def heartbeat(self, group_id: str, generation: int, member_id: str) -> int:
        group = self.groups.get(group_id)
        if group is not None:
            await self._expire(group)
        return self._check(group, generation, member_id)

    async def leave(self, group_id: str, member_id: str) -> int:
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        del group.members[member_id]
        if group.joining:
            await self._maybe_complete(group)
        else:
            await self._new_generation(group)
        return NONE

    async def commit(self, req: OffsetCommitRequest) -> list[tuple[str, list[tuple[int, int]]]]:
        """Store the offsets; every partition answered with one error code."""
        try:
            await self._log()
        except LedgerStoreError as exc:
            log.warning("the groups' log cannot be opened: %s", exc)
            return _every(req, COORDINATOR_NOT_AVAILABLE)
        group = self._group(req.group_id)
        if req.generation != -1 or req.member_id:  # -1 and no member: a consumer outside any group
            error = self._check(group, req.generation, req.member_id)
            if error != NONE:
                return _every(req, error)
        offsets = [(topic, p, offset, metadata) for topic, parts in req.topics for p, offset, metadata in parts]
        try:
            await self._append({"group": req.group_id, "offsets": [list(o) for o in offsets]})
        except LedgerStoreError as exc:
            log.warning("group %r: committing offsets failed: %s", req.group_id, exc)
            return _every(req, COORDINATOR_NOT_AVAILABLE)
        for topic, p, offset, metadata in offsets:
            group.offsets[(topic, p)] = (offset, metadata)
        return _every(req, NONE)

    async def fetch_offsets(self, group_id: str, topics: list[tuple[str, list[int]]] | None
                            ) -> list[tuple[str, list[tuple[int, int, str | None, int]]]]:
        await self._log()
        group = self._group(group_id)
        if topics is None:
            by_topic: dict[str, list[int]] = {}
            for topic, p in sorted(group.offsets):
                by_topic.setdefault(topic, []).append(p)
            topics = list(by_topic.items())
        out = []
        for topic, parts in topics:
            rows = []
            for p in parts:
                offset, metadata = group.offsets.get((topic, p), (-1, None))
                rows.append((p, offset, metadata, NONE))
            out.append((topic, rows))
        return out

    async def forget(self) -> None:
        """Drop every group's state and the log writer (the role changed hands): the next request
        that needs them opens the log again and replays it."""
        async with self._opening:
            self.groups = {}
            await self.close()

    async def close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            try:
                await writer.close()
            except LedgerStoreError as exc:
                log.warning("closing the groups' log: %s", exc)


def _common_protocols(group: Group, member: Member, protocols: list[tuple[str, bytes]]) -> list[str]:
    """The protocols ``protocols`` names that every other member of ``group`` supports too."""
    others = [m for m in group.members.values() if m.member_id != member.member_id]
    return [n for n, _ in protocols if all(n in dict(m.protocols) for m in others)]


def _every(req: OffsetCommitRequest, error: int) -> list[tuple[str, list[tuple[int, int]]]]:
    return [(topic, [(p, error) for p, _, _ in parts]) for topic, parts in req.topics]
