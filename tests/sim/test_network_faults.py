"""The simulated network's slow-path faults: a link held between two sends, heavy-tailed
delays on one link, and connection resets."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from ledgerstore.api.transport import FrameHandler, ServerConnection
from ledgerstore.sim import VirtualTimeLoop
from ledgerstore.sim.network import LinkFaults, SimNetwork, SimTransport
from ledgerstore.sim.trace import Trace


class _Sink(FrameHandler):
    def __init__(self, got: list[tuple[str, bytes]]) -> None:
        self.got = got

    def frames_received(self, conn: ServerConnection, frames: Sequence[bytes]) -> None:
        peer: Any = conn
        self.got.extend((peer.peer, f) for f in frames)

    def connection_lost(self, conn: ServerConnection) -> None:
        self.got.append(("lost", b""))


def _run(scenario: Any) -> Any:
    loop = VirtualTimeLoop()
    net = SimNetwork(loop, random.Random(1), Trace(loop.clock))
    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        return runner.run(scenario(net))


def test_a_held_link_delays_only_one_process_frames_to_one_bookie_and_keeps_their_order() -> None:
    async def scenario(net: SimNetwork) -> list[tuple[str, bytes]]:
        got: list[tuple[str, bytes]] = []
        await SimTransport(net, "bookie-1").serve("sim://bookie-1:3181", _Sink(got))
        writer = await SimTransport(net, "writer").connect("sim://bookie-1:3181", lambda f: None, lambda e: None)
        other = await SimTransport(net, "recoverer").connect("sim://bookie-1:3181", lambda f: None, lambda e: None)
        net.hold_link("writer", "bookie-1")
        writer.send(b"w1")
        writer.send(b"w2")
        other.send(b"r1")
        await asyncio.sleep(5)
        assert got == [("recoverer", b"r1")]
        net.release_link("writer", "bookie-1")
        await asyncio.sleep(1)
        return got

    assert _run(scenario) == [("recoverer", b"r1"), ("writer", b"w1"), ("writer", b"w2")]


def test_a_heavy_tailed_link_holds_frames_back_for_seconds_while_other_links_pass() -> None:
    async def scenario(net: SimNetwork) -> tuple[list[float], list[float]]:
        arrivals: dict[str, list[float]] = {"writer": [], "recoverer": []}

        class Clock(_Sink):
            def frames_received(self, conn: ServerConnection, frames: Sequence[bytes]) -> None:
                peer: Any = conn
                arrivals[peer.peer].append(asyncio.get_running_loop().time())

        await SimTransport(net, "bookie-1").serve("sim://bookie-1:3181", Clock([]))
        slow = await SimTransport(net, "writer").connect("sim://bookie-1:3181", lambda f: None, lambda e: None)
        fast = await SimTransport(net, "recoverer").connect("sim://bookie-1:3181", lambda f: None, lambda e: None)
        net.set_faults("writer", "bookie-1", LinkFaults(tail=1.0, tail_scale=1.0))
        t0 = asyncio.get_running_loop().time()
        for _ in range(200):
            slow.send(b"x")
            fast.send(b"y")
        await asyncio.sleep(60)
        return [t - t0 for t in arrivals["writer"]], [t - t0 for t in arrivals["recoverer"]]

    slow, fast = _run(scenario)
    assert len(slow) == len(fast) == 200
    assert max(fast) < 0.01
    assert min(slow) >= 1.0  # Pareto with scale 1: never earlier than the scale
    assert max(slow) > 5.0  # and some of them many times later
    assert slow == sorted(slow)  # the connection keeps its order: frames behind a late one wait


def test_a_reset_loses_the_frame_and_both_ends_hear_that_the_connection_broke() -> None:
    async def scenario(net: SimNetwork) -> tuple[list[tuple[str, bytes]], list[BaseException | None], bool]:
        got: list[tuple[str, bytes]] = []
        closed: list[BaseException | None] = []
        await SimTransport(net, "bookie-1").serve("sim://bookie-1:3181", _Sink(got))
        conn = await SimTransport(net, "recoverer").connect("sim://bookie-1:3181", lambda f: None, closed.append)
        net.set_faults("recoverer", "bookie-1", LinkFaults(reset=1.0))
        conn.send(b"fence")
        await asyncio.sleep(1)
        return got, closed, conn.is_closed

    got, closed, is_closed = _run(scenario)
    assert got == [("lost", b"")]
    assert is_closed and len(closed) == 1 and closed[0] is not None


class _Recorder:
    """A frame observer that writes down what it sees."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, int, bytes]] = []

    def sent(self, src: str, dst: str, conn: int, frame: bytes) -> None:
        self.seen.append(("sent", src, dst, conn, frame))

    def arrived(self, src: str, dst: str, conn: int, frame: bytes) -> None:
        self.seen.append(("arrived", src, dst, conn, frame))

    def serving(self, node: str) -> None:
        self.seen.append(("serving", node, "", 0, b""))


def test_observers_see_a_frame_leave_once_it_is_released_and_arrive_and_each_connection_has_its_number() -> None:
    async def scenario(net: SimNetwork) -> list[tuple[str, str, str, int, bytes]]:
        rec = _Recorder()
        net.observers.append(rec)
        await SimTransport(net, "bookie-1").serve("sim://bookie-1:3181", _Sink([]))
        first = await SimTransport(net, "writer").connect("sim://bookie-1:3181", lambda f: None, lambda e: None)
        second = await SimTransport(net, "writer").connect("sim://bookie-1:3181", lambda f: None, lambda e: None)
        net.hold("writer")
        first.send(b"a")  # held: it has not left the paused process yet
        await asyncio.sleep(1)
        assert [s for s in rec.seen if s[0] != "serving"] == []
        net.release("writer")
        second.send(b"b")
        net.partition("writer", "bookie-1", one_way=True)
        second.send(b"lost")  # it leaves the process, and the network loses it
        await asyncio.sleep(1)
        return rec.seen

    seen = _run(scenario)
    assert seen[0] == ("serving", "bookie-1", "", 0, b"")
    assert [frame for kind, _, _, _, frame in seen if kind == "sent"] == [b"a", b"b", b"lost"]
    assert sorted(frame for kind, _, _, _, frame in seen if kind == "arrived") == [b"a", b"b"]
    conns = {frame: conn for _, _, _, conn, frame in seen[1:]}
    assert conns[b"a"] != conns[b"b"] == conns[b"lost"]
