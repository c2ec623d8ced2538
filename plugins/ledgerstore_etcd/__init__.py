"""etcd v3 backend of the ``ledgerstore.metadata`` slot (URI scheme ``etcd``).

Install ledgerstore with its ``etcd`` extra (docs/install.md); see docs/metadata-zookeeper-etcd.md.
"""

from ledgerstore_etcd.store import EtcdMetadataStore, parse_etcd_uri

__all__ = ["EtcdMetadataStore", "parse_etcd_uri"]
