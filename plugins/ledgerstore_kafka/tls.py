"""TLS for the Kafka listener: the server context built from the handler's ``tls_*`` options,
as the admin HTTP server builds its own (a certificate and key, and a CA whose clients' certificates
it then requires: Kafka's ``ssl.client.auth=required``). Files that do not load are refused in one
line naming the option."""

from __future__ import annotations

import ssl

from ledgerstore.errors import ConfigError

__all__ = ["server_context"]


def server_context(cert_file: str, key_file: str, ca_file: str) -> ssl.SSLContext | None:
    """The listener's TLS context; ``None`` without a certificate (plaintext)."""
    if not cert_file and not key_file:
        if ca_file:
            raise ConfigError("kafka tls_ca_file needs tls_cert_file and tls_key_file (the broker's own certificate)")
        return None
    if not cert_file or not key_file:
        raise ConfigError("kafka TLS needs both tls_cert_file and tls_key_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"kafka tls_cert_file {cert_file!r} / tls_key_file {key_file!r}: {exc}") from None
    if ca_file:
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"kafka tls_ca_file {ca_file!r}: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
