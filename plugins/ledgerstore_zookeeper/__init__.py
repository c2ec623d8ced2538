"""ZooKeeper backend of the ``ledgerstore.metadata`` slot (URI scheme ``zk``).

Install with ``pip install 'ledgerstore[zookeeper]'``; see docs/metadata-zookeeper-etcd.md.
"""

from ledgerstore_zookeeper.store import ZooKeeperMetadataStore, parse_zk_uri

__all__ = ["ZooKeeperMetadataStore", "parse_zk_uri"]
