"""Helpers shared by CLI commands: output as tables or JSON, errors as exit codes."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from ledgerstore.errors import ConfigError, LedgerStoreError, NoSuchEntryError, NoSuchLedgerError

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
        except ConfigError as exc:
            err_console.print(f"[red]configuration error:[/red] {exc}")
            sys.exit(EXIT_USAGE)
        except (NoSuchLedgerError, NoSuchEntryError) as exc:
            err_console.print(f"[red]not found:[/red] {exc}")
            sys.exit(EXIT_NOT_FOUND)
        except LedgerStoreError as exc:
            err_console.print(f"[red]error ({type(exc).__name__}):[/red] {exc}")
            sys.exit(EXIT_FAILED)

    return wrapper


def emit(data: Any, as_json: bool, columns: Sequence[str] | None = None, title: str | None = None) -> None:
    """Print ``data`` (a list of dicts, or a dict) as JSON or as a table."""
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    if isinstance(data, dict):
        table = Table(title=title, show_header=False)
        table.add_column("key", style="bold")
        table.add_column("value")
        for k, v in data.items():
            table.add_row(str(k), v if isinstance(v, str) else json.dumps(v, default=str))
        console.print(table)
        return
    rows = list(data)
    cols = list(columns or (rows[0].keys() if rows else []))
    table = Table(title=title)
    for c in cols:
        table.add_column(c, overflow="fold")
    for r in rows:
        table.add_row(*(str(r.get(c, "")) for c in cols))
    console.print(table)


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
