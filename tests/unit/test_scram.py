"""The server side of SCRAM (RFC 5802) against RFC 7677's SCRAM-SHA-256 test vector, a client
written from the RFC for SCRAM-SHA-512, and the exchanges that must fail; SASL/PLAIN's message."""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerstore.auth.credentials import CredentialStore, derive, new_credentials, write_credentials
from ledgerstore.auth.scram import INVALID_CREDENTIALS, ScramServer, parse_plain
from ledgerstore.errors import AuthenticationError

# RFC 7677 section 3
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


@pytest.fixture
def store(tmp_path: Path) -> CredentialStore:
    path = tmp_path / "users"
    write_credentials(path, {"user": {"SCRAM-SHA-256": derive("SCRAM-SHA-256", "pencil", SALT, 4096)},
                             "bob": new_credentials("bobs password")})
    return CredentialStore(path)


def rfc7677(store: CredentialStore) -> ScramServer:
    return ScramServer(store, "SCRAM-SHA-256", nonce=lambda: SERVER_NONCE)


def test_the_server_answers_rfc_7677s_exchange_byte_for_byte(store: CredentialStore) -> None:
    server = rfc7677(store)
    assert server.first(CLIENT_FIRST) == SERVER_FIRST
    assert server.final(CLIENT_FINAL) == SERVER_FINAL
    assert server.user == "user"


def client_final(mechanism: str, password: str, client_first_bare: str, server_first: bytes) -> tuple[bytes, bytes]:
    """The client's final message and the server signature it expects (RFC 5802 section 3)."""
    attrs = dict(part.split("=", 1) for part in server_first.decode().split(","))
    return client_final_with_nonce(mechanism, password, client_first_bare, server_first, attrs["r"])


def client_final_with_nonce(mechanism: str, password: str, client_first_bare: str, server_first: bytes,
                            nonce: str) -> tuple[bytes, bytes]:
    """:func:`client_final` sending ``nonce`` as its ``r`` attribute."""
    digest = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    attrs = dict(part.split("=", 1) for part in server_first.decode().split(","))
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.digest(salted, b"Client Key", digest)
    without_proof = f"c=biws,r={nonce}"
    auth = f"{client_first_bare},{server_first.decode()},{without_proof}".encode()
    signature = hmac.digest(hashlib.new(digest, client_key).digest(), auth, digest)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_signature = hmac.digest(hmac.digest(salted, b"Server Key", digest), auth, digest)
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode(), b"v=" + base64.b64encode(server_signature)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_client_with_the_password_is_verified_and_verifies_the_server(store: CredentialStore, mechanism: str) -> None:
    server = ScramServer(store, mechanism)
    bare = "n=bob,r=fyko+d2lbbFgONRv9qkxdawL"
    server_first = server.first(f"n,,{bare}".encode())
    assert server_first.startswith(b"r=fyko+d2lbbFgONRv9qkxdawL") and len(server_first.split(b",")[0]) > 30
    final, expected = client_final(mechanism, "bobs password", bare, server_first)
    assert server.final(final) == expected


def test_each_exchange_has_a_fresh_server_nonce(store: CredentialStore) -> None:
    one = ScramServer(store, "SCRAM-SHA-256").first(CLIENT_FIRST)
    two = ScramServer(store, "SCRAM-SHA-256").first(CLIENT_FIRST)
    assert one != two


@pytest.mark.parametrize(("user", "password"), [("user", "pencil!"), ("nobody", "pencil")])
def test_a_wrong_password_and_an_unknown_user_fail_alike_at_the_proof(store: CredentialStore, user: str,
                                                                        password: str) -> None:
    server = ScramServer(store, "SCRAM-SHA-256")
    bare = f"n={user},r=abcdefghijklmnop"
    server_first = server.first(f"n,,{bare}".encode())  # an unknown user gets a server-first too
    final, _ = client_final("SCRAM-SHA-256", password, bare, server_first)
    with pytest.raises(AuthenticationError) as info:
        server.final(final)
    assert str(info.value) == INVALID_CREDENTIALS and password not in str(info.value)


