"""Configuration for bookies and clients loaded from TOML and validated once (the types are in
:mod:`ledgerstore.config_schema`).

Every option has a default; a file need only set what differs. Environment variables override the
file: ``LEDGERSTORE_BOOKIE_<KEY>`` / ``LEDGERSTORE_CLIENT_<KEY>`` for top-level keys and
``..._<TABLE>__<KEY>`` for keys in a table, e.g. ``LEDGERSTORE_BOOKIE_JOURNAL__MAX_GROUP_WAIT_MS=1``.
Errors name the key and the file (or the environment variable) they came from.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from ledgerstore.config_schema import (
    MAX_FRAME_SIZE,
    MAX_PORT,
    MIN_FRAME_SIZE,
    AdminHttpConfig,
    AutoRecoveryConfig,
    BookieConfig,
    ClientConfig,
    JournalConfig,
    address_problems,
)
from ledgerstore.errors import ConfigError, LedgerStoreError

__all__ = [
    "MAX_FRAME_SIZE", "MAX_PORT", "MIN_FRAME_SIZE", "AdminHttpConfig", "AutoRecoveryConfig", "BookieConfig",
    "ClientConfig", "JournalConfig", "address_problems", "load", "load_bookie_config", "load_client_config",
    "plugin_problems", "to_toml",
]

class _Dataclass(Protocol):
    """A dataclass, as :func:`dataclasses.fields` sees one."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]


class _Config(_Dataclass, Protocol):
    """A config dataclass (BookieConfig or ClientConfig): it validates itself."""

    def validate(self) -> list[str]:
        """One line per problem; empty when the config is valid."""
        ...


D = TypeVar("D", bound=_Dataclass)
C = TypeVar("C", bound=_Config)


def plugin_problems(kind: str, cfg: Any) -> list[str]:
    """Problems with the plugins a config names: each must be installed and accept its options.
    Each option table is first checked against the ``Options`` its plugin declares (unknown
    names, wrong types, values out of range); then each backend is built, not started (no file,
    socket or connection is opened), so its own checks of how options combine run. The same
    check runs in ``config check`` and at start."""
    from ledgerstore import plugins

    checks: list[tuple[str, str, str, Mapping[str, Any] | None, Any]] = []  # (option, slot, name, table, build)
    if "://" in cfg.metadata:
        checks.append(("metadata", "metadata", cfg.metadata.partition("://")[0], cfg.metadata_options,
                       lambda c: plugins.construct("metadata", cfg.metadata.partition("://")[0], c, cfg.metadata,
                                                   options=cfg.metadata_options)))
    if kind == "bookie":
        if "://" in cfg.listen:
            checks.append(("listen", "transport", cfg.listen.partition("://")[0], cfg.transport,
                           lambda c: plugins.construct("transport", cfg.listen.partition("://")[0], c,
                                                       options=cfg.transport, max_frame_size=cfg.max_frame_size)))
        checks.append(("storage", "storage", cfg.storage, cfg.storage_options,
                       lambda c: plugins.construct("storage", cfg.storage, c, [Path(d) for d in cfg.ledger_dirs],
                                                   options=cfg.storage_options)))
        ar = cfg.autorecovery
        checks.append(("autorecovery.placement", "placement", ar.placement, ar.placement_options,
                       lambda c: plugins.construct("placement", ar.placement, c, options=ar.placement_options)))
        client_tables = ("autorecovery.client_transport", cfg.autorecovery.client_transport)
    else:
        checks.append(("placement", "placement", cfg.placement, cfg.placement_options,
                       lambda c: plugins.construct("placement", cfg.placement, c, options=cfg.placement_options)))
        client_tables = ("transport", cfg.transport)
    # per-scheme client transport tables ({ "tcp+tls" = { ca_file = ... } }): checked, not built
    prefix, tables = client_tables
    for scheme, table in tables.items():
        if isinstance(table, dict) and scheme in plugins.installed("transport"):
            checks.append((f"{prefix}.{scheme}", "transport", scheme, table, None))
    problems = []
    for option, slot, name, table, build in checks:
        try:
            plugin = plugins.load_driver(slot, name)
            declared = plugins.option_problems(slot, name, plugin, table or {})
            problems.extend(declared)
            if not declared and build is not None:
                build(plugin)
        except (LedgerStoreError, ValueError, TypeError) as exc:
            problems.append(f"'{option}': {exc}")
    return problems


