"""Who may call the bookie's admin HTTP server: a bearer token, a user of the credential file
(HTTP Basic), a client certificate, or nobody.

The rules (``[bookie.http]`` in the bookie's config, see :class:`ledgerstore.config.AdminHttpConfig`):

- a state-changing request (any method but GET/HEAD, and the few GET routes registered as
  protected) needs credentials: ``Authorization: Bearer <token>`` matching the token read once at
  start from ``token_file``, ``Authorization: Basic <base64 of user:password>`` for a user of
  ``credentials_file`` (:mod:`ledgerstore.auth.credentials`, the store the Kafka listener's SASL
  reads too), or a client certificate signed by ``tls_ca_file`` (mutual TLS);
- a read answers anonymously when ``allow_anonymous_read`` is true (the default, as in
  BookKeeper, whose admin server has no authentication and whose metrics Prometheus scrapes
  without credentials) or when its path is one of ``anonymous_paths`` (probes);
- a presented but wrong credential is refused with 401 even where anonymity would have been
  allowed, so a misconfigured client is noticed instead of silently downgraded;
- with no token, no credential file and no client CA configured, requests that need credentials answer 403 with
  a message saying how to configure them.

The token is compared with :func:`hmac.compare_digest` and never logged; a Basic password is
checked by deriving its SCRAM keys with the user's salt (:meth:`CredentialStore.verify_password`);
``Authorization`` is not part of any log line or error message.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hmac
import logging
import os
import ssl
import stat
from pathlib import Path
from typing import Any

from ledgerstore.auth.credentials import CredentialStore
from ledgerstore.config import AdminHttpConfig
from ledgerstore.errors import ConfigError

log = logging.getLogger(__name__)

#: query parameters whose values are secrets: refused in URLs, masked in access logs
SECRET_PARAMS = frozenset({"password", "passwd", "token", "access_token", "secret"})

HOW_TO_CONFIGURE = (
    "the admin HTTP server has no credentials configured, so it refuses this request; set "
    "[bookie.http] token_file = \"/etc/ledgerstore/admin-token\" (a file holding a random token) and send "
    "'Authorization: Bearer <token>', or set credentials_file (users added with `ledgerstore credentials add`) "
    "and send HTTP Basic, or set tls_cert_file, tls_key_file and tls_ca_file to accept client "
    "certificates"
)


def read_token_file(path: str | os.PathLike[str], what: str = "admin HTTP token_file") -> str:
    """The token in ``path`` (surrounding whitespace stripped); :class:`ConfigError` if the file
    is missing, unreadable, empty or not one line of text."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what} {str(path)!r} cannot be read: {exc}") from None
    token = text.strip()
    if not token:
        raise ConfigError(f"{what} {str(path)!r} is empty; put a random token in it, e.g. `openssl rand -hex 32 > FILE`")
    if any(c.isspace() for c in token) or not token.isprintable():
        raise ConfigError(f"{what} {str(path)!r} must hold one token: no spaces, line breaks or control characters")
    return token


def bearer_headers(token_file: str | os.PathLike[str] | None) -> dict[str, str]:
    """Request headers for a client of the admin API (``{}`` without a token file)."""
    if not token_file:
        return {}
    return {"Authorization": f"Bearer {read_token_file(token_file, 'admin token file')}"}


@dataclasses.dataclass(frozen=True)
class Decision:
    """Outcome of :meth:`AdminAuth.check`: ``status`` 0 lets the request through."""

    status: int = 0
    message: str = ""
    #: how the caller authenticated: "token", "user NAME", "certificate" or "anonymous"
    principal: str = "anonymous"


