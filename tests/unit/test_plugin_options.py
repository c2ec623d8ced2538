"""A backend's option table is parsed once, by the host, into the ``Options`` dataclass the backend
declares; the backend is built from that object and keeps no defaults or checks of its own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ledgerstore.api import option, options_for, parse_options
from ledgerstore.errors import ConfigError
from ledgerstore.plugins import build, create_metadata_store, plugin_options
from ledgerstore_entrylog import EntryLogStorage
from ledgerstore_placement.rack import RackAwarePlacement
from ledgerstore_sqlite import SqliteMetadataStore


@dataclasses.dataclass(frozen=True)
class _Pair:
    cert_file: str | None = option(None, "client certificate (with key_file)")
    key_file: str | None = option(None, "the certificate's private key")
    retries: int = option(3, "attempts", minimum=1)

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: give both or neither")


def test_parse_options_types_each_value_and_fills_in_the_defaults() -> None:
    parsed = parse_options(_Pair, {"retries": "5"}, "metadata plugin 'acme'")
    assert parsed == _Pair(retries=5)


def test_every_problem_of_a_table_is_one_error_line_naming_the_slot_plugin_and_option() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_options(_Pair, {"retries": 0, "cert": "x"}, "metadata plugin 'acme'")
    message = str(exc.value)
    assert "\n" not in message
    assert "metadata plugin 'acme': unknown option 'cert'" in message
    assert "metadata plugin 'acme': option 'retries' = 0 is out of range: must be an integer >= 1" in message


def test_a_cross_field_check_in_post_init_is_reported_naming_the_plugin() -> None:
    with pytest.raises(ConfigError, match=r"^metadata plugin 'acme': cert_file and key_file go together"):
        parse_options(_Pair, {"cert_file": "/c.pem"}, "metadata plugin 'acme'")


def test_options_for_keeps_the_hosts_object_and_parses_keyword_options_by_the_same_rules() -> None:
    class Acme:
        Options = _Pair

    given = _Pair(retries=2)
    assert options_for(Acme, given, {}, "x") is given
    assert options_for(Acme, None, {"retries": "4"}, "x") == _Pair(retries=4)
    with pytest.raises(TypeError, match="not both"):
        options_for(Acme, given, {"retries": 4}, "x")


def test_the_host_builds_a_storage_engine_from_its_parsed_options(tmp_path: Path) -> None:
    engine = build("storage", "entrylog", [tmp_path], options={"page_size": "4096", "flush_interval": 0})
    assert isinstance(engine, EntryLogStorage)
    assert engine.options == EntryLogStorage.Options(page_size=4096)


def test_a_storage_option_refused_by_post_init_names_the_slot_and_plugin(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^storage plugin 'entrylog': page_size=100 must be a multiple of 8$"):
        build("storage", "entrylog", [tmp_path], options={"page_size": 100})


def test_the_host_builds_a_metadata_store_from_its_parsed_options(tmp_path: Path) -> None:
    store = create_metadata_store(f"sqlite://{tmp_path}/meta.db", session_timeout=3, synchronous="normal")
    assert isinstance(store, SqliteMetadataStore)
    assert isinstance(store.options, SqliteMetadataStore.Options)
    assert (store.session_ttl, store.synchronous) == (3.0, "NORMAL")


def test_session_ttl_wins_over_session_timeout_when_both_are_given(tmp_path: Path) -> None:
    store = create_metadata_store(f"sqlite://{tmp_path}/meta.db", session_timeout=3, session_ttl=7)
    assert store.session_ttl == 7.0


def test_plugin_options_names_the_slot_plugin_and_option() -> None:
    with pytest.raises(ConfigError, match=r"^placement plugin 'rack-aware': option 'enforce' = 'maybe'"):
        plugin_options("placement", "rack-aware", RackAwarePlacement, {"enforce": "maybe"})
    parsed = plugin_options("placement", "rack-aware", RackAwarePlacement, {"min_racks_per_write_quorum": 3})
    assert RackAwarePlacement(parsed).min_domains == 3
