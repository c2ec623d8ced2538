"""Where core keeps things in a metadata store (relative to the store's root).

Follows BookKeeper's ZooKeeper layout where it makes sense::

    /INSTANCEID                     cluster instance id (created once)
    /LAYOUT                         layout format version (see below)
    /available/<bookie-id>          writable bookies (ephemeral, JSON registration)
    /available/readonly/<bookie-id> read-only bookies (ephemeral)
    /cookies/<bookie-id>            cookies (persistent)
    /ledgers/...                    ledger metadata (JSON), keyed as the layout version says
    /idgen                          (counter namespace) ledger ids
    /logs/<name>                    log metadata (ordered ledger lists)
    /underreplication/...           auto-recovery markers and locks

Ledger keys, by ``/LAYOUT`` version:

- **2** (clusters made since issue 30): BookKeeper's ``LongHierarchicalLedgerManager`` layout. The
  id, written with 19 digits, is cut into 3, 4, 4, 4 and 4 digits:
  ledger 1234567 is ``/ledgers/000/0000/0000/0123/L4567``. No znode ever has more than 10,000
  children, whatever the number of ledgers (ZooKeeper's practical limit, and its ``jute.maxbuffer``
  on one ``getChildren`` answer), and a listing reads one small level at a time.
- **1** (clusters made before): ``/ledgers/<id // 10000, 15 digits>/L<id, 19 digits>``. Each bucket
  holds at most 10,000 ledgers but ``/ledgers`` gains a bucket every 10,000 ids. Such clusters keep
  this layout (every process reads ``/LAYOUT``), so old and new processes agree on every key.
"""

from __future__ import annotations

import enum
import re

#: the layout a new cluster is created with
LAYOUT_VERSION = 2
INSTANCE_ID = "/INSTANCEID"
LAYOUT = "/LAYOUT"
AVAILABLE = "/available"
READONLY = "/available/readonly"
COOKIES = "/cookies"
LEDGERS = "/ledgers"
LOGS = "/logs"
UNDERREPLICATION = "/underreplication"
LEDGER_ID_COUNTER = "ledger"
#: the most children any level of the hierarchical ledger layout can have (4 decimal digits)
MAX_LEVEL_CHILDREN = 10_000
_BUCKET = 10_000
_LONG_HIERARCHICAL = re.compile(r"/(\d{3})/(\d{4})/(\d{4})/(\d{4})/L(\d{4})")
_BUCKETED = re.compile(r"/(\d{15})/L(\d{19})")


class LedgerLayout(enum.IntEnum):
    """How ledger ids map to keys under :data:`LEDGERS` (the ``/LAYOUT`` version that says so)."""

    #: ``/ledgers/<id // 10000>/L<id>`` (layout version 1)
    BUCKETED = 1
    #: ``/ledgers/ddd/dddd/dddd/dddd/Ldddd``, BookKeeper's long-hierarchical layout (version 2)
    LONG_HIERARCHICAL = 2

    @property
    def depth(self) -> int:
        """Levels of directories between :data:`LEDGERS` and a ledger's key."""
        return 4 if self is LedgerLayout.LONG_HIERARCHICAL else 1

    def path(self, ledger_id: int) -> str:
        """The key of ledger ``ledger_id``'s metadata."""
        if self is LedgerLayout.BUCKETED:
            return f"{LEDGERS}/{ledger_id // _BUCKET:015d}/L{ledger_id:019d}"
        d = f"{ledger_id:019d}"
        return f"{LEDGERS}/{d[:3]}/{d[3:7]}/{d[7:11]}/{d[11:15]}/L{d[15:]}"

    def level_ok(self, level: int, name: str) -> bool:
        """Whether ``name`` can be a directory at ``level`` (0 is right under :data:`LEDGERS`)."""
        width = 15 if self is LedgerLayout.BUCKETED else (3 if level == 0 else 4)
        return len(name) == width and name.isdigit()

    def leaf_id(self, parents: tuple[str, ...], name: str) -> int | None:
        """The ledger id of leaf ``name`` below the directories ``parents``; None if it is none."""
        width = 19 if self is LedgerLayout.BUCKETED else 4
        if len(name) != width + 1 or name[0] != "L" or not name[1:].isdigit():
            return None
        return int(name[1:]) if self is LedgerLayout.BUCKETED else int("".join(parents) + name[1:])


def parse_layout(value: bytes | None, cluster_exists: bool) -> LedgerLayout:
    """The ledger layout a ``/LAYOUT`` value names. Without the key, a store that holds a cluster
    (an instance id) predates the marker's second version, so it is bucketed; an empty store gets
    the current layout. :class:`ValueError` for a version this code does not know."""
    if value is None:
        return LedgerLayout.BUCKETED if cluster_exists else LedgerLayout(LAYOUT_VERSION)
    text = value.decode(errors="replace").strip()
    if not text.isdigit() or int(text) not in LedgerLayout._value2member_map_:
        raise ValueError(f"metadata layout version {text!r} is not supported (this release reads "
                         f"{', '.join(str(v.value) for v in LedgerLayout)}); upgrade ledgerstore")
    return LedgerLayout(int(text))


def ledger_path(ledger_id: int, ledger_layout: LedgerLayout = LedgerLayout.LONG_HIERARCHICAL) -> str:
    """The key of a ledger's metadata in ``ledger_layout`` (a new cluster's layout by default)."""
    return ledger_layout.path(ledger_id)


def parse_ledger_key(key: str) -> int | None:
    """The ledger id whose metadata lives at ``key`` in either layout; None for any other key."""
    if not key.startswith(LEDGERS + "/"):
        return None
    rest = key[len(LEDGERS):]
    if m := _LONG_HIERARCHICAL.fullmatch(rest):
        return int("".join(m.groups()))
    if m := _BUCKETED.fullmatch(rest):
        return int(m.group(2))
    return None
