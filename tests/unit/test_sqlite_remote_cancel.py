"""A request to the sqlite metadata server that is cancelled in the same loop iteration in which
its answer arrives stays cancelled. asyncio.wait_for (Python 3.11) returned the answer instead and
dropped the cancellation, so a task told to stop (a decommission's local replication worker) ran on
forever and the shell command hung."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ledgerstore_sqlite.endpoint import UnixEndpoint
from ledgerstore_sqlite.remote import RemoteSession


class _Writer:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.sent.append(data)


def test_a_request_cancelled_as_its_answer_arrives_stays_cancelled() -> None:
    async def main() -> None:
        session = RemoteSession(UnixEndpoint("/nonexistent.sock"), 10.0, lambda *_: None, 30.0)
        session._writer = _Writer()  # type: ignore[assignment]
        session._ready = True
        task = asyncio.get_running_loop().create_task(session.call("get", key="/x"))
        await asyncio.sleep(0)  # the request is sent and waits for its answer
        (fut,) = session._pending.values()
        fut.set_result({"value": None})  # the answer arrives...
        task.cancel()  # ...in the same iteration as the cancellation
        with pytest.raises(asyncio.CancelledError):
            result: Any = await task
            raise AssertionError(f"the cancellation was dropped; the task returned {result!r}")

    asyncio.run(main())
