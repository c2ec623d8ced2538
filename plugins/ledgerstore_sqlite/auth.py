"""Credentials of the sqlite metadata server's TCP listener: the secret file and the handshake.

Pure functions over bytes and files, no sockets (the IO is in :mod:`ledgerstore_sqlite.server`
and :mod:`ledgerstore_sqlite.remote`). Server and clients share one secret, read from a file that
only its owner may read (as ssh insists for a private key). The secret never crosses the wire:

1. the server sends ``{"challenge": <server nonce>, "mechanism": "hmac-sha256"}`` as soon as a
   TCP connection is accepted;
2. the client answers ``{"id": 0, "op": "auth", "nonce": <client nonce>, "proof": <client proof>}``
   with ``client proof = HMAC-SHA256(secret, "ledgerstore-sqlite-auth/1 client" || server nonce
   || client nonce)``;
3. the server compares the proof in constant time; on a match it answers ``{"id": 0, "result":
   {"proof": <server proof>}}`` (the same HMAC with ``server`` for ``client``), so the client
   knows the server holds the secret too, and the connection carries requests from then on. On a
   mismatch it answers ``{"id": 0, "error": "unauthorized", "message": ...}`` and hangs up.

Nonces are 32 random bytes, base64 in the frames of :mod:`ledgerstore_sqlite.protocol`. A fresh
server nonce per connection makes a recorded proof useless for another connection. The format is
documented in ``docs/metadata-sqlite.md``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import stat
from typing import Any, Final

from ledgerstore.errors import ConfigError, MetadataError

__all__ = [
    "MECHANISM",
    "MIN_SECRET_BYTES",
    "NONCE_BYTES",
    "MetadataAuthError",
    "challenge",
    "check_auth",
    "client_answer",
    "client_proof",
    "new_nonce",
    "read_secret",
    "server_proof",
    "verify_server",
]

#: the one mechanism this code speaks
MECHANISM: Final = "hmac-sha256"
#: random bytes in each side's nonce
NONCE_BYTES: Final = 32
#: a shorter secret is refused: 16 bytes is 128 bits, as much as a guess should ever have to beat
MIN_SECRET_BYTES: Final = 16
_LABEL: Final = b"ledgerstore-sqlite-auth/1 "


class MetadataAuthError(MetadataError):
    """The sqlite metadata server refused this client's credentials, or a server failed to prove
    it holds the shared secret."""


def read_secret(path: str, what: str = "secret_file") -> bytes:
    """The shared secret in ``path`` (trailing whitespace dropped). :class:`ConfigError` in one
    line if the file is missing, not a regular file, readable or writable by group or others,
    or holds fewer than :data:`MIN_SECRET_BYTES` bytes."""
    path = os.path.expanduser(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(f"{what} {path!r} cannot be opened: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {path!r} is not a regular file")
        if st.st_mode & 0o077:
            raise ConfigError(
                f"{what} {path!r} has permissions {stat.S_IMODE(st.st_mode):04o}, open to other users; "
                f"run 'chmod 600 {path}'"
            )
        data = os.read(fd, 64 * 1024).rstrip()
    finally:
        os.close(fd)
    if len(data) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{what} {path!r} holds {len(data)} bytes; a secret needs at least {MIN_SECRET_BYTES} "
            f"(e.g. 'head -c 32 /dev/urandom | base64 > {path}')"
        )
    return data


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _mac(secret: bytes, side: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, _LABEL + side + server_nonce + client_nonce, hashlib.sha256).digest()


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What the client sends to prove it holds ``secret``."""
    return _mac(secret, b"client", server_nonce, client_nonce)


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What the server sends back to prove it holds ``secret`` too."""
    return _mac(secret, b"server", server_nonce, client_nonce)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(message: dict[str, Any], field: str) -> bytes:
    text = message.get(field)
    if not isinstance(text, str):
        raise MetadataAuthError(f"authentication message has no base64 {field!r}")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise MetadataAuthError(f"authentication field {field!r} is not valid base64") from None


def challenge(server_nonce: bytes) -> dict[str, Any]:
    """The server's first frame on a TCP connection."""
    return {"challenge": _b64(server_nonce), "mechanism": MECHANISM}


def client_answer(secret: bytes, message: dict[str, Any]) -> tuple[dict[str, Any], bytes, bytes]:
    """The client's ``auth`` request for the server's challenge ``message``, and the two nonces.
    :class:`MetadataAuthError` if ``message`` is not a challenge this code speaks."""
    if message.get("mechanism") != MECHANISM:
        raise MetadataAuthError(
            f"the server asks for authentication {message.get('mechanism')!r}; this client speaks {MECHANISM!r}"
        )
    server_nonce = _unb64(message, "challenge")
    client_nonce = new_nonce()
    request = {"id": 0, "op": "auth", "nonce": _b64(client_nonce),
               "proof": _b64(client_proof(secret, server_nonce, client_nonce))}
    return request, server_nonce, client_nonce


def check_auth(secret: bytes, server_nonce: bytes, message: dict[str, Any]) -> dict[str, Any]:
    """The server's answer to the client's ``auth`` request: the server proof on success.
    :class:`MetadataAuthError` (whose text is what the client is told) otherwise."""
    if message.get("op") != "auth":
        raise MetadataAuthError(
            f"the first request on a TCP connection must be 'auth', not {message.get('op')!r}"
        )
    client_nonce = _unb64(message, "nonce")
    if len(client_nonce) != NONCE_BYTES:
        raise MetadataAuthError(f"the client nonce must be {NONCE_BYTES} bytes, not {len(client_nonce)}")
    proof = _unb64(message, "proof")
    if not hmac.compare_digest(proof, client_proof(secret, server_nonce, client_nonce)):
        raise MetadataAuthError("wrong secret: the proof does not match this server's secret_file")
    return {"id": 0, "result": {"proof": _b64(server_proof(secret, server_nonce, client_nonce))}}


def verify_server(secret: bytes, server_nonce: bytes, client_nonce: bytes, message: dict[str, Any]) -> None:
    """Check the server's answer to ``auth``: :class:`MetadataAuthError` if it refused the client
    or does not prove it holds ``secret``."""
    if "error" in message:
        raise MetadataAuthError(f"the sqlite metadata server refused the credentials: {message.get('message')}")
    result = message.get("result")
    if not isinstance(result, dict):
        raise MetadataAuthError("the sqlite metadata server answered 'auth' without a result")
    if not hmac.compare_digest(_unb64(result, "proof"), server_proof(secret, server_nonce, client_nonce)):
        raise MetadataAuthError(
            "the sqlite metadata server does not hold this client's secret (its proof does not match); "
            "check that both use the same secret_file"
        )
