"""A cluster's whole metadata as one snapshot: read from a store, written to another, saved to a file.

Built on the :class:`~ledgerstore.api.MetadataStore` primitives only (``children``, ``get``,
``put``, ``next_id``), so it moves metadata between any two backends (sqlite, ZooKeeper, etcd, a
third party's) without knowing how either keeps it. Used by ``ledgerstore shell metadata-export``,
``metadata-import`` and ``metadata-copy`` (``cli/shell_metadata.py``).

What a snapshot holds: every persistent key below the store's root with its value, byte for byte
(instance id, layout, cookies, ledgers, logs, under-replication markers and switches, whatever a
manager keeps), and the ledger id counter. Not in it: keys bound to a live session (bookie
registrations, auditor candidates; their owners re-create them when they start) and the stores'
own versions, which are each backend's numbering and mean nothing in another.

The counter. The interface can only allocate from a counter, so :func:`read_snapshot` takes one
id from the source's (a gap, as a failed create leaves) and :func:`write_snapshot` allocates from
the target's until it has passed that value: new ledgers on the target never reuse an id. That is
one round trip per id the source had handed out.

The file format (:func:`snapshot_to_bytes`) is JSON with a format name, a version and a SHA-256
of its content, checked on load.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ledgerstore.api import NOT_EXISTS, MetadataStore
from ledgerstore.errors import ConfigError, KeyExistsError, LedgerStoreError
from ledgerstore.meta import layout

#: the ``format`` field of an export file, and its version
FILE_FORMAT = "ledgerstore-metadata"
FILE_VERSION = 1
#: the counters a snapshot carries (every counter core allocates from)
COUNTERS = (layout.LEDGER_ID_COUNTER,)

Progress = Callable[[int, int], None]


class TransferError(LedgerStoreError):
    """A metadata transfer was refused (a bookie is registered, the target is not empty) or its
    result did not match what was read."""


@dataclasses.dataclass
class Snapshot:
    """Every persistent key and value of a cluster's metadata, and its counters."""

    #: key -> value, for every persistent key
    keys: dict[str, bytes]
    #: counter name -> a value the counter has handed out (the target must hand out only larger ones)
    counters: dict[str, int]

    @property
    def instance_id(self) -> str | None:
        value = self.keys.get(layout.INSTANCE_ID)
        return None if value is None else value.decode(errors="replace")

    def counts(self) -> dict[str, int]:
        """How many keys of each kind: ledgers, cookies, logs, markers, and every other key by
        its top-level name."""
        kinds: Counter[str] = Counter()
        for key in self.keys:
            kinds[_kind(key)] += 1
        return dict(sorted(kinds.items()))


def _kind(key: str) -> str:
    if layout.parse_ledger_key(key) is not None:
        return "ledgers"
    if key.startswith(layout.COOKIES + "/"):
        return "cookies"
    if key.startswith(layout.LOGS + "/"):
        return "logs"
    if key.startswith(f"{layout.UNDERREPLICATION}/ledgers/"):
        return "under-replication markers"
    return "other keys"


def _below(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix.rstrip("/") + "/")


async def walk(store: MetadataStore, skip: Sequence[str] = (), key: str = "/") -> dict[str, bytes]:
    """Every key below ``key`` and its value, leaving out the subtrees ``skip`` names.

    A key with an empty value and children is left out too: it is the structure a backend made
    for its children (a ZooKeeper parent znode; ``put`` implies parents), which the target makes
    again for itself, not something a manager stored."""
    found: dict[str, bytes] = {}
    for name in await store.children(key):
        child = f"{key.rstrip('/')}/{name}"
        if any(_below(child, s) for s in skip):
            continue
        below = await walk(store, skip, child)
        got = await store.get(child)
        if got is not None and (got.value or not await store.children(child)):
            found[child] = got.value
        found.update(below)
    return found


async def live_sessions(store: MetadataStore, live: Sequence[str]) -> list[str]:
    """The keys bound to a live session below the ``live`` prefixes (registered bookies,
    auditor candidates): a transfer is refused while any exists."""
    keys = []
    for prefix in live:
        keys += sorted(k for k in (await walk(store, key=prefix)) if k != layout.READONLY)
    return keys


async def refuse_live(store: MetadataStore, live: Sequence[str], uri: str) -> None:
    """TransferError naming them if processes hold sessions at ``uri`` (the cluster is not offline)."""
    holders = await live_sessions(store, live)
    if holders:
        names = ", ".join(h.rpartition("/")[2] for h in holders[:5]) + (" ..." if len(holders) > 5 else "")
        raise TransferError(f"refused: {len(holders)} processes are registered at {uri} ({names}); stop every "
                            "bookie and auto-recovery process first (metadata moves only while the cluster is offline)")


