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

    def close(self) -> None:
        pass


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


def test_a_request_made_while_the_connection_says_hello_waits_for_it() -> None:
    """A reconnect delivers the catch-up notifications of the watches it re-creates before it
    is ready; a request made from such a notification (or right after it) waited for nothing
    and failed at once with "unreachable (reconnecting)" though the connection was up. It now
    waits for the hello to end; with no connection at all it still fails at once."""

    async def main() -> None:
        session = RemoteSession(UnixEndpoint("/nonexistent.sock"), 10.0, lambda *_: None, 30.0)
        session._writer = _Writer()  # type: ignore[assignment]
        task = asyncio.get_running_loop().create_task(session.call("get", key="/x"))
        await asyncio.sleep(0.01)
        assert not task.done() and not session._pending  # waiting, not sent
        session._ready = True
        session._ready_event.set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        (fut,) = session._pending.values()
        fut.set_result({"value": None})
        assert await task == {"value": None}

        session._disconnect()
        with pytest.raises(Exception, match="unreachable"):
            await session.call("get", key="/x")

    asyncio.run(main())
