# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled per-entry work of the entry log's batch append (built by scripts/setup.sh):
``format.record_heads``'s loop, with the same tuples, bytes and errors, and the common case of
``EntryLogStorage.add_entries``'s loop (``append_run``), with the same bytes and index slots,
and ``EntryLog.read_window``'s loop (``cut_records``), with the same data and damage."""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint32_t, uint64_t

from ledgerstore.errors import InvalidArgumentError


cdef extern from "_speedups_c.h":  # core's C helpers (ledgerstore/proto), found by the build's include path
    void ls_crc32c_init()
    uint32_t ls_crc32c(uint32_t value, const void *p, size_t n) nogil
    void ls_put_u64(unsigned char *p, uint64_t v) nogil
    void ls_put_u32(unsigned char *p, uint32_t v) nogil
    uint64_t ls_get_u64(const unsigned char *p) nogil
    uint32_t ls_get_u32(const unsigned char *p) nogil

cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1

ls_crc32c_init()

cdef enum:
    LOG_HEADER_SIZE = 16  # format.LOG_HEADER_SIZE


def record_heads(uint64_t ledger_id, entries):
    """``(entry id, record header, data, record size)`` for each ``(entry id, data)``: the
    24-byte header is ``u32 length, u32 crc32c(ledger id, entry id, data), u64 ledger, u64 entry``.
    InvalidArgumentError for an entry id outside ``0..2**63-1``, before anything is returned."""
    cdef list out = []
    cdef Py_buffer view
    cdef unsigned char *p
    cdef bytes head
    cdef long long eid
    cdef int overflow
    for entry_id, data in entries:
        eid = PyLong_AsLongLongAndOverflow(entry_id, &overflow)
        if overflow or eid < 0:
            raise InvalidArgumentError(f"entry ({ledger_id}, {entry_id}) is outside 0..2**63-1")
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            head = PyBytes_FromStringAndSize(NULL, 24)
            p = <unsigned char *>PyBytes_AS_STRING(head)
            ls_put_u32(p, <uint32_t>view.len)
            ls_put_u64(p + 8, ledger_id)
            ls_put_u64(p + 16, <uint64_t>eid)
            ls_put_u32(p + 4, ls_crc32c(ls_crc32c(0, p + 8, 16), view.buf, <size_t>view.len))
            out.append((entry_id, head, data, 24 + view.len))
        finally:
            PyBuffer_Release(&view)
    return out


def append_run(list records, Py_ssize_t i, bytearray buf not None, long long size, long long limit, Py_ssize_t wbs,
               unsigned long long base, long long spp, long long cur_no, slots, long long last):
    """The common case of ``EntryLogStorage.add_entries``'s loop, from ``records[i]`` on: append
    each record (a ``record_heads`` tuple) to ``buf`` and point its slot of ``slots`` (index page
    ``cur_no``) at it, while the record stays on that page, fits the log's ``limit`` and leaves
    ``buf`` under ``wbs``. Stops before the first record that needs more (a roll, a buffer write,
    another page), which the Python loop then takes; returns ``(i, size, last)`` there."""
    cdef unsigned long long[::1] s = slots
    cdef Py_ssize_t n = len(records)
    cdef Py_ssize_t blen = len(buf)
    cdef tuple r
    cdef long long eid, rec, page_no
    while i < n:
        r = <tuple>records[i]
        eid = r[0]
        rec = r[3]
        if size + rec > limit and size > LOG_HEADER_SIZE:
            break
        page_no = eid // spp
        if page_no != cur_no or blen + rec >= wbs:
            break
        buf += <bytes>r[1]
        buf += r[2]
        s[eid - page_no * spp] = (base | <unsigned long long>size) + 1
        size += rec
        blen += rec
        if eid > last:
            last = eid
        i += 1
    return i, size, last


def cut_records(bytes raw, long long start, unsigned long long ledger_id, wanted, list results):
    """The loop of ``EntryLog.read_window`` over one ``pread`` of the log from ``start``: for each
    ``(location, entry_id, position)`` of ``wanted`` whose record the window holds entirely,
    ``results[position]`` gets its data once its ids and CRC32C check out. Returns ``(bytes of
    data cut, rest)``; ``rest`` lists ``(location, entry_id, position, what)`` for the records
    left to the caller: ``what`` None when the window does not hold the record entirely (read it
    on its own), else what is wrong with it (the caller raises the damage)."""
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(raw)
    cdef Py_ssize_t avail = PyBytes_GET_SIZE(raw)
    cdef long long offset, rel, end
    cdef uint32_t dlen, crc
    cdef uint64_t rlid, reid
    cdef Py_ssize_t nbytes = 0
    cdef list rest = []
    for item in wanted:
        loc, entry_id, pos = item
        offset = <long long>(loc & 0xFFFFFFFF)
        rel = offset - start
        if rel >= 0 and rel + 24 <= avail:
            dlen = ls_get_u32(p + rel)
            end = rel + 24 + <long long>dlen
            if end <= avail:
                crc = ls_get_u32(p + rel + 4)
                rlid = ls_get_u64(p + rel + 8)
                reid = ls_get_u64(p + rel + 16)
                if rlid != ledger_id or reid != <uint64_t>entry_id:
                    rest.append((loc, entry_id, pos, f"holds ledger {rlid} entry {reid} instead"))
                elif ls_crc32c(0, p + rel + 8, <size_t>(end - rel - 8)) != crc:
                    rest.append((loc, entry_id, pos, "fails its CRC32C check"))
                else:
                    results[pos] = PyBytes_FromStringAndSize(<const char *>(p + rel + 24), dlen)
                    nbytes += dlen
                continue
        rest.append((loc, entry_id, pos, None))
    return nbytes, rest
