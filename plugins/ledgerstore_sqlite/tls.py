"""TLS for the sqlite metadata server's TCP listener: the contexts of the server and its clients.

TLS is optional and sits under the handshake of :mod:`ledgerstore_sqlite.auth`: the shared secret
still authenticates every client; TLS adds confidentiality and integrity to what follows, and lets
a client check the server's certificate (hostname included) against the CAs it trusts. TLS 1.2 is
the minimum. See ``docs/metadata-sqlite.md``.
"""

from __future__ import annotations

import os
import ssl

from ledgerstore.errors import ConfigError

__all__ = ["client_context", "server_context"]


def _readable(what: str, path: str) -> str:
    path = os.path.expanduser(path)
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise ConfigError(f"{what} {path!r} is not a readable file")
    return path


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The listener's context: its certificate chain and private key (PEM files)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    cert, key = _readable("--tls-cert-file", cert_file), _readable("--tls-key-file", key_file)
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"--tls-cert-file {cert!r} and --tls-key-file {key!r}: cannot load them ({exc}); both must be PEM "
            "and belong together"
        ) from None
    return ctx


def client_context(ca_file: str) -> ssl.SSLContext:
    """A client's context: it trusts the CAs in ``ca_file`` and checks the server's hostname."""
    path = _readable("metadata option 'ca_file'", ca_file)
    try:
        ctx = ssl.create_default_context(cafile=path)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"metadata option 'ca_file' {path!r} holds no PEM certificates: {exc}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx
