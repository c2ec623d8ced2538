# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of :mod:`ledgerstore.client.adds` (built by scripts/setup.sh): a writer's
pending add and the loop that acknowledges them in order. Same attributes, same results; the
pure-Python versions stay in ``adds.py`` and ``adds.implementation()`` chooses."""

from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_AsUnsignedLongLong
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

from time import perf_counter


cdef extern from *:
    int __builtin_popcountll(unsigned long long x) nogil


cdef class PendingAdd:
    """One add until it is acknowledged (see ``adds.PendingAdd``)."""

    cdef public object entry_id
    cdef public object item
    cdef public object future
    cdef public object group
    cdef public object wsmask
    cdef public object acked
    cdef public object failed
    cdef public object ensemble
    cdef public bint done
    cdef public double started

    def __init__(self, entry_id, item, future, wsmask, double started=0.0):
        self.entry_id = entry_id
        self.item = item
        self.future = future
        self.group = None
        self.wsmask = wsmask
        self.acked = 0
        self.failed = 0
        self.ensemble = None
        self.done = False
        self.started = started


cdef inline int _popcount(object mask) except -1:
    if mask.bit_length() <= 64:  # every ensemble of up to 64 bookies
        return __builtin_popcountll(PyLong_AsUnsignedLongLong(mask))
    return mask.bit_count()


cdef inline Py_ssize_t _bucket(tuple bounds, double value):
    """``bisect_left(bounds, value)`` over a tuple of floats."""
    cdef Py_ssize_t lo = 0, hi = PyTuple_GET_SIZE(bounds), mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if PyFloat_AS_DOUBLE(<object>PyTuple_GET_ITEM(bounds, mid)) < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


def pop_acknowledged(q, int ack_quorum, hist):
    """Pop the leading adds of ``q`` that reached ``ack_quorum`` (see ``adds.pop_acknowledged``)."""
    cdef PendingAdd pa
    cdef object g, fut
    cdef object last = -1
    cdef double now = 0.0, dt, total = 0.0
    cdef tuple bounds = None
    cdef list counts = None
    cdef Py_ssize_t i
    popleft = q.popleft
    while q:
        pa = <PendingAdd?>q[0]
        g = pa.group
        if g is not None:
            if _popcount((pa.acked | g.acked) & pa.wsmask) < ack_quorum:
                break
        elif _popcount(pa.acked) < ack_quorum:
            break
        popleft()
        pa.done = True
        last = pa.entry_id
        fut = pa.future
        if fut is not None and not fut.done():
            fut.set_result(last)
            if bounds is None:
                now = perf_counter()
                bounds = hist.bounds
                counts = hist.counts
            dt = now - pa.started
            i = _bucket(bounds, dt)
            counts[i] += 1
            total += dt
    if bounds is not None:
        hist.sum += total
    return last
