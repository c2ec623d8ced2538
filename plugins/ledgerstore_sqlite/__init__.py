"""``sqlite`` metadata backend: the embedded default MetadataStore.

One sqlite database file holds the metadata of a cluster whose processes (a client and the
bookies of ``ledgerstore standalone``) run on one machine. Select it with
``metadata = "sqlite:///path/to/meta.db"``. When ``ledgerstore metadata-server`` serves the file
(the standalone always runs one), stores reach it through the server's Unix socket and never hold
the file's lock themselves. Schema, options, the server's frames and sessions, and the durability
story: ``docs/metadata-sqlite.md``.
"""

from ledgerstore_sqlite.store import SqliteMetadataStore, path_from_uri

__all__ = ["SqliteMetadataStore", "path_from_uri"]
