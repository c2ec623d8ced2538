"""The metadata server's client sessions, alive in memory.

A ZooKeeper session lives while its client is heard from, however long the server's disk takes
with the writes queued before it. So the server renews a client's session on the event loop each
time a frame arrives from it or one of its requests is answered, without a write of its own, and
answers pings from here. The engine's heartbeat, on the writer thread, copies every live lease
into the ``sessions`` table in the transaction that reaps the expired ones, so the table decides
expiry exactly as this map does (and a restarted server resumes sessions from the table).

A lease that lapsed stays lapsed: it is not renewed again, and the next reap removes the session
and its ephemeral keys. A lease whose row is gone from the table (the session was ended there) ends
at that heartbeat too. Times are ``time.time()``, as in the ``sessions`` table.
"""

from __future__ import annotations

import threading
import time

__all__ = ["SessionLeases"]


class SessionLeases:
    """Deadlines of the sessions a metadata server's clients hold; safe to use from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadlines: dict[int, float] = {}

    def start(self, session: int, ttl: float) -> None:
        """Hold ``session`` alive for ``ttl`` seconds from now (it was opened or resumed)."""
        with self._lock:
            self._deadlines[session] = time.time() + ttl

    def touch(self, session: int, ttl: float) -> bool:
        """Renew ``session`` for ``ttl`` seconds from now; False (and no renewal) if it lapsed."""
        now = time.time()
        with self._lock:
            deadline = self._deadlines.get(session)
            if deadline is None or deadline < now:
                return False
            self._deadlines[session] = max(deadline, now + ttl)
            return True

    def alive(self, session: int) -> bool:
        """Whether ``session`` holds a lease that has not lapsed."""
        with self._lock:
            return self._deadlines.get(session, 0.0) >= time.time()

    def end(self, session: int) -> None:
        """Forget ``session`` (it was closed)."""
        with self._lock:
            self._deadlines.pop(session, None)

    def live(self, now: float) -> dict[int, float]:
        """The deadlines of the leases alive at ``now``; the lapsed ones are forgotten."""
        with self._lock:
            lapsed = [s for s, deadline in self._deadlines.items() if deadline < now]
            for session in lapsed:
                del self._deadlines[session]
            return dict(self._deadlines)
