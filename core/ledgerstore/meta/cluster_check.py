"""Whether a metadata URI holds a cluster, found out without creating anything there.

Clients (the Python API, the shell, ``bench``, ``autorecovery``) and bookies join a cluster;
only ``initnewcluster`` and ``ledgerstore standalone`` create one. A mistyped URI must therefore
end in one :class:`~ledgerstore.errors.NoClusterError` naming ``initnewcluster``, leaving no
sqlite file or folder, no znode and no etcd key behind: the sqlite path is checked before the
store is opened (sqlite creates its file on connect), and the instance id is read, never
written, once it is open.
"""

from __future__ import annotations

import os

from ledgerstore.api import MetadataStore
from ledgerstore.errors import NoClusterError
from ledgerstore.meta.bookies import ClusterManager


def no_cluster(uri: str) -> NoClusterError:
    """The error for ``uri`` holding no cluster, saying how to create one."""
    return NoClusterError(f"no cluster is initialised at {uri}: check the URI, or create one with "
                          f"'ledgerstore shell --metadata {uri} initnewcluster' (ledgerstore standalone creates its own)")


def refuse_missing_sqlite_file(uri: str) -> None:
    """A sqlite store creates its file on connect: refuse a path that does not exist before that,
    so a mistyped path leaves no empty database behind."""
    scheme, _, rest = uri.partition("://")
    if scheme == "sqlite":
        path = rest.partition("?")[0]
        if path and path != ":memory:" and not os.path.exists(path):
            raise no_cluster(uri)


async def require_cluster(store: MetadataStore, uri: str) -> str:
    """The cluster instance id at ``uri``; NoClusterError when none was initialised there.

    Call :func:`refuse_missing_sqlite_file` before starting ``store``."""
    iid = await ClusterManager(store).instance_id()
    if iid is None:
        raise no_cluster(uri)
    return iid
