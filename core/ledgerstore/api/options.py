"""Declared plugin options: what a plugin accepts in its ``[metadata]``, ``[transport]``,
``[storage]`` or ``[placement]`` option table.

A plugin class declares ``Options``, a frozen dataclass whose fields are its options, each with a
type, a default and a description given by :func:`option`::

    @dataclasses.dataclass(frozen=True)
    class Options:
        connect_timeout: float = option(5.0, "seconds to wait for a connection", minimum=0.001)
        compression: str = option("lz4", "block compression", choices=("none", "lz4", "zstd"))

``ledgerstore`` checks a configuration's option table against it when the configuration loads
(and in ``ledgerstore config check``) with :func:`check_options`: unknown names, values of the
wrong type and values out of range are refused, one line each, naming the plugin, the option and
what is allowed. :func:`parse_options` then builds the ``Options`` instance once, with every value
of its declared type, and the host hands that object to the plugin's constructor. Checks of how
options combine belong in the dataclass's ``__post_init__`` (raise ``ValueError`` with the reason);
they run when the instance is built, and the host reports them as one line naming the plugin. A
plugin without ``Options`` works as before: it gets its option table as keyword arguments.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from ledgerstore.errors import ConfigError

__all__ = ["MAX_DURATION_S", "OptionInfo", "check_options", "describe_options", "option", "options_for", "parse_options"]

OptionsT = typing.TypeVar("OptionsT")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


#: the longest duration, in seconds, any option may name (a day of slack on a year): longer is a
#: typo, and values past it overflow timers and C-level timeouts (an interval of 10**20 ms once
#: passed ``config check`` and started a bookie). Plugins pass it as the ``maximum`` of their
#: duration options; core configuration checks its own with it.
MAX_DURATION_S = 366 * 24 * 3600.0


def option(
    default: Any,
    doc: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: Sequence[Any] | None = None,
) -> Any:
    """A field of a plugin's ``Options`` dataclass: its ``default``, a one-sentence ``doc``, and
    optionally the inclusive range (``minimum``/``maximum``) or the ``choices`` allowed."""
    meta = {"doc": doc, "minimum": minimum, "maximum": maximum,
            "choices": tuple(choices) if choices is not None else None}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class OptionInfo:
    """One declared option, for messages, ``config check`` and documentation."""

    name: str
    type: Any
    default: Any
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] | None = None

    def allowed(self) -> str:
        """What values are allowed, in words (``"an integer >= 1"``, ``"one of 'full', 'normal'"``)."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        what = _type_words(self.type)
        if self.minimum is not None and self.maximum is not None:
            return f"{what} between {_number(self.minimum)} and {_number(self.maximum)}"
        if self.minimum is not None:
            return f"{what} >= {_number(self.minimum)}"
        if self.maximum is not None:
            return f"{what} <= {_number(self.maximum)}"
        return what


def describe_options(options_cls: type) -> list[OptionInfo]:
    """The options an ``Options`` dataclass declares, in declaration order."""
    hints = typing.get_type_hints(options_cls)
    infos = []
    for f in dataclasses.fields(options_cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        meta = f.metadata
        infos.append(OptionInfo(f.name, hints.get(f.name, Any), default, meta.get("doc", ""),
                                meta.get("minimum"), meta.get("maximum"), meta.get("choices")))
    return infos


def check_options(options_cls: type, values: Mapping[str, Any], plugin: str) -> list[str]:
    """Problems of ``values`` against ``options_cls``, one line each, naming ``plugin`` (e.g.
    ``"transport plugin 'tcp'"``), the option and what is allowed; ``[]`` when all are valid.

    Values from the environment arrive as text: ``"5"`` is accepted for an integer option."""
    infos = {info.name: info for info in describe_options(options_cls)}
    problems = []
    for name in sorted(set(values) - set(infos)):
        problems.append(f"{plugin}: unknown option {name!r}; allowed options: {', '.join(sorted(infos)) or 'none'}")
    for name, raw in values.items():
        info = infos.get(name)
        if info is None:
            continue
        try:
            value = _coerce(raw, info.type)
        except (ValueError, TypeError):
            problems.append(f"{plugin}: option {name!r} = {raw!r} is not {info.allowed()}")
            continue
        if info.choices is not None and value not in info.choices:
            problems.append(f"{plugin}: option {name!r} = {raw!r} is not {info.allowed()}")
        elif isinstance(value, int | float) and not isinstance(value, bool) and (
                value != value  # NaN passes every comparison below
                or (info.minimum is not None and value < info.minimum)
                or (info.maximum is not None and value > info.maximum)):
            problems.append(f"{plugin}: option {name!r} = {raw!r} is out of range: must be {info.allowed()}")
    return problems


def parse_options(options_cls: type[OptionsT], values: Mapping[str, Any], plugin: str) -> OptionsT:
    """``values`` (an option table) as an instance of ``options_cls``, each value of its declared
    type (``"5"`` from the environment becomes ``5``); absent options take their defaults.

    Raises :class:`~ledgerstore.errors.ConfigError` in one line naming ``plugin`` (e.g.
    ``"placement plugin 'rack-aware'"``): every problem :func:`check_options` finds, or the
    reason the dataclass's ``__post_init__`` refuses how the options combine."""
    problems = check_options(options_cls, values, plugin)
    if problems:
        raise ConfigError("; ".join(problems))
    types_of = {info.name: info.type for info in describe_options(options_cls)}
    try:
        return options_cls(**{name: _coerce(raw, types_of[name]) for name, raw in values.items()})
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{plugin}: {exc}") from None


def options_for(plugin: type, options: Any, values: Mapping[str, Any], label: str) -> Any:
    """What a plugin's constructor keeps as its options: ``options``, the ``Options`` instance the
    host parsed (:func:`parse_options`), or, for a plugin built in code with keyword arguments,
    ``values`` parsed by the same rules. ``label`` names the plugin in errors (``"storage plugin
    'acme'"``). A plugin class that declares no ``Options`` dataclass gets ``values`` back as a dict."""
    declared = getattr(plugin, "Options", None)
    if options is not None:
        if values:
            raise TypeError(f"{plugin.__name__}: pass its Options or keyword options, not both")
        return options
    if isinstance(declared, type) and dataclasses.is_dataclass(declared):
        return parse_options(declared, values, label)
    return dict(values)


def _number(value: float) -> str:
    """A bound as people write it: ``0.001``, ``5``, ``31622400`` (not ``3.16224e+07``)."""
    return f"{value:.0f}" if math.isfinite(value) and value == int(value) else f"{value:g}"


def _type_words(tp: Any) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_words(a) for a in args)
    origin = typing.get_origin(tp) or tp
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a table"}.get(origin, "a value")


def _coerce(value: Any, tp: Any) -> Any:
    """``value`` as ``tp``; ValueError when it is not one."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg)
            except (ValueError, TypeError):
                pass
        raise ValueError(value)
    if origin is list or tp is list:
        (item,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list | tuple):
            raise ValueError(value)
        return [_coerce(v, item) for v in value]
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ValueError(value)
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise ValueError(value)
    if tp is int:
        if isinstance(value, bool) or isinstance(value, float):
            raise ValueError(value)
        return int(value)  # ValueError for text that is not an integer
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(value)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(value)
        return value
    return value
