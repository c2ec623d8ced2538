"""Write docs/configuration.md from the config dataclasses (their ``#:`` comments are the docs).

Run: .venv/bin/python scripts/gen_config_docs.py ; tests/test_docs.py checks the page is current."""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from pathlib import Path

from ledgerstore.config import AdminHttpConfig, AutoRecoveryConfig, BookieConfig, ClientConfig, JournalConfig

HEADER = """# Configuration reference

Bookies and clients read TOML files (`ledgerstore bookie --config bookie.toml`,
`ledgerstore.Client.from_config("client.toml")`). Keys go in a `[bookie]` or `[client]` table
(or at top level). Relative directories are relative to the file. Every key can be overridden by
an environment variable: `LEDGERSTORE_BOOKIE_<KEY>`, `LEDGERSTORE_BOOKIE_<TABLE>__<KEY>` (e.g.
`LEDGERSTORE_BOOKIE_JOURNAL__MAX_GROUP_WAIT_MS=1`), `LEDGERSTORE_CLIENT_<KEY>`. `ledgerstore config
check FILE` validates a file and prints the effective configuration; errors name the key and the file.

This page is generated from `core/ledgerstore/config.py` by `scripts/gen_config_docs.py`.
"""

EXAMPLE = """
## Example

```toml
[bookie]
metadata = "zk://127.0.0.1:2181/ledgers"
listen = "tcp://0.0.0.0:3181"
advertised_address = "tcp://10.0.0.5:3181"
journal_dir = "/var/lib/ledgerstore/journal"
ledger_dirs = ["/var/lib/ledgerstore/ledgers"]
storage = "entrylog"
rack = "/dc1/rack7"
http_port = 8000

[bookie.journal]
max_group_wait_ms = 2

[bookie.autorecovery]
enabled = true
```

`[bookie.transport]`, `[bookie.storage_options]` and `[bookie.metadata_options]` hold the options of
the chosen plugins; see [transports](transports.md), [entrylog](storage-entrylog.md),
[RocksDB](storage-rocksdb.md), [sqlite](metadata-sqlite.md) and [ZooKeeper/etcd](metadata-zookeeper-etcd.md).
"""


def doc_comments(cls: type) -> dict[str, str]:
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        s = line.strip()
        if s.startswith("#:"):
            pending.append(s[2:].strip())
            continue
        m = re.match(r"(\w+): ", s)
        if m and pending:
            out[m.group(1)] = " ".join(pending)
        pending = []
    return out


def table(cls: type, prefix: str) -> list[str]:
    docs = doc_comments(cls)
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            d = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            v = f.default_factory()  # type: ignore[misc]
            d = "(table)" if dataclasses.is_dataclass(v) else repr(v)
        else:
            d = ""
        rows.append(f"| `{prefix}{f.name}` | `{d}` | {docs.get(f.name, '')} |")
    return rows


def render() -> str:
    parts = [HEADER, "## Bookie (`[bookie]`)\n", *table(BookieConfig, ""),
             "\n## Journal (`[bookie.journal]`)\n", *table(JournalConfig, "journal."),
             "\n## Auto-recovery (`[bookie.autorecovery]`)\n", *table(AutoRecoveryConfig, "autorecovery."),
             "\n## Admin HTTP credentials (`[bookie.http]`)\n", *table(AdminHttpConfig, "http."),
             "\n## Client (`[client]`)\n", *table(ClientConfig, ""), EXAMPLE]
    return "\n".join(parts)


if __name__ == "__main__":
    target = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    target.write_text(render())
    sys.stdout.write(f"wrote {target}\n")
