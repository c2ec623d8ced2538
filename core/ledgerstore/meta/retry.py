"""Retrying idempotent metadata reads across a metadata-server outage or session loss."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ledgerstore.errors import BadVersionError, MetadataError, NoSuchKeyError

T = TypeVar("T")
log = logging.getLogger(__name__)

#: how long a read keeps retrying before the outage is reported to the caller, unless the client
#: sets ``metadata_read_retry_s``
DEFAULT_READ_RETRY_S = 30.0


async def retry_read(fn: Callable[[], Awaitable[T]], what: str, timeout: float | None = None) -> T:
    """Run an idempotent metadata read, retrying with backoff while the store is unreachable for
    ``timeout`` seconds (default :data:`DEFAULT_READ_RETRY_S`).

    Answers that are facts (a version conflict, a missing key) are never retried; writes must not
    use this (a write whose outcome is unknown is not safe to repeat blindly).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (DEFAULT_READ_RETRY_S if timeout is None else timeout)
    delay = 0.05
    while True:
        try:
            return await fn()
        except (BadVersionError, NoSuchKeyError):
            raise
        except MetadataError as exc:
            if loop.time() + delay > deadline:
                raise
            log.info("metadata read %s failed (%s); retrying in %.2fs", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
