"""Ledger password checks: a salted scrypt hash that names its own parameters, verified in
constant time; an older release's unsalted check still opens its ledger and is rewritten by
compare-and-set the first time its password is verified; nothing shown of ledger metadata
carries anything derived from the password."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import uuid
from collections.abc import Awaitable, Callable

import pytest

from ledgerstore.client.passwords import PasswordChecks
from ledgerstore.config import ClientConfig
from ledgerstore.errors import MetadataError, UnauthorizedAccessError
from ledgerstore.meta.ledgers import LedgerManager, LedgerMetadata
from ledgerstore.proto import digest
from ledgerstore.proto.digest import (
    check_needs_upgrade,
    legacy_password_check,
    password_check,
    verify_password,
)
from ledgerstore_memory import MemoryMetadataStore

PW = b"pw"


def run_with_manager(scenario: Callable[[LedgerManager], Awaitable[None]]) -> None:
    async def main() -> None:
        store = MemoryMetadataStore(f"memory://passwords-{uuid.uuid4().hex}")
        await store.start()
        try:
            await scenario(LedgerManager(store))
        finally:
            await store.close()

    asyncio.run(main())


def metadata(ledger_id: int, check: str) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=ledger_id, ensemble_size=1, write_quorum=1, ack_quorum=1, digest_type="crc32c",
                          password_check=check, ensembles=[(0, ["b:1"])])


def test_a_check_is_salted_scrypt_naming_its_parameters() -> None:
    check = password_check(PW)
    kind, n, r, p, salt, hashed = check.split("$")
    assert (kind, n, r, p) == ("scrypt", f"n={digest.SCRYPT_N}", f"r={digest.SCRYPT_R}", f"p={digest.SCRYPT_P}")
    assert len(base64.b64decode(salt)) == 16 and len(base64.b64decode(hashed)) == 32
    assert password_check(PW) != check  # a fresh salt each time: equal passwords do not show
    assert verify_password(check, PW)
    assert not verify_password(check, b"pW")
    assert not verify_password(check, b"")
    assert not check_needs_upgrade(check)


def test_a_check_made_with_smaller_parameters_still_verifies_and_asks_to_be_rewritten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digest, "SCRYPT_N", 2**10)
    weak = password_check(PW)
    monkeypatch.undo()
    assert weak.startswith("scrypt$n=1024$")
    assert verify_password(weak, PW) and not verify_password(weak, b"other")
    assert check_needs_upgrade(weak)


def test_the_unsalted_check_of_older_releases_verifies_and_asks_to_be_rewritten() -> None:
    old = legacy_password_check(PW)
    assert len(old) == 64
    assert verify_password(old, PW) and not verify_password(old, b"other")
    assert check_needs_upgrade(old)


@pytest.mark.parametrize("corrupt", [
    "", "sha1$abc", "scrypt$n=16384$r=8$p=1$c2FsdA==",  # a part missing
    "scrypt$n=1000$r=8$p=1$c2FsdHNhbHQ=$aGFzaGhhc2g=",  # n is not a power of two
    "scrypt$n=1073741824$r=8$p=1$c2FsdHNhbHQ=$aGFzaGhhc2g=",  # would allocate 128 GiB
    "scrypt$n=16384$r=8$p=1$c2Fsd!Q=$aGFzaGhhc2g=",
])
def test_a_corrupt_check_is_a_metadata_error_not_a_crash_or_a_huge_allocation(corrupt: str) -> None:
    with pytest.raises(MetadataError):
        verify_password(corrupt, PW)


def test_an_old_format_check_opens_and_is_rewritten_by_compare_and_set() -> None:
    async def scenario(ledgers: LedgerManager) -> None:
        created = await ledgers.create(metadata(7, legacy_password_check(PW)))
        checks = PasswordChecks(ledgers)
        with pytest.raises(UnauthorizedAccessError, match="wrong password for ledger 7"):
            await checks.verify(await ledgers.read(7), b"wrong")
        assert (await ledgers.read(7)).version == created.version  # a wrong password writes nothing

        opened = await checks.verify(await ledgers.read(7), PW)
        stored = await ledgers.read(7)
        assert opened.version == stored.version and stored.version != created.version
        assert stored.password_check.startswith("scrypt$") and stored.password_check == opened.password_check
        assert verify_password(stored.password_check, PW)
        assert dataclasses.replace(stored, password_check="", version=None) == \
            dataclasses.replace(created, password_check="", version=None)  # nothing else changed
        # once rewritten, verifying again writes nothing, in this client or a fresh one
        await checks.verify(stored, PW)
        await PasswordChecks(ledgers).verify(await ledgers.read(7), PW)
        assert (await ledgers.read(7)).version == stored.version
        with pytest.raises(UnauthorizedAccessError):
            await PasswordChecks(ledgers).verify(await ledgers.read(7), b"wrong")

    run_with_manager(scenario)


def test_losing_the_rewrite_race_still_opens_and_a_later_open_rewrites() -> None:
    async def scenario(ledgers: LedgerManager) -> None:
        await ledgers.create(metadata(8, legacy_password_check(PW)))
        seen = await ledgers.read(8)
        # a writer changes the metadata between this client's read and its rewrite
        await ledgers.write(dataclasses.replace(seen, custom={"changed": "yes"}))
        opened = await PasswordChecks(ledgers).verify(seen, PW)
        assert opened is seen
        stored = await ledgers.read(8)
        assert stored.custom == {"changed": "yes"} and stored.password_check == legacy_password_check(PW)
        await PasswordChecks(ledgers).verify(stored, PW)
        upgraded = await ledgers.read(8)
        assert upgraded.password_check.startswith("scrypt$") and upgraded.custom == {"changed": "yes"}

    run_with_manager(scenario)


def test_a_client_verifies_a_check_once_and_not_with_another_password(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = digest.verify_password

    def counting(check: str, password: bytes) -> bool:
        calls.append(check)
        return real(check, password)

    monkeypatch.setattr("ledgerstore.client.passwords.verify_password", counting)

    async def scenario(ledgers: LedgerManager) -> None:
        checks = PasswordChecks(ledgers)
        md = await ledgers.create(metadata(9, await checks.make(PW)))
        for _ in range(3):
            await checks.verify(md, PW)
        assert calls == []  # made by this client: known
        other = PasswordChecks(ledgers)
        for _ in range(3):
            await other.verify(md, PW)
        assert len(calls) == 1
        with pytest.raises(UnauthorizedAccessError):
            await other.verify(md, b"wrong")  # a remembered check does not let another password through
        assert len(calls) == 2

    run_with_manager(scenario)


def test_nothing_shown_of_ledger_metadata_is_derived_from_the_password() -> None:
    md = metadata(3, password_check(PW))
    md.password = base64.b64encode(PW).decode()
    salt, hashed = md.password_check.split("$")[-2:]
    for shown in (repr(md), str(md), str(md.to_dict())):
        for secret in (md.password_check, salt, hashed, legacy_password_check(PW), md.password):
            assert secret not in shown, (secret, shown)
    assert "password_check" not in md.to_dict()
    assert md.to_dict()["password"] == "(stored)"
    # ...while what is stored keeps it
    assert LedgerMetadata.from_bytes(md.to_bytes()).password_check == md.password_check


def test_the_configured_cost_makes_new_checks_and_weaker_ones_are_rewritten() -> None:
    async def scenario(ledgers: LedgerManager) -> None:
        cheap = PasswordChecks(ledgers, cost=2**10)
        md = await ledgers.create(metadata(11, await cheap.make(PW)))
        assert md.password_check.startswith("scrypt$n=1024$")
        assert (await cheap.verify(md, PW)).version == md.version  # as strong as this client asks
        raised = await PasswordChecks(ledgers).verify(md, PW)  # the default cost is higher: rewritten
        assert raised.password_check.startswith(f"scrypt$n={digest.SCRYPT_N}$") and raised.version != md.version

    run_with_manager(scenario)


@pytest.mark.parametrize("cost", [0, 1000, 2**9, 2**21])
def test_a_password_check_cost_out_of_range_is_a_config_problem(cost: int) -> None:
    problems = ClientConfig(metadata="sqlite:///tmp/x.db", password_check_cost=cost).validate()
    assert problems == [f"'password_check_cost' = {cost} must be a power of two from 1024 to 1048576"]
