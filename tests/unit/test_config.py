from __future__ import annotations

from pathlib import Path

import pytest

from ledgerstore.config import BookieConfig, load, load_bookie_config, load_client_config
from ledgerstore.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bookie.toml"
    p.write_text(text)
    return p


def test_defaults_and_relative_dirs(tmp_path: Path) -> None:
    p = write(tmp_path, '[bookie]\nmetadata = "sqlite:///x.db"\njournal_dir = "j"\nledger_dirs = ["l1", "/abs/l2"]\n')
    cfg = load_bookie_config(p)
    assert cfg.journal_dir == str(tmp_path / "j")
    assert cfg.ledger_dirs == [str(tmp_path / "l1"), "/abs/l2"]
    assert cfg.storage == "entrylog" and cfg.journal.max_group_wait_ms == 2.0


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    p = write(tmp_path, '[bookie]\nmetadata = "sqlite:///x.db"\njournl_dir = "j"\n')
    with pytest.raises(ConfigError) as info:
        load_bookie_config(p)
    assert "journl_dir" in str(info.value) and str(p) in str(info.value) and "journal_dir" in str(info.value)


def test_stray_table_beside_the_bookie_table_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path, '[bookie]\nmetadata = "sqlite:///x.db"\n\n[storage_options]\nflush_entrylog_bytes = 0\n')
    with pytest.raises(ConfigError, match=r"'storage_options' beside \[bookie\].*\[bookie.storage_options\]"):
        load_bookie_config(p)
    # a shared file with both roles' tables is fine
    p = write(tmp_path, '[bookie]\nmetadata = "sqlite:///x.db"\n\n[client]\nmetadata = "sqlite:///x.db"\n')
    assert load_bookie_config(p).metadata == "sqlite:///x.db"


def test_wrong_type_names_nested_key(tmp_path: Path) -> None:
    p = write(tmp_path, '[bookie]\nmetadata = "sqlite:///x.db"\n[bookie.journal]\nmax_group_bytes = "lots"\n')
    with pytest.raises(ConfigError, match=r"journal\.max_group_bytes.*integer"):
        load_bookie_config(p)


def test_missing_metadata_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'metadata' is required"):
        load_bookie_config(write(tmp_path, "[bookie]\n"))


def test_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_bookie_config(write(tmp_path, "[bookie\n"))


def test_environment_overrides(tmp_path: Path) -> None:
    p = write(tmp_path, '[bookie]\nmetadata = "sqlite:///x.db"\n')
    env = {"LEDGERSTORE_BOOKIE_STORAGE": "rocksdb", "LEDGERSTORE_BOOKIE_JOURNAL__MAX_GROUP_WAIT_MS": "0.5",
           "LEDGERSTORE_BOOKIE_LEDGER_DIRS": "/a,/b"}
    cfg = load(BookieConfig, "bookie", p, environ=env)
    assert cfg.storage == "rocksdb" and cfg.journal.max_group_wait_ms == 0.5 and cfg.ledger_dirs == ["/a", "/b"]
    with pytest.raises(ConfigError, match="LEDGERSTORE_BOOKIE_NOPE"):
        load(BookieConfig, "bookie", p, environ={"LEDGERSTORE_BOOKIE_NOPE": "1"})


def test_client_quorum_validation() -> None:
    with pytest.raises(ConfigError, match="ensemble >= write_quorum >= ack_quorum"):
        load_client_config(None, metadata="sqlite:///x.db", ensemble=2, write_quorum=3)


def test_bookkeeper_digest_names_are_accepted_in_client_config() -> None:
    for name in ("CRC32", "CRC32C", "MAC", "DUMMY", "crc32c"):
        assert load_client_config(None, metadata="sqlite:///x.db", digest=name).digest == name
    with pytest.raises(ConfigError, match="digest"):
        load_client_config(None, metadata="sqlite:///x.db", digest="SHA7")
