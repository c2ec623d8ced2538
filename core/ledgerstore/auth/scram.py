"""The server side of a SCRAM exchange (RFC 5802, with RFC 7677's SHA-256 and SHA-512): pure
functions of the messages and the credential store, no sockets.

One :class:`ScramServer` per exchange::

    client-first   n,,n=user,r=<client nonce>                  -> server.first(message)
    server-first   r=<client nonce><server nonce>,s=<salt>,i=<iterations>
    client-final   c=biws,r=<both nonces>,p=<ClientProof>      -> server.final(message)
    server-final   v=<ServerSignature>

The proof is verified as the RFC says: ``ClientSignature = HMAC(StoredKey, AuthMessage)``,
``ClientKey = ClientProof XOR ClientSignature``, and ``H(ClientKey)`` must equal ``StoredKey``
(compared with :func:`hmac.compare_digest`). Channel binding is not offered (the GS2 header must be
``n`` or ``y``), nor extensions such as Kafka's ``tokenauth`` (delegation tokens). An unknown user
gets a server-first message like anyone's (from the store's decoy) and fails at the proof, with
the same message as a wrong password.

The client-final message must carry the exchange's nonce (client's and server's); the one other
form accepted is the client's nonce followed by that, which librdkafka before 2.6.1 sends
(confluentinc/librdkafka#4895; Debian's kcat links 2.0.2). It still holds the whole fresh server
nonce, and the proof covers the message as sent, so a replayed exchange still fails; Kafka's
brokers since 3.8.1 accept it the same way. Every failure is an :class:`AuthenticationError` whose
message names no password or proof.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Callable

from ledgerstore.auth.credentials import MECHANISMS, CredentialStore, ScramCredential
from ledgerstore.errors import AuthenticationError

__all__ = ["ScramServer", "parse_plain"]

#: what a failed proof, a wrong password and an unknown user are all answered with
INVALID_CREDENTIALS = "authentication failed: invalid user name or password"


def _fresh_nonce() -> str:
    return secrets.token_urlsafe(24)


def _attributes(message: str, what: str) -> list[tuple[str, str]]:
    """``message``'s ``k=v`` attributes, in order (a value may itself hold ``=``)."""
    out = []
    for part in message.split(","):
        key, eq, value = part.partition("=")
        if not key.isalnum() or not eq:
            raise AuthenticationError(f"SCRAM {what} message is malformed: an attribute is not 'x=value'")
        out.append((key, value))
    return out