def test_a_user_without_a_credential_for_the_mechanism_fails(store: CredentialStore) -> None:
    server = ScramServer(store, "SCRAM-SHA-512")  # "user" has only SCRAM-SHA-256
    bare = "n=user,r=abcdefghijklmnop"
    final, _ = client_final("SCRAM-SHA-512", "pencil", bare, server.first(f"n,,{bare}".encode()))
    with pytest.raises(AuthenticationError, match="invalid user name or password"):
        server.final(final)


@pytest.mark.parametrize(("first", "fragment"), [
    (b"p=tls-unique,,n=user,r=abc", "channel binding"),
    (b"x,,n=user,r=abc", "GS2 flag"),
    (b"n,,r=abc,n=user", "expected n=<user>,r=<nonce>"),
    (b"n,,n=user,r=abc,tokenauth=true", "extensions"),
    (b"n,a=admin,n=user,r=abc", "another user"),
    (b"n,,n=us=er,r=abc", "escape"),
    (b"n", "no GS2 header"),
    (b"\xff\xfe", "UTF-8"),
])
def test_a_malformed_client_first_message_is_refused(store: CredentialStore, first: bytes, fragment: str) -> None:
    with pytest.raises(AuthenticationError, match=fragment):
        ScramServer(store, "SCRAM-SHA-256").first(first)


@pytest.mark.parametrize(("prefix", "accepted"), [("cnonce123", True), ("other", False), ("cnonce123x", False)])
def test_librdkafkas_final_message_with_the_client_nonce_repeated_is_accepted(store: CredentialStore, prefix: str,
                                                                               accepted: bool) -> None:
    """librdkafka before 2.6.1 sends r=<client nonce><client nonce><server nonce>: the whole
    server nonce is there, and the proof covers the message as sent; nothing else is accepted."""
    server = ScramServer(store, "SCRAM-SHA-256")
    bare = "n=bob,r=cnonce123"
    server_first = server.first(f"n,,{bare}".encode())
    combined = dict(part.split("=", 1) for part in server_first.decode().split(","))["r"]
    final, expected = client_final_with_nonce("SCRAM-SHA-256", "bobs password", bare, server_first, prefix + combined)
    if accepted:
        assert server.final(final) == expected
    else:
        with pytest.raises(AuthenticationError, match="another nonce"):
            server.final(final)


def test_a_final_message_with_another_nonce_or_binding_or_out_of_order_is_refused(store: CredentialStore) -> None:
    with pytest.raises(AuthenticationError, match="out of order"):
        rfc7677(store).final(CLIENT_FINAL)
    server = rfc7677(store)
    server.first(CLIENT_FIRST)
    with pytest.raises(AuthenticationError, match="another nonce"):
        server.final(CLIENT_FINAL.replace(b"k0,p=", b"k1,p="))
    server = rfc7677(store)
    server.first(CLIENT_FIRST)
    with pytest.raises(AuthenticationError, match="channel binding"):
        server.final(CLIENT_FINAL.replace(b"c=biws", b"c=eSws"))
    server = rfc7677(store)
    server.first(CLIENT_FIRST)
    with pytest.raises(AuthenticationError, match="invalid user name or password"):
        server.final(CLIENT_FINAL[:-8] + b"AAAAAAA=")
    with pytest.raises(AuthenticationError, match="out of order"):
        server.final(CLIENT_FINAL)  # one attempt per exchange


def test_plain_messages_are_split_into_user_and_password() -> None:
    assert parse_plain(b"\0alice\0pw") == ("alice", "pw")
    assert parse_plain(b"alice\0alice\0pw") == ("alice", "pw")
    for bad in (b"alice\0pw", b"\0\0pw", b"\0alice\0", b"bob\0alice\0pw", b"\xff\0a\0b"):
        with pytest.raises(AuthenticationError):
            parse_plain(bad)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200), st.binary(max_size=200), st.sampled_from(["SCRAM-SHA-256", "SCRAM-SHA-512"]))
def test_random_messages_raise_only_authentication_error(store: CredentialStore, first: bytes, final: bytes,
                                                         mechanism: str) -> None:
    server = ScramServer(store, mechanism)
    try:
        server.first(first)
        server.final(final)
    except AuthenticationError:
        pass
    else:
        raise AssertionError("a random exchange authenticated")
    with pytest.raises(AuthenticationError):
        server.final(final)  # never a second try
    try:
        parse_plain(first)
    except AuthenticationError:
        pass
