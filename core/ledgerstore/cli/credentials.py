"""``ledgerstore credentials``: manage the credential file the admin HTTP server (HTTP Basic) and
the Kafka listener (SASL) read (:mod:`ledgerstore.auth.credentials`).

A password is read from a prompt (typed twice, not echoed) or, when stdin is not a terminal, from
its first line: never from the command line, where other users see it in the process list and the
shell keeps it in its history. The file is rewritten atomically with mode 0600.
"""

from __future__ import annotations

import os
import sys

import click

from ledgerstore.auth.credentials import (
    DEFAULT_ITERATIONS,
    ScramCredential,
    check_user_name,
    new_credentials,
    read_credentials,
    write_credentials,
)
from ledgerstore.cli.common import emit, handle_errors
from ledgerstore.errors import ConfigError

__all__ = ["credentials"]

_FILE = click.option("--file", "path", type=click.Path(dir_okay=False), required=True,
                     help="the credential file ([bookie.http] credentials_file, [kafka] credentials_file)")


def _existing(path: str) -> dict[str, dict[str, ScramCredential]]:
    """The users already in ``path`` (none when it does not exist yet)."""
    if not os.path.lexists(path):
        return {}
    return read_credentials(path)


def _read_password(name: str) -> str:
    if sys.stdin.isatty():
        password = click.prompt(f"password for {name}", hide_input=True, confirmation_prompt=True)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise ConfigError("the password is empty: type one at the prompt or pipe it on stdin")
    if "\0" in password:
        raise ConfigError("the password holds a NUL character, which SASL/PLAIN cannot carry")
    return str(password)


@click.group("credentials")
def credentials() -> None:
    """Users of the admin HTTP server and the Kafka listener (SCRAM-SHA-256/512 credentials)."""


@credentials.command("add")
@click.argument("name")
@_FILE
@click.option("--iterations", type=click.IntRange(4096, 1_000_000), default=DEFAULT_ITERATIONS, show_default=True,
              help="PBKDF2 iterations of the salted password")
@handle_errors
def add(name: str, path: str, iterations: int) -> None:
    """Add user NAME, or set a new password for it; the password comes from a prompt or stdin."""
    check_user_name(name)
    users = _existing(path)
    password = _read_password(name)
    replaced = name in users
    users[name] = new_credentials(password, iterations)
    write_credentials(path, users)
    click.echo(f"{'updated' if replaced else 'added'} {name} in {path} (SCRAM-SHA-256, SCRAM-SHA-512, "
               f"{iterations} iterations)")


@credentials.command("remove")
@click.argument("name")
@_FILE
@handle_errors
def remove(name: str, path: str) -> None:
    """Remove user NAME."""
    users = read_credentials(path)
    if name not in users:
        raise ConfigError(f"no user {name!r} in {path} (`ledgerstore credentials list --file {path}` lists them)")
    del users[name]
    write_credentials(path, users)
    click.echo(f"removed {name} from {path}")


@credentials.command("list")
@_FILE
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@handle_errors
def list_users(path: str, as_json: bool) -> None:
    """List the users and their mechanisms (never a key or a salt)."""
    users = read_credentials(path)
    rows = [{"name": name, "mechanisms": ", ".join(sorted(held)),
             "iterations": ", ".join(str(held[m].iterations) for m in sorted(held))} for name, held in sorted(users.items())]
    emit(rows, as_json, ["name", "mechanisms", "iterations"], title=f"users in {path}")