def _unescape_name(name: str) -> str:
    """A ``saslname`` with RFC 5802's escapes (``=2C`` for ``,``, ``=3D`` for ``=``) undone."""
    if name.replace("=2C", "").replace("=3D", "").count("="):
        raise AuthenticationError("SCRAM client-first message is malformed: a bad '=' escape in the user name")
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """One SCRAM exchange on the server side for ``mechanism`` (``SCRAM-SHA-256`` or ``-512``).

    ``nonce`` makes the server's nonce (random by default; a test passes RFC 7677's)."""

    def __init__(self, store: CredentialStore, mechanism: str, nonce: Callable[[], str] = _fresh_nonce) -> None:
        if mechanism not in MECHANISMS:
            raise AuthenticationError(f"SCRAM mechanism {mechanism!r} is not served (one of {', '.join(MECHANISMS)})")
        self.store = store
        self.mechanism = mechanism
        self.digest = MECHANISMS[mechanism]
        self._nonce = nonce
        self.user: str | None = None
        self._credential: ScramCredential | None = None
        self._known = False
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._client_nonce = ""
        self._combined_nonce = ""
        self.done = False

    def first(self, client_first: bytes) -> bytes:
        """Answer the client-first message with the server-first message."""
        if self._server_first:
            raise AuthenticationError("SCRAM client-first message sent twice")
        try:
            text = client_first.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationError("SCRAM client-first message is not UTF-8") from None
        cbind, _, rest = text.partition(",")
        authzid, comma, bare = rest.partition(",")
        if not comma:
            raise AuthenticationError("SCRAM client-first message is malformed: no GS2 header")
        if cbind.startswith("p="):
            raise AuthenticationError("SCRAM channel binding is not supported: use the 'n' GS2 flag")
        if cbind not in ("n", "y"):
            raise AuthenticationError("SCRAM client-first message is malformed: the GS2 flag is not n, y or p")
        attrs = _attributes(bare, "client-first")
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
            raise AuthenticationError("SCRAM client-first message is malformed: expected n=<user>,r=<nonce>")
        if len(attrs) > 2:
            raise AuthenticationError("SCRAM extensions (such as delegation tokens) are not supported")
        user = _unescape_name(attrs[0][1])
        if authzid and authzid != f"a={attrs[0][1]}":
            raise AuthenticationError("SCRAM authorization as another user is not supported")
        self.user = user
        credential = self.store.lookup(user, self.mechanism)
        self._known = credential is not None
        self._credential = credential if credential is not None else self.store.decoy(user, self.mechanism)
        self._gs2_header = f"{cbind},{authzid},"
        self._client_first_bare = bare
        self._client_nonce = attrs[1][1]
        self._combined_nonce = self._client_nonce + self._nonce()
        salt = base64.b64encode(self._credential.salt).decode("ascii")
        self._server_first = f"r={self._combined_nonce},s={salt},i={self._credential.iterations}"
        return self._server_first.encode("utf-8")

    def final(self, client_final: bytes) -> bytes:
        """Verify the client-final message's proof and answer the server-final message; an
        :class:`AuthenticationError` if the proof (or anything else) does not check out."""
        if not self._server_first or self.done:
            raise AuthenticationError("SCRAM client-final message out of order")
        self.done = True
        assert self._credential is not None
        try:
            text = client_final.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationError("SCRAM client-final message is not UTF-8") from None
        without_proof, _, proof_part = text.rpartition(",p=")
        attrs = _attributes(without_proof, "client-final")
        if len(attrs) < 2 or attrs[0][0] != "c" or attrs[1][0] != "r":
            raise AuthenticationError("SCRAM client-final message is malformed: expected c=..,r=..,p=..")
        if len(attrs) > 2:
            raise AuthenticationError("SCRAM extensions (such as delegation tokens) are not supported")
        try:
            binding = base64.b64decode(attrs[0][1], validate=True)
            proof = base64.b64decode(proof_part, validate=True)
        except binascii.Error:
            raise AuthenticationError("SCRAM client-final message is malformed: c or p is not base64") from None
        if binding != self._gs2_header.encode("utf-8"):
            raise AuthenticationError("SCRAM channel binding does not match the client-first message's GS2 header")
        nonce = attrs[1][1].encode()
        if not (hmac.compare_digest(nonce, self._combined_nonce.encode())
                or hmac.compare_digest(nonce, (self._client_nonce + self._combined_nonce).encode())):
            raise AuthenticationError("SCRAM client-final message carries another nonce than the exchange's")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        stored_key = self._credential.stored_key
        client_signature = hmac.digest(stored_key, auth_message, self.digest)
        if len(proof) != len(client_signature):
            raise AuthenticationError(INVALID_CREDENTIALS)
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        verified = hmac.compare_digest(hashlib.new(self.digest, client_key).digest(), stored_key)
        if not verified or not self._known:
            raise AuthenticationError(INVALID_CREDENTIALS)
        server_signature = hmac.digest(self._credential.server_key, auth_message, self.digest)
        return b"v=" + base64.b64encode(server_signature)


def parse_plain(token: bytes) -> tuple[str, str]:
    """``(user, password)`` of a SASL/PLAIN message (RFC 4616: ``[authzid] NUL authcid NUL passwd``);
    an authorization identity other than the user is refused."""
    try:
        authzid, user, password = token.decode("utf-8").split("\0")
    except (UnicodeDecodeError, ValueError):
        raise AuthenticationError("SASL/PLAIN message is malformed: expected [authzid] NUL user NUL password") from None
    if authzid and authzid != user:
        raise AuthenticationError("SASL/PLAIN authorization as another user is not supported")
    if not user or not password:
        raise AuthenticationError("SASL/PLAIN message is malformed: an empty user name or password")
    return user, password
