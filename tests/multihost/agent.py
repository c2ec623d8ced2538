"""A client process the multi-host tests run inside a test host: one JSON command per stdin line,
one JSON answer per stdout line.

Usage: ``agent.py METADATA [CLIENT_OPTIONS_JSON]`` (options are :class:`ClientConfig` fields).
Payloads are ``<tag>-<n>`` with ``n`` the handle's n-th append, so a reader can check every entry.

Commands (``op`` and its arguments) and answers:

- ``create`` e, qw, qa: a new ledger becomes the current handle: ``{"ledger": id}``
- ``append`` n: n pipelined appends: ``{"acked": [...], "error": "Class: text" | null}``
- ``write_for`` seconds, batch: appends in batches until the time is up or an add fails:
  ``{"acked": [...], "error", "max_gap": longest wait for a batch (s)}``
- ``close``: close the current ledger; ``bookies``: ``{"bookies": [registered bookie ids]}``
- ``metadata`` ledger: ``{"state", "last", "ensembles": [[first, [bookie, ...]], ...]}``
- ``recover`` ledger: open with recovery (fence, close): ``{"last": id}``
- ``read`` ledger: read it whole without recovery: ``{"count", "bad": [ids whose payload is wrong]}``
- ``open_log`` name: become its leader: ``{"ledger": id}``; ``log_append`` n: as ``append``
- ``close_log``: close the log writer (its ledger too)
- ``read_log`` name: ``{"payloads": [...]}``
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from ledgerstore.aio import Client, LedgerHandle, LogWriter
from ledgerstore.config_schema import ClientConfig

PASSWORD = b"pw"


def _error(exc: BaseException | None) -> str | None:
    return None if exc is None else f"{type(exc).__name__}: {exc}"


class Agent:
    """The state of one client process: its client, current ledger handle and log writer."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.lh: LedgerHandle | None = None
        self.log: LogWriter | None = None
        self.seq = 0
        self.tag = "e"

    async def _appends(self, n: int, log: bool) -> tuple[list[Any], str | None]:
        futs = []
        for _ in range(n):
            payload = f"{self.tag}-{self.seq}".encode()
            self.seq += 1
            if log:
                assert self.log is not None
                futs.append(self.log.append_async(payload))
            else:
                assert self.lh is not None
                futs.append(self.lh.append_async(payload))
        results = await asyncio.gather(*futs, return_exceptions=True)
        acked = [str(r) if log else r for r in results if not isinstance(r, BaseException)]
        errors = [r for r in results if isinstance(r, BaseException)]
        return acked, _error(errors[0] if errors else None)

    async def do(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["op"]
        if op == "create":
            self.lh = await self.client.create_ledger(cmd["e"], cmd["qw"], cmd["qa"], password=PASSWORD)
            self.seq, self.tag = 0, "e"
            return {"ledger": self.lh.ledger_id}
        if op in ("append", "log_append"):
            acked, error = await self._appends(cmd["n"], op == "log_append")
            return {"acked": acked, "error": error}
        if op == "write_for":
            acked_all: list[Any] = []
            gap, error = 0.0, None
            end = time.monotonic() + cmd["seconds"]
            while time.monotonic() < end and error is None:
                t0 = time.monotonic()
                acked, error = await self._appends(cmd.get("batch", 20), False)
                gap = max(gap, time.monotonic() - t0)
                acked_all += acked
            return {"acked": acked_all, "error": error, "max_gap": gap}
        if op == "close":
            assert self.lh is not None
            await self.lh.close()
            return {"closed": self.lh.ledger_id}
        if op == "bookies":
            return {"bookies": sorted(b.bookie_id for b in await self.client.list_bookies())}
        if op == "metadata":
            md = await self.client.ledger_metadata(cmd["ledger"])
            return {"state": md.state.value, "last": md.last_entry_id,
                    "ensembles": [[first, list(ens)] for first, ens in md.ensembles]}
        if op == "recover":
            rh = await self.client.open_ledger(cmd["ledger"], PASSWORD, recovery=True)
            return {"last": rh.last_add_confirmed}
        if op == "read":
            rh = await self.client.open_ledger(cmd["ledger"], PASSWORD, recovery=False)
            last = rh.last_add_confirmed
            entries = await rh.read(0, last) if last >= 0 else []
            bad = [e.entry_id for e in entries if e.payload != f"e-{e.entry_id}".encode()]
            return {"count": len(entries), "last": last, "bad": bad}
        if op == "open_log":
            self.log = await self.client.open_log(cmd["name"], ensemble=3, write_quorum=2, ack_quorum=2,
                                                  password=PASSWORD)
            self.tag = cmd.get("tag", "log")
            return {"ledger": self.log.ledger_id}
        if op == "close_log":
            assert self.log is not None
            await self.log.close()
            return {"closed": True}
        if op == "read_log":
            reader = await self.client.open_log_reader(cmd["name"], password=PASSWORD)
            payloads: list[str] = []
            while batch := await reader.read_batch(1000):
                payloads += [p.decode() for _, p in batch]
            return {"payloads": payloads}
        raise ValueError(f"unknown op {op!r}")


async def main(metadata: str, options: dict[str, Any]) -> None:
    config = ClientConfig(metadata=metadata, **options)
    async with Client(config=config) as client:
        agent = Agent(client)
        print(json.dumps({"ready": True}), flush=True)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            try:
                answer = await asyncio.wait_for(agent.do(cmd), cmd.get("timeout", 60))
            except Exception as exc:  # the test reads the error class and text
                answer = {"error": _error(exc)}
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}))
