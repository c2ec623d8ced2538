from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerstore.errors import DigestMismatchError, InvalidArgumentError
from ledgerstore.proto.digest import DIGEST_TYPES, DigestManager


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
