"""What the shell prints of stored bytes: data, never markup or terminal control."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ledgerstore.cli.common import payload_text, printable


def test_terminal_controls_are_escaped_and_text_is_kept() -> None:
    assert payload_text(b"\x1b[31mred\x07") == "\\x1b[31mred\\x07"
    assert payload_text(b"[bold]x[/x]") == "[bold]x[/x]"
    assert payload_text("caf\u00e9 \u202e\u2028".encode()) == "café \\u202e\\u2028"
    assert payload_text(b"a\\b\n\t\r") == "a\\\\b\\n\\t\\r"


def test_bytes_that_are_not_utf8_are_shown_one_by_one() -> None:
    assert payload_text(b"\xff\xfeok\xc3") == "\\xff\\xfeok\\xc3"


@given(st.binary(max_size=64))
def test_no_control_character_survives(data: bytes) -> None:
    shown = payload_text(data)
    assert shown.isprintable()
    assert printable(shown, backslashes=False) == shown  # a second pass changes nothing


@given(st.text(max_size=32))
def test_escaped_text_tells_different_payloads_apart(a: str) -> None:
    b = a + "\\"
    assert printable(a) != printable(b)
