"""The contracts every plugin is held to: declared options checked when the config loads,
capability flags read instead of probing, session events as an enum, typed hooks whose failures
stay with their plugin, and plugin instances handed to a client."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import typing
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledgerstore import hookimpl, hookspecs
from ledgerstore.aio import Client
from ledgerstore.api import (
    MetadataStore,
    PlacementPolicy,
    SessionEvent,
    StorageEngine,
    StorageStats,
    Transport,
    check_options,
    describe_options,
)
from ledgerstore.bookie.server import Bookie
from ledgerstore.cli.main import cli
from ledgerstore.config import BookieConfig, ClientConfig, load, load_bookie_config, load_client_config
from ledgerstore.errors import ConfigError
from ledgerstore.plugins import (
    SLOTS,
    IsolatingPluginManager,
    hooks,
    installed,
    load_driver,
    notify,
    option_problems,
)
from ledgerstore_entrylog import EntryLogStorage
from ledgerstore_example_plugin.placement import RoundRobinPlacement
from ledgerstore_memory import MemoryMetadataStore, drop_namespace
from ledgerstore_tcp import TcpTransport


@pytest.fixture
def meta_uri(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path}/meta.db"


def _problems(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    """The problems a config error lists: one on its only line, or one per line under its header."""
    lines = str(exc.value).splitlines()
    if len(lines) == 1:
        return [lines[0].split("): ", 1)[1]]
    return [line.strip()[2:] for line in lines[1:]]


# --- options --------------------------------------------------------------------------------------


@pytest.mark.parametrize("slot", sorted(SLOTS))
def test_every_installed_plugin_declares_documented_options_that_accept_their_defaults(slot: str) -> None:
    names = installed(slot)
    assert names
    for name in names:
        plugin = load_driver(slot, name)
        options = plugin.Options
        assert dataclasses.is_dataclass(options), (slot, name)
        assert options.__dataclass_params__.frozen, f"{slot} plugin {name!r}: Options must be frozen"
        defaults = {}
        for info in describe_options(options):
            assert info.default is not dataclasses.MISSING, f"{slot} plugin {name!r}: {info.name} has no default"
            if getattr(plugin, "Options", None) is not None and options.__doc__ and not info.doc:
                # a dataclass documented as a whole (rocksdb's RocksDBConfig) names every field there
                assert info.name in options.__doc__, f"{slot} plugin {name!r}: {info.name} is undocumented"
            if info.default is not None:
                defaults[info.name] = info.default
        assert check_options(options, defaults, name) == [], (slot, name)


def test_an_unknown_option_is_one_line_naming_the_plugin_the_option_and_the_allowed_names(
        meta_uri: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_bookie_config(metadata=meta_uri, ledger_dirs=[str(tmp_path / "l")],
                           storage_options={"page_sise": 8192})
    (line,) = [p for p in _problems(exc) if "page_sise" in p]
    assert line.startswith("storage plugin 'entrylog': unknown option 'page_sise'; allowed options: ")
    assert "page_size" in line and "\n" not in line


def test_a_typo_in_a_transport_option_is_refused_rather_than_ignored(meta_uri: str) -> None:
    # the tcp transport used to read its options with .get() and ignore every other name
    with pytest.raises(ConfigError) as exc:
        load_bookie_config(metadata=meta_uri, transport={"conect_timeout": 1.0})
    assert any(p.startswith("transport plugin 'tcp': unknown option 'conect_timeout'") and "connect_timeout" in p
               for p in _problems(exc))


def test_a_wrong_type_names_the_option_and_the_type_wanted(meta_uri: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_bookie_config(metadata=meta_uri, transport={"high_water": "lots"})
    assert "transport plugin 'tcp': option 'high_water' = 'lots' is not an integer >= 1" in _problems(exc)


def test_an_out_of_range_value_names_the_range(meta_uri: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_client_config(metadata=meta_uri, placement="disk-aware", placement_options={"max_disk_usage": 1.5})
    assert ("placement plugin 'disk-aware': option 'max_disk_usage' = 1.5 is out of range: "
            "must be a number between 0 and 1") in _problems(exc)


def test_a_value_outside_the_choices_lists_them(meta_uri: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_client_config(metadata=meta_uri, metadata_options={"synchronous": "fast"})
    assert "metadata plugin 'sqlite': option 'synchronous' = 'fast' is not one of 'full', 'normal'" in _problems(exc)


def test_a_client_transport_table_per_scheme_is_checked_against_that_transport(meta_uri: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_client_config(metadata=meta_uri, transport={"tcp+tls": {"ca_fil": "/etc/ca.pem"}})
    assert any(p.startswith("transport plugin 'tcp+tls': unknown option 'ca_fil'") for p in _problems(exc))
    assert load_client_config(metadata=meta_uri, transport={"tcp": {"connect_timeout": 2.0}}).transport


def test_the_autorecovery_client_transport_tables_are_checked_too(meta_uri: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_bookie_config(metadata=meta_uri, autorecovery={"client_transport": {"zmq": {"sndhwm": -5}}})
    assert ("transport plugin 'zmq': option 'sndhwm' = -5 is out of range: must be an integer >= 0"
            in _problems(exc))


def test_option_values_from_the_environment_arrive_as_text_and_are_accepted(meta_uri: str) -> None:
    cfg = load(BookieConfig, "bookie", environ={"LEDGERSTORE_BOOKIE_METADATA": meta_uri,
                                                "LEDGERSTORE_BOOKIE_TRANSPORT__HIGH_WATER": "65536"})
    assert cfg.transport == {"high_water": "65536"}
    with pytest.raises(ConfigError, match="option 'high_water' = 'much' is not an integer"):
        load(BookieConfig, "bookie", environ={"LEDGERSTORE_BOOKIE_METADATA": meta_uri,
                                              "LEDGERSTORE_BOOKIE_TRANSPORT__HIGH_WATER": "much"})


def test_config_check_reports_a_bad_plugin_option_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text(f'[bookie]\nmetadata = "sqlite://{tmp_path}/meta.db"\n'
                    '[bookie.storage_options]\nflush_interval = -1.0\n')
    result = CliRunner().invoke(cli, ["config", "check", str(path)])
    assert result.exit_code != 0
    assert ("storage plugin 'entrylog': option 'flush_interval' = -1.0 is out of range: must be a number between "
            "0 and 31622400" in result.output)


def test_a_plugin_without_options_is_not_validated_and_says_so_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    class ThirdPartyPlacement(PlacementPolicy):  # written before Options existed
        def new_ensemble(self, *args: object, **kwargs: object) -> list[str]:
            return []

        def replace_bookie(self, *args: object, **kwargs: object) -> str:
            return ""

    with caplog.at_level(logging.DEBUG, logger="ledgerstore.plugins"):
        assert option_problems("placement", "third-party", ThirdPartyPlacement, {"anything": object()}) == []
    assert "declares no Options" in caplog.text and "third-party" in caplog.text


# --- capabilities ---------------------------------------------------------------------------------


def test_base_classes_declare_every_capability_with_a_conservative_default() -> None:
    assert (StorageEngine.supports_batch_add, StorageEngine.supports_compaction, StorageEngine.durable_sync) == (
        False, False, True)
    assert (MetadataStore.supports_watches, MetadataStore.supports_session_events, MetadataStore.supports_tls) == (
        True, False, False)
    assert (Transport.supports_tls, Transport.supports_curve, Transport.closes_oversized_senders) == (
        False, False, True)
    assert (PlacementPolicy.supports_seed, PlacementPolicy.rack_aware, PlacementPolicy.region_aware) == (
        False, False, False)


def test_first_party_plugins_declare_what_they_do() -> None:
    for name in ("sqlite", "zk", "etcd"):
        assert load_driver("metadata", name).supports_session_events, name
    assert load_driver("metadata", "etcd").supports_tls
    assert load_driver("transport", "tcp+tls").supports_tls and not load_driver("transport", "tcp").supports_tls
    assert load_driver("transport", "zmq").supports_curve
    for name in ("entrylog", "rocksdb"):
        engine = load_driver("storage", name)
        assert engine.supports_compaction and engine.supports_batch_add and engine.durable_sync, name
    assert load_driver("placement", "rack-aware").rack_aware
    assert load_driver("placement", "region-aware").region_aware


def test_the_default_compact_does_nothing_and_returns_stats(tmp_path: Path) -> None:
    engine = _Engine([tmp_path])
    engine.open()
    try:
        engine.set_master_key(1, b"mk")
        engine.add_entry(1, 0, b"x")
        assert StorageEngine.compact(engine, 0.8) == engine.stats()
        assert isinstance(StorageEngine.compact(engine, 0.8), StorageStats)
        assert engine.get_entry(1, 0) == b"x"
    finally:
        engine.close()


class _Engine(EntryLogStorage):
    """Counts compact() calls; the capability flag is set per test."""

    calls: typing.ClassVar[list[float]] = []

    def compact(self, threshold: float) -> StorageStats:
        self.calls.append(threshold)
        return super().compact(threshold)


@pytest.mark.parametrize("declared", [False, True])
def test_the_bookie_compacts_only_engines_that_declare_compaction(tmp_path: Path, declared: bool) -> None:
    engine_cls = type("Engine", (_Engine,), {"supports_compaction": declared, "calls": []})

    async def main() -> dict[str, object]:
        name = f"contracts-{uuid.uuid4().hex}"
        store, engine = MemoryMetadataStore(f"memory://{name}"), engine_cls([tmp_path])
        bookie = Bookie(BookieConfig(metadata=f"memory://{name}", ledger_dirs=[str(tmp_path)]),
                        metadata_store=store, engine=engine)
        await store.start()
        engine.open()
        try:
            return await bookie.gc(major=True)
        finally:
            engine.close()
            await store.close()
            drop_namespace(name)

    result = asyncio.run(main())
    assert result["compaction"] == ("major" if declared else None)
    assert engine_cls.calls == ([0.8] if declared else [])


# --- session events -------------------------------------------------------------------------------


def test_session_events_are_an_enum_whose_values_are_the_old_strings() -> None:
    assert [e.value for e in SessionEvent] == ["lost", "restored"]
    assert SessionEvent.LOST == "lost"  # listeners written against the strings keep working
    store = MemoryMetadataStore(f"memory://{uuid.uuid4().hex}")
    heard: list[object] = []
    store.add_session_listener(heard.append)
    store._fire_session_event("lost")  # a backend still passing the string
    store._fire_session_event(SessionEvent.RESTORED)
    assert heard == [SessionEvent.LOST, SessionEvent.RESTORED]
    assert all(type(e) is SessionEvent for e in heard)


def test_the_bookie_refuses_adds_on_lost_and_re_registers_on_restored(tmp_path: Path) -> None:
    async def main() -> None:
        name = f"contracts-{uuid.uuid4().hex}"
        bookie = Bookie(BookieConfig(metadata=f"memory://{name}", listen="tcp://127.0.0.1:0", auto_init_cluster=True,
                                     journal_dir=str(tmp_path / "journal"), ledger_dirs=[str(tmp_path / "ledgers")]))
        await bookie.start()
        try:
            assert bookie.status().registered
            await bookie.registry.unregister(bookie.bookie_id)  # what the lost session's ephemeral node does
            bookie.on_session_event(SessionEvent.LOST)
            assert not bookie.status().registered
            bookie.on_session_event(SessionEvent.RESTORED)
            await asyncio.wait_for(bookie.state.registered.wait(), 10)
            assert [i.bookie_id for i in await bookie.registry.all()] == [bookie.bookie_id]
        finally:
            await bookie.stop()
            drop_namespace(name)

    asyncio.run(main())


# --- hooks ----------------------------------------------------------------------------------------


class _Raising:
    @hookimpl
    def ledgerstore_ledger_deleted(self, ledger_id: int) -> None:
        raise RuntimeError(f"observer broke on {ledger_id}")

    @hookimpl
    def ledgerstore_config_validate(self, kind: str, config: object) -> list[str] | None:
        raise RuntimeError("validator broke")


class _Recording:
    def __init__(self) -> None:
        self.deleted: list[int] = []

    @hookimpl
    def ledgerstore_ledger_deleted(self, ledger_id: int) -> None:
        self.deleted.append(ledger_id)

    @hookimpl
    def ledgerstore_config_validate(self, kind: str, config: object) -> list[str] | None:
        return ["'metadata' is refused by the recording plugin"]


@pytest.mark.parametrize("raising_first", [True, False])
def test_one_failing_hook_implementation_does_not_stop_the_others(
        raising_first: bool, caplog: pytest.LogCaptureFixture) -> None:
    pm = IsolatingPluginManager("ledgerstore")
    pm.add_hookspecs(hookspecs)
    recording = _Recording()
    plugins = [("broken-plugin", _Raising()), ("recording-plugin", recording)]
    for name, plugin in plugins if raising_first else plugins[::-1]:
        pm.register(plugin, name=name)
    with caplog.at_level(logging.ERROR, logger="ledgerstore.plugins"):
        assert pm.hook.ledgerstore_ledger_deleted(ledger_id=7) == []
    assert recording.deleted == [7]
    assert "ledgerstore_ledger_deleted" in caplog.text and "'broken-plugin'" in caplog.text


def test_an_observer_that_raises_does_not_keep_the_event_from_the_other_observers(
        caplog: pytest.LogCaptureFixture) -> None:
    pm = hooks()
    recording, broken = _Recording(), _Raising()
    pm.register(recording, name="recording-observer")
    pm.register(broken, name="broken-observer")  # pluggy calls the last registered first
    try:
        with caplog.at_level(logging.ERROR, logger="ledgerstore.plugins"):
            notify("ledgerstore_ledger_deleted", ledger_id=11)
        assert recording.deleted == [11]
        assert "'broken-observer'" in caplog.text
    finally:
        pm.unregister(broken)
        pm.unregister(recording)


def test_a_failing_config_validator_is_logged_and_the_others_still_refuse(
        meta_uri: str, caplog: pytest.LogCaptureFixture) -> None:
    pm = hooks()
    broken, recording = _Raising(), _Recording()
    pm.register(broken, name="broken-validator")
    pm.register(recording, name="recording-validator")
    try:
        with caplog.at_level(logging.ERROR, logger="ledgerstore.plugins"), pytest.raises(ConfigError) as exc:
            load_client_config(metadata=meta_uri)
        assert "'metadata' is refused by the recording plugin" in _problems(exc)
        assert "'broken-validator'" in caplog.text
    finally:
        pm.unregister(broken)
        pm.unregister(recording)


def test_every_hookspec_is_fully_typed_and_documented() -> None:
    specs = [f for name, f in vars(hookspecs).items() if name.startswith("ledgerstore_") and callable(f)]
    assert len(specs) >= 12
    for spec in specs:
        hints = typing.get_type_hints(spec)  # resolves: no name is left undefined
        params = inspect.signature(spec).parameters
        assert set(params) <= set(hints) and "return" in hints, spec.__name__
        assert all(hints[p] is not typing.Any for p in params), spec.__name__
        assert spec.__doc__, spec.__name__


# --- plugin instances in a client -----------------------------------------------------------------


def test_a_client_uses_the_plugin_instances_it_is_given() -> None:
    name = f"contracts-{uuid.uuid4().hex}"
    store = MemoryMetadataStore(f"memory://{name}")
    transport = TcpTransport(connect_timeout=1.0)
    placement = RoundRobinPlacement(start=2)

    async def main() -> None:
        config = ClientConfig(metadata=f"memory://{name}", placement="random")
        async with Client(config, metadata_store=store, transport=transport, placement=placement) as client:
            assert client.store is store
            assert client.placement is placement
            assert client.pool.transport_for("tcp://127.0.0.1:3181") is transport
            assert client.pool.transport_for("zmq://127.0.0.1:3181") is not transport  # zmq is not its scheme

    try:
        asyncio.run(main())
    finally:
        drop_namespace(name)


def test_placement_and_transport_given_as_config_values_are_still_overrides(meta_uri: str) -> None:
    client = Client(meta_uri, placement="rack-aware", transport={"tcp": {"connect_timeout": 2.0}})
    assert client.config.placement == "rack-aware" and type(client.placement).__name__ == "RackAwarePlacement"
    assert client.config.transport == {"tcp": {"connect_timeout": 2.0}}
