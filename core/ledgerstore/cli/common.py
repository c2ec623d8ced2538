"""Helpers shared by CLI commands: output as tables or JSON, errors as exit codes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import sys
import unicodedata
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ledgerstore.client.client import Client
from ledgerstore.errors import ConfigError, LedgerStoreError, NoSuchEntryError, NoSuchLedgerError
from ledgerstore.startup import quiet_client_libraries

T = TypeVar("T")
# Piped output is not cut at 80 columns: tables stay whole for grep and for people alike.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)

#: exit codes: 0 success, 1 operation failed, 2 usage/configuration error, 3 not found
EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND = 1, 2, 3


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def handle_errors(fn: Callable[..., T]) -> Callable[..., T]:
    """Turn ledgerstore errors into a one-line message and a meaningful exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        # Messages are printed as text, not rich markup: an install hint's extra
        # (pip install '/path/to/ledgerstore[rocksdb]') must survive on the command line.
        except ConfigError as exc:
            err_console.print(f"[red]configuration error:[/red] {escape(str(exc))}")
            sys.exit(EXIT_USAGE)
        except (NoSuchLedgerError, NoSuchEntryError) as exc:
            err_console.print(f"[red]not found:[/red] {escape(str(exc))}")
            sys.exit(EXIT_NOT_FOUND)
        except LedgerStoreError as exc:
            err_console.print(f"[red]error ({type(exc).__name__}):[/red] {escape(str(exc))}")
            sys.exit(EXIT_FAILED)
        except OSError as exc:  # a file or socket the command needs: one line, not a traceback
            where = f" ({exc.filename})" if exc.filename else ""
            err_console.print(f"[red]error:[/red] {escape(exc.strerror or str(exc))}{escape(where)}")
            sys.exit(EXIT_FAILED)

    return wrapper


@contextlib.asynccontextmanager
async def cluster_client(**client_kwargs: Any) -> AsyncIterator[Client]:
    """``async with cluster_client(metadata=URI) as client``: a started client of an initialised
    cluster, or NoClusterError (one line) without creating anything at the URI (the client's
    start checks that: see :mod:`ledgerstore.meta.cluster_check`)."""
    client = Client(**client_kwargs)
    try:
        with quiet_client_libraries():  # an unreachable store is one line, not a reconnect log
            await client.start()
        yield client
    finally:
        await client.close()


_NAMED_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str, *, backslashes: bool = True) -> str:
    """``text`` safe for a terminal and unambiguous: backslashes doubled, newlines and tabs as
    ``\\n`` ``\\r`` ``\\t``, every other control, format, separator or unassigned character as
    ``\\xNN`` / ``\\uNNNN`` / ``\\UNNNNNNNN``, and the lone surrogates ``surrogateescape`` makes of
    bytes that are not UTF-8 as ``\\xNN`` of the original byte. Nothing in the result reaches the
    terminal as an escape sequence. ``backslashes=False`` leaves backslashes alone, so text that
    went through here once is unchanged by a second pass."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch == "\\" and not backslashes:
            out.append(ch)
        elif ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif unicodedata.category(ch)[0] in "CZ" and ch != " ":
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def payload_text(data: bytes) -> str:
    """Bytes as :func:`printable` text: UTF-8 where they are, ``\\xNN`` for each byte that is not."""
    return printable(data.decode("utf-8", errors="surrogateescape"))


def _cell(value: str) -> Text:
    # Text, not a markup string: a value reading "[bold]" or "[/x]" is shown as written.
    return Text(printable(value, backslashes=False))


def emit(data: Any, as_json: bool, columns: Sequence[str] | None = None, title: str | None = None) -> None:
    """Print ``data`` (a list of dicts, or a dict) as JSON or as a table. Table cells are data:
    never read as rich markup, control characters shown escaped (:func:`printable`)."""
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    if isinstance(data, dict):
        table = Table(title=title, show_header=False)
        table.add_column("key", style="bold")
        table.add_column("value")
        for k, v in data.items():
            table.add_row(_cell(str(k)), _cell(v if isinstance(v, str) else json.dumps(v, default=str)))
        console.print(table)
        return
    rows = list(data)
    cols = list(columns or (rows[0].keys() if rows else []))
    table = Table(title=title)
    for c in cols:
        table.add_column(c, overflow="fold")
    for r in rows:
        table.add_row(*(_cell(str(r.get(c, ""))) for c in cols))
    console.print(table)


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
