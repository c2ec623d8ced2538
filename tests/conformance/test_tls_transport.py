"""The transport conformance suite for ``tcp+tls``, with a throwaway CA made by the openssl CLI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ledgerstore.testing import TransportConformance
from ledgerstore_tcp.tls import TlsTcpTransport

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(directory: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, as PEM files."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=ledgerstore test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
    for name, ext in (("server", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        (directory / f"{name}.ext").write_text(ext)
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=directory)
    return {name: str(directory / name) for name in
            ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


class TestTlsTransport(TransportConformance):
    """Server authenticated by the client; the client presents no certificate."""

    @pytest.fixture
    def server_transport_factory(self, pki):
        return lambda: TlsTcpTransport(max_frame_size=self.max_frame_size,
                                       cert_file=pki["server.pem"], key_file=pki["server.key"])

    @pytest.fixture
    def transport_factory(self, pki):
        return lambda: TlsTcpTransport(max_frame_size=self.max_frame_size, ca_file=pki["ca.pem"])

    @pytest.fixture
    def listen_address(self):
        return "tcp+tls://127.0.0.1:0"


class TestMutualTlsTransport(TestTlsTransport):
    """Both sides authenticated: the bookie requires a client certificate signed by the CA."""

    @pytest.fixture
    def server_transport_factory(self, pki):
        return lambda: TlsTcpTransport(max_frame_size=self.max_frame_size, cert_file=pki["server.pem"],
                                       key_file=pki["server.key"], ca_file=pki["ca.pem"],
                                       require_client_cert=True)

    @pytest.fixture
    def transport_factory(self, pki):
        return lambda: TlsTcpTransport(max_frame_size=self.max_frame_size, ca_file=pki["ca.pem"],
                                       client_cert_file=pki["client.pem"], client_key_file=pki["client.key"],
                                       server_hostname="localhost")
