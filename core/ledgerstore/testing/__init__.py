"""Reusable conformance suites: every backend, first-party or third-party, subclasses these.

Example for a metadata backend::

    from ledgerstore.testing import MetadataStoreConformance

    class TestMyStore(MetadataStoreConformance):
        @pytest.fixture
        def store_factory(self, my_server):
            return lambda: MyStore(f"my://{my_server}/root")

Each suite documents the fixture it needs. The suites drive the async interfaces with
``asyncio.run`` so they need no pytest plugin.
"""

from ledgerstore.testing.metadata import MetadataStoreConformance
from ledgerstore.testing.placement import PlacementPolicyConformance
from ledgerstore.testing.protocol import ProtocolHandlerConformance
from ledgerstore.testing.storage import StorageEngineConformance
from ledgerstore.testing.transport import TransportConformance

__all__ = [
    "MetadataStoreConformance",
    "PlacementPolicyConformance",
    "ProtocolHandlerConformance",
    "StorageEngineConformance",
    "TransportConformance",
]
