"""SaslHandshake (17) and SaslAuthenticate (36) at their non-flexible versions (0 and 1), as
Kafka's message schemas define them. Decoding and encoding only; the exchange a connection goes
through is :mod:`ledgerstore_kafka.sasl`.

SaslHandshake v0 and v1 carry the same fields; v0 tells the broker that the SASL tokens follow
unframed (a 4-byte size and the token, no request header), v1 that they come in SaslAuthenticate
requests, which can carry an error code and message back.
"""

from __future__ import annotations

from collections.abc import Sequence

from ledgerstore_kafka.codec import Reader, Writer

__all__ = ["SASL_SUPPORTED", "SaslApiKey", "SaslError"]


class SaslApiKey:
    """Kafka's API keys of the SASL requests."""

    SASL_HANDSHAKE = 17
    SASL_AUTHENTICATE = 36


class SaslError:
    """Kafka's error codes of a SASL exchange."""

    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    SASL_AUTHENTICATION_FAILED = 58


#: API key -> (lowest, highest) version served, listed by ApiVersions only when SASL is on
SASL_SUPPORTED: dict[int, tuple[int, int]] = {
    SaslApiKey.SASL_HANDSHAKE: (0, 1),
    SaslApiKey.SASL_AUTHENTICATE: (0, 1),
}


def decode_sasl_handshake(r: Reader, version: int) -> str:
    """The mechanism a SaslHandshake asks for."""
    return r.string()


def encode_sasl_handshake(version: int, error: int, mechanisms: Sequence[str]) -> bytes:
    """SaslHandshake response: error code and the mechanisms enabled."""
    w = Writer().int16(error).array_length(len(mechanisms))
    for m in mechanisms:
        w.string(m)
    return w.bytes()


def decode_sasl_authenticate(r: Reader, version: int) -> bytes:
    """The SASL token a SaslAuthenticate carries."""
    return r.nullable_bytes() or b""


def encode_sasl_authenticate(version: int, error: int, message: str | None, token: bytes) -> bytes:
    """SaslAuthenticate response: error code and message, the server's token, and (v1) the
    session lifetime, 0: the session never needs to authenticate again."""
    w = Writer().int16(error).nullable_string(message).nullable_bytes(token)
    if version >= 1:
        w.int64(0)
    return w.bytes()
