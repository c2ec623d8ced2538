"""EtcdMetadataStore: the MetadataStore contract on etcd v3 (tested with 3.4), over gRPC asyncio.

The generated etcd v3 stubs come from ``aetcd`` (the ``etcd3`` package fails at import with the
protobuf releases pip installs today: "Descriptors cannot be created directly"). The store talks
to the stubs itself rather than through ``aetcd.Client`` because it needs what that client hides:
the header revision of a transaction (our new version), TLS channels, several endpoints, watch
streams that resume from a revision, and re-authentication when a token expires.

Layout: the key ``/a/b`` is the etcd key ``<prefix>/a/b`` (bytes, UTF-8). Counters of
:meth:`next_id` live outside the key space under ``<prefix>.counters/``.

Versions are ``mod_revision``: cluster-wide, never reused, so a compare-and-set on a key that was
deleted and re-created fails as it must. Conditional writes are single transactions:
create-if-absent compares ``create_revision == 0``, compare-and-set compares ``mod_revision``.

Ephemeral keys are bound to one lease per store (the "session"), kept alive by a task. If the
lease is found gone (revoked, or expired while the servers were unreachable) the store fires
``"lost"``, grants a new lease and fires ``"restored"``; owners then re-register their keys.
A plain write to an ephemeral key keeps it ephemeral (as in ZooKeeper).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from aetcd import rpc

from ledgerstore.api import (
    MAX_DURATION_S,
    NOT_EXISTS,
    EventType,
    MetadataStore,
    Notification,
    NotificationCallback,
    SessionEvent,
    Subscription,
    Versioned,
    option,
)
from ledgerstore.errors import (
    BadVersionError,
    ConfigError,
    InvalidArgumentError,
    KeyExistsError,
    MetadataError,
    NoSuchKeyError,
    SessionExpiredError,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

#: keys per range request when listing children
_PAGE = 1000
#: how etcd 3.4 words auth failures that do not come as UNAUTHENTICATED / PERMISSION_DENIED
_AUTH_MESSAGES = ("user name is empty", "authentication failed", "invalid auth token", "permission denied")


def parse_etcd_uri(uri: str) -> tuple[list[tuple[str, int]], str]:
    """``etcd://h1:p1[,h2:p2]/prefix`` -> ([(h1, p1), ...], ``"/prefix"``). Empty prefix: ``/ledgerstore``."""
    scheme, sep, rest = uri.partition("://")
    if scheme != "etcd" or not sep:
        raise ConfigError(f"not an etcd metadata URI: {uri!r} (expected etcd://host:port[,host:port]/prefix)")
    hosts, _, path = rest.partition("/")
    endpoints: list[tuple[str, int]] = []
    for part in filter(None, hosts.split(",")):
        host, colon, port = part.rpartition(":")
        if not colon:
            host, port = part, "2379"
        try:
            endpoints.append((host.strip("[]"), int(port)))
        except ValueError:
            raise ConfigError(f"etcd URI {uri!r}: bad port in {part!r}") from None
    if not endpoints:
        raise ConfigError(f"etcd URI {uri!r} names no server (expected etcd://host:port[,host:port]/prefix)")
    prefix = "/" + path.strip("/") if path.strip("/") else "/ledgerstore"
    if "//" in prefix:
        raise ConfigError(f"etcd URI {uri!r}: prefix {prefix!r} has an empty path segment")
    return endpoints, prefix


def _range_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd's prefix convention)."""
    b = bytearray(prefix)
    while b:
        if b[-1] < 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return b"\0"


class _Subscription(Subscription):
    def __init__(self) -> None:
        self.cancelled = False
        self.task: asyncio.Task[None] | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()


