# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled hot path of the wire codec and the CRC32C digest (built by scripts/setup.sh).

Each function gives the same values, the same bytes and the same errors as the pure-Python code
it stands in for (named in its docstring), for the inputs those callers pass; ``speedups.py``
decides which of the two runs. Only the per-entry loops are here, as in asyncpg's protocol: the
messages and their checks stay in Python.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from ledgerstore.errors import ProtocolError


cdef extern from "_speedups_c.h":
    void ls_crc32c_init()
    uint32_t ls_crc32c(uint32_t value, const void *p, size_t n) nogil
    uint32_t ls_crc32c_sw(uint32_t crc, const unsigned char *p, size_t n) nogil
    void ls_put_u64(unsigned char *p, uint64_t v) nogil
    void ls_put_u32(unsigned char *p, uint32_t v) nogil
    void ls_put_u16(unsigned char *p, uint16_t v) nogil
    uint64_t ls_get_u64(const unsigned char *p) nogil
    uint32_t ls_get_u32(const unsigned char *p) nogil
    uint16_t ls_get_u16(const unsigned char *p) nogil
    object ls_tuple4(object type, object a, object b, object c, object d)
    int ls_crc_hw

ls_crc32c_init()

#: whether CRC32C runs on the CPU's crc32 instruction (SSE4.2) rather than the table
HARDWARE_CRC = bool(ls_crc_hw)

cdef enum:
    ENTRY_HEADER = 24  # u64 ledger, u64 entry, i64 lac
    CRC_HEADER = 28  # the entry header and its crc32c
    ITEM_HEAD = 12  # an ADD_BATCH item: u64 entry, u32 length
    READ_ITEM_HEAD = 14  # a READ_MULTI answer item: i64 entry, u16 status, u32 length

cdef uint64_t MAX_ID = 0x7FFFFFFFFFFFFFFF


def crc32c(data, uint32_t value=0):
    """CRC32C of ``data`` (any bytes-like object) continuing from ``value``: ``crc32c.crc32c``."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return ls_crc32c(value, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)


def crc32c_portable(data, uint32_t value=0):
    """:func:`crc32c` by the table (slicing-by-8), never by the CPU's instruction: what runs on
    a CPU without SSE4.2, kept callable so the tests check it on every machine."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return ~ls_crc32c_sw(~value, <const unsigned char *>view.buf, <size_t>view.len) & 0xFFFFFFFF
    finally:
        PyBuffer_Release(&view)


cdef bytes _crc32c_item(uint64_t ledger_id, uint64_t eid, int64_t lac, payload):
    """One ADD_BATCH item: u64 entry, u32 length, the entry header, its CRC32C and the payload."""
    cdef Py_buffer view
    cdef unsigned char *p
    cdef bytes item
    cdef Py_ssize_t n
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        n = view.len
        item = PyBytes_FromStringAndSize(NULL, 40 + n)
        p = <unsigned char *>PyBytes_AS_STRING(item)
        ls_put_u64(p, eid)
        ls_put_u32(p + 8, <uint32_t>(CRC_HEADER + n))
        ls_put_u64(p + 12, ledger_id)
        ls_put_u64(p + 20, eid)
        ls_put_u64(p + 28, <uint64_t>lac)
        ls_put_u32(p + 36, ls_crc32c(ls_crc32c(0, p + 12, ENTRY_HEADER), view.buf, <size_t>n))
        if n:
            memcpy(p + 40, view.buf, <size_t>n)
    finally:
        PyBuffer_Release(&view)
    return item


def crc32c_batch_items(uint64_t ledger_id, uint64_t first_entry_id, int64_t lac, payloads):
    """Sign ``payloads`` with CRC32C as consecutive entries and frame each as an ADD_BATCH item:
    the CRC32C branch of ``codec.add_batch_items``."""
    cdef list out = []
    cdef uint64_t eid = first_entry_id
    for payload in payloads:
        out.append(_crc32c_item(ledger_id, eid, lac, payload))
        eid += 1
    return out


def crc32c_item(uint64_t ledger_id, uint64_t entry_id, int64_t lac, payload):
    """One entry of :func:`crc32c_batch_items`: the CRC32C branch of ``codec.item_signer``."""
    return _crc32c_item(ledger_id, entry_id, lac, payload)


