/* C helpers of ledgerstore.proto._speedups: CRC32C (Castagnoli, the value the `crc32c` package
 * computes: crc32c(b, crc32c(a)) == crc32c(a + b)), big-endian loads and stores, and a tuple
 * subclass constructor. SSE4.2's crc32 instruction when the CPU has it, else slicing-by-8. */
#ifndef LEDGERSTORE_SPEEDUPS_C_H
#define LEDGERSTORE_SPEEDUPS_C_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint32_t ls_crc_table[8][256];
static int ls_crc_hw = 0;

static inline void ls_crc32c_init(void) {
    uint32_t i, c;
    int k;
    for (i = 0; i < 256; i++) {
        c = i;
        for (k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        ls_crc_table[0][i] = c;
    }
    for (i = 0; i < 256; i++)
        for (k = 1; k < 8; k++)
            ls_crc_table[k][i] = (ls_crc_table[k - 1][i] >> 8) ^ ls_crc_table[0][ls_crc_table[k - 1][i] & 0xFF];
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    ls_crc_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
}

static inline uint32_t ls_crc32c_sw(uint32_t crc, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = ls_crc_table[7][lo & 0xFF] ^ ls_crc_table[6][(lo >> 8) & 0xFF] ^ ls_crc_table[5][(lo >> 16) & 0xFF]
            ^ ls_crc_table[4][lo >> 24] ^ ls_crc_table[3][p[4]] ^ ls_crc_table[2][p[5]]
            ^ ls_crc_table[1][p[6]] ^ ls_crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ ls_crc_table[0][(crc ^ *p++) & 0xFF];
    return crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2")))
static inline uint32_t ls_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = crc;
    uint64_t v;
    while (n >= 8) {
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c;
    while (n--)
        crc = __builtin_ia32_crc32qi(crc, *p++);
    return crc;
}
#endif

/* The CRC32C of n bytes at p, continuing from value (0 to start). */
static inline uint32_t ls_crc32c(uint32_t value, const void *p, size_t n) {
    uint32_t crc = ~value;
#if defined(__x86_64__) && defined(__GNUC__)
    if (ls_crc_hw)
        return ~ls_crc32c_hw(crc, (const unsigned char *)p, n);
#endif
    return ~ls_crc32c_sw(crc, (const unsigned char *)p, n);
}

static inline void ls_put_u64(unsigned char *p, uint64_t v) {
    int i;
    for (i = 7; i >= 0; i--) {
        p[i] = (unsigned char)(v & 0xFF);
        v >>= 8;
    }
}

static inline void ls_put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void ls_put_u16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static inline uint64_t ls_get_u64(const unsigned char *p) {
    uint64_t v = 0;
    int i;
    for (i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static inline uint32_t ls_get_u32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline uint16_t ls_get_u16(const unsigned char *p) {
    return (uint16_t)((uint16_t)p[0] << 8 | p[1]);
}

/* tuple.__new__(type, (a, b, c, d)) for a tuple subclass (a NamedTuple), as CPython's
 * tuple_subtype_new builds it, without calling the class's Python-level __new__. */
static inline PyObject *ls_tuple4(PyObject *type, PyObject *a, PyObject *b, PyObject *c, PyObject *d) {
    PyTypeObject *t = (PyTypeObject *)type;
    PyObject *o = t->tp_alloc(t, 4);
    if (o == NULL)
        return NULL;
    Py_INCREF(a);
    PyTuple_SET_ITEM(o, 0, a);
    Py_INCREF(b);
    PyTuple_SET_ITEM(o, 1, b);
    Py_INCREF(c);
    PyTuple_SET_ITEM(o, 2, c);
    Py_INCREF(d);
    PyTuple_SET_ITEM(o, 3, d);
    return o;
}

#endif