class EtcdMetadataStore(MetadataStore):
    """MetadataStore on etcd v3. URI ``etcd://host:port[,host:port]/prefix``.

    Options:

    ``lease_ttl`` (int, seconds, default 10)
        TTL of the store's lease: how long ephemeral keys outlive a dead process.
    ``user``, ``password``
        etcd authentication (both or neither).
    ``ca_file``, ``cert_file``, ``key_file``
        TLS: the CA bundle that signed the servers' certificates, and a client certificate and
        key for servers that require one. Giving ``ca_file`` switches the channel to TLS.
    ``operation_timeout`` (float, seconds, default 30)
        Deadline of every request.
    """

    schemes = ("etcd",)
    supports_session_events = True
    supports_tls = True

    @dataclasses.dataclass(frozen=True)
    class Options:
        """The ``metadata_options`` table of an ``etcd://`` metadata store."""

        session_timeout: float | None = option(None, "the name every metadata backend understands for lease_ttl",
                                             minimum=2, maximum=MAX_DURATION_S)
        lease_ttl: int | None = option(None, "seconds ephemeral keys outlive a dead process (the lease TTL; "
                                       "default session_timeout, else 10)", minimum=2, maximum=MAX_DURATION_S)
        user: str | None = option(None, "etcd user (with password)")
        password: str | None = option(None, "etcd password (with user)")
        ca_file: str | None = option(None, "CA bundle of the servers' certificates; switches the channel to TLS")
        cert_file: str | None = option(None, "client certificate (with key_file and ca_file)")
        key_file: str | None = option(None, "client certificate's private key")
        operation_timeout: float = option(30.0, "deadline of every request, in seconds", minimum=0.001, maximum=MAX_DURATION_S)

        def __post_init__(self) -> None:
            if (self.user is None) != (self.password is None):
                raise ValueError("user and password go together: give both or neither")
            if (self.cert_file is None) != (self.key_file is None):
                raise ValueError("cert_file and key_file go together: give both or neither")
            if self.cert_file is not None and self.ca_file is None:
                raise ValueError("cert_file needs ca_file (TLS is switched on by ca_file)")

    def __init__(self, uri: str, options: EtcdMetadataStore.Options | None = None, /, **values: Any) -> None:
        """``options``: the ``metadata_options`` table as the host parsed it; a store built in code
        may pass the table as keyword arguments instead (parsed by the same rules)."""
        super().__init__(uri, options, **values)
        opts: EtcdMetadataStore.Options = self.options
        self.endpoints, self.prefix = parse_etcd_uri(uri)
        # session_timeout is the name every metadata backend understands; lease_ttl is etcd's own
        self.lease_ttl: int = (opts.lease_ttl if opts.lease_ttl is not None
                               else 10 if opts.session_timeout is None else int(opts.session_timeout))
        self.operation_timeout = opts.operation_timeout
        self._user = opts.user
        self._password = opts.password
        self._tls = {"ca_file": opts.ca_file, "cert_file": opts.cert_file, "key_file": opts.key_file}
        self._base = self.prefix.encode()
        self._counters = self._base + b".counters/"
        self._channel: grpc.aio.Channel | None = None
        self._kv: Any = None
        self._lease: Any = None
        self._watch: Any = None
        self._metadata: tuple[tuple[str, str], ...] | None = None
        self._lease_id: int | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self._lease_check = asyncio.Event()
        self._subs: set[_Subscription] = set()
        self._closing = False

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def lease_id(self) -> int | None:
        """ID of the current lease (the session), None while it is lost."""
        return self._lease_id

    def _target(self) -> tuple[str, list[tuple[str, Any]]]:
        options: list[tuple[str, Any]] = []
        if len(self.endpoints) == 1:
            host, port = self.endpoints[0]
            return f"{host}:{port}", options
        # gRPC takes several endpoints only as addresses of one family: resolve names (IPv4 first),
        # and keep the first name for TLS hostname checks.
        addrs: list[tuple[str, int]] = []
        for host, port in self.endpoints:
            try:
                ipaddress.ip_address(host)
                addrs.append((host, port))
                continue
            except ValueError:
                pass
            if self._tls["ca_file"] is not None and not options:
                options.append(("grpc.ssl_target_name_override", host))
            for family in (socket.AF_INET, socket.AF_INET6):
                try:
                    infos = socket.getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)
                except socket.gaierror:
                    continue
                addrs.extend((str(info[4][0]), port) for info in infos)
                break
            else:
                raise ConfigError(f"etcd URI {self.uri!r}: cannot resolve host {host!r}")
        families = {":" in h for h, _ in addrs}
        if len(families) > 1:
            raise ConfigError(f"etcd URI {self.uri!r}: mixes IPv4 and IPv6 endpoints, which gRPC cannot combine")
        if families == {True}:
            return "ipv6:" + ",".join(f"[{h}]:{p}" for h, p in addrs), options
        return "ipv4:" + ",".join(f"{h}:{p}" for h, p in addrs), options

    async def start(self) -> None:
        if self._channel is not None:
            return
        self._closing = False
        target, options = self._target()
        if self._tls["ca_file"] is not None:
            def read(name: str) -> bytes | None:
                path = self._tls[name]
                if path is None:
                    return None
                with open(str(path), "rb") as f:
                    return f.read()

            creds = grpc.ssl_channel_credentials(
                root_certificates=read("ca_file"), private_key=read("key_file"),
                certificate_chain=read("cert_file"),
            )
            self._channel = grpc.aio.secure_channel(target, creds, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        self._kv = rpc.KVStub(self._channel)
        self._lease = rpc.LeaseStub(self._channel)
        self._watch = rpc.WatchStub(self._channel)
        try:
            await self._authenticate()
            await self._grant_lease()
        except BaseException:
            await self.close()
            raise
        self._lease_task = asyncio.create_task(self._keep_alive(), name=f"etcd-lease {self.uri}")

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is None:
            return
        self._closing = True
        for sub in list(self._subs):
            sub.cancel()
        self._subs.clear()
        if self._lease_task is not None:
            self._lease_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lease_task
            self._lease_task = None
        lease_id, self._lease_id = self._lease_id, None
        if lease_id is not None:
            # Revoking makes our ephemeral keys vanish now rather than after the TTL.
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
                await self._lease.LeaseRevoke(
                    rpc.LeaseRevokeRequest(ID=lease_id), timeout=min(5.0, self.operation_timeout),
                    metadata=self._metadata,
                )
        await channel.close()

    async def _authenticate(self) -> None:
        if self._user is None:
            return
        auth = rpc.AuthStub(self._channel)
        try:
            resp = await auth.Authenticate(
                rpc.AuthenticateRequest(name=str(self._user), password=str(self._password)),
                timeout=self.operation_timeout,
            )
        except grpc.aio.AioRpcError as e:
            raise self._translate(e, "authenticate", f"user {self._user!r}") from None
        self._metadata = (("token", resp.token),)

    async def _rpc(self, method: Callable[..., Awaitable[T]], request: Any, op: str, key: str) -> T:
        if self._channel is None:
            raise MetadataError(f"etcd store {self.uri} is not started: await start() first")
        try:
            return await method(request, timeout=self.operation_timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            # Simple tokens expire (5 min by default); the server refused the request before
            # executing it, so it is safe to re-authenticate and send it once more.
            if e.code() == grpc.StatusCode.UNAUTHENTICATED and self._user is not None:
                await self._authenticate()
                try:
                    return await method(request, timeout=self.operation_timeout, metadata=self._metadata)
                except grpc.aio.AioRpcError as e2:
                    raise self._translate(e2, op, key) from None
            raise self._translate(e, op, key) from None

    def _translate(self, e: grpc.aio.AioRpcError, op: str, key: str) -> MetadataError:
        where = f"{op} of {key} on etcd {self.endpoints[0][0]}:{self.endpoints[0][1]}"
        code, details = e.code(), e.details() or ""
        if code == grpc.StatusCode.NOT_FOUND and "lease" in details:
            self._lease_check.set()
            return SessionExpiredError(f"{where}: the store's lease is gone ({details}); retry once restored")
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or any(
            m in details for m in _AUTH_MESSAGES
        ):
            return MetadataError(f"{where}: not authorized ({details}); check the user and password options")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return MetadataError(f"{where}: etcd unreachable or too slow ({code.name}: {details}); outcome unknown")
        return MetadataError(f"{where} failed: {code.name}: {details}")

    # --- lease (the session) -----------------------------------------------------------------

    async def _grant_lease(self) -> None:
        resp = await self._rpc(self._lease.LeaseGrant, rpc.LeaseGrantRequest(TTL=self.lease_ttl), "grant lease", "-")
        self._lease_id = int(resp.ID)

    async def _refresh(self, lease_id: int) -> int:
        """Send one keep-alive; return the TTL the server granted (0: the lease is gone)."""
        call = self._lease.LeaseKeepAlive(timeout=self.operation_timeout, metadata=self._metadata)
        try:
            await call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
            reply = await call.read()
        finally:
            call.cancel()
        if reply is grpc.aio.EOF:
            raise MetadataError("etcd closed the keep-alive stream")
        return int(reply.TTL)

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        interval = max(0.5, self.lease_ttl / 3)
        last_ok = loop.time()
        while not self._closing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._lease_check.wait(), interval)
            self._lease_check.clear()
            lease_id = self._lease_id
            if lease_id is not None:
                try:
                    ttl = await self._refresh(lease_id)
                except (grpc.aio.AioRpcError, MetadataError) as e:
                    if loop.time() - last_ok <= self.lease_ttl:
                        log.warning("etcd lease %x keep-alive failed: %s", lease_id, e)
                        continue
                    ttl = 0  # unreachable for a whole TTL: the server has expired it
                if ttl > 0:
                    last_ok = loop.time()
                    continue
                self._lease_id = None
                self._fire_session_event(SessionEvent.LOST)
            try:
                await self._grant_lease()
            except MetadataError as e:
                log.warning("etcd: could not grant a new lease yet: %s", e)
                continue
            last_ok = loop.time()
            self._fire_session_event(SessionEvent.RESTORED)

    # --- key mapping --------------------------------------------------------------------------

    def _ekey(self, key: str) -> bytes:
        if not isinstance(key, str) or not key.startswith("/"):
            raise InvalidArgumentError(f"metadata keys are absolute paths starting with '/', got {key!r}")
        key = key.rstrip("/")
        if "//" in key:
            raise InvalidArgumentError(f"metadata key {key!r} has an empty path segment")
        return self._base + key.encode()

    def _ukey(self, ekey: bytes) -> str:
        return ekey[len(self._base):].decode() or "/"

    # --- the contract ------------------------------------------------------------------------

    async def get(self, key: str) -> Versioned | None:
        resp = await self._rpc(self._kv.Range, rpc.RangeRequest(key=self._ekey(key)), "get", key)
        if not resp.kvs:
            return None
        kv = resp.kvs[0]
        return Versioned(kv.value, int(kv.mod_revision))

    async def put(self, key: str, value: bytes, expected_version: int | None = None) -> int:
        ekey = self._ekey(key)
        if expected_version == NOT_EXISTS:
            compare = [rpc.Compare(key=ekey, result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, create_revision=0)]
            success = [rpc.RequestOp(request_put=rpc.PutRequest(key=ekey, value=value))]
            resp = await self._rpc(self._kv.Txn, rpc.TxnRequest(compare=compare, success=success), "create-if-absent", key)
            if not resp.succeeded:
                raise KeyExistsError(f"create-if-absent of {key} on etcd: key already exists")
            return int(resp.header.revision)
        if expected_version is None:
            # A write keeps an ephemeral key ephemeral: reuse its lease when the key exists.
            compare = [rpc.Compare(key=ekey, result=rpc.Compare.GREATER, target=rpc.Compare.CREATE, create_revision=0)]
            success = [rpc.RequestOp(request_put=rpc.PutRequest(key=ekey, value=value, ignore_lease=True))]
            failure = [rpc.RequestOp(request_put=rpc.PutRequest(key=ekey, value=value))]
        else:
            compare = [rpc.Compare(key=ekey, result=rpc.Compare.EQUAL, target=rpc.Compare.MOD,
                                   mod_revision=int(expected_version))]
            success = [rpc.RequestOp(request_put=rpc.PutRequest(key=ekey, value=value, ignore_lease=True))]
            failure = []
        resp = await self._rpc(
            self._kv.Txn, rpc.TxnRequest(compare=compare, success=success, failure=failure), "put", key
        )
        if expected_version is not None and not resp.succeeded:
            raise BadVersionError(
                f"compare-and-set of {key} on etcd: expected version {expected_version}; "
                "the key changed or vanished since it was read"
            )
        return int(resp.header.revision)

    async def delete(self, key: str, expected_version: int | None = None) -> None:
        ekey = self._ekey(key)
        if expected_version is None:
            resp = await self._rpc(self._kv.DeleteRange, rpc.DeleteRangeRequest(key=ekey), "delete", key)
            if resp.deleted == 0:
                raise NoSuchKeyError(f"delete of {key} on etcd: no such key")
            return
        compare = [rpc.Compare(key=ekey, result=rpc.Compare.EQUAL, target=rpc.Compare.MOD,
                               mod_revision=int(expected_version))]
        success = [rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=ekey))]
        failure = [rpc.RequestOp(request_range=rpc.RangeRequest(key=ekey, count_only=True))]
        resp = await self._rpc(
            self._kv.Txn, rpc.TxnRequest(compare=compare, success=success, failure=failure), "delete", key
        )
        if not resp.succeeded:
            if resp.responses[0].response_range.count == 0:
                raise NoSuchKeyError(f"delete of {key} on etcd: no such key")
            raise BadVersionError(f"delete of {key} on etcd: expected version {expected_version}, the key changed")

    async def children(self, key: str) -> list[str]:
        base = self._ekey(key) + b"/"
        end = _range_end(base)
        names: set[bytes] = set()
        start = base
        # Page through the keys, jumping over each child's subtree once its name is known, so a
        # child with a million descendants costs about one page, not a million keys.
        while True:
            req = rpc.RangeRequest(key=start, range_end=end, keys_only=True, limit=_PAGE)
            resp = await self._rpc(self._kv.Range, req, "children", key)
            for kv in resp.kvs:
                names.add(kv.key[len(base):].split(b"/", 1)[0])
            if not resp.more or not resp.kvs:
                break
            last_key = resp.kvs[-1].key
            child = base + last_key[len(base):].split(b"/", 1)[0]
            # Past the last child's own key and, if the page ended inside it, its whole subtree.
            start = last_key + b"\0" if last_key == child else _range_end(child + b"/")
        return sorted(n.decode() for n in names)

    async def put_ephemeral(self, key: str, value: bytes) -> int:
        lease_id = self._lease_id
        if lease_id is None:
            raise SessionExpiredError(f"put_ephemeral of {key} on etcd: the store's lease is lost; retry once restored")
        resp = await self._rpc(
            self._kv.Put, rpc.PutRequest(key=self._ekey(key), value=value, lease=lease_id), "put_ephemeral", key
        )
        return int(resp.header.revision)

    async def next_id(self, name: str) -> int:
        if not name or "/" in name:
            raise InvalidArgumentError(f"counter names are non-empty and contain no '/', got {name!r}")
        # etcd serialises puts to a key and counts them in kv.version: the version this put made
        # (the previous one + 1) is ours alone - one round trip, no retries under contention.
        req = rpc.PutRequest(key=self._counters + name.encode(), value=b"", prev_kv=True)
        resp = await self._rpc(self._kv.Put, req, "next_id", name)
        return int(resp.prev_kv.version) + 1 if resp.HasField("prev_kv") else 1

    async def watch(self, prefix: str, callback: NotificationCallback) -> Subscription:
        ekey = self._ekey(prefix)
        sub = _Subscription()
        created: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        sub.task = asyncio.create_task(self._watch_loop(sub, ekey, callback, created), name=f"etcd-watch {prefix}")
        self._subs.add(sub)
        try:
            await created
        except BaseException:
            sub.cancel()
            self._subs.discard(sub)
            raise
        return sub

    async def _watch_loop(
        self, sub: _Subscription, ekey: bytes, callback: NotificationCallback, created: asyncio.Future[None]
    ) -> None:
        below = ekey + b"/"
        start_revision = 0  # 0: from now on; later: resume right after the last event we saw
        failures = 0
        while not sub.cancelled and not self._closing:
            call = self._watch.Watch(metadata=self._metadata)
            try:
                await call.write(rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
                    key=ekey, range_end=_range_end(ekey), start_revision=start_revision)))
                while True:
                    resp = await call.read()
                    if resp is grpc.aio.EOF:
                        raise MetadataError("etcd ended the watch stream")
                    if resp.created and not created.done():
                        created.set_result(None)
                    if resp.compact_revision:
                        log.warning("etcd watch on %r: revisions up to %d compacted; changes in between are lost",
                                    ekey, resp.compact_revision)
                        start_revision = resp.compact_revision
                    elif resp.canceled:
                        raise MetadataError(f"etcd cancelled the watch: {resp.cancel_reason}")
                    if start_revision == 0 and resp.created:
                        start_revision = resp.header.revision + 1
                    failures = 0
                    for ev in resp.events:
                        k = ev.kv.key
                        start_revision = ev.kv.mod_revision + 1
                        if k != ekey and not k.startswith(below):
                            continue  # a sibling sharing the byte prefix, e.g. /w2 for /w
                        if ev.type == rpc.Event.DELETE:
                            etype = EventType.DELETED
                        elif ev.kv.version == 1:
                            etype = EventType.CREATED
                        else:
                            etype = EventType.MODIFIED
                        if sub.cancelled:
                            return
                        try:
                            callback(Notification(etype, self._ukey(k)))
                        except Exception:
                            log.exception("metadata watch callback %r failed", callback)
            except asyncio.CancelledError:
                raise
            except (grpc.aio.AioRpcError, MetadataError) as e:
                if not created.done():
                    created.set_exception(
                        self._translate(e, "watch", self._ukey(ekey)) if isinstance(e, grpc.aio.AioRpcError) else e
                    )
                    return
                failures += 1
                log.warning("etcd watch on %r interrupted (%s); resuming from revision %d", ekey, e, start_revision)
                await asyncio.sleep(min(2.0, 0.1 * 2 ** min(failures, 5)))
            finally:
                call.cancel()

    def __repr__(self) -> str:
        return f"<EtcdMetadataStore {self.uri}>"
