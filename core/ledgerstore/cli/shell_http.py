"""Calls from the shell to a running bookie's admin HTTP API: every failure is one line."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any

from ledgerstore.errors import LedgerStoreError


class AdminApiError(LedgerStoreError):
    """A bookie's admin API refused a request, failed it, or could not be reached."""


def _reason(exc: urllib.error.HTTPError) -> str:
    """The bookie's own words for a refusal (its JSON ``error``), else the HTTP reason."""
    try:
        body = exc.read()
        return str(json.loads(body).get("error") or exc.reason)
    except (OSError, ValueError, AttributeError, http.client.HTTPException):
        return str(exc.reason)


def admin_request(address: str, method: str, path: str, headers: dict[str, str], timeout: float) -> Any:
    """The decoded JSON answer of ``method http://address/path``; AdminApiError in one line on an
    HTTP error status (401/403 name the token file to pass), an unreachable bookie or a non-JSON answer."""
    url = f"http://{address}{path}"
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        hint = ("; pass --token-file with the bookie's admin token ([bookie.http] token_file)"
                if exc.code in (401, 403) else "")
        raise AdminApiError(f"{method} {url} answered {exc.code} {exc.reason}: {_reason(exc)}{hint}") from None
    except urllib.error.URLError as exc:
        raise AdminApiError(f"cannot reach the bookie's admin API at {address}: {exc.reason}") from None
    except (OSError, http.client.HTTPException) as exc:
        raise AdminApiError(f"{method} {url} failed: {exc or type(exc).__name__}") from None
    try:
        return json.loads(raw)
    except ValueError:
        raise AdminApiError(f"{method} {url} answered something that is not JSON: {raw[:80]!r}") from None
