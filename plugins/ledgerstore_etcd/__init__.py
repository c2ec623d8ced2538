"""etcd v3 backend of the ``ledgerstore.metadata`` slot (URI scheme ``etcd``).

Install with ``pip install 'ledgerstore[etcd]'``; see docs/metadata-zookeeper-etcd.md.
"""

from ledgerstore_etcd.store import EtcdMetadataStore, parse_etcd_uri

__all__ = ["EtcdMetadataStore", "parse_etcd_uri"]
