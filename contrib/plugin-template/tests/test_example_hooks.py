"""The hook implementations: registered through the entry point, called through pluggy."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest

import ledgerstore_example_plugin.hooks as example_hooks
from ledgerstore.plugins import hooks


def test_hooks_module_is_registered_by_its_entry_point() -> None:
    pm = hooks()
    assert pm.get_plugin("example-plugin") is example_hooks
    implemented = {caller.name for caller in pm.get_hookcallers(example_hooks) or []}
    assert {"ledgerstore_ledger_created", "ledgerstore_ledger_closed", "ledgerstore_cli_commands"} <= implemented


def test_ledger_created_is_logged_when_the_hook_is_called(caplog: pytest.LogCaptureFixture) -> None:
    metadata = SimpleNamespace(
        ensembles=[(0, ["127.0.0.1:4000", "127.0.0.1:4001"])], ensemble_size=2, write_quorum=2, ack_quorum=1
    )
    with caplog.at_level(logging.INFO, logger="ledgerstore_example_plugin"):
        hooks().hook.ledgerstore_ledger_created(ledger_id=42, metadata=metadata)
        hooks().hook.ledgerstore_ledger_closed(ledger_id=42, last_entry_id=9, recovered=True)
    messages = [r.getMessage() for r in caplog.records if r.name == "ledgerstore_example_plugin"]
    assert messages == [
        "ledger 42 created on 127.0.0.1:4000,127.0.0.1:4001 (ensemble 2, write quorum 2, ack quorum 1)",
        "ledger 42 closed at entry 9 by recovery",
    ]


def test_cli_command_is_added_to_the_ledgerstore_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ledgerstore", "placement-preview", "-n", "3", "-e", "2", "--json", "b", "a", "c"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [["a", "b"], ["b", "c"], ["c", "a"]]


def test_cli_command_reports_too_few_bookies() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ledgerstore", "placement-preview", "-e", "3", "a", "b"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0
    assert "needs 3 writable bookies" in done.stderr and "found 2" in done.stderr
