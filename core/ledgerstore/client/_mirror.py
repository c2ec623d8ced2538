"""Generates the synchronous API from the asyncio one, as fsspec's ``mirror_sync_methods`` does.

One event-loop thread per process (started on first use, a daemon, stopped when the last
synchronous client closes and at interpreter exit) runs every coroutine of the synchronous API.
A class that subclasses :class:`SyncWrapper` with ``mirrors=AsyncClass`` gets, for every public
name of the async class that it does not define by hand:

- a coroutine method: a blocking method with the same name, signature and docstring;
- an async generator method, or a method returning an async iterator: the same, returning an
  iterator (``__aiter__`` becomes ``__iter__``);
- ``__aenter__`` / ``__aexit__``: ``__enter__`` / ``__exit__``;
- a property: a property reading the async object's.

Results that are async objects with a synchronous mirror come back wrapped in it. A caller
interrupted while it waits (KeyboardInterrupt, or the deadline of :func:`call_timeout`) cancels
the coroutine on the loop and waits for it to unwind before the exception propagates.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import functools
import inspect
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from ledgerstore.errors import LedgerStoreError

T = TypeVar("T")

#: async protocol methods and the synchronous names they are mirrored as
DUNDERS = {"__aenter__": "__enter__", "__aexit__": "__exit__", "__aiter__": "__iter__"}

#: how long an interrupted call waits for its coroutine to unwind after cancelling it
CANCEL_GRACE_S = 10.0

#: items an iterator reads ahead of its consumer (it pauses there until the consumer catches up)
ITER_READ_AHEAD = 1024


# --- the loop thread -------------------------------------------------------------------------------


class _LoopThread:
    """The process's event loop and the thread running it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name="ledgerstore-io", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def stop(self) -> None:
        """Cancel what still runs on the loop, let it unwind, stop the loop and join the thread."""
        if self.thread is threading.current_thread():
            raise RuntimeError("the ledgerstore loop cannot be stopped from its own thread")
        if self.loop.is_running():
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(CANCEL_GRACE_S)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(CANCEL_GRACE_S)
        if not self.thread.is_alive():
            self.loop.close()


async def _cancel_all() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


_lock = threading.Lock()
_current: _LoopThread | None = None
_users = 0


def get_loop() -> asyncio.AbstractEventLoop:
    """The process's ledgerstore event loop (started if it is not running)."""
    global _current
    with _lock:
        if _current is None:
            _current = _LoopThread()
        return _current.loop


def acquire() -> asyncio.AbstractEventLoop:
    """Count one more user of the loop (a synchronous client) and return the loop."""
    global _users
    loop = get_loop()
    with _lock:
        _users += 1
    return loop


def release() -> None:
    """One user fewer; the last one stops the loop thread (a later user starts a new one)."""
    global _users, _current
    with _lock:
        _users = max(0, _users - 1)
        if _users or _current is None:
            return
        current, _current = _current, None
        current.stop()


@atexit.register
def shutdown() -> None:
    """Stop the loop thread whoever still uses it (at interpreter exit)."""
    global _users, _current
    with _lock:
        current, _current, _users = _current, None, 0
    if current is not None and current.thread is not threading.current_thread():
        current.stop()


def _forget_after_fork() -> None:
    # a forked child has the parent's loop object but not its thread: start afresh on first use
    global _lock, _users, _current
    _lock = threading.Lock()  # the parent's may have been held by a thread the child does not have
    _current, _users = None, 0


os.register_at_fork(after_in_child=_forget_after_fork)


# --- running coroutines from other threads -------------------------------------------------------

_deadline = threading.local()


@contextlib.contextmanager
def call_timeout(seconds: float) -> Iterator[None]:
    """Synchronous calls made by this thread inside the block raise :class:`TimeoutError` once
    ``seconds`` have passed, after cancelling what they were waiting for on the loop."""
    outer = getattr(_deadline, "at", None)
    at = time.monotonic() + seconds
    _deadline.at = at if outer is None else min(at, outer)
    try:
        yield
    finally:
        _deadline.at = outer


def _remaining() -> float | None:
    at = getattr(_deadline, "at", None)
    return None if at is None else max(0.0, at - time.monotonic())


class _Call(Generic[T]):
    """One coroutine submitted to the loop from another thread, cancellable before it starts.

    Construction does not submit: the caller calls :meth:`submit` inside the ``try`` whose handler
    cancels, so an interrupt (a signal handler runs at any bytecode) that lands just after the
    coroutine reached the loop still cancels it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> None:
        self.loop = loop
        self.coro = coro
        self.result: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.ended = threading.Event()
        self.task: asyncio.Task[T] | None = None
        self.abandoned = False
        self.submitted = False

    def submit(self) -> None:
        """Hand the coroutine to the loop (once)."""
        if self.submitted:
            return
        self.submitted = True  # before the hand-over: an interrupt inside it still waits for _start
        self.loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        if self.abandoned:
            self.coro.close()
            self.result.cancel()
            self.ended.set()
            return
        self.task = self.loop.create_task(self.coro)
        self.task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[T]) -> None:
        if task.cancelled():
            self.result.cancel()
        elif task.exception() is not None:
            self.result.set_exception(task.exception())
        else:
            self.result.set_result(task.result())
        self.ended.set()

    def _cancel(self) -> None:
        self.abandoned = True
        if self.task is not None:
            self.task.cancel()

    def cancel_and_wait(self) -> None:
        """Cancel the coroutine on the loop and wait until it has unwound."""
        if self.ended.is_set():
            return
        if not self.submitted:  # interrupted before the loop ever saw it
            self.coro.close()
            self.result.cancel()
            self.ended.set()
            return
        if _on_loop_thread(self.loop):  # e.g. an abandoned iterator collected there: cannot wait
            self._cancel()
            return
        with contextlib.suppress(RuntimeError):  # the loop is already closed: nothing runs there
            self.loop.call_soon_threadsafe(self._cancel)
            self.ended.wait(CANCEL_GRACE_S)


def run(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop | None = None) -> T:
    """Run ``coro`` on the ledgerstore loop and wait for its result (see :func:`call_timeout`)."""
    loop = loop or get_loop()
    if _on_loop_thread(loop):
        coro.close()
        raise RuntimeError("synchronous ledgerstore calls cannot be made from the client's own loop thread")
    if loop.is_closed():
        coro.close()
        raise LedgerStoreError("the ledgerstore client this object belongs to is closed")
    call = _Call(loop, coro)
    try:
        call.submit()
        return call.result.result(_remaining())
    except BaseException as exc:
        if call.result.done():  # the coroutine's own outcome
            raise
        call.cancel_and_wait()
        if isinstance(exc, TimeoutError):
            raise TimeoutError("the call did not finish within the call_timeout() deadline; it was cancelled") from None
        raise


def wait_future(fut: concurrent.futures.Future[T]) -> T:
    """The result of ``fut`` (resolved on the loop), waiting no longer than :func:`call_timeout`
    allows. What the future stands for is not cancelled: an add, once queued, cannot be taken back,
    so an interrupted wait leaves its outcome unknown."""
    try:
        return fut.result(_remaining())
    except TimeoutError:
        if fut.done():
            raise
        raise TimeoutError("no answer within the call_timeout() deadline; the outcome is unknown") from None


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def _call_plain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    value = fn(*args, **kwargs)
    if isinstance(value, asyncio.Future):  # callbacks are added on the loop, not from the caller's thread
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()
        value.add_done_callback(functools.partial(relay, out=out))
        return out
    return value


# --- iterators -----------------------------------------------------------------------------------


class _Pump:
    """Drives an async iterator on the loop into a buffer the consuming thread reads from, at
    most :data:`ITER_READ_AHEAD` items ahead: no loop round trip per item."""

    def __init__(self, loop: asyncio.AbstractEventLoop, make: Callable[[], Any]) -> None:
        if loop.is_closed():
            raise LedgerStoreError("the ledgerstore client this object belongs to is closed")
        self.loop = loop
        self.buf: collections.deque[Any] = collections.deque()
        self.cond = threading.Condition()
        self.done = False
        self.error: BaseException | None = None
        self.waiting = False  # the consumer sleeps on cond
        self.paused = False  # the pump waits for room
        self.room: asyncio.Event | None = None
        self.call = _Call(loop, self._run(make))
        self.call.submit()

    async def _run(self, make: Callable[[], Any]) -> None:
        self.room = asyncio.Event()
        try:
            ait = make()
            if inspect.isawaitable(ait):
                ait = await ait
            async for item in ait:
                self.buf.append(item)
                if self.waiting:
                    with self.cond:
                        self.cond.notify()
                if len(self.buf) >= ITER_READ_AHEAD:
                    with self.cond:
                        if len(self.buf) >= ITER_READ_AHEAD:
                            self.paused = True
                            self.room.clear()
                    while self.paused:
                        await self.room.wait()
        except BaseException as exc:
            self.error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            with self.cond:
                self.done = True
                self.cond.notify()

    def _resume(self) -> None:
        # under cond
        self.paused = False
        assert self.room is not None
        self.loop.call_soon_threadsafe(self.room.set)

    def take(self) -> tuple[bool, Any]:
        """The next item as ``(True, item)``, or ``(False, None)`` at the end; raises what the
        async iterator raised, and TimeoutError past the call_timeout() deadline."""
        while True:
            try:
                item = self.buf.popleft()
            except IndexError:
                pass
            else:
                if self.paused and len(self.buf) <= ITER_READ_AHEAD // 2:
                    with self.cond:
                        if self.paused:
                            self._resume()
                return True, item
            with self.cond:
                if self.paused:
                    self._resume()
                self.waiting = True
                try:
                    while not self.buf and not self.done:
                        left = _remaining()
                        if left is not None and left <= 0:
                            raise TimeoutError("the iterator had nothing within the call_timeout() deadline")
                        self.cond.wait(left)
                finally:
                    self.waiting = False
                if self.buf:
                    continue
            if self.error is not None:
                raise self.error
            return False, None

    def stop(self) -> list[Any]:
        """Cancel the pump, wait for it to unwind and return what it read that nobody took."""
        self.call.cancel_and_wait()
        left = list(self.buf)
        self.buf.clear()
        return left


def iterate(loop: asyncio.AbstractEventLoop, make: Callable[[], Any],
            unconsumed: collections.deque[Any] | None = None) -> Iterator[Any]:
    """A blocking iterator over the async iterator ``make()`` returns (``make`` runs on ``loop``).

    With ``unconsumed`` (a cursor shared by every iterator of one object), it first yields what an
    earlier iterator read but nobody took, and what it reads itself but nobody takes (the caller
    left the loop early) goes back there."""
    if unconsumed:
        while unconsumed:
            yield unconsumed.popleft()
    pump = _Pump(loop, make)
    try:
        while True:
            more, item = pump.take()
            if not more:
                return
            yield item
    finally:
        left = pump.stop()
        if unconsumed is not None:
            unconsumed.extendleft(reversed(left))


# --- generating the classes ----------------------------------------------------------------------

_SYNC_OF: dict[type, type[SyncWrapper]] = {}


def to_sync(value: Any, owner: SyncWrapper) -> Any:
    """``value`` as the synchronous API returns it: mirrored async objects wrapped, async
    iterators as blocking iterators."""
    if value is owner.aio:
        return owner
    for cls in type(value).__mro__:
        wrapper = _SYNC_OF.get(cls)
        if wrapper is not None:
            return wrapper(value, owner.loop)
    if hasattr(value, "__anext__"):
        return iterate(owner.loop, lambda: value, owner._cursor())
    return value


def relay(f: asyncio.Future[T], out: concurrent.futures.Future[T]) -> None:
    """Copy the outcome of an asyncio future to a concurrent one (a done callback on the loop)."""
    if f.cancelled():
        out.cancel()
    elif f.exception() is not None:
        out.set_exception(f.exception())
    else:
        out.set_result(f.result())


class _MirroredProperty(property):
    """A property generated from the async class (a hand-written one is a plain property)."""


def _describe(fn: Callable[..., Any], name: str, owner: type, source: Any) -> Callable[..., Any]:
    fn.__name__ = name
    fn.__qualname__ = f"{owner.__qualname__}.{name}"
    fn.__module__ = owner.__module__
    fn.__doc__ = inspect.getdoc(source)
    # a function's attributes live in its __dict__ (inspect.signature reads __signature__ there)
    vars(fn).update(__signature__=inspect.signature(source), __mirrored__=True)
    return fn


def _mirror_member(owner: type, name: str, member: Any) -> Any:
    """The synchronous counterpart of async ``member`` (None: not mirrored, write it by hand)."""
    sync_name = DUNDERS.get(name, name)
    if isinstance(member, property):
        return _MirroredProperty(lambda self: to_sync(getattr(self.aio, name), self), doc=member.__doc__)
    if not inspect.isfunction(member):
        return None  # classmethods, staticmethods and class attributes
    if inspect.iscoroutinefunction(member):
        def blocking(self: SyncWrapper, *args: Any, **kwargs: Any) -> Any:
            return to_sync(run(getattr(self.aio, name)(*args, **kwargs), self.loop), self)

        return _describe(blocking, sync_name, owner, member)
    if inspect.isasyncgenfunction(member):
        def iterating(self: SyncWrapper, *args: Any, **kwargs: Any) -> Iterator[Any]:
            return iterate(self.loop, lambda: getattr(self.aio, name)(*args, **kwargs), self._cursor())

        return _describe(iterating, sync_name, owner, member)

    def on_loop(self: SyncWrapper, *args: Any, **kwargs: Any) -> Any:
        # a plain method of an async object may touch loop state: call it there
        return to_sync(run(_call_plain(getattr(self.aio, name), *args, **kwargs), self.loop), self)

    return _describe(on_loop, sync_name, owner, member)


def _by_hand(cls: type, name: str) -> bool:
    for k in cls.__mro__:
        if k is SyncWrapper or k is object:
            return False
        member = k.__dict__.get(name)
        if member is not None:
            return not (isinstance(member, _MirroredProperty) or getattr(member, "__mirrored__", False))
    return False


def public_names(cls: type) -> set[str]:
    """The names a class offers its users: public ones and the (async) protocol dunders."""
    return {n for n in dir(cls) if not n.startswith("_") or n in DUNDERS or n in DUNDERS.values()}


class SyncWrapper:
    """Base of the generated synchronous classes: a blocking view of one asyncio object.

    ``class ReadHandle(SyncWrapper, mirrors=aio.ReadHandle)`` generates the methods; names the
    subclass defines itself are kept. ``_attributes`` lists instance attributes of the async
    object (invisible on its class) to forward as properties."""

    _mirrors: ClassVar[type]
    #: instance attributes of the async object forwarded as properties
    _attributes: ClassVar[tuple[str, ...]] = ()
    #: True when every iterator of the object reads from one cursor (a log reader): what an
    #: iterator left early read ahead is handed out first by the next read
    _shared_cursor: ClassVar[bool] = False

    def __init_subclass__(cls, mirrors: type | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if mirrors is None:
            return
        cls._mirrors = mirrors
        _SYNC_OF[mirrors] = cls
        for name in sorted(public_names(mirrors)):
            sync_name = DUNDERS.get(name, name)
            if name in DUNDERS.values() or _by_hand(cls, sync_name):
                continue
            mirrored = _mirror_member(cls, name, inspect.getattr_static(mirrors, name))
            if mirrored is not None:
                setattr(cls, sync_name, mirrored)
        for attr in cls._attributes:
            if not _by_hand(cls, attr):
                setattr(cls, attr, _MirroredProperty(
                    functools.partial(_get_attr, name=attr), functools.partial(_set_attr, name=attr),
                    doc=f"The async object's ``{attr}``."))

    def __init__(self, obj: Any, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._aio = obj
        self._loop = loop or get_loop()
        #: what iterators of a shared cursor read ahead and nobody took yet
        self._unconsumed: collections.deque[Any] = collections.deque()

    def _cursor(self) -> collections.deque[Any] | None:
        return self._unconsumed if self._shared_cursor else None

    @property
    def aio(self) -> Any:
        """The asyncio object this one mirrors (its coroutines must run on :attr:`loop`)."""
        return self._aio

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the asyncio object lives on: the process's ledgerstore loop thread."""
        return self._loop

    def __repr__(self) -> str:
        return f"<sync {self._aio!r}>"

    if TYPE_CHECKING:
        # the generated methods exist only at run time: type checkers see them as Any (every
        # mirrored class is a context manager: its async class has __aenter__, or it has one by hand)
        def __getattr__(self, name: str) -> Any: ...
        def __enter__(self) -> Any: ...
        def __exit__(self, *exc: object) -> Any: ...


def _get_attr(self: SyncWrapper, name: str) -> Any:
    return to_sync(getattr(self.aio, name), self)


def _set_attr(self: SyncWrapper, value: Any, name: str) -> None:
    setattr(self.aio, name, value)


__all__ = ["SyncWrapper", "acquire", "call_timeout", "get_loop", "iterate", "public_names", "release", "relay",
           "run", "shutdown", "to_sync", "wait_future"]
