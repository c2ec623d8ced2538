from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ledgerstore.errors import PluginError
from ledgerstore.plugins import create_metadata_store, installed, load_driver


def test_unknown_backend_names_slot_name_installed_and_extra() -> None:
    with pytest.raises(PluginError) as info:
        load_driver("storage", "leveldb")
    msg = str(info.value)
    assert "storage" in msg and "'leveldb'" in msg and "entrylog" in msg and "ledgerstore.storage" in msg


def test_missing_first_party_backend_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import ledgerstore.plugins as plugins

    monkeypatch.setattr(plugins, "installed", lambda slot: ["sqlite"])  # as if the extra were not installed
    with pytest.raises(PluginError, match=r"'zookeeper' extra: pip install '/path/to/ledgerstore\[zookeeper\]'"):
        create_metadata_store("zk://127.0.0.1:2181/ledgers")


def test_unknown_scheme_lists_installed() -> None:
    with pytest.raises(PluginError, match="installed: .*sqlite"):
        create_metadata_store("nosuch://x")
    assert "zk" in installed("metadata") and "sqlite" in installed("metadata")


def test_not_a_uri() -> None:
    with pytest.raises(PluginError, match="not a URI"):
        create_metadata_store("/just/a/path.db")


def test_every_first_party_backend_loads() -> None:
    for slot in ("metadata", "transport", "storage", "placement"):
        for name in installed(slot):
            assert isinstance(load_driver(slot, name), type)


def test_plugins_command_lists_backends_with_distribution() -> None:
    out = subprocess.run([sys.executable, "-m", "ledgerstore", "plugins", "--json"], capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    names = {(r["slot"], r["name"]) for r in rows}
    assert {("metadata", "sqlite"), ("transport", "tcp"), ("storage", "entrylog"), ("placement", "random")} <= names
    assert all(r["distribution"] for r in rows if r["slot"] != "hooks")
    assert all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"]