async def read_snapshot(store: MetadataStore, live: Sequence[str], uri: str,
                        extra_counters: Sequence[str] = ()) -> Snapshot:
    """The snapshot of an offline cluster (TransferError while a process is registered, or when
    the store holds no cluster). ``extra_counters``: counters plugins allocate from (a protocol
    handler's ``metadata_counters``), carried like core's."""
    await refuse_live(store, live, uri)
    keys = await walk(store, live)
    if layout.INSTANCE_ID not in keys:
        raise TransferError(f"no cluster at {uri}: it holds no instance id ({len(keys)} keys)")
    counters = {name: await store.next_id(name) for name in dict.fromkeys([*COUNTERS, *extra_counters])}
    # a ledger restored under an id of its own (ledgermetadata -restorefromfile) may lie past the counter
    ids = [layout.parse_ledger_key(k) for k in keys]
    counters[layout.LEDGER_ID_COUNTER] = max([counters[layout.LEDGER_ID_COUNTER], *(i for i in ids if i is not None)])
    return Snapshot(dict(sorted(keys.items())), counters)


async def write_snapshot(store: MetadataStore, snap: Snapshot, uri: str, progress: Progress | None = None) -> None:
    """Write ``snap`` into the empty store at ``uri`` (TransferError if it holds any key), the
    instance id last, so an interrupted import is no cluster; then advance the counters."""
    existing = await walk(store)
    if existing:
        raise TransferError(f"refused: the target {uri} is not empty: it holds {len(existing)} keys "
                            f"(first {next(iter(sorted(existing)))}); give an empty store")
    order = [k for k in snap.keys if k != layout.INSTANCE_ID] + [layout.INSTANCE_ID]
    total = len(order) + sum(snap.counters.values())
    for done, key in enumerate(order, 1):
        try:
            await store.put(key, snap.keys[key], NOT_EXISTS)
        except KeyExistsError:
            raise TransferError(f"refused: {key} appeared in the target {uri} while it was written; "
                                "another process is using it") from None
        if progress is not None:
            progress(done, total)
    done = len(order)
    for name, value in snap.counters.items():
        while await store.next_id(name) < value:
            done += 1
            if progress is not None and done % 1000 == 0:
                progress(done, total)


async def verify_copy(store: MetadataStore, snap: Snapshot, live: Sequence[str], uri: str) -> dict[str, int]:
    """Read the target back: the same keys, each with a version and the very bytes written, the
    same layout version, counters past the source's. Returns the counts; TransferError naming
    the first difference otherwise."""
    got = await walk(store, live)
    missing, extra = sorted(set(snap.keys) - set(got)), sorted(set(got) - set(snap.keys))
    if missing or extra:
        raise TransferError(f"verification failed at {uri}: {len(missing)} keys missing "
                            f"({', '.join(missing[:3])}), {len(extra)} unexpected ({', '.join(extra[:3])})")
    for key, data in snap.keys.items():
        read = await store.get(key)
        if read is None or read.value != data or read.version is None:
            raise TransferError(f"verification failed at {uri}: {key} does not hold what was written")
    copied = Snapshot(got, snap.counters)
    if copied.counts() != snap.counts():
        raise TransferError(f"verification failed at {uri}: counts {copied.counts()} != {snap.counts()}")
    if got.get(layout.LAYOUT) != snap.keys.get(layout.LAYOUT):
        raise TransferError(f"verification failed at {uri}: layout version differs")
    for name, value in snap.counters.items():
        if await store.next_id(name) <= value:
            raise TransferError(f"verification failed at {uri}: counter {name!r} did not pass {value}")
    return copied.counts()


def _digest(doc: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in doc.items() if k != "sha256"}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def snapshot_to_bytes(snap: Snapshot) -> bytes:
    """The export file's content: versioned JSON, values in base64, with a SHA-256 of the rest."""
    doc: dict[str, Any] = {
        "format": FILE_FORMAT,
        "version": FILE_VERSION,
        "instance_id": snap.instance_id,
        "layout_version": (snap.keys.get(layout.LAYOUT) or b"").decode(errors="replace"),
        "counts": snap.counts(),
        "counters": snap.counters,
        "keys": {k: base64.b64encode(v).decode() for k, v in snap.keys.items()},
    }
    doc["sha256"] = _digest(doc)
    return json.dumps(doc, indent=1).encode()


def snapshot_from_bytes(data: bytes, name: str) -> Snapshot:
    """The snapshot an export file holds; ConfigError naming ``name`` and what is wrong with it."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{name} is not a metadata export (not JSON: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FILE_FORMAT:
        raise ConfigError(f"{name} is not a metadata export (no format {FILE_FORMAT!r})")
    if doc.get("version") != FILE_VERSION:
        raise ConfigError(f"{name} is a metadata export of version {doc.get('version')!r}; this ledgerstore reads "
                          f"version {FILE_VERSION}")
    if doc.get("sha256") != _digest(doc):
        raise ConfigError(f"{name} is damaged: its SHA-256 does not match its content")
    try:
        keys = {str(k): base64.b64decode(v, validate=True) for k, v in doc["keys"].items()}
        counters = {str(k): int(v) for k, v in doc["counters"].items()}
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        raise ConfigError(f"{name} is damaged: {exc}") from None
    snap = Snapshot(keys, counters)
    if layout.INSTANCE_ID not in keys or snap.counts() != doc.get("counts"):
        raise ConfigError(f"{name} is damaged: its keys do not match its counts")
    return snap
