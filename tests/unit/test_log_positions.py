"""Log positions: total order, string form, parsing; the log metadata format."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerstore.errors import InvalidArgumentError, LogError, MetadataError
from ledgerstore.meta.logs import LogMetadata, LogSegment, Position, validate_log_name

ids = st.integers(min_value=0, max_value=2**63 - 1)
positions = st.builds(Position, ids, ids)


def test_position_orders_by_ledger_then_entry() -> None:
    assert Position(1, 999) < Position(2, 0) < Position(2, 1)
    assert sorted([Position(3, 0), Position(1, 5), Position(1, 2)]) == [Position(1, 2), Position(1, 5), Position(3, 0)]
    assert max(Position(7, 1), Position(6, 100)) == Position(7, 1)


def test_position_string_form() -> None:
    assert str(Position(17, 0)) == "17:0"
    assert Position.parse("17:0") == Position(17, 0)
    assert Position.parse(" 5:12 ") == Position(5, 12)


@pytest.mark.parametrize("text", ["", "17", "17:", ":3", "a:b", "-1:0", "1:-2", "1:2:3", "1.0:2"])
def test_position_parse_rejects_malformed_text(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match="position"):
        Position.parse(text)


def test_position_coerce() -> None:
    assert Position.coerce((4, 5)) == Position(4, 5)
    assert Position.coerce("4:5") == Position(4, 5)
    with pytest.raises(InvalidArgumentError):
        Position.coerce((4, -1))
    with pytest.raises(InvalidArgumentError):
        Position.coerce((4,))  # type: ignore[arg-type]


@given(positions)
def test_parse_inverts_str(p: Position) -> None:
    assert Position.parse(str(p)) == p


@given(positions, positions)
def test_order_is_the_ledger_entry_pair_order(a: Position, b: Position) -> None:
    assert (a < b) == ((a.ledger_id, a.entry_id) < (b.ledger_id, b.entry_id))
    assert (a == b) == (str(a) == str(b))


def test_log_metadata_round_trips_and_is_versioned() -> None:
    md = LogMetadata(name="orders", segments=[LogSegment(3, 1000), LogSegment(9, 2000)],
                     truncated_before=Position(3, 7), deleting=[1, 2])
    back = LogMetadata.from_bytes(md.to_bytes(), version=42)
    assert back.ledger_ids == [3, 9] and back.truncated_before == Position(3, 7) and back.deleting == [1, 2]
    assert back.version == 42 and back.name == "orders" and back.ctime_ms == md.ctime_ms
    with pytest.raises(MetadataError, match="format"):
        LogMetadata.from_bytes(md.to_bytes().replace(b'"format":1', b'"format":2'))
    with pytest.raises(MetadataError, match="corrupt"):
        LogMetadata.from_bytes(b"{not json")


def test_appending_a_ledger_keeps_ids_increasing() -> None:
    md = LogMetadata(name="orders", segments=[LogSegment(9, 0)], version=1)
    assert md.with_ledger(10).ledger_ids == [9, 10]
    assert md.ledger_ids == [9], "with_ledger returns a copy"
    with pytest.raises(LogError, match="must increase"):
        md.with_ledger(8)


@pytest.mark.parametrize("name", ["", "a/b", ".hidden", "-x", "a b", "x" * 201, "..", "é"])
def test_bad_log_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="log name"):
        validate_log_name(name)


def test_good_log_names() -> None:
    for name in ("orders", "orders.v2", "a_b-c", "0"):
        assert validate_log_name(name) == name
