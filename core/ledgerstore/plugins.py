"""Finding backends (stevedore drivers) and extensions (pluggy hooks).

A backend fills one slot and is chosen by name from configuration. A missing or broken backend
fails at start-up with :class:`~ledgerstore.errors.PluginError` naming the slot, the name asked for,
the installed names and the extra to install. A backend's option table is checked against the
``Options`` dataclass it declares (:func:`option_problems`) and parsed once into an instance of
it (:func:`plugin_options`), which :func:`build` hands to the backend's constructor.

Hook implementations are isolated from each other: one that raises is logged with its plugin's
name and the others still run (:class:`IsolatingPluginManager`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import logging
from collections.abc import Callable, Mapping
from typing import Any

import pluggy
from stevedore import driver, extension

from ledgerstore import hookspecs
from ledgerstore.api.options import check_options, parse_options
from ledgerstore.api.transport import DEFAULT_MAX_FRAME_SIZE
from ledgerstore.errors import PluginError

log = logging.getLogger(__name__)

SLOTS = {
    "metadata": "ledgerstore.metadata",
    "transport": "ledgerstore.transport",
    "storage": "ledgerstore.storage",
    "placement": "ledgerstore.placement",
    # protocol handlers: front ends serving another wire protocol (Kafka) on their own port
    "protocol": "ledgerstore.protocol",
}
HOOKS_GROUP = "ledgerstore.hooks"

#: Which extra of the ``ledgerstore`` distribution brings a first-party backend's dependencies.
EXTRAS = {
    ("metadata", "zk"): "zookeeper",
    ("metadata", "etcd"): "etcd",
    ("transport", "zmq"): "zmq",
    ("storage", "rocksdb"): "rocksdb",
}


def installed(slot: str) -> list[str]:
    """Names registered in a slot's entry-point namespace, sorted."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=SLOTS[slot])})


def load_driver(slot: str, name: str) -> type:
    """Return the backend class registered as ``name`` in ``slot``."""
    if slot not in SLOTS:
        raise PluginError(f"unknown plugin slot {slot!r}; slots are {', '.join(SLOTS)}")
    namespace = SLOTS[slot]
    names = installed(slot)
    extra = EXTRAS.get((slot, name))
    hint = (
        f"; install ledgerstore with its {extra!r} extra: pip install '/path/to/ledgerstore[{extra}]' "
        "(a checkout, an sdist or a wheel; see docs/install.md)"
        if extra
        else "; install the distribution that provides it"
    )
    if name not in names:
        raise PluginError(
            f"no {slot} backend named {name!r} (entry-point namespace {namespace}); "
            f"installed: {', '.join(names) or 'none'}{hint}"
        )
    try:
        mgr = driver.DriverManager(namespace, name, invoke_on_load=False, on_load_failure_callback=_reraise)
    except Exception as exc:
        raise PluginError(
            f"the {slot} backend {name!r} is installed but failed to load: {type(exc).__name__}: {exc}"
            f"{hint}"
        ) from exc
    plugin = mgr.driver
    if not isinstance(plugin, type):
        raise PluginError(f"the {slot} backend {name!r} ({namespace}) is {plugin!r}, not a class{hint}")
    return plugin


def _reraise(manager: Any, entrypoint: Any, exc: BaseException) -> None:
    raise exc


def option_problems(slot: str, name: str, plugin: type, options: Mapping[str, Any]) -> list[str]:
    """Problems of ``options`` (a config's option table for the ``slot`` backend ``name``) against
    the ``Options`` dataclass ``plugin`` declares, one line each naming the plugin, the option and
    the allowed values. A plugin that declares no ``Options`` is not checked (logged at debug)."""
    declared = declared_options(plugin)
    if declared is None:
        log.debug("%s plugin %r (%s) declares no Options dataclass: its options are not validated",
                  slot, name, plugin.__qualname__)
        return []
    return check_options(declared, options, f"{slot} plugin {name!r}")


def declared_options(plugin: type) -> type | None:
    """The ``Options`` dataclass ``plugin`` declares, or ``None``."""
    declared = getattr(plugin, "Options", None)
    return declared if isinstance(declared, type) and dataclasses.is_dataclass(declared) else None


def plugin_options(slot: str, name: str, plugin: type, options: Mapping[str, Any]) -> Any:
    """``options`` parsed into the ``Options`` instance ``plugin`` declares; raises
    :class:`~ledgerstore.errors.ConfigError` in one line naming the slot, the plugin and the option."""
    declared = declared_options(plugin)
    if declared is None:
        raise PluginError(f"the {slot} plugin {name!r} ({plugin.__qualname__}) declares no Options dataclass")
    return parse_options(declared, options, f"{slot} plugin {name!r}")


