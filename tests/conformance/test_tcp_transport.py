import pytest

from ledgerstore.testing import TransportConformance
from ledgerstore_tcp import TcpTransport


class TestTcpTransport(TransportConformance):
    @pytest.fixture
    def transport_factory(self):
        return lambda: TcpTransport(max_frame_size=self.max_frame_size)

    @pytest.fixture
    def listen_address(self):
        return "tcp://127.0.0.1:0"
