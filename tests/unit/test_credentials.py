"""The credential file the admin HTTP server and the Kafka listener share: what it keeps of a
password (RFC 5802's salted keys, never the password), the mode and line checks that refuse a bad
file in one line, re-reading a changed file, and ``ledgerstore credentials`` (the password from
stdin, never argv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerstore.auth.credentials import (
    MECHANISMS,
    CredentialStore,
    derive,
    new_credentials,
    read_credentials,
    write_credentials,
)
from ledgerstore.errors import ConfigError


def written(tmp_path: Path, password: str = "hunter2-long", name: str = "alice") -> Path:
    path = tmp_path / "users"
    write_credentials(path, {name: new_credentials(password)})
    return path


def test_a_user_is_kept_as_salted_scram_keys_in_a_file_only_its_owner_reads(tmp_path: Path) -> None:
    path = written(tmp_path)
    text = path.read_text()
    assert "hunter2-long" not in text
    assert os.stat(path).st_mode & 0o777 == 0o600
    users = read_credentials(path)
    assert set(users["alice"]) == set(MECHANISMS)
    sha256, sha512 = users["alice"]["SCRAM-SHA-256"], users["alice"]["SCRAM-SHA-512"]
    assert sha256.salt != sha512.salt and len(sha256.stored_key) == 32 and len(sha512.stored_key) == 64
    assert sha256.iterations == 4096
    assert derive("SCRAM-SHA-256", "hunter2-long", sha256.salt, 4096) == sha256


def test_a_password_is_verified_by_deriving_its_keys(tmp_path: Path) -> None:
    store = CredentialStore(written(tmp_path))
    assert store.verify_password("alice", "hunter2-long")
    assert store.verify_password("alice", "hunter2-long", ["SCRAM-SHA-512"])
    assert not store.verify_password("alice", "hunter2-lonG")
    assert not store.verify_password("mallory", "hunter2-long")


def test_an_unknown_user_gets_the_same_decoy_salt_every_time(tmp_path: Path) -> None:
    store = CredentialStore(written(tmp_path))
    assert store.lookup("mallory", "SCRAM-SHA-256") is None
    one, two = store.decoy("mallory", "SCRAM-SHA-256"), store.decoy("mallory", "SCRAM-SHA-256")
    assert one.salt == two.salt and store.decoy("eve", "SCRAM-SHA-256").salt != one.salt
    assert not one.verify_password("")


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o666])
def test_a_file_open_to_other_users_is_refused_in_one_line(tmp_path: Path, mode: int) -> None:
    path = written(tmp_path)
    path.chmod(mode)
    with pytest.raises(ConfigError, match=r"open to other users .*chmod 600") as info:
        CredentialStore(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("line", "fragment"), [
    ("alice SCRAM-SHA-256 4096 c2FsdA==", "expected 6 fields"),
    ("al:ice SCRAM-SHA-256 4096 c2FsdA== AAAA AAAA", "user name"),
    ("alice SCRAM-SHA-1 4096 c2FsdA== AAAA AAAA", "unknown mechanism"),
    ("alice SCRAM-SHA-256 1000 c2FsdA== AAAA AAAA", "iterations"),
    ("alice SCRAM-SHA-256 lots c2FsdA== AAAA AAAA", "iterations"),
    ("alice SCRAM-SHA-256 4096 c2Fsd!== AAAA AAAA", "base64"),
    ("alice SCRAM-SHA-256 4096 c2FsdA== AAAA AAAA", "32 bytes"),
])
def test_a_bad_line_is_refused_in_one_line_naming_the_file_and_line(tmp_path: Path, line: str, fragment: str) -> None:
    path = tmp_path / "users"
    path.write_text(f"# users\n\n{line}\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError) as info:
        read_credentials(path)
    message = str(info.value)
    assert fragment in message and "line 3" in message and str(path) in message and "\n" not in message


def test_a_user_named_twice_for_one_mechanism_is_refused(tmp_path: Path) -> None:
    path = written(tmp_path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, lines[1]]) + "\n")
    with pytest.raises(ConfigError, match="second SCRAM-SHA-256 line"):
        read_credentials(path)


def test_a_missing_file_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        CredentialStore(tmp_path / "nothing-here")


def test_the_store_reads_the_file_again_when_it_changes_and_keeps_the_users_if_it_breaks(tmp_path: Path) -> None:
    path = written(tmp_path)
    store = CredentialStore(path)
    users = read_credentials(path)
    users["bob"] = new_credentials("bobs-password")
    write_credentials(path, users)
    assert store.users == ["alice", "bob"] and store.verify_password("bob", "bobs-password")
    path.chmod(0o644)  # broken now: the users read last stay in force
    assert store.users == ["alice", "bob"]


def ledgerstore(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerstore", *args], input=stdin, capture_output=True, text=True,
                          timeout=60)


def test_the_command_line_adds_lists_and_removes_users_reading_the_password_from_stdin(tmp_path: Path) -> None:
    path = str(tmp_path / "users")
    added = ledgerstore("credentials", "add", "alice", "--file", path, stdin="from-stdin-pw\n")
    assert added.returncode == 0 and "added alice" in added.stdout, added
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert CredentialStore(path).verify_password("alice", "from-stdin-pw")
    assert ledgerstore("credentials", "add", "bob", "--file", path, stdin="other-pw\n").returncode == 0
    listed = ledgerstore("credentials", "list", "--file", path, "--json")
    assert [row["name"] for row in json.loads(listed.stdout)] == ["alice", "bob"]
    assert ledgerstore("credentials", "remove", "bob", "--file", path).returncode == 0
    assert CredentialStore(path).users == ["alice"]
    again = ledgerstore("credentials", "remove", "bob", "--file", path)
    assert again.returncode == 2 and "no user 'bob'" in again.stderr and "Traceback" not in again.stderr


@pytest.mark.parametrize(("args", "stdin", "fragment"), [
    (["add", "al ice"], "pw\n", "not allowed"),
    (["add", "alice"], "\n", "password is empty"),
])
def test_the_command_line_refuses_bad_input_in_one_line(tmp_path: Path, args: list[str], stdin: str,
                                                         fragment: str) -> None:
    done = ledgerstore("credentials", *args, "--file", str(tmp_path / "users"), stdin=stdin)
    err = done.stderr.strip()
    assert done.returncode == 2 and fragment in err and len(err.splitlines()) == 1, done
    assert not (tmp_path / "users").exists()