def batch_max_lac(uint64_t ledger_id, entries):
    """The highest LAC of an ADD_BATCH's signed entries, or None for a malformed one: the loop of
    ``codec.batch_max_lac``."""
    cdef int64_t max_lac = -1, lac
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef bint ok
    for eid, entry in entries:
        PyObject_GetBuffer(entry, &view, PyBUF_SIMPLE)
        try:
            p = <const unsigned char *>view.buf
            ok = view.len >= ENTRY_HEADER and ls_get_u64(p) == ledger_id and 0 <= eid <= 0xFFFFFFFFFFFFFFFF
            if ok:
                ok = ls_get_u64(p + 8) == <uint64_t>eid
            if ok:
                lac = <int64_t>ls_get_u64(p + 16)
        finally:
            PyBuffer_Release(&view)
        if not ok:
            return None
        if lac > max_lac:
            max_lac = lac
    return max_lac


def add_batch_entries(bytes frame, Py_ssize_t pos, Py_ssize_t count):
    """The ``(entry id, signed entry)`` items of an ADD_BATCH request's entry section, which
    starts at ``pos`` and must end the frame: the loop of ``AddBatchRequest.decode``."""
    return _entry_section(frame, pos, count, False)


def read_multi_items(bytes frame, Py_ssize_t pos, Py_ssize_t count):
    """The ``(entry id, status, signed entry)`` items of a READ_MULTI answer, which start at
    ``pos`` and must end the frame: the loop of ``ReadMultiResponse.decode``."""
    return _entry_section(frame, pos, count, True)


cdef list _entry_section(bytes frame, Py_ssize_t pos, Py_ssize_t count, bint answer):
    """``count`` items of ``u64 entry, u32 length, bytes`` (an ADD_BATCH request), or with
    ``answer`` of ``i64 entry, u16 status, u32 length, bytes`` (a READ_MULTI answer), from ``pos``
    to the end of ``frame``; ProtocolError with the pure decoder's message when they do not fit."""
    cdef const unsigned char *buf = <const unsigned char *>PyBytes_AS_STRING(frame)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(frame)
    cdef Py_ssize_t head = READ_ITEM_HEAD if answer else ITEM_HEAD
    cdef list items = []
    cdef Py_ssize_t i
    cdef uint64_t eid
    cdef uint32_t size
    for i in range(count):
        if n - pos < head:
            if answer:
                raise ProtocolError(f"truncated read-multi response: {len(items)} of {count} entries")
            raise ProtocolError(f"truncated add-batch: {len(items)} of {count} entries")
        eid = ls_get_u64(buf + pos)
        size = ls_get_u32(buf + pos + head - 4)
        pos += head
        if answer:
            if size > n - pos:
                raise ProtocolError(f"read-multi entry {<int64_t>eid} of {size} bytes does not fit the frame")
            items.append((<int64_t>eid, ls_get_u16(buf + pos - 6),
                          PyBytes_FromStringAndSize(<const char *>buf + pos, size)))
        else:
            if size > n - pos or eid > MAX_ID:
                raise ProtocolError(
                    f"add-batch entry {eid} of {size} bytes does not fit the frame or its id is out of range")
            items.append((eid, PyBytes_FromStringAndSize(<const char *>buf + pos, size)))
        pos += size
    if pos != n:
        if answer:
            raise ProtocolError(f"read-multi response has {n - pos} bytes after its {count} entries")
        raise ProtocolError(f"add-batch frame has {n - pos} bytes after its {count} entries")
    return items


def read_multi_section(items):
    """``count x (i64 entry, u16 status, u32 length, bytes)`` of ``(entry, status, data)`` items:
    the items of ``ReadMultiResponse.frame`` (a bookie's answer to a multi-entry read)."""
    cdef Py_buffer view
    cdef Py_ssize_t total = 0
    cdef Py_ssize_t pos = 0
    cdef unsigned char *p
    cdef bytes out
    for e, st, data in items:  # sizes first: one allocation for the whole answer
        total += READ_ITEM_HEAD + len(data)
    out = PyBytes_FromStringAndSize(NULL, total)
    p = <unsigned char *>PyBytes_AS_STRING(out)
    for e, st, data in items:
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            if pos + READ_ITEM_HEAD + view.len > total:
                raise ValueError("an item's data changed size while its answer was encoded")
            ls_put_u64(p + pos, <uint64_t><int64_t>e)
            ls_put_u16(p + pos + 8, <uint16_t>st)
            ls_put_u32(p + pos + 10, <uint32_t>view.len)
            memcpy(p + pos + READ_ITEM_HEAD, view.buf, <size_t>view.len)
            pos += READ_ITEM_HEAD + view.len
        finally:
            PyBuffer_Release(&view)
    if pos != total:
        raise ValueError("an item's data changed size while its answer was encoded")
    return out


