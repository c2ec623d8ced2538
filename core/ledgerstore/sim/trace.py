"""The event trace of one simulated run: what happened, when, in order; and its hash."""

from __future__ import annotations

import hashlib

from ledgerstore.sim.loop import VirtualClock


class Trace:
    """Lines of ``time kind details``. Two runs of one seed give the same lines."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self.lines: list[str] = []
        self._hash = hashlib.sha256()

    def __call__(self, kind: str, details: str = "") -> None:
        now = self._clock.now
        line = f"{now:12.6f} {kind} {details}".rstrip()
        self.lines.append(line)
        self._hash.update(line.encode())
        self._hash.update(b"\n")

    def digest(self) -> str:
        """Hex SHA-256 of every line so far (the replay check: same seed, same digest)."""
        return self._hash.hexdigest()[:16]