def build(slot: str, name: str, *args: Any, options: Mapping[str, Any]) -> Any:
    """An instance of the ``slot`` backend ``name``, built as ``cls(*args, parsed_options)`` when it
    declares ``Options`` (the table parsed once, :func:`plugin_options`), or as
    ``cls(*args, **options)`` when it does not."""
    return construct(slot, name, load_driver(slot, name), *args, options=options)


def construct(slot: str, name: str, cls: type, *args: Any, options: Mapping[str, Any], **settings: Any) -> Any:
    """:func:`build` with the backend class already loaded (``config check`` loads it first).
    ``settings`` are the host's own keyword arguments for the slot (a transport's
    ``max_frame_size``), passed beside the parsed options."""
    if declared_options(cls) is None:
        return cls(*args, **options, **settings)
    return cls(*args, plugin_options(slot, name, cls, options), **settings)


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    slot: str
    name: str
    target: str
    distribution: str
    version: str
    error: str = ""


def describe_plugins() -> list[PluginInfo]:
    """Every installed backend and hook implementation, with the distribution providing it."""
    rows: list[PluginInfo] = []
    for slot, group in [*SLOTS.items(), ("hooks", HOOKS_GROUP)]:
        for ep in sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist else "?"
            version = ep.dist.version if ep.dist else "?"
            error = ""
            try:
                ep.load()
            except Exception as exc:  # report, do not fail: this is a listing
                error = f"{type(exc).__name__}: {exc}"
            rows.append(PluginInfo(slot, ep.name, ep.value, dist, version, error))
    return rows


class IsolatingPluginManager(pluggy.PluginManager):
    """A pluggy manager whose hook implementations cannot break each other or the caller.

    Every implementation registered (entry point or :meth:`register`) is wrapped: when it raises,
    the error is logged with the plugin's name and the hook's, the implementation counts as having
    returned ``None`` (no result), and the remaining implementations still run. Wrappers
    (``hookwrapper``/``wrapper`` implementations) are left as they are.
    """

    def register(self, plugin: object, name: str | None = None) -> str | None:
        plugin_name = super().register(plugin, name)
        if plugin_name is not None:
            for caller in self.get_hookcallers(plugin) or []:
                for impl in caller.get_hookimpls():
                    if impl.plugin is plugin and not (impl.hookwrapper or impl.wrapper):
                        # pluggy calls impl.function for each implementation in turn: wrapping
                        # it is the one place a failure can be contained per implementation
                        # (pluggy declares the attribute Final, as nothing else should replace it)
                        impl.function = _isolated(impl.function, plugin_name, caller.name)  # type: ignore[misc]
        return plugin_name


def _isolated(function: Callable[..., Any], plugin_name: str, hook_name: str) -> Callable[..., Any]:
    @functools.wraps(function)
    def call(*args: Any) -> Any:
        try:
            return function(*args)
        except Exception:
            log.exception("hook %s of plugin %r failed; the other implementations still run",
                          hook_name, plugin_name)
            return None

    return call


@functools.lru_cache(maxsize=1)
def hooks() -> pluggy.PluginManager:
    """The process-wide plugin manager with every ``ledgerstore.hooks`` entry point loaded."""
    pm = IsolatingPluginManager("ledgerstore")
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints(HOOKS_GROUP)
    return pm


def notify(hook_name: str, **kwargs: Any) -> None:
    """Call an observer hook. Each implementation's failure is logged and the others still run
    (see :class:`IsolatingPluginManager`); nothing is raised to the data path."""
    getattr(hooks().hook, hook_name)(**kwargs)


def uri_scheme(uri: str) -> str:
    scheme, sep, _ = uri.partition("://")
    if not sep or not scheme:
        raise PluginError(f"{uri!r} is not a URI: expected scheme://..., e.g. sqlite:///var/lib/ledgerstore/meta.db")
    return scheme


def create_metadata_store(uri: str, **options: Any) -> Any:
    """Build (unstarted) the metadata store the URI's scheme names, its options parsed once
    (:func:`build`)."""
    return build("metadata", uri_scheme(uri), uri, options=options)


def create_transport(scheme: str, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                     options: Mapping[str, Any] | None = None) -> Any:
    """Build the transport the scheme names, its option table parsed once into its ``Options``
    (:func:`plugin_options`), with ``max_frame_size`` (the host's setting for both sides)."""
    return construct("transport", scheme, load_driver("transport", scheme), options=options or {},
                     max_frame_size=max_frame_size)


extension_manager = extension.ExtensionManager  # re-exported for plugin authors' tests
