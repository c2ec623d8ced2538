"""The credential store: users and their salted SCRAM credentials, in one file that the admin HTTP
server (HTTP Basic) and the Kafka listener (SASL/PLAIN and SCRAM) both read.

The file holds no password, only what RFC 5802 (SCRAM) keeps of one, for SCRAM-SHA-256 and
SCRAM-SHA-512 (RFC 7677): a random salt, the iteration count, ``StoredKey = H(ClientKey)`` and
``ServerKey``, where ``SaltedPassword = PBKDF2(password, salt, iterations)``,
``ClientKey = HMAC(SaltedPassword, "Client Key")`` and ``ServerKey = HMAC(SaltedPassword, "Server Key")``.
One line per user and mechanism, blank lines and ``#`` comments allowed::

    # ledgerstore credentials v1: NAME MECHANISM ITERATIONS SALT STORED_KEY SERVER_KEY (base64)
    alice SCRAM-SHA-256 4096 9cM1...== kZr0...= 3P0h...=
    alice SCRAM-SHA-512 4096 cD8q...== W1yq...== 6hSx...==

The file must be readable by its owner only (mode 0600, as ``ledgerstore credentials add``
writes it): a file that group or others may read, a line that does not parse, or a user named
twice for one mechanism is refused with one :class:`ConfigError` naming the file and the line.

A plain password (HTTP Basic, SASL/PLAIN) is verified by deriving its keys with the stored salt
and iterations and comparing ``StoredKey`` with :func:`hmac.compare_digest`; an unknown user costs
the same derivation against a made-up credential, so the time taken does not tell who exists.
:class:`CredentialStore` reads the file again when it changes on disk (a user added with the CLI
is accepted without a restart); a change that does not load is logged and the previous users
stay in force. The SCRAM exchange itself is :mod:`ledgerstore.auth.scram`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from ledgerstore.errors import ConfigError

__all__ = [
    "DEFAULT_ITERATIONS", "MECHANISMS", "CredentialStore", "ScramCredential", "check_user_name", "derive",
    "format_credentials", "read_credentials", "write_credentials",
]

log = logging.getLogger(__name__)

#: SCRAM mechanism -> hash function name (RFC 5802's SHA-1 variant is not offered: Kafka's brokers
#: neither offer it)
MECHANISMS: dict[str, str] = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}

#: RFC 7677 asks for at least 4096 iterations; Kafka refuses fewer too
DEFAULT_ITERATIONS = 4096
MIN_ITERATIONS = 4096
#: beyond this a single PLAIN or HTTP Basic check would hold the event loop for seconds
MAX_ITERATIONS = 1_000_000

SALT_BYTES = 32

#: a user name: no spaces (the file's separator), no ',' or '=' (SCRAM's attribute syntax) and no ':'
#: (HTTP Basic's separator); 1 to 128 characters
_NAME = re.compile(r"[A-Za-z0-9._@+-]{1,128}")

HEADER = "# ledgerstore credentials v1: NAME MECHANISM ITERATIONS SALT STORED_KEY SERVER_KEY (base64)"


@dataclasses.dataclass(frozen=True)
class ScramCredential:
    """What a server keeps of one user's password for one SCRAM mechanism (RFC 5802 section 3)."""

    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def verify_password(self, password: str) -> bool:
        """Whether ``password`` derives this credential's ``StoredKey`` (constant-time compare)."""
        return hmac.compare_digest(derive(self.mechanism, password, self.salt, self.iterations).stored_key,
                                   self.stored_key)


def check_user_name(name: str) -> str:
    """``name`` if it may name a user, else :class:`ConfigError` saying what is allowed."""
    if not _NAME.fullmatch(name):
        raise ConfigError(f"user name {name!r} is not allowed: use 1 to 128 of A-Z a-z 0-9 . _ @ + -")
    return name


