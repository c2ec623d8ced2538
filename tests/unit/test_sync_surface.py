"""The synchronous API offers what the asyncio one does, name for name and signature for
signature (it is generated from it; these tests catch a hand-written override that drifts)."""

from __future__ import annotations

import inspect

import pytest

import ledgerstore
from ledgerstore import aio
from ledgerstore.client._mirror import DUNDERS, public_names

PAIRS = [
    (ledgerstore.Client, aio.Client),
    (ledgerstore.ReadHandle, aio.ReadHandle),
    (ledgerstore.LedgerHandle, aio.LedgerHandle),
    (ledgerstore.LogWriter, aio.LogWriter),
    (ledgerstore.LogReader, aio.LogReader),
]

#: names only the synchronous classes have, and why
SYNC_ONLY = {
    "aio",  # the asyncio object behind a sync one (the Spark connector runs coroutines of it)
    "loop",  # the process's loop those coroutines run on
}
#: sync-only conveniences the hand-written facade had and scripts may use
SYNC_ONLY_BY_CLASS: dict[type, set[str]] = {
    ledgerstore.ReadHandle: {"__iter__", "__enter__", "__exit__"},
    ledgerstore.LedgerHandle: {"__iter__", "__enter__", "__exit__"},
}


def _expected(async_cls: type) -> set[str]:
    return {DUNDERS.get(n, n) for n in public_names(async_cls)}


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_sync_classes_offer_the_async_names_and_no_others(sync_cls: type, async_cls: type) -> None:
    extra = SYNC_ONLY | SYNC_ONLY_BY_CLASS.get(sync_cls, set()) | set(sync_cls._attributes)  # type: ignore[attr-defined]
    assert public_names(sync_cls) - extra == _expected(async_cls)


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_sync_methods_take_the_async_parameters(sync_cls: type, async_cls: type) -> None:
    for name in sorted(public_names(async_cls)):
        a = inspect.getattr_static(async_cls, name)
        s = inspect.getattr_static(sync_cls, DUNDERS.get(name, name))
        if isinstance(a, property):
            assert isinstance(s, property), f"{sync_cls.__name__}.{name} should be a property"
            continue
        a_params = [(p.name, p.kind, p.default) for p in inspect.signature(getattr(async_cls, name)).parameters.values()]
        s_params = [(p.name, p.kind, p.default)
                    for p in inspect.signature(getattr(sync_cls, DUNDERS.get(name, name))).parameters.values()]
        assert s_params == a_params, f"{sync_cls.__name__}.{name}"


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_generated_methods_carry_the_async_docstrings(sync_cls: type, async_cls: type) -> None:
    for name in sorted(public_names(async_cls)):
        s = inspect.getattr_static(sync_cls, DUNDERS.get(name, name))
        if getattr(s, "__mirrored__", False):
            assert s.__doc__ == inspect.getdoc(getattr(async_cls, name))


def test_sync_client_is_built_with_the_async_clients_arguments() -> None:
    assert inspect.signature(ledgerstore.Client) == inspect.signature(aio.Client)


def test_hand_written_sync_methods_are_only_the_expected_ones() -> None:
    by_hand = {
        (cls.__name__, name)
        for cls, _ in PAIRS
        for name in public_names(cls) - SYNC_ONLY
        if not getattr(inspect.getattr_static(cls, name), "__mirrored__", False)
        and type(inspect.getattr_static(cls, name)).__name__ != "_MirroredProperty"
    }
    assert by_hand == {
        # building and closing a client: the loop thread is shared and counted
        ("Client", "from_config"), ("Client", "close"), ("Client", "__exit__"),
        # the append inbox: many blocking adds share one loop wake-up and one batch
        *((h, m) for h in ("LedgerHandle",) for m in ("append", "append_async", "append_many", "append_many_async")),
        *((h, m) for h in ("LogWriter",) for m in ("append", "append_async", "append_many", "append_many_async")),
        # a log reader's cursor includes what an abandoned iterator read ahead; every iterator
        # reads records into it, so plain and records() loops can follow each other
        ("LogReader", "position"), ("LogReader", "read_batch"), ("LogReader", "wait"),
        ("LogReader", "__iter__"), ("LogReader", "tail"), ("LogReader", "records"),
        # sync-only conveniences
        *((h, m) for h in ("ReadHandle", "LedgerHandle") for m in ("__iter__", "__enter__", "__exit__")),
    }
