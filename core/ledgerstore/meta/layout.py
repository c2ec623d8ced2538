"""Where core keeps things in a metadata store (relative to the store's root).

Follows BookKeeper's ZooKeeper layout where it makes sense::

    /INSTANCEID                     cluster instance id (created once)
    /LAYOUT                         layout format version
    /available/<bookie-id>          writable bookies (ephemeral, JSON registration)
    /available/readonly/<bookie-id> read-only bookies (ephemeral)
    /cookies/<bookie-id>            cookies (persistent)
    /ledgers/<bucket>/L<id>         ledger metadata (JSON); bucket = id // 10000, 15 digits
    /idgen                          (counter namespace) ledger ids
    /logs/<name>                    log metadata (ordered ledger lists)
    /underreplication/...           auto-recovery markers and locks
"""

from __future__ import annotations

LAYOUT_VERSION = 1
INSTANCE_ID = "/INSTANCEID"
LAYOUT = "/LAYOUT"
AVAILABLE = "/available"
READONLY = "/available/readonly"
COOKIES = "/cookies"
LEDGERS = "/ledgers"
LOGS = "/logs"
UNDERREPLICATION = "/underreplication"
LEDGER_ID_COUNTER = "ledger"
_BUCKET = 10_000


def ledger_path(ledger_id: int) -> str:
    return f"{LEDGERS}/{ledger_id // _BUCKET:015d}/L{ledger_id:019d}"


def parse_ledger_node(name: str) -> int | None:
    if name.startswith("L") and name[1:].isdigit():
        return int(name[1:])
    return None
