"""The MetadataStore conformance suite, run against the memory store.

Each test gets its own namespace, so the suite's "one shared, empty namespace" holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator

import pytest

from ledgerstore.testing import MetadataStoreConformance
from ledgerstore_memory import MemoryMetadataStore, drop_namespace


class TestMemoryMetadataStore(MetadataStoreConformance):
    # Closing a memory session deletes its ephemeral keys synchronously; no expiry to wait for.
    ephemeral_timeout = 2.0

    @pytest.fixture
    def store_factory(self) -> Iterator[Callable[[], MemoryMetadataStore]]:
        name = f"conformance-{uuid.uuid4().hex}"
        yield lambda: MemoryMetadataStore(f"memory://{name}")
        drop_namespace(name)

    @pytest.fixture
    def expire_session(self) -> Callable[[MemoryMetadataStore], Awaitable[None]]:
        async def expire(store: MemoryMetadataStore) -> None:
            store.expire_session()

        return expire
