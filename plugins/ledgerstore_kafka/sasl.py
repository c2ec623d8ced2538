"""SASL on a Kafka connection: which mechanisms are enabled, and one connection's exchange.

With ``sasl_mechanisms`` set, a connection must authenticate before anything but ApiVersions,
SaslHandshake and SaslAuthenticate is served (the broker closes it otherwise, as Kafka's do):

1. SaslHandshake names a mechanism; one not enabled is answered ``UNSUPPORTED_SASL_MECHANISM``
   with the enabled list, and the connection closes.
2. The mechanism's tokens follow, in SaslAuthenticate requests (after a v1 handshake) or unframed
   (after v0): PLAIN sends ``[authzid] NUL user NUL password`` once; SCRAM-SHA-256/512 runs
   RFC 5802's two round trips (:class:`ledgerstore.auth.scram.ScramServer`).
3. A refused user is answered ``SASL_AUTHENTICATION_FAILED`` with a message (never the password),
   and the connection closes; the broker serves the others on.

The users are those of the credential file (:mod:`ledgerstore.auth.credentials`), the one the
admin HTTP server reads for HTTP Basic. A PLAIN password is checked by deriving its SCRAM keys in
a worker thread (PBKDF2 would otherwise hold the event loop for every connection).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from ledgerstore.auth import MECHANISMS, CredentialStore, ScramServer, parse_plain
from ledgerstore.auth.scram import INVALID_CREDENTIALS
from ledgerstore.errors import AuthenticationError, ConfigError
from ledgerstore_kafka.codec import Reader
from ledgerstore_kafka.sasl_messages import (
    SaslApiKey,
    SaslError,
    decode_sasl_authenticate,
    decode_sasl_handshake,
    encode_sasl_authenticate,
    encode_sasl_handshake,
)

__all__ = ["PRE_AUTHENTICATION_APIS", "SaslSession", "SaslSettings", "sasl_settings"]

log = logging.getLogger(__name__)

#: the mechanisms that can be enabled
SERVED_MECHANISMS = ("PLAIN", *MECHANISMS)

#: what a connection may ask before it has authenticated: ApiVersions and the SASL requests
PRE_AUTHENTICATION_APIS = frozenset({18, SaslApiKey.SASL_HANDSHAKE, SaslApiKey.SASL_AUTHENTICATE})

#: the largest unframed token read after a v0 handshake (a SCRAM message is a few hundred bytes)
MAX_RAW_TOKEN = 64 * 1024


@dataclasses.dataclass(frozen=True)
class SaslSettings:
    """The enabled mechanisms, in the order a handshake lists them, and the users."""

    mechanisms: tuple[str, ...]
    users: CredentialStore


def check_mechanisms(mechanisms: list[str], credentials_file: str) -> None:
    """``ValueError`` (the options' way to refuse a combination) unless the ``[kafka]`` SASL options agree."""
    unknown = [m for m in mechanisms if m not in SERVED_MECHANISMS]
    if unknown:
        raise ValueError(f"sasl_mechanisms: {unknown[0]!r} is not served (one of {', '.join(SERVED_MECHANISMS)})")
    if len(set(mechanisms)) != len(mechanisms):
        raise ValueError("sasl_mechanisms names a mechanism twice")
    if mechanisms and not credentials_file:
        raise ValueError("sasl_mechanisms needs credentials_file (users added with `ledgerstore credentials add`)")
    if credentials_file and not mechanisms:
        raise ValueError("credentials_file is read only for SASL: set sasl_mechanisms too, e.g. [\"SCRAM-SHA-256\"]")


def sasl_settings(mechanisms: list[str], credentials_file: str) -> SaslSettings | None:
    """The listener's SASL settings (``None``: SASL off); :class:`ConfigError` in one line if
    the credential file does not load."""
    if not mechanisms:
        return None
    try:
        check_mechanisms(mechanisms, credentials_file)
    except ValueError as exc:
        raise ConfigError(f"kafka {exc}") from None
    return SaslSettings(tuple(mechanisms), CredentialStore(credentials_file, "kafka credentials_file"))


class SaslSession:
    """One connection's SASL state: the mechanism chosen, the exchange under way, and the user
    once authenticated. After :attr:`closing` is set the connection answers what it has and closes."""

    def __init__(self, settings: SaslSettings, peer: object) -> None:
        self.settings = settings
        self.peer = peer
        self.mechanism: str | None = None
        self.user: str | None = None
        self._scram: ScramServer | None = None
        self._plain_user: str | None = None
        #: the tokens come unframed (after a v0 handshake)
        self.unframed = False
        self.closing = False

    @property
    def authenticated(self) -> bool:
        return self.user is not None

    def allows(self, api_key: int) -> bool:
        """Whether a request with ``api_key`` may be served now."""
        return self.authenticated or api_key in PRE_AUTHENTICATION_APIS

    async def handle(self, api_key: int, r: Reader, version: int) -> bytes:
        """Answer a SaslHandshake or SaslAuthenticate request."""
        if api_key == SaslApiKey.SASL_HANDSHAKE:
            return self.handshake(decode_sasl_handshake(r, version), version)
        token = decode_sasl_authenticate(r, version)
        if self.mechanism is None or self.unframed or self.authenticated:
            self.closing = True
            return encode_sasl_authenticate(version, SaslError.ILLEGAL_SASL_STATE,
                                            "SaslAuthenticate is expected once, after a SaslHandshake v1", b"")
        try:
            answer = await self.step(token)
        except AuthenticationError as exc:
            self.closing = True
            return encode_sasl_authenticate(version, SaslError.SASL_AUTHENTICATION_FAILED, str(exc), b"")
        return encode_sasl_authenticate(version, 0, None, answer)

    def handshake(self, mechanism: str, version: int) -> bytes:
        enabled = self.settings.mechanisms
        if self.mechanism is not None or self.authenticated:
            self.closing = True
            return encode_sasl_handshake(version, SaslError.ILLEGAL_SASL_STATE, enabled)
        if mechanism not in enabled:
            self.closing = True
            log.info("SASL from %s: mechanism %r is not enabled (%s)", self.peer, mechanism[:40], ", ".join(enabled))
            return encode_sasl_handshake(version, SaslError.UNSUPPORTED_SASL_MECHANISM, enabled)
        self.mechanism = mechanism
        self.unframed = version == 0
        return encode_sasl_handshake(version, 0, enabled)

    async def unframed_token(self, token: bytes) -> bytes | None:
        """The answer to a token sent unframed (after a v0 handshake); ``None`` when the
        exchange failed (Kafka closes such a connection without an answer)."""
        try:
            return await self.step(token)
        except AuthenticationError:
            self.closing = True
            return None

    async def step(self, token: bytes) -> bytes:
        """The mechanism's next answer to ``token``; :class:`AuthenticationError` when refused."""
        try:
            if self.mechanism == "PLAIN":
                return await self._plain(token)
            if self._scram is None:
                assert self.mechanism is not None
                self._scram = ScramServer(self.settings.users, self.mechanism)
                return self._scram.first(token)
            answer = self._scram.final(token)
            self._authenticated(self._scram.user)
            return answer
        except AuthenticationError as exc:
            who = self._scram.user if self._scram is not None else self._plain_user
            log.info("SASL %s from %s refused (user %r): %s", self.mechanism, self.peer, who, exc)
            raise

    async def _plain(self, token: bytes) -> bytes:
        user, password = parse_plain(token)
        self._plain_user = user
        ok = await asyncio.to_thread(self.settings.users.verify_password, user, password)
        if not ok:
            raise AuthenticationError(INVALID_CREDENTIALS)
        self._authenticated(user)
        return b""

    def _authenticated(self, user: str | None) -> None:
        assert user is not None
        self.user = user
        log.debug("SASL %s from %s: authenticated as %r", self.mechanism, self.peer, user)
