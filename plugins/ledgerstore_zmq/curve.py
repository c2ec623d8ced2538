"""CURVE key options for the ``zmq`` transport: parsing Z85 keys and key files into bytes.

Every key option accepts either a 40-character Z85 string or the path of a key file written by
``zmq.auth.create_certificates`` (``NAME.key`` holds the public key, ``NAME.key_secret`` both).
Errors are :class:`~ledgerstore.errors.ConfigError` naming the option and the path.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import zmq
import zmq.auth

from ledgerstore.errors import ConfigError

from .options import ZmqOptions

__all__ = ["load_key", "load_allowed_clients", "CurveServerKeys", "CurveClientKeys"]

_Z85_KEY_LEN = 40


def _is_z85_key(value: str) -> bool:
    if len(value) != _Z85_KEY_LEN:
        return False
    try:
        zmq.utils.z85.decode(value.encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        return False
    return True


def load_key(option: str, value: Any, *, secret: bool) -> bytes:
    """Return the Z85 key (as bytes) given by ``value`` for ``option``: the value itself when it
    is a Z85 key, else the public (or, with ``secret``, the secret) key of the key file it names."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise ConfigError(f"transport option {option!r} must be a Z85 key or a key file path, got {value!r}")
    text = str(value)
    if _is_z85_key(text):
        return text.encode("ascii")
    path = os.path.expanduser(text)
    if not os.path.isfile(path):
        raise ConfigError(
            f"transport option {option!r}: {text!r} is neither a 40-character Z85 key nor an existing "
            "key file; make keys with zmq.auth.create_certificates (see docs/transports.md)"
        )
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"transport option {option!r}: cannot read key file {path!r}: {exc}") from exc
    if secret:
        if secret_key is None:
            raise ConfigError(
                f"transport option {option!r}: key file {path!r} holds only a public key; "
                "give the matching '.key_secret' file"
            )
        return secret_key
    return public


def load_allowed_clients(value: Any) -> set[bytes]:
    """Public keys allowed by ``curve_allowed_clients``: a directory of ``*.key`` files, or a list
    of Z85 keys / key file paths. An empty directory or list allows nobody."""
    option = "curve_allowed_clients"
    if isinstance(value, str | os.PathLike):
        path = os.path.expanduser(str(value))
        if not os.path.isdir(path):
            raise ConfigError(
                f"transport option {option!r}: {path!r} is not a directory of client public keys "
                "(or give a list of Z85 public keys)"
            )
        try:
            return set(zmq.auth.load_certificates(path))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"transport option {option!r}: cannot read keys in {path!r}: {exc}") from exc
    if isinstance(value, Iterable):
        return {load_key(option, item, secret=False) for item in value}
    raise ConfigError(f"transport option {option!r} must be a directory or a list of keys, got {value!r}")


class CurveServerKeys:
    """The server's CURVE settings, validated once from the transport options."""

    def __init__(self, secret_key: bytes, public_key: bytes, allowed: set[bytes] | None) -> None:
        self.secret_key = secret_key
        self.public_key = public_key
        #: None means any client holding the server's public key may connect (``curve_allow_any``).
        self.allowed = allowed

    @classmethod
    def from_options(cls, options: ZmqOptions) -> CurveServerKeys | None:
        """None when the options do not turn CURVE on for the server."""
        secret_opt = options.curve_server_secret_key
        if not secret_opt:
            return None
        secret = load_key("curve_server_secret_key", secret_opt, secret=True)
        derived = zmq.curve_public(secret)
        public_opt = options.curve_server_public_key
        if public_opt:
            public = load_key("curve_server_public_key", public_opt, secret=False)
            if public != derived:
                raise ConfigError(
                    "transport options 'curve_server_public_key' and 'curve_server_secret_key' are not "
                    "a key pair: the public key does not match the secret key"
                )
        # ZmqOptions refuses CURVE without curve_allowed_clients or curve_allow_any
        allowed = None if options.curve_allow_any else load_allowed_clients(options.curve_allowed_clients or [])
        return cls(secret, derived, allowed)


class CurveClientKeys:
    """The client's CURVE settings, validated once from the transport options."""

    def __init__(self, server_public_key: bytes, public_key: bytes, secret_key: bytes) -> None:
        self.server_public_key = server_public_key
        self.public_key = public_key
        self.secret_key = secret_key

    @classmethod
    def from_options(cls, options: ZmqOptions) -> CurveClientKeys | None:
        """None when the options do not turn CURVE on for the client. Without its own key pair a
        client gets a fresh one (accepted only by a server with ``curve_allow_any``)."""
        server_opt = options.curve_server_public_key
        if not server_opt:
            return None
        server_public = load_key("curve_server_public_key", server_opt, secret=False)
        secret_opt = options.curve_secret_key
        if secret_opt:
            secret = load_key("curve_secret_key", secret_opt, secret=True)
            public = zmq.curve_public(secret)
            public_opt = options.curve_public_key
            if public_opt and load_key("curve_public_key", public_opt, secret=False) != public:
                raise ConfigError(
                    "transport options 'curve_public_key' and 'curve_secret_key' are not a key pair"
                )
        else:  # ZmqOptions refuses curve_public_key without curve_secret_key
            public, secret = zmq.curve_keypair()
        return cls(server_public, public, secret)
