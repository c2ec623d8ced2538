"""What the bookie's journal carries per append and hands back once the append is durable (or
its group failed): how to answer the request behind it. The journal (``journal.py``) never looks
inside; the request processor (``processor.py``) builds them and is the :class:`Answerer` they
answer through.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Protocol

from ledgerstore.api import ServerConnection
from ledgerstore.bookie.counters import BookieCounters
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status

log = logging.getLogger(__name__)


class Answerer(Protocol):
    """What a completion answers through (the request processor)."""

    counters: BookieCounters

    def release_inflight(self, conn: ServerConnection, n: int) -> None:
        """``n`` adds of ``conn`` were answered: they no longer count against its limit."""


@dataclasses.dataclass(slots=True)
class AddCompletion:
    """Adds (one entry or a batch of ``records``) answered with ``frame`` once durable."""

    conn: ServerConnection
    frame: bytes
    records: int = 1

    def durable(self, answerer: Answerer) -> None:
        """Answer OK and release the adds' in-flight count."""
        answerer.release_inflight(self.conn, self.records)
        self.conn.send(self.frame)

    def failed(self, answerer: Answerer) -> None:
        """Answer IO_ERROR under the request's opcode and id."""
        _, op, _, rid = codec.HEADER.unpack_from(self.frame)
        self.conn.send(codec.encode_error_response(op, rid, Status.IO_ERROR))


@dataclasses.dataclass(slots=True)
class FenceCompletion:
    """A fence, answered by ``answer()`` once the fence record is durable."""

    conn: ServerConnection
    answer: Callable[[], None]
    records: int = 1

    def durable(self, answerer: Answerer) -> None:
        """Answer the fencing request."""
        try:  # a fence's answer: its failure must not cost the rest of the group theirs
            self.answer()
        except Exception as exc:
            answerer.counters.failed_requests += 1
            log.error("answering a fence of %s failed: %r", self.conn.peer, exc, exc_info=exc)

    def failed(self, answerer: Answerer) -> None:
        """No answer: the client times out and retries elsewhere."""


#: what the bookie's journal carries per append (None: a record nobody waits for, a first key)
Completion = AddCompletion | FenceCompletion | None
