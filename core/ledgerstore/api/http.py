"""What admin HTTP handlers receive and return (built-in and plugin ones alike): :class:`Request`,
:class:`Response`, :class:`HttpError`. Kept apart from the server so endpoint modules can use them."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


class HttpError(Exception):
    """Raised by a handler to answer with ``status`` and a JSON ``{"error": message}`` body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclasses.dataclass
class Request:
    """One parsed request, handed to route handlers (built-in and plugin ones alike)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    bookie: Any

    def json(self) -> Any:
        """The body parsed as JSON; :class:`HttpError` 400 if it is not JSON."""
        if not self.body:
            raise HttpError(400, "this request needs a JSON body")
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HttpError(400, f"the body is not valid JSON: {exc}") from None

    def int_param(self, name: str, default: int | None = None) -> int:
        """Query parameter ``name`` as an int; 400 if missing (without default) or not a number."""
        raw = self.query.get(name)
        if raw is None or raw == "":
            if default is None:
                raise HttpError(400, f"query parameter {name!r} is required")
            return default
        try:
            return int(raw)
        except ValueError:
            raise HttpError(400, f"query parameter {name}={raw!r} is not an integer") from None

    def bool_param(self, name: str, default: bool = False) -> bool:
        """Query parameter ``name`` as a boolean (true/false/1/0/yes/no)."""
        raw = self.query.get(name)
        if raw is None or raw == "":
            return default
        return parse_bool(raw, f"query parameter {name}")


@dataclasses.dataclass
class Response:
    """What a handler returns (plugin handlers may return a ``(status, content_type, body)`` tuple)."""

    status: int = 200
    content_type: str = JSON
    body: bytes = b""
    #: extra response headers (e.g. ``WWW-Authenticate``)
    headers: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of_json(cls, data: Any, status: int = 200) -> Response:
        return cls(status, JSON, (json.dumps(data, indent=2, default=str) + "\n").encode())

    @classmethod
    def error(cls, status: int, message: str) -> Response:
        return cls.of_json({"error": message, "status": status}, status)


Handler = Callable[[Request], "Awaitable[Response | tuple[int, str, bytes]] | Response | tuple[int, str, bytes]"]


def parse_bool(raw: Any, what: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(raw, str) and raw.lower() in ("false", "0", "no", "off"):
        return False
    raise HttpError(400, f"{what}={raw!r} is not a boolean (true or false)")
