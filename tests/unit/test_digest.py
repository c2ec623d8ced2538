from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerstore.errors import DigestMismatchError, InvalidArgumentError
from ledgerstore.proto.digest import (
    DIGEST_TYPES,
    Crc32cDigest,
    Crc32Digest,
    DigestManager,
    Entry,
    HmacSha256Digest,
    NoDigest,
    normalize_digest_type,
)

# every test here runs on the compiled hot path and on the pure-Python one
pytestmark = pytest.mark.usefixtures("hot_path")


@pytest.mark.parametrize("dtype", DIGEST_TYPES)
@given(payload=st.binary(max_size=1000), eid=st.integers(0, 2**62), lac=st.integers(-1, 2**62))
def test_sign_verify_round_trip(dtype: str, payload: bytes, eid: int, lac: int) -> None:
    dm = DigestManager(42, dtype, b"pw")
    e = dm.verify(dm.sign(eid, lac, payload), eid)
    assert (e.ledger_id, e.entry_id, e.last_add_confirmed, e.payload) == (42, eid, lac, payload)


@pytest.mark.parametrize("dtype", [d for d in DIGEST_TYPES if d != "none"])
@given(payload=st.binary(min_size=1, max_size=300), data=st.data())
def test_any_flipped_byte_is_detected(dtype: str, payload: bytes, data: st.DataObject) -> None:
    dm = DigestManager(7, dtype, b"pw")
    signed = bytearray(dm.sign(3, 2, payload))
    i = data.draw(st.integers(0, len(signed) - 1))
    signed[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(DigestMismatchError):
        dm.verify(bytes(signed), 3)


def test_hmac_depends_on_password() -> None:
    signed = DigestManager(1, "hmac-sha256", b"right").sign(0, -1, b"data")
    with pytest.raises(DigestMismatchError, match="wrong password"):
        DigestManager(1, "hmac-sha256", b"wrong").verify(signed, 0)


def test_unknown_digest_type() -> None:
    with pytest.raises(InvalidArgumentError, match="crc32c"):
        DigestManager(1, "md5")


@pytest.mark.parametrize("dtype", DIGEST_TYPES)
@given(payloads=st.lists(st.binary(max_size=200), min_size=1, max_size=20), first=st.integers(0, 2**40), lac=st.integers(-1, 2**40))
def test_sign_many_signs_like_sign(dtype: str, payloads: list[bytes], first: int, lac: int) -> None:
    dm = DigestManager(5, dtype, b"pw")
    assert dm.sign_many(first, lac, payloads) == [dm.sign(first + i, lac, p) for i, p in enumerate(payloads)]
    assert dm.sign_many(first, lac, [bytearray(p) for p in payloads]) == dm.sign_many(first, lac, payloads)


@pytest.mark.parametrize("dtype", DIGEST_TYPES)
def test_verify_into_keeps_only_valid_copies(dtype: str) -> None:
    dm = DigestManager(5, dtype, b"pw")
    signed = dm.sign_many(0, -1, [b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 10, b"e" * 10])
    damaged = bytearray(signed[1])
    damaged[-1] ^= 1
    items = [
        (0, 0, signed[0]),
        (1, 0, bytes(damaged)),                         # flipped payload byte
        (2, 0, signed[3]),                               # another entry's copy
        (3, 8, b""),                                     # not OK on the bookie
        (4, 0, signed[4][:10]),                          # shorter than its header
        (5, 0, DigestManager(6, dtype, b"pw").sign(5, -1, b"x")),  # another ledger
    ]
    out: dict[int, object] = {}
    dm.verify_into(items, out)
    expected = {0} if dtype != "none" else {0, 1}  # without a digest only ids and ledger are checked
    assert set(out) == expected
    assert out[0] == dm.verify(signed[0], 0)


# --- one class per digest type, registered by its names -------------------------------------------

NAMES = [("crc32c", Crc32cDigest), ("CRC32C", Crc32cDigest), ("crc32", Crc32Digest), ("CRC32", Crc32Digest),
         ("hmac-sha256", HmacSha256Digest), ("MAC", HmacSha256Digest), ("none", NoDigest), ("DUMMY", NoDigest)]


@pytest.mark.parametrize(("name", "cls"), NAMES)
def test_a_digest_name_ours_or_bookkeepers_builds_its_class(name: str, cls: type[DigestManager]) -> None:
    dm = DigestManager(3, name, b"pw")
    assert type(dm) is cls and dm.digest_type == cls.name == normalize_digest_type(name)
    assert cls(3, password=b"pw").sign(0, -1, b"x") == dm.sign(0, -1, b"x")


def test_every_digest_type_has_its_class_and_the_default_comes_first() -> None:
    assert DIGEST_TYPES == ("crc32c", "crc32", "hmac-sha256", "none")
    assert [DigestManager(1, t).size for t in DIGEST_TYPES] == [4, 4, 32, 0]


def test_a_digest_class_refuses_another_types_name() -> None:
    with pytest.raises(InvalidArgumentError, match="not 'crc32'"):
        Crc32Digest(1, "crc32c")


@given(payload=st.binary(max_size=300), eid=st.integers(0, 2**62), lac=st.integers(-1, 2**62))
def test_the_crc32c_fast_paths_agree_with_the_generic_ones(payload: bytes, eid: int, lac: int) -> None:
    dm = Crc32cDigest(9)
    signed = dm.sign(eid, lac, payload)
    assert dm.sign_many(eid, lac, [payload]) == [DigestManager.sign_many(dm, eid, lac, [payload])[0]] == [signed]
    assert dm.verify(signed, eid) == DigestManager.verify(dm, signed, eid)
    fast: dict[int, Entry] = {}
    slow: dict[int, Entry] = {}
    dm.verify_into([(eid, 0, signed)], fast)
    DigestManager.verify_into(dm, [(eid, 0, signed)], slow)
    assert fast == slow == {eid: dm.verify(signed, eid)}


@pytest.mark.parametrize(("dtype", "signed"), [
    ("crc32c", "000000000000000700000000000000030000000000000002f95533527061796c6f6164"),
    ("crc32", "000000000000000700000000000000030000000000000002ecbc9d237061796c6f6164"),
    ("hmac-sha256", "00000000000000070000000000000003000000000000000290db6c8a12c466be7b79a9ea181bd955a7123575fca129f6"
                    "6849ad7ff87e5d867061796c6f6164"),
    ("none", "0000000000000007000000000000000300000000000000027061796c6f6164"),
])
def test_each_digest_class_signs_entries_as_stored_on_disk_and_wire(dtype: str, signed: str) -> None:
    """Known answers: entries already written by bookies must keep verifying."""
    dm = DigestManager(7, dtype, b"pw")
    assert dm.sign(3, 2, b"payload").hex() == signed
    assert dm.verify(bytes.fromhex(signed), 3).payload == b"payload"
