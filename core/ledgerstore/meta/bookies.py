"""Bookie registration, cookies and the cluster instance id, built once on any MetadataStore."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

from ledgerstore.api import NOT_EXISTS, BookieInfo, MetadataStore
from ledgerstore.errors import BadVersionError, CookieMismatchError, InstanceIdMismatchError, MetadataError
from ledgerstore.meta import layout

#: the cookie field naming the incarnation
INCARNATION = "incarnation"


def identity(cookie: dict[str, Any] | None) -> str | None:
    """The incarnation a cookie names: None when there is no cookie, ``""`` for a cookie written
    before incarnations existed (such a bookie keeps that identity until it is formatted)."""
    if cookie is None:
        return None
    return str(cookie.get(INCARNATION) or "")


def info_to_bytes(info: BookieInfo) -> bytes:
    return json.dumps(dataclasses.asdict(info), separators=(",", ":")).encode()


def info_from_bytes(data: bytes) -> BookieInfo:
    try:
        d = json.loads(data)
        fields = {f.name for f in dataclasses.fields(BookieInfo)}
        return BookieInfo(**{k: v for k, v in d.items() if k in fields})
    except (ValueError, TypeError) as exc:
        raise MetadataError(f"corrupt bookie registration: {exc}") from exc


class BookieRegistry:
    """Registration of bookies as writable or read-only (ephemeral keys)."""

    def __init__(self, store: MetadataStore, read_retry_s: float | None = None) -> None:
        self.store = store
        #: seconds a listing retries while the store is unreachable (default ``DEFAULT_READ_RETRY_S``)
        self.read_retry_s = read_retry_s

    async def register(self, info: BookieInfo) -> None:
        """Publish ``info`` under the writable or read-only path, removing it from the other."""
        mine = f"{layout.READONLY if info.read_only else layout.AVAILABLE}/{info.bookie_id}"
        other = f"{layout.AVAILABLE if info.read_only else layout.READONLY}/{info.bookie_id}"
        await self.store.put_ephemeral(mine, info_to_bytes(info))
        await self._remove(other)

    async def unregister(self, bookie_id: str) -> None:
        for path in (f"{layout.AVAILABLE}/{bookie_id}", f"{layout.READONLY}/{bookie_id}"):
            await self._remove(path)

    async def _remove(self, path: str) -> None:
        from ledgerstore.errors import NoSuchKeyError

        try:
            await self.store.delete(path)
        except NoSuchKeyError:
            pass

    async def writable(self) -> list[BookieInfo]:
        return await self._list(layout.AVAILABLE, skip={"readonly"})

    async def read_only(self) -> list[BookieInfo]:
        return await self._list(layout.READONLY)

    async def all(self) -> list[BookieInfo]:
        return await self.writable() + await self.read_only()

    async def _list(self, path: str, skip: set[str] | None = None) -> list[BookieInfo]:
        from ledgerstore.meta.retry import retry_read

        return await retry_read(lambda: self._list_once(path, skip), f"of {path}", self.read_retry_s)

    async def _list_once(self, path: str, skip: set[str] | None = None) -> list[BookieInfo]:
        out = []
        for name in await self.store.children(path):
            if skip and name in skip:
                continue
            got = await self.store.get(f"{path}/{name}")
            if got is not None and got.value:
                out.append(info_from_bytes(got.value))
        return out

    async def endpoint_of(self, bookie_id: str) -> str | None:
        """The transport address of a bookie: from its registration, else from its cookie."""
        for path in (f"{layout.AVAILABLE}/{bookie_id}", f"{layout.READONLY}/{bookie_id}"):
            got = await self.store.get(path)
            if got is not None and got.value:
                return info_from_bytes(got.value).endpoint
        cookie = await CookieManager(self.store).get(bookie_id)
        if cookie is not None:
            return str(cookie.get("endpoint") or "") or None
        return None


class ClusterManager:
    """The cluster instance id and layout."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def instance_id(self) -> str | None:
        got = await self.store.get(layout.INSTANCE_ID)
        return got.value.decode() if got is not None else None

    async def init(self) -> str:
        """Create the instance id if absent; return it either way."""
        iid = str(uuid.uuid4())
        try:
            await self.store.put(layout.INSTANCE_ID, iid.encode(), NOT_EXISTS)
            await self.store.put(layout.LAYOUT, str(layout.LAYOUT_VERSION).encode())
            return iid
        except BadVersionError:
            existing = await self.instance_id()
            assert existing is not None
            return existing


class CookieManager:
    """Cookies: a bookie's identity in the cluster, stored both in metadata and in its dirs."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def get(self, bookie_id: str) -> dict[str, Any] | None:
        got = await self.store.get(f"{layout.COOKIES}/{bookie_id}")
        if got is None:
            return None
        return dict(json.loads(got.value))

    async def put(self, bookie_id: str, cookie: dict[str, Any]) -> None:
        await self.store.put(f"{layout.COOKIES}/{bookie_id}", json.dumps(cookie, sort_keys=True).encode())

    async def delete(self, bookie_id: str) -> None:
        from ledgerstore.errors import NoSuchKeyError

        try:
            await self.store.delete(f"{layout.COOKIES}/{bookie_id}")
        except NoSuchKeyError:
            pass


def compare_cookies(local: dict[str, Any], remote: dict[str, Any], where: str) -> None:
    """Raise CookieMismatchError naming every differing field."""
    if local.get("instance_id") != remote.get("instance_id"):
        raise InstanceIdMismatchError(
            f"{where}: this bookie's data belongs to cluster instance {local.get('instance_id')!r}, but the metadata "
            f"store is instance {remote.get('instance_id')!r}. Point it at its own cluster, or format its "
            f"directories (ledgerstore shell bookieformat) to join this one."
        )
    diffs = [
        f"{k}: local {local.get(k)!r} vs registered {remote.get(k)!r}"
        for k in sorted(set(local) | set(remote))
        if k not in ("endpoint",) and local.get(k) != remote.get(k)
    ]
    if diffs:
        raise CookieMismatchError(
            f"{where}: the cookie in this bookie's directories does not match the one registered for it: "
            + "; ".join(diffs)
            + ". Was the configuration (directories, address) changed, or are two bookies sharing an id?"
        )