def crc32c_verify_into(ledger_id, items, dict out, type entry_type not None):
    """Verify the ``(entry id, status, data)`` items of a READ_MULTI answer against CRC32C and
    put each valid one into ``out`` as ``entry_type(ledger id, entry id, lac, payload)``:
    ``Crc32cDigest.verify_into``."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef uint64_t lid, l2, e2
    cdef int64_t want
    cdef bint ok
    cdef Py_ssize_t n
    if not issubclass(entry_type, tuple):
        raise TypeError(f"entry_type must be a tuple subclass, not {entry_type.__name__}")
    if ledger_id < 0 or ledger_id > MAX_ID * 2 + 1:
        return  # no header can name it (the pure loop compares and finds no match)
    lid = ledger_id
    for eid, status, data in items:
        if status:
            continue
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            n = view.len
            if n < CRC_HEADER:
                continue
            p = <const unsigned char *>view.buf
            l2 = ls_get_u64(p)
            e2 = ls_get_u64(p + 8)
            ok = (l2 == lid and eid >= 0 and eid <= MAX_ID * 2 + 1 and e2 == <uint64_t>eid
                  and ls_crc32c(ls_crc32c(0, p, ENTRY_HEADER), p + CRC_HEADER, <size_t>(n - CRC_HEADER))
                  == ls_get_u32(p + ENTRY_HEADER))
            if ok:
                lac = <int64_t>ls_get_u64(p + 16)
                if type(data) is bytes:
                    payload = PyBytes_FromStringAndSize(<const char *>p + CRC_HEADER, n - CRC_HEADER)
                else:
                    payload = data[CRC_HEADER:]
        finally:
            PyBuffer_Release(&view)
        if ok:
            out[eid] = ls_tuple4(entry_type, ledger_id, eid, lac, payload)


cdef bytes _log_entry_varint(bytes header, uint64_t seq, object payload):
    cdef Py_buffer view
    cdef Py_ssize_t n = PyBytes_GET_SIZE(header)
    cdef Py_ssize_t k = 1
    cdef uint64_t rest = seq >> 7
    cdef bytes entry
    cdef unsigned char *p
    while rest:
        k += 1
        rest >>= 7
    try:
        PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    except BufferError as exc:  # a strided memoryview: the TypeError the concatenation raises
        raise TypeError(f"can't concat {type(payload).__name__} to bytes ({exc})") from None
    try:
        entry = PyBytes_FromStringAndSize(NULL, n + k + view.len)
        p = <unsigned char *>PyBytes_AS_STRING(entry)
        memcpy(p, PyBytes_AS_STRING(header), n)
        p += n
        while seq >= 0x80:
            p[0] = <unsigned char>((seq & 0x7F) | 0x80)
            p += 1
            seq >>= 7
        p[0] = <unsigned char>seq
        memcpy(p + 1, view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return entry


def log_entry_varint(bytes header not None, uint64_t seq, payload):
    """A sequenced log entry, ``header`` (a producer's flags, id length and id), the sequence as
    an unsigned LEB128 varint, then ``payload``, built in one buffer: ``header + varint(seq) +
    payload`` in ``ledgerstore.client.log.entry``."""
    return _log_entry_varint(header, seq, payload)


def log_entries_varint(bytes header not None, uint64_t first_seq, payloads):
    """:func:`log_entry_varint` of each of ``payloads``, with the sequences ``first_seq``,
    ``first_seq + 1``, ...: ``entry.encode_many``'s pure-Python loop."""
    cdef list out = []
    cdef uint64_t seq = first_seq
    for payload in payloads:
        out.append(_log_entry_varint(header, seq, payload))
        seq += 1
    return out
