"""ZooKeeper backend of the ``ledgerstore.metadata`` slot (URI scheme ``zk``).

Install ledgerstore with its ``zookeeper`` extra (docs/install.md); see docs/metadata-zookeeper-etcd.md.
"""

from ledgerstore_zookeeper.store import ZooKeeperMetadataStore, parse_zk_uri

__all__ = ["ZooKeeperMetadataStore", "parse_zk_uri"]
