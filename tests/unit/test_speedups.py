"""The compiled hot path (``ledgerstore.proto._speedups``) gives the pure-Python path's bytes,
values and errors on random inputs, and is the one in use whenever it is built."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import crc32c as crc32c_package
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerstore.errors import InvalidArgumentError, ProtocolError
from ledgerstore.proto import codec, speedups
from ledgerstore.proto.digest import Crc32cDigest, Entry
from ledgerstore_entrylog import format as entrylog_format

PROTO = Path(speedups.__file__).parent
BUILT = sorted(PROTO.glob("_speedups*.so"))
RECORDS_BUILT = sorted(Path(entrylog_format.__file__).parent.glob("_records*.so"))
compiled = speedups.load()
needs_compiled = pytest.mark.skipif(
    compiled is None, reason=f"the compiled hot path is not built (scripts/setup.sh) or {speedups.PURE_PYTHON_ENV} is set")

u64 = st.integers(0, 2**64 - 1)
eid = st.integers(0, 2**63 - 1)
payloads = st.lists(st.binary(max_size=300), max_size=20)


@contextmanager
def _on(path: speedups.HotPath | None) -> Iterator[None]:
    saved = speedups.compiled
    speedups.compiled = path
    try:
        yield
    finally:
        speedups.compiled = saved


def _outcome(fn: Callable[[], Any]) -> Any:
    """What ``fn`` returns, or the type and message of the ProtocolError it raises."""
    try:
        return fn()
    except ProtocolError as exc:
        return ("ProtocolError", str(exc))


def _both(fn: Callable[[], Any]) -> tuple[Any, Any]:
    with _on(compiled):
        fast = _outcome(fn)
    with _on(None):
        pure = _outcome(fn)
    return fast, pure


def test_the_compiled_module_is_in_use_when_built() -> None:
    if not BUILT:
        pytest.skip("the compiled hot path is not built here (scripts/setup.sh builds it with gcc)")
    if speedups.forced_pure():
        assert speedups.compiled is None
        return
    assert speedups.compiled is not None, f"{BUILT[0].name} is built but the pure-Python path is in use"
    assert Path(speedups.compiled.__file__) in BUILT  # type: ignore[attr-defined]
    assert RECORDS_BUILT, "core's hot path is built but not the entry log's"
    assert entrylog_format._compiled_record_heads is not None
    from ledgerstore.client import adds
    assert adds.compiled_available(), "core's hot path is built but not the writer's pending adds"


@pytest.mark.parametrize("value", ["1", "yes"])
def test_the_environment_variable_forces_the_pure_python_path(value: str) -> None:
    code = "from ledgerstore.proto import speedups; print(speedups.compiled is None)"
    env = dict(os.environ, **{speedups.PURE_PYTHON_ENV: value})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
    env[speedups.PURE_PYTHON_ENV] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(not BUILT)


@needs_compiled
@given(ledger=eid, entry=eid, lac=st.integers(-1, 2**63 - 1), payload=st.binary(max_size=300))
def test_one_signed_item_is_the_same_on_both_paths_and_as_a_batch_of_one(ledger: int, entry: int, lac: int,
                                                                        payload: bytes) -> None:
    dm = Crc32cDigest(ledger)
    with _on(compiled):
        fast = codec.item_signer(dm)(entry, lac, payload)
    with _on(None):
        pure = codec.item_signer(dm)(entry, lac, payload)
    assert fast == pure == codec.add_batch_items(dm, entry, lac, [payload])[0]


def _signed(ledger: int, entry: int, lac: int, tail: bytes) -> bytes:
    return struct.pack(">QQq", ledger, entry, lac) + tail


batch_entries = st.lists(
    st.tuples(eid, st.integers(-1, 2**63 - 1), st.binary(max_size=8), st.sampled_from(["ok", "short", "ledger", "id"])),
    max_size=12)


@needs_compiled
@given(ledger=u64, spec=batch_entries)
def test_a_batchs_highest_lac_and_its_malformed_entries_are_the_same_on_both_paths(
        ledger: int, spec: list[tuple[int, int, bytes, str]]) -> None:
    entries = []
    for e, lac, tail, kind in spec:
        raw = _signed(ledger if kind != "ledger" else (ledger + 1) % 2**64, e if kind != "id" else e + 1, lac, tail)
        entries.append((e, raw[:23] if kind == "short" else raw))
    fast, pure = _both(lambda: codec.batch_max_lac(ledger, entries))
    assert fast == pure
    expect = None if any(k != "ok" for *_, k in spec) else max((lac for _, lac, _, _ in spec), default=-1)
    assert pure == expect


class _Recorder:
    """Stands in for the extension and records which of its functions the codec called."""

    def __init__(self) -> None:
        self.called: list[str] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def record(*args: Any) -> Any:
            self.called.append(name)
            return {"crc32c_verify_into": None, "read_multi_section": b""}.get(name, [])
        return record


def test_the_codec_and_digest_call_the_selected_hot_path() -> None:
    rec = _Recorder()
    batch = codec.encode_add_batch(1, 2, b"k", [(0, b"x")])
    multi = codec.encode_read_multi_response(1, 0, 2, [(0, 0, b"x")])
    with _on(rec):  # type: ignore[arg-type]
        codec.add_batch_items(Crc32cDigest(2), 0, -1, [b"x"])
        codec.decode_request(batch)
        codec.decode_response(multi)
        Crc32cDigest(2).verify_into([], {})
        codec.encode_read_multi_response(1, 0, 2, [(0, 0, b"x")])
    assert rec.called == ["crc32c_batch_items", "add_batch_entries", "read_multi_items", "crc32c_verify_into",
                          "read_multi_section"]


@needs_compiled
@given(st.binary(max_size=2000), st.integers(0, 2**32 - 1))
def test_crc32c_matches_the_crc32c_package_by_instruction_and_by_table(data: bytes, value: int) -> None:
    assert compiled is not None
    want = crc32c_package.crc32c(data, value)
    assert compiled.crc32c(data, value) == want
    assert compiled.crc32c_portable(data, value) == want
    assert compiled.crc32c(memoryview(bytearray(data)), value) == want


@needs_compiled
@given(u64, eid, st.integers(-(2**63), 2**63 - 1), payloads)
def test_signed_batch_items_are_byte_for_byte_the_pure_ones(ledger_id: int, first: int, lac: int,
                                                             items: list[bytes]) -> None:
    first = min(first, 2**63 - 1 - len(items))
    digest = Crc32cDigest(ledger_id)
    fast, pure = _both(lambda: codec.add_batch_items(digest, first, lac, items))
    assert fast == pure
    assert [type(i) for i in fast] == [bytes] * len(items)
    fast, pure = _both(lambda: codec.add_batch_items(digest, first, lac, [bytearray(p) for p in items]))
    assert fast == pure


@needs_compiled
def test_a_payload_that_is_not_bytes_is_a_type_error_on_both_paths() -> None:
    for path in (compiled, None):
        with _on(path), pytest.raises(TypeError):
            codec.add_batch_items(Crc32cDigest(1), 0, -1, [b"ok", "text"])  # type: ignore[list-item]


def _mangle(frame: bytes, data: st.DataObject) -> bytes:
    """``frame`` as sent, cut short, lengthened, or with one byte changed."""
    how = data.draw(st.sampled_from(["as is", "cut", "extra", "flip"]))
    if how == "cut" and frame:
        return frame[: data.draw(st.integers(0, len(frame) - 1))]
    if how == "extra":
        return frame + data.draw(st.binary(min_size=1, max_size=20))
    if how == "flip" and frame:
        i = data.draw(st.integers(0, len(frame) - 1))
        return frame[:i] + bytes([frame[i] ^ data.draw(st.integers(1, 255))]) + frame[i + 1 :]
    return frame


@needs_compiled
@given(st.lists(st.tuples(u64, st.binary(max_size=100)), max_size=12), st.data())
def test_the_bookies_batch_decode_is_the_pure_one_on_any_frame(entries: list[tuple[int, bytes]],
                                                               data: st.DataObject) -> None:
    assert compiled is not None
    body = codec.encode_add_batch_body(5, b"key", entries)
    start = 14 + 3  # the body's fixed part (u64 ledger, u16 key length, u32 count) and the key
    section = _mangle(body, data)
    count = data.draw(st.sampled_from([len(entries), max(0, len(entries) - 1), len(entries) + 1]))
    fast = _outcome(lambda: compiled.add_batch_entries(section, start, count))
    pure = _outcome(lambda: codec.add_batch_entries(section, start, count))
    assert fast == pure
    if section == body and count == len(entries) and all(e < 2**63 for e, _ in entries):
        assert fast == entries


@needs_compiled
@given(st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**16 - 1), st.binary(max_size=100)),
                max_size=12), st.data())
def test_a_read_multi_answer_encodes_and_decodes_as_the_pure_one(items: list[tuple[int, int, bytes]],
                                                                  data: st.DataObject) -> None:
    fast, pure = _both(lambda: codec.encode_read_multi_response(9, 0, 3, items))
    assert fast == pure  # a bookie's answer, byte for byte
    frame = _mangle(pure, data)
    fast, pure = _both(lambda: codec.decode_response(frame))
    assert fast == pure


@needs_compiled
@given(st.integers(0, 2**63 - 1), st.lists(st.binary(max_size=60), min_size=1, max_size=10), st.data())
def test_verify_into_keeps_what_the_pure_one_keeps(ledger_id: int, items: list[bytes], data: st.DataObject) -> None:
    signed = Crc32cDigest(ledger_id).sign_many(0, -1, items)
    answer = [(data.draw(st.integers(-1, len(items))), data.draw(st.sampled_from([0, 0, 403])), _mangle(s, data))
              for s in signed]
    fast_out: dict[int, Entry] = {}
    pure_out: dict[int, Entry] = {}
    with _on(compiled):
        Crc32cDigest(ledger_id).verify_into(answer, fast_out)
    with _on(None):
        Crc32cDigest(ledger_id).verify_into(answer, pure_out)
    assert fast_out == pure_out
    assert all(type(e) is Entry for e in fast_out.values())


@needs_compiled
@given(u64, st.lists(st.tuples(st.integers(-5, 2**63 + 5), st.binary(max_size=200)), max_size=12))
def test_entry_log_record_heads_are_the_pure_ones(ledger_id: int, entries: list[tuple[int, bytes]]) -> None:
    ledger_id &= 2**63 - 1
    out = []
    for path in (compiled, None):
        with _on(path):
            try:
                out.append(entrylog_format.record_heads(ledger_id, entries))
            except InvalidArgumentError as exc:
                out.append(str(exc))
    assert out[0] == out[1]
    if isinstance(out[0], list):
        assert [r[2] is d for r, (_, d) in zip(out[0], entries, strict=True)] == [True] * len(entries)