class AdminAuth:
    """The admin HTTP server's credentials and its decision for each request."""

    def __init__(self, config: AdminHttpConfig) -> None:
        self.config = config
        self._token: bytes | None = None
        if config.token_file:
            self._token = read_token_file(config.token_file).encode()
            _warn_if_readable_by_others(config.token_file)
        self.users = CredentialStore(config.credentials_file, "admin HTTP credentials_file") if config.credentials_file else None
        self.ssl_context = _server_context(config) if config.tls_cert_file else None
        self.client_certificates = bool(config.tls_ca_file)
        self._anonymous_paths = frozenset(p.rstrip("/") or "/" for p in config.anonymous_paths)

    @property
    def has_credentials(self) -> bool:
        """True when a token, a credential file or a client-certificate CA is configured."""
        return self._token is not None or self.users is not None or self.client_certificates

    @property
    def challenge(self) -> str:
        """The ``WWW-Authenticate`` value of a 401: Bearer, and Basic when users are configured."""
        realm = 'realm="ledgerstore-admin"'
        return f"Bearer {realm}, Basic {realm}" if self.users is not None else f"Bearer {realm}"

    def check(self, path: str, needs_credentials: bool, headers: dict[str, str], peercert: Any) -> Decision:
        """Decide whether a request may run. ``headers`` have lower-case names; ``peercert`` is
        the TLS peer certificate (non-empty only when it was verified against the CA)."""
        principal = "anonymous"
        if self.client_certificates and peercert:
            principal = "certificate"
        authorization = headers.get("authorization")
        if authorization is not None:
            scheme, _, presented = authorization.partition(" ")
            if scheme.lower() == "basic" and presented.strip():
                user = self._basic_user(presented.strip())
                if isinstance(user, Decision):
                    return user
                principal = f"user {user}"
            elif scheme.lower() != "bearer" or not presented.strip():
                return Decision(401, "the Authorization header must be 'Bearer <token>' or 'Basic <user:password>'")
            elif self._token is None:
                return Decision(401, "a bearer token was sent but this bookie has no token_file configured")
            elif not hmac.compare_digest(presented.strip().encode("latin-1", "replace"), self._token):
                return Decision(401, "wrong bearer token")
            else:
                principal = "token"
        if principal != "anonymous":
            return Decision(0, "", principal)
        if not needs_credentials and (self.config.allow_anonymous_read or path in self._anonymous_paths):
            return Decision(0, "", principal)
        if not self.has_credentials:
            return Decision(403, HOW_TO_CONFIGURE)
        what = "this request changes state" if needs_credentials else "anonymous reads are disabled (allow_anonymous_read = false)"
        ways = ["'Authorization: Bearer <token>'" if self._token is not None else "",
                "HTTP Basic with a user of credentials_file" if self.users is not None else "",
                "a client certificate" if self.client_certificates else ""]
        return Decision(401, f"{what}: send " + " or ".join(w for w in ways if w))

    def _basic_user(self, encoded: str) -> str | Decision:
        """The user an ``Authorization: Basic`` value authenticates, or the 401 to answer."""
        if self.users is None:
            return Decision(401, "HTTP Basic credentials were sent but this bookie has no credentials_file configured")
        try:
            name, colon, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return Decision(401, "the Basic credentials are not base64 of UTF-8 'user:password'")
        if not colon or not name:
            return Decision(401, "the Basic credentials are not base64 of UTF-8 'user:password'")
        if not self.users.verify_password(name, password):
            return Decision(401, "wrong user name or password")
        return name


def _warn_if_readable_by_others(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("admin HTTP token_file %s is readable by other users (mode %o); chmod 600 it",
                    path, stat.S_IMODE(mode))


def _server_context(config: AdminHttpConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"admin HTTP tls_cert_file {config.tls_cert_file!r} / tls_key_file "
                          f"{config.tls_key_file!r}: {exc}") from None
    if config.tls_ca_file:
        try:
            ctx.load_verify_locations(cafile=config.tls_ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"admin HTTP tls_ca_file {config.tls_ca_file!r}: {exc}") from None
        # optional: a client without a certificate may still present the token; one with a
        # certificate the CA did not sign fails the handshake
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx
