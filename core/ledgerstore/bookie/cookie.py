"""The cookie a bookie keeps in each of its directories (``COOKIE``, JSON).

Besides the bookie id, the cluster instance and the directories, a cookie carries an
*incarnation*: a random id drawn when the cookie is first written, that is when the bookie starts
on empty (new or formatted) directories. A bookie id that comes back with another incarnation is
a new bookie under an old name: it holds nothing of what the old one held.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from ledgerstore.errors import CookieMismatchError
from ledgerstore.meta.bookies import INCARNATION as INCARNATION  # the field, where metadata reads it too
from ledgerstore.meta.bookies import identity

COOKIE_FILE = "COOKIE"


def new_incarnation() -> str:
    """A fresh incarnation id for a bookie starting on empty directories."""
    return uuid.uuid4().hex


def cookie_dirs(journal_dir: Path, ledger_dirs: list[Path]) -> list[Path]:
    return [journal_dir, *ledger_dirs]


def read_local(dirs: list[Path]) -> dict[str, Any] | None:
    """The cookie found in the directories; CookieMismatchError if they disagree or only some
    directories have one (a new, empty disk swapped in)."""
    found: dict[Path, dict[str, Any]] = {}
    for d in dirs:
        p = d / COOKIE_FILE
        if p.exists():
            try:
                found[d] = json.loads(p.read_text())
            except ValueError as exc:
                raise CookieMismatchError(f"{p}: unreadable cookie ({exc})") from exc
    if not found:
        return None
    values = list(found.values())
    if len(found) != len(dirs) or any(v != values[0] for v in values):
        missing = [str(d) for d in dirs if d not in found]
        raise CookieMismatchError(
            "the bookie's directories disagree about its identity: "
            + (f"no cookie in {', '.join(missing)}; " if missing else "")
            + "cookies differ between directories. A directory was replaced or mixed up; "
            "restore it, or format the bookie (ledgerstore shell bookieformat) and let auto-recovery re-replicate."
        )
    return values[0]


def write_local(dirs: list[Path], cookie: dict[str, Any]) -> None:
    data = json.dumps(cookie, sort_keys=True, indent=1)
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / (COOKIE_FILE + ".tmp")
        with open(tmp, "w") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, d / COOKIE_FILE)


def changed_under(dirs: list[Path], cookie: dict[str, Any]) -> list[str]:
    """Why the cookie files in ``dirs`` no longer match ``cookie`` (the one a running bookie
    started with), one line per directory; empty when every one still does."""
    problems = []
    for d in dirs:
        p = d / COOKIE_FILE
        try:
            found = json.loads(p.read_text())
        except FileNotFoundError:
            problems.append(f"{p} is gone")
            continue
        except (OSError, ValueError) as exc:
            problems.append(f"{p} is unreadable ({exc})")
            continue
        if found != cookie:
            problems.append(f"{p} was rewritten (incarnation {identity(found)!r}, this bookie is {identity(cookie)!r})")
    return problems