# --- loading --------------------------------------------------------------------------------------


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (list, typing.List):  # noqa: UP006
        (item_tp,) = typing.get_args(tp) or (Any,)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return [_convert(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, typing.Dict):  # noqa: UP006
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {type(value).__name__} {value!r}")
        return dict(value)
    if origin in (typing.Union, types.UnionType):
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table, got {type(value).__name__} {value!r}")
        return _build(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {type(value).__name__} {value!r}")
        return value
    return value


def _build(cls: type[D], data: Mapping[str, Any], where: str) -> D:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"known keys: {', '.join(sorted(fields))}"
        )
    kwargs = {k: _convert(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


def _env_overrides(cls: type, kind: str, environ: Mapping[str, str]) -> dict[str, Any]:
    prefix = f"LEDGERSTORE_{kind.upper()}_"
    out: dict[str, Any] = {}
    names = {f.name.upper(): f.name for f in dataclasses.fields(cls)}
    for var, raw in environ.items():
        if not var.startswith(prefix):
            continue
        path = var[len(prefix) :].split("__")
        top = names.get(path[0])
        if top is None:
            raise ConfigError(f"environment variable {var}: no option {path[0].lower()!r} in the {kind} config")
        if len(path) == 1:
            out[top] = raw
        else:
            out.setdefault(top, {})[path[1].lower()] = raw
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = {**merged[k], **v}
        else:
            merged[k] = v
    return merged


def load(
    cls: type[C],
    kind: str,
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> C:
    """Load ``cls`` (BookieConfig or ClientConfig) from a TOML file (its ``[bookie]``/``[client]``
    table or top level), then environment overrides, then ``overrides``; validate once."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            with open(path, "rb") as fh:
                raw = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file {source} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {source} is not valid TOML: {exc}") from None
        if isinstance(raw.get(kind), dict):
            # a file may hold a [bookie] and a [client] table; anything else beside them would
            # be ignored, so it is refused (e.g. [storage_options] meant as [bookie.storage_options])
            stray = sorted(set(raw) - {"bookie", "client"})
            if stray:
                raise ConfigError(
                    f"{source}: unknown top-level {'tables' if len(stray) > 1 else 'table'} "
                    f"{', '.join(map(repr, stray))} beside [{kind}]; {kind} settings go inside it, "
                    f"e.g. [{kind}.{stray[0]}]")
            data = raw[kind]
        else:
            data = raw
        base_dir = Path(path).resolve().parent
        data = _relative_paths(data, base_dir)
    try:
        cfg = _build(cls, data, "")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    env = _env_overrides(cls, kind, os.environ if environ is None else environ)
    extra = _merge(env, dict(overrides or {}))
    if extra:
        merged = _merge(dataclasses.asdict(cfg), extra)
        try:
            cfg = _build(cls, merged, "")
        except ConfigError as exc:
            raise ConfigError(f"{source} (with environment/overrides): {exc}") from None
    problems = cfg.validate()
    problems.extend(plugin_problems(kind, cfg))
    from ledgerstore.plugins import hooks

    for extra_problems in hooks().hook.ledgerstore_config_validate(kind=kind, config=cfg):
        problems.extend(extra_problems or [])
    if len(problems) == 1:  # the common case is one line, as every other operator error
        raise ConfigError(f"invalid {kind} configuration ({source}): {problems[0]}")
    if problems:
        raise ConfigError(f"invalid {kind} configuration ({source}):\n  - " + "\n  - ".join(problems))
    return cfg


def _relative_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Directories in a config file are relative to the file, not to the working directory."""
    out = dict(data)
    for key in ("journal_dir",):
        if isinstance(out.get(key), str) and not os.path.isabs(out[key]):
            out[key] = str(base / out[key])
    if isinstance(out.get("ledger_dirs"), list):
        out["ledger_dirs"] = [d if not isinstance(d, str) or os.path.isabs(d) else str(base / d) for d in out["ledger_dirs"]]
    if isinstance(out.get("http"), dict):  # the admin HTTP token and TLS files
        out["http"] = {k: str(base / v) if k.endswith("_file") and isinstance(v, str) and v and not os.path.isabs(v)
                       else v for k, v in out["http"].items()}
    md = out.get("metadata")
    if isinstance(md, str) and md.startswith("sqlite://") and not md.startswith("sqlite:///"):
        out["metadata"] = "sqlite://" + str(base / md[len("sqlite://") :])
    return out


def load_bookie_config(path: str | os.PathLike[str] | None = None, **overrides: Any) -> BookieConfig:
    return load(BookieConfig, "bookie", path, overrides)


def load_client_config(path: str | os.PathLike[str] | None = None, **overrides: Any) -> ClientConfig:
    return load(ClientConfig, "client", path, overrides)


def to_toml(cfg: Any, table: str) -> str:
    """Render a config as TOML (for ``config check`` and generated standalone files)."""
    lines = [f"[{table}]"]
    tables: list[tuple[str, dict[str, Any]]] = []
    for k, v in dataclasses.asdict(cfg).items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {_toml_value(v)}")
    for name, values in tables:
        lines.append("")
        lines.append(f"[{table}.{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in values.items())
    return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return repr(v)
