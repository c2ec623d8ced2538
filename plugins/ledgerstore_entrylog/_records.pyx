# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled per-entry work of the entry log's batch append (built by scripts/setup.sh):
``format.record_heads``'s loop, with the same tuples, bytes and errors."""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint32_t, uint64_t

from ledgerstore.errors import InvalidArgumentError


cdef extern from "_speedups_c.h":  # core's C helpers (ledgerstore/proto), found by the build's include path
    void ls_crc32c_init()
    uint32_t ls_crc32c(uint32_t value, const void *p, size_t n) nogil
    void ls_put_u64(unsigned char *p, uint64_t v) nogil
    void ls_put_u32(unsigned char *p, uint32_t v) nogil

cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1

ls_crc32c_init()


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