def derive(mechanism: str, password: str, salt: bytes, iterations: int) -> ScramCredential:
    """The SCRAM credential of ``password`` with ``salt`` and ``iterations`` (RFC 5802: Hi() is
    PBKDF2 with HMAC over the mechanism's hash; the password is taken as UTF-8, without SASLprep,
    as Kafka's clients send it)."""
    digest = MECHANISMS[mechanism]
    salted = hashlib.pbkdf2_hmac(digest, password.encode("utf-8"), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", digest)
    return ScramCredential(mechanism, salt, iterations, hashlib.new(digest, client_key).digest(),
                           hmac.digest(salted, b"Server Key", digest))


def new_credentials(password: str, iterations: int = DEFAULT_ITERATIONS) -> dict[str, ScramCredential]:
    """A fresh credential for every mechanism of :data:`MECHANISMS`, each with its own random salt."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ConfigError(f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, not {iterations}")
    return {m: derive(m, password, secrets.token_bytes(SALT_BYTES), iterations) for m in MECHANISMS}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def format_credentials(users: dict[str, dict[str, ScramCredential]]) -> str:
    """The file's text for ``users`` (name -> mechanism -> credential), sorted by name."""
    lines = [HEADER]
    for name in sorted(users):
        for mechanism in sorted(users[name]):
            c = users[name][mechanism]
            lines.append(f"{name} {mechanism} {c.iterations} {_b64(c.salt)} {_b64(c.stored_key)} {_b64(c.server_key)}")
    return "\n".join(lines) + "\n"


def parse_credentials(text: str, where: str) -> dict[str, dict[str, ScramCredential]]:
    """The users of a credential file's ``text``; :class:`ConfigError` naming ``where`` and the
    line for anything that does not parse."""
    users: dict[str, dict[str, ScramCredential]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        at = f"{where} line {number}"
        fields = line.split()
        if len(fields) != 6:
            raise ConfigError(f"{at}: expected 6 fields (NAME MECHANISM ITERATIONS SALT STORED_KEY SERVER_KEY), "
                              f"found {len(fields)}")
        name, mechanism, iterations, salt, stored_key, server_key = fields
        if not _NAME.fullmatch(name):
            raise ConfigError(f"{at}: user name {name[:40]!r} is not allowed (1 to 128 of A-Z a-z 0-9 . _ @ + -)")
        if mechanism not in MECHANISMS:
            raise ConfigError(f"{at}: unknown mechanism {mechanism[:40]!r} (one of {', '.join(MECHANISMS)})")
        if not iterations.isdigit() or not MIN_ITERATIONS <= int(iterations) <= MAX_ITERATIONS:
            raise ConfigError(f"{at}: iterations must be an integer between {MIN_ITERATIONS} and {MAX_ITERATIONS}")
        size = hashlib.new(MECHANISMS[mechanism]).digest_size
        try:
            raw = [base64.b64decode(v, validate=True) for v in (salt, stored_key, server_key)]
        except binascii.Error:
            raise ConfigError(f"{at}: SALT, STORED_KEY and SERVER_KEY must be base64") from None
        if not raw[0] or len(raw[1]) != size or len(raw[2]) != size:
            raise ConfigError(f"{at}: a {mechanism} key is {size} bytes and the salt not empty")
        if mechanism in users.get(name, {}):
            raise ConfigError(f"{at}: user {name!r} has a second {mechanism} line")
        users.setdefault(name, {})[mechanism] = ScramCredential(mechanism, raw[0], int(iterations), raw[1], raw[2])
    return users


def check_file_mode(path: str | os.PathLike[str], what: str) -> None:
    """:class:`ConfigError` unless ``path`` is a regular file that only its owner may read or write."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{what} {str(path)!r} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {str(path)!r} is not a regular file")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{what} {str(path)!r} is open to other users (mode {stat.S_IMODE(st.st_mode):o}); "
                          f"chmod 600 it")


def read_credentials(path: str | os.PathLike[str],
                     what: str = "credentials file") -> dict[str, dict[str, ScramCredential]]:
    """The users of the credential file at ``path`` (mode checked first); :class:`ConfigError`
    in one line for a missing or unreadable file, a mode open to others, or a bad line."""
    check_file_mode(path, what)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what} {str(path)!r} cannot be read: {exc}") from None
    return parse_credentials(text, f"{what} {str(path)!r}")


def write_credentials(path: str | os.PathLike[str], users: dict[str, dict[str, ScramCredential]]) -> None:
    """Replace the file at ``path`` with ``users``, atomically and with mode 0600 from the start
    (a reader sees the old file or the new one, never a part, and never a moment of a wider mode)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(format_credentials(users))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class CredentialStore:
    """The users of one credential file, read at construction (errors are :class:`ConfigError`)
    and again whenever the file's size, time or inode changes."""

    def __init__(self, path: str | os.PathLike[str], what: str = "credentials file") -> None:
        self.path = str(path)
        self.what = what
        self._users = read_credentials(self.path, what)
        self._seen = self._signature()
        #: what an unknown user is checked against, so that it costs what a known one does
        self._decoys = {m: derive(m, secrets.token_hex(16), secrets.token_bytes(SALT_BYTES), DEFAULT_ITERATIONS)
                        for m in MECHANISMS}
        self._decoy_key = secrets.token_bytes(32)

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _refresh(self) -> None:
        seen = self._signature()
        if seen == self._seen:
            return
        self._seen = seen
        try:
            self._users = read_credentials(self.path, self.what)
        except ConfigError as exc:
            log.warning("%s changed but does not load, the previous users stay in force: %s", self.what, exc)

    @property
    def users(self) -> list[str]:
        """Every user's name, sorted."""
        self._refresh()
        return sorted(self._users)

    def lookup(self, name: str, mechanism: str) -> ScramCredential | None:
        """The user's credential for ``mechanism``, or ``None`` for an unknown user."""
        self._refresh()
        return self._users.get(name, {}).get(mechanism)

    def decoy(self, name: str, mechanism: str) -> ScramCredential:
        """A made-up credential for an unknown user: the same salt for the same name on every
        exchange (so a SCRAM server-first message does not tell a missing user by a fresh salt),
        and one that no password verifies."""
        real = self._decoys[mechanism]
        salt = hmac.digest(self._decoy_key, f"{mechanism}\0{name}".encode(), "sha256")
        return dataclasses.replace(real, salt=salt)

    def verify_password(self, name: str, password: str, mechanisms: Iterable[str] = MECHANISMS) -> bool:
        """Whether ``password`` is the user's (HTTP Basic, SASL/PLAIN), checked against the first
        of ``mechanisms`` the user has a credential for; an unknown user is checked against a
        decoy, so it takes as long and fails."""
        self._refresh()
        held = self._users.get(name, {})
        mechanisms = tuple(mechanisms)
        for mechanism in mechanisms:
            if mechanism in held:
                return held[mechanism].verify_password(password)
        self.decoy(name, mechanisms[0] if mechanisms else "SCRAM-SHA-256").verify_password(password)
        return False
