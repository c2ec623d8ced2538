"""ledgerstore-memory: an in-process ``memory://NAME`` MetadataStore for notebooks and tests.

Installed, it registers ``memory`` in the ``ledgerstore.metadata`` entry-point namespace, so any
ledgerstore configuration can say ``metadata = "memory://my-test"``.
"""

from ledgerstore_memory.store import MemoryMetadataStore, drop_namespace, namespace_names

__all__ = ["MemoryMetadataStore", "drop_namespace", "namespace_names"]
__version__ = "0.1.0"
