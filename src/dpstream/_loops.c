/*
 * dpstream._loops: compiled twins of a few NumPy loops of dpstream, same bits.
 *
 * Optional: when this module is not built, dpstream runs the NumPy code it stands
 * in for (see dpstream/compiled.py). Every loop performs, per element, the IEEE
 * double operations of its NumPy twin in the same order. It must be compiled
 * without contraction into fused multiply-adds (-ffp-contract=off, set in
 * setup.py) and without fast-math; tests/test_compiled.py checks the bits
 * against the NumPy path.
 *
 * Arrays are taken through the buffer protocol (C-contiguous, 8-byte items), so
 * the module needs only Python's headers, not NumPy's.
 *
 * The module is private, but it must stay memory-safe whatever it is given
 * (tests/test_loops_hostile.py): a loop that checks values of an argument (offsets,
 * codes, positions) and reads them again refuses a written array that shares a byte
 * with its other arguments (refuse_overlaps), and a value read where the GIL is
 * released, or after Python code could run, is checked where it is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Doubles must be evaluated as doubles: x87 extended precision (FLT_EVAL_METHOD 2,
 * 32-bit x86 without SSE2) would round twice, and fast-math reorders; either would
 * break the bit identity with NumPy. The build is optional: it then fails, and
 * dpstream runs the NumPy path. */
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "dpstream._loops needs FLT_EVAL_METHOD == 0 (SSE2 doubles, no x87)"
#endif
#ifdef __FAST_MATH__
#error "dpstream._loops must not be compiled with fast-math"
#endif

/* a struct format of one native item of ``size`` bytes (format_is: 8): 'Q' (uint64),
 * 'd' (double), 'q' (int64), 'I' (uint32), with no byte order or one that is the
 * machine's; NumPy writes longs as 'L'/'l' on some platforms (the size tells which),
 * and a byte-swapped array as '>Q' (refused: its values would be read wrong) */
static int
format_is_size(const Py_buffer *b, const char *accepted, Py_ssize_t size)
{
    const char *f = b->format ? b->format : "B";
    const unsigned int one = 1;
    const char native = *(const unsigned char *)&one ? '<' : '>';
    if (f[0] == '@' || f[0] == '=' || f[0] == native || (f[0] == '!' && native == '>'))
        f++;
    return f[0] != '\0' && f[1] == '\0' && strchr(accepted, f[0]) != NULL &&
           b->itemsize == size;
}

static int
format_is(const Py_buffer *b, const char *accepted)
{
    return format_is_size(b, accepted, 8);
}

#define U64 "QL"
#define U32 "IL"
#define F64 "d"
#define I64 "ql"

/* An array argument of a loop: its name, whether it is written, and its item types:
 * ``types`` (struct formats, see format_is_size) with 8-byte items, or ``narrow`` (if
 * not NULL) with 4-byte items; ``types`` NULL: any contiguous buffer, read as bytes. */
typedef struct {
    const char *name, *types, *narrow;
    int writable;
} array_spec;

/* a C-contiguous buffer of obj as spec says, or -1 (with an exception, nothing held) */
static int
get_spec(PyObject *obj, Py_buffer *b, const array_spec *spec)
{
    int flags = PyBUF_C_CONTIGUOUS | (spec->types ? PyBUF_FORMAT : 0) |
                (spec->writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, flags) < 0)
        return -1;
    if (spec->types && !format_is(b, spec->types) &&
        !(spec->narrow && format_is_size(b, spec->narrow, 4))) {
        PyErr_Format(PyExc_TypeError, "%s: wrong item type (format %s)", spec->name,
                     b->format ? b->format : "B");
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* get_spec of an array of 8-byte items */
static int
get(PyObject *obj, Py_buffer *b, int writable, const char *accepted, const char *name)
{
    const array_spec spec = {name, accepted, NULL, writable};
    return get_spec(obj, b, &spec);
}

static void
release_arrays(Py_buffer *b, int got)
{
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&b[i]);
}

/* get_spec for objs[0..n-1] by spec[0..n-1]; on failure releases what it took, -1 */
static int
get_arrays(PyObject **objs, Py_buffer *b, const array_spec *spec, int n)
{
    for (int i = 0; i < n; i++)
        if (get_spec(objs[i], &b[i], &spec[i]) < 0) {
            release_arrays(b, i);
            return -1;
        }
    return 0;
}

/* Whether the bytes of two buffers intersect ([buf, buf + len) each; an empty one
 * meets nothing). */
static int
buffers_overlap(const Py_buffer *a, const Py_buffer *b)
{
    if (a->len <= 0 || b->len <= 0)
        return 0;
    uintptr_t a0 = (uintptr_t)a->buf, b0 = (uintptr_t)b->buf;
    return a0 < b0 + (uintptr_t)b->len && b0 < a0 + (uintptr_t)a->len;
}

/* -1 with a ValueError when the written buffer w (named wname) shares a byte with
 * the buffer r (rname), else 0. A loop that checks some values of an argument (an
 * offset, a code, a position) and then reads them again must not write into them in
 * between: its writes are refused any byte of its other arguments. */
static int
refuse_overlap(const char *fn, const Py_buffer *w, const char *wname, const Py_buffer *r,
               const char *rname)
{
    if (!buffers_overlap(w, r))
        return 0;
    PyErr_Format(PyExc_ValueError,
                 "%s: %s (written) overlaps %s in memory: a written array must share no "
                 "byte with another argument",
                 fn, wname, rname);
    return -1;
}

/* refuse_overlap for every written b[i] (spec[i].writable) against every other b[j],
 * i, j < n */
static int
refuse_overlaps(const char *fn, const Py_buffer *b, const array_spec *spec, int n)
{
    for (int i = 0; i < n; i++) {
        if (!spec[i].writable)
            continue;
        for (int j = 0; j < n; j++)
            if (j != i && !(spec[j].writable && j < i) &&
                refuse_overlap(fn, &b[i], spec[i].name, &b[j], spec[j].name) < 0)
                return -1;
    }
    return 0;
}

/* get_arrays, then refuse_overlaps; on failure releases what it took, -1 */
static int
get_disjoint_arrays(const char *fn, PyObject **objs, Py_buffer *b, const array_spec *spec,
                    int n)
{
    if (get_arrays(objs, b, spec, n) < 0)
        return -1;
    if (refuse_overlaps(fn, b, spec, n) < 0) {
        release_arrays(b, n);
        return -1;
    }
    return 0;
}

/* Offsets into an item table's bytes: int64, or uint32 while the bytes are fewer
 * than 2^32 (4 bytes an item instead of 8). */
typedef struct {
    const void *p;
    int wide;
} offs;

#define OFF(o, i) \
    ((o).wide ? ((const int64_t *)(o).p)[i] : (int64_t)((const uint32_t *)(o).p)[i])

#define OFFSETS_SPEC {"offsets", I64, U32, 0}

/* the offs of an offsets buffer (taken by OFFSETS_SPEC) */
static offs
offsets_of(const Py_buffer *b)
{
    offs o = {b->buf, b->itemsize == 8};
    return o;
}

/* SciPy's ndtri, the very function behind scipy.special.ndtri, taken from the C API
 * that scipy.special.cython_special exports (a capsule of this signature). Set by
 * set_ndtri only after dpstream.compiled has checked, on a grid of points, that it
 * gives the bits of the ufunc; until then the ziggurat leaves its tail points and
 * restarts to the caller, who uses the ufunc. */
#define NDTRI_SIGNATURE "double (double, int __pyx_skip_dispatch)"
static double (*ndtri_fn)(double, int) = NULL;
static PyObject *ndtri_capsule = NULL;  /* held while ndtri_fn points into its module */

/* set_ndtri(capsule or None): use this ndtri in the loops below (None: stop). */
static PyObject *
set_ndtri(PyObject *self, PyObject *capsule)
{
    void *fn = NULL;
    if (capsule != Py_None) {
        fn = PyCapsule_GetPointer(capsule, NDTRI_SIGNATURE);
        if (fn == NULL)
            return NULL;
        Py_INCREF(capsule);
    }
    PyObject *old = ndtri_capsule;
    ndtri_fn = (double (*)(double, int))fn;
    ndtri_capsule = capsule == Py_None ? NULL : capsule;
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static int
need_ndtri(void)
{
    if (ndtri_fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ndtri is not set (see dpstream.compiled)");
        return -1;
    }
    return 0;
}

/* ndtri_into(p, out): out[i] = ndtri(p[i]) through the function set_ndtri set (the
 * check that it gives the ufunc's bits). */
static PyObject *
ndtri_into(PyObject *self, PyObject *args)
{
    static const array_spec spec[2] = {{"p", F64, NULL, 0}, {"out", F64, NULL, 1}};
    PyObject *o[2];
    Py_buffer b[2];
    if (!PyArg_ParseTuple(args, "OO", &o[0], &o[1]) || need_ndtri() < 0 ||
        get_arrays(o, b, spec, 2) < 0)
        return NULL;
    if (b[0].len != b[1].len) {
        PyErr_SetString(PyExc_ValueError, "ndtri_into: array sizes do not match");
    } else {
        const double *pv = b[0].buf;
        double *ov = b[1].buf;
        for (Py_ssize_t i = 0; i < b[0].len / 8; i++)
            ov[i] = ndtri_fn(pv[i], 0);
    }
    release_arrays(b, 2);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* The version 1 uniform of a 64-bit word: min(((w >> 11) + 1/2) 2^-53, the largest
 * double below 1), inside (0, 1): the top word would round to 1.0 (see
 * dpstream.ziggurat.UNIFORM_MAX). */
static inline double
uniform53(uint64_t w)
{
    double u = ((double)(int64_t)(w >> 11) + 0.5) * 0x1p-53;
    return u < 0x1.fffffffffffffp-1 ? u : 0x1.fffffffffffffp-1;
}

/*
 * ziggurat_restarts(words, pending, out): out[pending[i]] = ndtri(uniform(words[i]))
 * for the k points above the curve, words[i] being the first word of the AES of
 * point i's block under the retry key (see dpstream.ziggurat._restart). The positions
 * are checked before any write, then read again: out may share no byte with them.
 */
static PyObject *
ziggurat_restarts(PyObject *self, PyObject *args)
{
    static const array_spec spec[3] = {
        {"words", U64, NULL, 0}, {"pending", I64, NULL, 0}, {"out", F64, NULL, 1}};
    PyObject *o[3];
    Py_buffer b[3];
    if (!PyArg_ParseTuple(args, "OOO", &o[0], &o[1], &o[2]) || need_ndtri() < 0 ||
        get_disjoint_arrays("ziggurat_restarts", o, b, spec, 3) < 0)
        return NULL;
    Py_ssize_t k = b[1].len / 8, c = b[2].len / 8;
    const uint64_t *words = b[0].buf;
    const int64_t *pending = b[1].buf;
    double *out = b[2].buf;
    if (b[0].len != b[1].len) {
        PyErr_SetString(PyExc_ValueError, "ziggurat_restarts: array sizes do not match");
    } else {
        for (Py_ssize_t i = 0; i < k; i++)
            if (pending[i] < 0 || pending[i] >= c) {
                PyErr_SetString(PyExc_IndexError, "ziggurat_restarts: position out of range");
                break;
            }
        if (!PyErr_Occurred())
            for (Py_ssize_t i = 0; i < k; i++)
                out[pending[i]] = ndtri_fn(uniform53(words[i]), 0);
    }
    release_arrays(b, 3);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/*
 * ziggurat(blocks, out, scaled, limit, bottom, rise, pending, close, tail_probability)
 *     -> (n_restart, n_tail, n_close)
 *
 * blocks: (c, 2) uint64; out: c float64; scaled, limit: 512 float64 (region and
 * sign); bottom, rise: 256 float64; pending, close: c int64. See
 * dpstream.ziggurat.normals_into for the method and dpstream.compiled.ziggurat
 * for what is left to the caller. With ndtri set (set_ndtri), the tail points are
 * drawn here, x = -ndtri(v P(Z > r)) with P(Z > r) = tail_probability, and
 * n_tail is 0.
 */
static PyObject *
ziggurat(PyObject *self, PyObject *args)
{
    static const array_spec spec[8] = {
        {"blocks", U64, NULL, 0},  {"out", F64, NULL, 1},    {"scaled", F64, NULL, 0},
        {"limit", F64, NULL, 0},   {"bottom", F64, NULL, 0}, {"rise", F64, NULL, 0},
        {"pending", I64, NULL, 1}, {"close", I64, NULL, 1}};
    PyObject *o[8];
    Py_buffer b[8];
    PyObject *result = NULL;
    double tail_probability;

    if (!PyArg_ParseTuple(args, "OOOOOOOOd", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6], &o[7], &tail_probability) ||
        get_arrays(o, b, spec, 8) < 0)
        return NULL;

    Py_ssize_t c = b[1].len / 8;
    if (b[0].len != 16 * c || b[6].len < 8 * c || b[7].len < 8 * c || b[2].len != 8 * 512 ||
        b[3].len != 8 * 512 || b[4].len != 8 * 256 || b[5].len != 8 * 256) {
        PyErr_SetString(PyExc_ValueError, "ziggurat: array sizes do not match");
        goto done;
    }
    const uint64_t *blocks = b[0].buf;
    double *out = b[1].buf;
    const double *scaled = b[2].buf, *limit = b[3].buf, *bottom = b[4].buf,
                 *rise = b[5].buf;
    int64_t *pending = b[6].buf, *close = b[7].buf;
    Py_ssize_t n_restart = 0, n_tail = 0, n_close = 0;
    double (*const tail_ndtri)(double, int) = ndtri_fn;

    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t a = 0; a < c; a++) {
        uint64_t w0 = blocks[2 * a];
        int64_t j = (int64_t)(w0 & 511u);  /* region (bits 0..7) and sign (bit 8) */
        double h = (double)(int64_t)(w0 >> 11) + 0.5;
        double value = h * scaled[j];  /* +-u x[i], u = h 2^-53 */
        out[a] = value;
        if (h < limit[j])
            continue;  /* fast path: under the curve */
        int64_t layer = j & 255;
        double v = uniform53(blocks[2 * a + 1]);
        if (layer == 0) {  /* the tail beyond r: a fresh draw from it, here or by the caller */
            if (tail_ndtri != NULL)
                out[a] = copysign(-tail_ndtri(v * tail_probability, 0), value);
            else
                pending[c - 1 - n_tail++] = a;
            continue;
        }
        double x = fabs(value);
        double height = bottom[layer] + v * rise[layer];
        double q = -0.5 * (x * x);
        double e = exp(q);
        double spacing = nextafter(e, INFINITY) - e;  /* numpy.spacing for e > 0 */
        if (fabs(height - e) <= 4.0 * spacing)
            close[n_close++] = a;  /* decided exactly by the caller */
        else if (!(height < e))
            pending[n_restart++] = a;  /* above the curve: restarted by the caller */
    }
    Py_END_ALLOW_THREADS

    result = Py_BuildValue("nnn", n_restart, n_tail, n_close);
done:
    release_arrays(b, 8);
    return result;
}

/* ---------------------------------------------------------------------------------
 * The item table (dpstream.mechanisms.item_table): str items kept as UTF-8 bytes end
 * to end (data, with uint32 or int64 offsets: see offs), found through an
 * open-addressing table of slots, linear probing. A slot is 0 (empty) or a tag from
 * the hash's high half and pos + 1 (see slot_entry): uint32 slots while there are at
 * most 2^31 of them (the Python side uses them up to 2^26, so a tag keeps at least 6
 * bits), any number of them, the first probed one taken from the hash's low 32 bits by
 * a multiply-shift; uint64 slots beyond, a power of 2 of them, the first probed one
 * the hash's low bits. The hash is SipHash-1-3 (Aumasson and Bernstein) of the UTF-8
 * bytes under the table's random 128-bit key, so an input cannot be crafted to
 * collide without it. A probe that matches the tag is confirmed by comparing the
 * bytes: two items are never confused.
 */

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                               \
    do {                                                                       \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);              \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                 \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                 \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);              \
    } while (0)

static uint64_t
siphash13(uint64_t k0, uint64_t k1, const unsigned char *m, Py_ssize_t len)
{
    uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
    Py_ssize_t full = len & ~(Py_ssize_t)7;
    for (Py_ssize_t i = 0; i < full; i += 8) {
        uint64_t w = 0;
        for (int b = 7; b >= 0; b--)  /* little-endian, whatever the machine */
            w = (w << 8) | m[i + b];
        v3 ^= w;
        SIPROUND;
        v0 ^= w;
    }
    uint64_t last = (uint64_t)len << 56;
    for (Py_ssize_t b = len - full - 1; b >= 0; b--)
        last |= (uint64_t)m[full + b] << (8 * b);
    v3 ^= last;
    SIPROUND;
    v0 ^= last;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* The UTF-8 bytes of a str (items are canonical, so plain str; a subclass is read
 * by its value): 1 and the bytes, or 0 (another type, or a str that is not valid
 * UTF-8: a lone surrogate), with no error set. */
static int
str_utf8(PyObject *o, const char **p, Py_ssize_t *n)
{
    if (!PyUnicode_Check(o))
        return 0;
    if (PyUnicode_IS_COMPACT_ASCII(o)) {
        *p = (const char *)PyUnicode_DATA(o);
        *n = PyUnicode_GET_LENGTH(o);
        return 1;
    }
    *p = PyUnicode_AsUTF8AndSize(o, n);
    if (*p == NULL) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

typedef struct {
    Py_buffer key, data, offsets, slots;
    offs off;
    int64_t count;    /* stored items: entries of offsets - 1 */
    int got;
    uint64_t nslots;  /* any number >= 1 of uint32 slots; a power of 2 of uint64 ones */
    int wide;         /* uint64 slots (else uint32) */
    int shift;        /* uint32 slots: the bits that hold pos + 1 (< nslots) */
    uint64_t posmask; /* the bits of a slot that hold pos + 1 */
} table_args;

/* The slots' layout. A uint64 slot is (hash >> 32) << 32 | (pos + 1). A uint32 slot
 * of a table of n slots is tag << shift | (pos + 1), shift the bit length of n - 1 and
 * the tag the top 32 - shift bits of the hash's high half: pos + 1 < n <= 2^shift,
 * since the table is never full, and the slot's index comes from the hash's low half,
 * so the tag adds bits the index does not already carry. */
static inline uint64_t
slot_at(const void *slots, int wide, uint64_t s)
{
    return wide ? ((const uint64_t *)slots)[s] : ((const uint32_t *)slots)[s];
}

/* the first slot probed for hash h */
static inline uint64_t
slot_index(const table_args *t, uint64_t h)
{
    return t->wide ? h & (t->nslots - 1) : ((h & 0xffffffffu) * t->nslots) >> 32;
}

/* the slot probed after s */
static inline uint64_t
slot_next(const table_args *t, uint64_t s)
{
    return s + 1 == t->nslots ? 0 : s + 1;
}

/* the tag of hash h */
static inline uint64_t
slot_tag(uint64_t h, int wide, int shift)
{
    return wide ? h >> 32 : (h >> 32) >> shift;
}

/* the slot of the item at pos with hash h */
static inline uint64_t
slot_entry(uint64_t h, int wide, int shift, int64_t pos)
{
    return (slot_tag(h, wide, shift) << (wide ? 32 : shift)) | (uint64_t)(pos + 1);
}

/* the tag a stored slot carries */
static inline uint64_t
entry_tag(uint64_t e, int wide, int shift)
{
    return e >> (wide ? 32 : shift);
}

/* the position a stored slot names (-1 for an empty slot) */
static inline int64_t
entry_pos(uint64_t e, uint64_t posmask)
{
    return (int64_t)(e & posmask) - 1;
}

static void
release_table(table_args *t)
{
    Py_buffer *b[4] = {&t->key, &t->data, &t->offsets, &t->slots};
    for (int i = 0; i < t->got; i++)
        PyBuffer_Release(b[i]);
}

/* key (2 uint64), data (bytes), offsets (uint32 or int64, n + 1), slots (uint32, at
 * most 2^31 of them, or uint64, a power of 2 of them); writable (the slots of fn): the
 * slots may share no byte with the key, data or offsets */
static int
get_table(const char *fn, PyObject *key, PyObject *data, PyObject *offsets, PyObject *slots,
          int writable, table_args *t)
{
    const array_spec spec[4] = {{"key", U64, NULL, 0}, {"data", NULL, NULL, 0}, OFFSETS_SPEC,
                                {"slots", U64, U32, writable}};
    PyObject *objs[4] = {key, data, offsets, slots};
    Py_buffer *b[4] = {&t->key, &t->data, &t->offsets, &t->slots};
    for (t->got = 0; t->got < 4; t->got++)
        if (get_spec(objs[t->got], b[t->got], &spec[t->got]) < 0)
            goto fail;
    if (writable)
        for (int i = 0; i < 3; i++)
            if (refuse_overlap(fn, b[3], "slots", b[i], spec[i].name) < 0)
                goto fail;
    t->off = offsets_of(&t->offsets);
    t->wide = t->slots.itemsize == 8;
    Py_ssize_t nslots = t->slots.len / t->slots.itemsize;
    t->count = (int64_t)(t->offsets.len / t->offsets.itemsize) - 1;
    if (t->key.len != 16 || t->count < 0 || nslots < 1 ||
        (t->wide ? (nslots & (nslots - 1)) != 0 : (uint64_t)nslots > ((uint64_t)1 << 31))) {
        PyErr_SetString(PyExc_ValueError, "item table: bad key, offsets or slots");
        goto fail;
    }
    t->nslots = (uint64_t)nslots;
    /* uint32: the bit length of nslots - 1 (log2 of a power of 2), so pos + 1 < nslots
     * fits in the low shift bits; uint64: 32 */
    t->shift = t->wide || nslots == 1
                   ? (t->wide ? 32 : 0)
                   : 64 - __builtin_clzll((unsigned long long)(nslots - 1));
    t->posmask = t->wide ? 0xffffffffu : (((uint64_t)1 << t->shift) - 1);
    return 0;
fail:
    release_table(t);
    return -1;
}

/* whether stored item pos (0 <= pos < count) lies inside the data: the arrays come
 * from Python, and a slot or offset that does not match them must not be followed */
static inline int
item_in_data(offs offsets, int64_t count, Py_ssize_t data_len, int64_t pos)
{
    if (pos < 0 || pos >= count)
        return 0;
    int64_t a = OFF(offsets, pos), b = OFF(offsets, pos + 1);
    return a >= 0 && a <= b && b <= data_len;
}

/* the position of the str bytes (p, n) with hash h, -1 if absent, or -2 when the
 * slots do not match the data (a slot past the items, no empty slot) */
static inline int64_t
probe(const table_args *t, const unsigned char *data, Py_ssize_t data_len,
      offs offsets, int64_t count, uint64_t h, const char *p, Py_ssize_t n)
{
    const void *slots = t->slots.buf;
    int wide = t->wide, shift = t->shift;
    uint64_t s = slot_index(t, h), tag = slot_tag(h, wide, shift);
    for (uint64_t tries = 0; tries < t->nslots; tries++) {
        uint64_t e = slot_at(slots, wide, s);
        if (e == 0)
            return -1;
        if (entry_tag(e, wide, shift) == tag) {
            int64_t pos = entry_pos(e, t->posmask);
            if (!item_in_data(offsets, count, data_len, pos))
                return -2;
            int64_t a = OFF(offsets, pos);
            if (OFF(offsets, pos + 1) - a == n && memcmp(data + a, p, (size_t)n) == 0)
                return pos;
        }
        s = slot_next(t, s);
    }
    return -2;
}

/* items per group of item_lookup's prefetching stages */
#define LOOKUP_GROUP 32

/* item_lookup(items, key, data, offsets, slots, out): out[i] = the position of items[i],
 * -1 if it is not in the table (or not a str that is valid UTF-8) */
static PyObject *
item_lookup(PyObject *self, PyObject *args)
{
    PyObject *items, *key, *data, *offsets, *slots, *out_obj;
    if (!PyArg_ParseTuple(args, "OOOOOO", &items, &key, &data, &offsets, &slots, &out_obj))
        return NULL;
    PyObject *seq = PySequence_Fast(items, "items must be a sequence");
    if (seq == NULL)
        return NULL;
    table_args t;
    Py_buffer out;
    PyObject *result = NULL;
    if (get_table("item_lookup", key, data, offsets, slots, 0, &t) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    if (get(out_obj, &out, 1, I64, "out") < 0)
        goto done_table;
    {
        const Py_buffer *tb[4] = {&t.key, &t.data, &t.offsets, &t.slots};
        static const char *const tn[4] = {"key", "data", "offsets", "slots"};
        for (int i = 0; i < 4; i++)
            if (refuse_overlap("item_lookup", &out, "out", tb[i], tn[i]) < 0)
                goto done;
    }
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    if (out.len != 8 * k) {
        PyErr_SetString(PyExc_ValueError, "item_lookup: out must hold one int64 per item");
        goto done;
    }
    PyObject **objs = PySequence_Fast_ITEMS(seq);
    const uint64_t *kw = t.key.buf;
    const void *sl = t.slots.buf;
    int wide = t.wide;
    uint64_t posmask = t.posmask;
    int64_t *res = out.buf;
    int64_t count = t.count;
    offs off = t.off;
    const unsigned char *bytes = t.data.buf;
    /* A group at a time, in stages that only prefetch (the slot an item's hash leads
     * to, then its candidate's offsets, then its bytes), so that the cache misses of
     * a group overlap; the probe then runs as usual, mostly on cached lines. */
    const char *gp[LOOKUP_GROUP];
    Py_ssize_t gn[LOOKUP_GROUP];
    uint64_t gh[LOOKUP_GROUP];
    int gok[LOOKUP_GROUP];
    for (Py_ssize_t g = 0; g < k; g += LOOKUP_GROUP) {
        int m = (int)(k - g < LOOKUP_GROUP ? k - g : LOOKUP_GROUP);
        for (int j = 0; j < m; j++) {
            gok[j] = str_utf8(objs[g + j], &gp[j], &gn[j]);
            if (gok[j]) {
                gh[j] = siphash13(kw[0], kw[1], (const unsigned char *)gp[j], gn[j]);
                __builtin_prefetch((const char *)sl + slot_index(&t, gh[j]) * t.slots.itemsize);
            }
        }
        for (int j = 0; j < m; j++) {
            if (!gok[j])
                continue;
            uint64_t e = slot_at(sl, wide, slot_index(&t, gh[j]));
            int64_t pos = entry_pos(e, posmask);
            if (e != 0 && pos < count)
                __builtin_prefetch((const char *)off.p + pos * t.offsets.itemsize);
        }
        for (int j = 0; j < m; j++) {
            if (!gok[j])
                continue;
            uint64_t e = slot_at(sl, wide, slot_index(&t, gh[j]));
            int64_t pos = entry_pos(e, posmask);
            if (e != 0 && pos < count && item_in_data(off, count, t.data.len, pos))
                __builtin_prefetch(bytes + OFF(off, pos));
        }
        for (int j = 0; j < m; j++) {
            Py_ssize_t i = g + j;
            if (!gok[j]) {
                res[i] = -1;
                continue;
            }
            res[i] = probe(&t, bytes, t.data.len, off, count, gh[j], gp[j], gn[j]);
            if (res[i] == -2) {
                PyErr_SetString(PyExc_ValueError,
                                "item_lookup: the slots do not match the items");
                goto done;
            }
        }
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&out);
done_table:
    release_table(&t);
    Py_DECREF(seq);
    return result;
}

/* offset i, read from memory exactly once (volatile: not read again by the compiler,
 * whatever else writes the array meanwhile) */
static inline int64_t
off_once(offs o, int64_t i)
{
    return o.wide ? ((const volatile int64_t *)o.p)[i]
                  : (int64_t)((const volatile uint32_t *)o.p)[i];
}

/* item_insert(key, data, offsets, slots, first, last): put the stored items first..last-1
 * into free slots (the caller keeps the table at most 4/5 full). The slots may share no
 * byte with the other arrays; and since the loop runs without the GIL (another thread
 * could write the offsets meanwhile), each item's offsets are read once and checked
 * again where they are used. */
static PyObject *
item_insert(PyObject *self, PyObject *args)
{
    PyObject *key, *data, *offsets, *slots;
    Py_ssize_t first, last;
    if (!PyArg_ParseTuple(args, "OOOOnn", &key, &data, &offsets, &slots, &first, &last))
        return NULL;
    table_args t;
    if (get_table("item_insert", key, data, offsets, slots, 1, &t) < 0)
        return NULL;
    Py_ssize_t nslots = (Py_ssize_t)t.nslots;
    offs off = t.off;
    int64_t count = t.count;
    /* at most 4/5 full: a probe always meets an empty slot, and stays short */
    int ok = first >= 0 && last >= first && last <= count && last < 0xffffffffLL &&
             (int64_t)last * 5 <= (int64_t)nslots * 4;
    for (Py_ssize_t pos = first; ok && pos < last; pos++)
        ok = item_in_data(off, count, t.data.len, pos);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "item_insert: positions out of range or table full");
        release_table(&t);
        return NULL;
    }
    const uint64_t *kw = t.key.buf;
    void *sl = t.slots.buf;
    int wide = t.wide, shift = t.shift;
    const unsigned char *d = t.data.buf;
    Py_ssize_t data_len = t.data.len;
    int moved = 0;  /* offsets that changed after the check */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t pos = first; ok && pos < last; pos++) {
        int64_t a = off_once(off, pos), z = off_once(off, pos + 1);
        if (a < 0 || a > z || z > data_len) {
            ok = 0;
            moved = 1;
            break;
        }
        uint64_t h = siphash13(kw[0], kw[1], d + a, z - a);
        uint64_t s = slot_index(&t, h), tries = 0;
        while (slot_at(sl, wide, s) != 0 && ++tries < t.nslots)
            s = slot_next(&t, s);
        /* pos + 1 <= last <= 4/5 of the slots: below nslots <= 2^shift, and below 2^32 */
        if (slot_at(sl, wide, s) != 0)
            ok = 0;  /* no free slot: the slots were already full */
        else if (wide)
            ((uint64_t *)sl)[s] = slot_entry(h, wide, shift, pos);
        else
            ((uint32_t *)sl)[s] = (uint32_t)slot_entry(h, wide, shift, pos);
    }
    Py_END_ALLOW_THREADS
    release_table(&t);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, moved ? "item_insert: the offsets changed during "
                                                  "the call"
                                                : "item_insert: no free slot");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* item_prefix_equals(items, data, offsets, n): whether items[:n] are, in order, str
 * equal to the stored items 0..n-1 */
static PyObject *
item_prefix_equals(PyObject *self, PyObject *args)
{
    PyObject *items, *data, *offsets;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOOn", &items, &data, &offsets, &n))
        return NULL;
    PyObject *seq = PySequence_Fast(items, "items must be a sequence");
    if (seq == NULL)
        return NULL;
    static const array_spec spec[2] = {{"data", NULL, NULL, 0}, OFFSETS_SPEC};
    PyObject *o[2] = {data, offsets};
    Py_buffer b[2];
    if (get_arrays(o, b, spec, 2) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    const Py_buffer *d = &b[0];
    offs off = offsets_of(&b[1]);
    int equal =
        n >= 0 && PySequence_Fast_GET_SIZE(seq) >= n && b[1].len / b[1].itemsize >= n + 1;
    PyObject **objs = PySequence_Fast_ITEMS(seq);
    const unsigned char *bytes = d->buf;
    for (Py_ssize_t i = 0; equal && i < n; i++) {
        const char *p;
        Py_ssize_t len;
        int64_t a = OFF(off, i), z = OFF(off, i + 1);
        /* (in this order: z - a cannot overflow once 0 <= a <= z) */
        equal = str_utf8(objs[i], &p, &len) && a >= 0 && a <= z && z <= d->len &&
                z - a == len && memcmp(bytes + a, p, (size_t)len) == 0;
    }
    release_arrays(b, 2);
    Py_DECREF(seq);
    return PyBool_FromLong(equal);
}

/* item_strings(data, offsets, positions): the stored items at positions, as a list of str */
static PyObject *
item_strings(PyObject *self, PyObject *args)
{
    static const array_spec spec[3] = {
        {"data", NULL, NULL, 0}, OFFSETS_SPEC, {"positions", I64, NULL, 0}};
    PyObject *o[3];
    Py_buffer b[3];
    if (!PyArg_ParseTuple(args, "OOO", &o[0], &o[1], &o[2]) || get_arrays(o, b, spec, 3) < 0)
        return NULL;
    const Py_buffer *d = &b[0];
    offs off = offsets_of(&b[1]);
    Py_ssize_t k = b[2].len / 8, n = b[1].len / b[1].itemsize - 1;
    const int64_t *pos = b[2].buf;
    PyObject *list = PyList_New(k);
    for (Py_ssize_t i = 0; list != NULL && i < k; i++) {
        int64_t j = pos[i];
        if (!item_in_data(off, n, d->len, j)) {
            PyErr_SetString(PyExc_IndexError, "item_strings: position out of range");
            Py_CLEAR(list);
            break;
        }
        int64_t a = OFF(off, j);
        PyObject *s = PyUnicode_DecodeUTF8((const char *)d->buf + a, OFF(off, j + 1) - a,
                                           "strict");
        if (s == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, s);
    }
    release_arrays(b, 3);
    return list;
}

/* siphash13(key, data): the table's hash of bytes (for tests) */
static PyObject *
py_siphash13(PyObject *self, PyObject *args)
{
    Py_buffer k, d;
    if (!PyArg_ParseTuple(args, "y*y*", &k, &d))
        return NULL;
    PyObject *r = NULL;
    if (k.len != 16)
        PyErr_SetString(PyExc_ValueError, "siphash13: the key must be 16 bytes");
    else {
        const unsigned char *kb = k.buf;
        uint64_t k0 = 0, k1 = 0;
        for (int b = 7; b >= 0; b--) {
            k0 = (k0 << 8) | kb[b];
            k1 = (k1 << 8) | kb[8 + b];
        }
        r = PyLong_FromUnsignedLongLong(siphash13(k0, k1, d.buf, d.len));
    }
    PyBuffer_Release(&k);
    PyBuffer_Release(&d);
    return r;
}

/* flatten_events(events, offsets) -> list | None: the items of a step's events, in
 * order, as one list, with offsets[j] .. offsets[j + 1] the positions of event j
 * (offsets: len(events) + 1 int64, written). ``events`` is a list or tuple. None
 * (offsets then mean nothing) when an event is not exactly a list or tuple, or an
 * item not exactly a str, int or bytes: the caller then takes its per-event path.
 * The twin of dpstream.mechanisms.columns.flatten_events. No item is hashed,
 * compared or converted; the one allocation could run a finalizer (a garbage
 * collection) that changes an event, or the offsets (the caller's memory), so the
 * second pass trusts neither: it takes each event's size again, writes no item past
 * the list's end, and writes the offsets again from what it filled. */
static PyObject *
flatten_events(PyObject *self, PyObject *args)
{
    PyObject *events, *offsets_obj, *flat = NULL;
    Py_buffer ob;
    if (!PyArg_ParseTuple(args, "OO", &events, &offsets_obj))
        return NULL;
    if (!PyList_CheckExact(events) && !PyTuple_CheckExact(events)) {
        PyErr_SetString(PyExc_TypeError, "flatten_events: events must be a list or tuple");
        return NULL;
    }
    if (get(offsets_obj, &ob, 1, I64, "offsets") < 0)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(events);
    if (ob.len != 8 * (n + 1)) {
        PyErr_SetString(PyExc_ValueError, "flatten_events: offsets must hold len(events) + 1");
        goto done;
    }
    int64_t *off = ob.buf;
    int64_t total = 0;
    off[0] = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *ev = PySequence_Fast_ITEMS(events)[j];
        if (!PyList_CheckExact(ev) && !PyTuple_CheckExact(ev))
            goto none;
        total += PySequence_Fast_GET_SIZE(ev);
        off[j + 1] = total;
    }
    flat = PyList_New((Py_ssize_t)total);
    if (flat == NULL)
        goto done;
    if (PySequence_Fast_GET_SIZE(events) != n)
        goto none;
    /* (nothing below runs Python code: the events and offsets stay as they are now) */
    Py_ssize_t k = 0;
    off[0] = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *ev = PySequence_Fast_ITEMS(events)[j];
        if (!PyList_CheckExact(ev) && !PyTuple_CheckExact(ev))
            goto none;
        Py_ssize_t size = PySequence_Fast_GET_SIZE(ev);
        if (size > total - k)
            goto none;  /* an event grew: no room in the list */
        PyObject **items = PySequence_Fast_ITEMS(ev);
        for (Py_ssize_t i = size; i > 0; i--) {
            PyObject *it = *items++;
            if (!PyUnicode_CheckExact(it) && !PyLong_CheckExact(it) && !PyBytes_CheckExact(it))
                goto none;
            Py_INCREF(it);
            PyList_SET_ITEM(flat, k++, it);
        }
        off[j + 1] = k;
    }
    if (k != total)
        goto none;  /* an event shrank: entries left empty */
    goto done;
none:
    Py_XDECREF(flat);  /* entries not filled are NULL: the list's dealloc skips them */
    flat = Py_None;
    Py_INCREF(flat);
done:
    PyBuffer_Release(&ob);
    return flat;
}

/* unique_codes(codes, scratch, used, inverse) -> k: the distinct values of codes (int64,
 * each in [0, len(scratch))) in order of first appearance, used[:k], and inverse[i]
 * with used[inverse[i]] == codes[i]. scratch (int64) must hold -1 everywhere; it is
 * used as a map from a code to its slot in used, and left holding -1 again. Every
 * code is checked before scratch is touched. O(len(codes)), unlike a sort. The four
 * arrays may share no byte (the codes and slots read back must be those written or
 * checked). */
static PyObject *
unique_codes(PyObject *self, PyObject *args)
{
    static const array_spec spec[4] = {{"codes", I64, NULL, 0}, {"scratch", I64, NULL, 1},
                                       {"used", I64, NULL, 1}, {"inverse", I64, NULL, 1}};
    PyObject *o[4];
    Py_buffer b[4];
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "OOOO", &o[0], &o[1], &o[2], &o[3]) ||
        get_disjoint_arrays("unique_codes", o, b, spec, 4) < 0)
        return NULL;
    Py_ssize_t m = b[0].len / 8, d = b[1].len / 8;
    if (b[2].len < 8 * m || b[3].len != 8 * m) {
        PyErr_SetString(PyExc_ValueError, "unique_codes: array sizes do not match");
        goto done;
    }
    const int64_t *codes = b[0].buf;
    int64_t *scratch = b[1].buf, *used = b[2].buf, *inverse = b[3].buf;
    for (Py_ssize_t i = 0; i < m; i++)
        if (codes[i] < 0 || codes[i] >= d) {
            PyErr_SetString(PyExc_IndexError, "unique_codes: a code is out of range");
            goto done;
        }
    Py_ssize_t k = 0;
    int dirty = 0;
    for (Py_ssize_t i = 0; i < m && !dirty; i++) {
        int64_t c = codes[i], slot = scratch[c];
        if (slot < 0) {
            slot = scratch[c] = k;
            used[k++] = c;
        } else if (slot >= k || used[slot] != c) {
            dirty = 1;  /* a value this call did not write: the scratch was not clear */
            break;
        }
        inverse[i] = slot;
    }
    for (Py_ssize_t j = 0; j < k; j++)
        scratch[used[j]] = -1;
    if (dirty)
        PyErr_SetString(PyExc_ValueError, "unique_codes: the scratch must hold -1 everywhere");
    else
        result = PyLong_FromSsize_t(k);
done:
    release_arrays(b, 4);
    return result;
}

/* the two-digit pairs "00".."99", for writing decimals two digits at a time */
static const char DIGIT_PAIRS[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* how many decimal digits u has (1 for 0) */
static inline int
decimal_width(uint64_t u)
{
    int k = 1;
    while (u >= 10000) {
        u /= 10000;
        k += 4;
    }
    return k + (u >= 10) + (u >= 100) + (u >= 1000);
}

/* u in decimal, its last digit at end[-1] (decimal_width(u) bytes before end) */
static inline void
put_decimal(char *end, uint64_t u)
{
    while (u >= 100) {
        unsigned r = (unsigned)(u % 100);
        u /= 100;
        end -= 2;
        memcpy(end, DIGIT_PAIRS + 2 * r, 2);
    }
    if (u >= 10) {
        memcpy(end - 2, DIGIT_PAIRS + 2 * u, 2);
    } else {
        end[-1] = (char)('0' + u);
    }
}

/* x in decimal, with its sign, at w; returns the end */
static inline char *
put_int64(char *w, int64_t x)
{
    uint64_t u = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
    if (x < 0)
        *w++ = '-';
    int k = decimal_width(u);
    put_decimal(w + k, u);
    return w + k;
}

/* A constant piece of every row (head, mid, tail, separator). One of at most 16 bytes is
 * kept padded and copied 16 bytes at a time (a fixed-size copy: no call to memcpy),
 * which needs 16 bytes of slack past the end of the output. */
typedef struct {
    const char *buf;
    Py_ssize_t len;
    char padded[16];
} piece;

static void
piece_of(piece *p, const Py_buffer *b)
{
    p->buf = b->buf;
    p->len = b->len;
    memset(p->padded, 0, 16);
    if (p->len <= 16)
        memcpy(p->padded, p->buf, (size_t)p->len);
}

static inline char *
put_piece(char *w, const piece *p)
{
    if (p->len <= 16)
        memcpy(w, p->padded, 16);
    else
        memcpy(w, p->buf, (size_t)p->len);
    return w + p->len;
}

/* join_rows(data, offsets, values, head, mid, tail, sep[, first, last]): the bytes of
 * first + the n rows head + item i + mid + values[i] in decimal + tail, separated by
 * sep + last, where item i is data[offsets[i]:offsets[i + 1]] (offsets uint32 or int64:
 * the release formatters' rows of integer counts, with the items' text encoded once;
 * first and last, a release's own start and end, written in place: no copy of the rows) */
static PyObject *
join_rows(PyObject *self, PyObject *args)
{
    static const array_spec spec[3] = {
        {"data", NULL, NULL, 0}, OFFSETS_SPEC, {"values", I64, NULL, 0}};
    PyObject *o[3];
    Py_buffer head, mid, tail, sep, first = {0}, last = {0};
    if (!PyArg_ParseTuple(args, "OOOy*y*y*y*|y*y*", &o[0], &o[1], &o[2], &head, &mid, &tail,
                          &sep, &first, &last))
        return NULL;
    PyObject *out = NULL;
    Py_buffer b[3];
    int got = 0;
    if (get_arrays(o, b, spec, 3) < 0)
        goto done;
    got = 3;
    const Py_buffer *d = &b[0];
    offs off = offsets_of(&b[1]);
    Py_ssize_t n = b[2].len / 8;
    const int64_t *val = b[2].buf;
    if (b[1].len / b[1].itemsize != n + 1) {
        PyErr_SetString(PyExc_ValueError, "join_rows: offsets must hold one more than values");
        goto done;
    }
    /* the items' text must lie inside the data, in order */
    if (OFF(off, 0) < 0 || OFF(off, n) > d->len) {
        PyErr_SetString(PyExc_ValueError, "join_rows: offsets outside the data");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (OFF(off, i + 1) < OFF(off, i)) {
            PyErr_SetString(PyExc_ValueError, "join_rows: offsets must not decrease");
            goto done;
        }
    }
    /* 20: the longest int64 in decimal, with its sign; 16: the slack of 16-byte copies */
    double need = (double)(OFF(off, n) - OFF(off, 0)) +
                  (double)n * (double)(head.len + mid.len + tail.len + 20 + sep.len) + 16.0 +
                  (double)first.len + (double)last.len;
    if (need > (double)(PY_SSIZE_T_MAX / 2)) {
        PyErr_NoMemory();
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)need);
    if (out == NULL)
        goto done;
    char *w = PyBytes_AS_STRING(out);
    const char *src = d->buf;
    piece ph, pm, pt, ps;
    piece_of(&ph, &head);
    piece_of(&pm, &mid);
    piece_of(&pt, &tail);
    piece_of(&ps, &sep);
    if (first.len) {
        memcpy(w, first.buf, (size_t)first.len);
        w += first.len;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i)
            w = put_piece(w, &ps);
        w = put_piece(w, &ph);
        int64_t a = OFF(off, i), len = OFF(off, i + 1) - a;
        if (len <= 16 && a + 16 <= d->len)
            memcpy(w, src + a, 16); /* within the data; the bytes past len are overwritten */
        else
            memcpy(w, src + a, (size_t)len);
        w += len;
        w = put_piece(w, &pm);
        w = put_int64(w, val[i]);
        w = put_piece(w, &pt);
    }
    if (last.len) {
        memcpy(w, last.buf, (size_t)last.len);
        w += last.len;
    }
    _PyBytes_Resize(&out, w - PyBytes_AS_STRING(out));
done:
    release_arrays(b, got);
    PyBuffer_Release(&head);
    PyBuffer_Release(&mid);
    PyBuffer_Release(&tail);
    PyBuffer_Release(&sep);
    if (first.obj != NULL)
        PyBuffer_Release(&first);
    if (last.obj != NULL)
        PyBuffer_Release(&last);
    return out;
}

/* ------------------------------------------------------------------ item hashes
 * SHA-256 (the domain fingerprint, mechanisms/known.py) and keyed BLAKE2b-128 (the
 * item ids, noise.py) of the canonical bytes of many items, the bytes hashlib gives
 * for the same messages (FIPS 180-4, RFC 7693). An item's canonical bytes are those
 * of dpstream.noise.encode_item: b"s" + UTF-8 for a str, b"i" + decimal for an int,
 * b"b" + bytes for bytes; anything else (NumPy scalars, subclasses, bools, which it
 * refuses) is encoded by that Python function itself, passed in as ``encode``. */

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static const uint32_t sha256_iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

static inline uint32_t
ror32(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

static inline uint32_t
load_be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void
sha256_blocks_portable(uint32_t st[8], const uint8_t *p, size_t nblocks)
{
    uint32_t w[64];
    for (; nblocks; nblocks--, p += 64) {
        for (int i = 0; i < 16; i++)
            w[i] = load_be32(p + 4 * i);
        for (int i = 16; i < 64; i++) {
            uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
            uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = st[0], b = st[1], c = st[2], d = st[3];
        uint32_t e = st[4], f = st[5], g = st[6], h = st[7];
        for (int i = 0; i < 64; i++) {
            uint32_t t1 = h + (ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25)) + ((e & f) ^ (~e & g)) +
                          sha256_k[i] + w[i];
            uint32_t t2 = (ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            h = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        st[0] += a;
        st[1] += b;
        st[2] += c;
        st[3] += d;
        st[4] += e;
        st[5] += f;
        st[6] += g;
        st[7] += h;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define DPS_SHA_NI 1

/* The same compression with the x86 SHA extensions (4 rounds per pair of sha256rnds2). */
__attribute__((target("sha,sse4.1,ssse3"))) static void
sha256_blocks_shani(uint32_t st[8], const uint8_t *p, size_t nblocks)
{
    const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_loadu_si128((const __m128i *)&st[0]);
    __m128i s1 = _mm_loadu_si128((const __m128i *)&st[4]);
    tmp = _mm_shuffle_epi32(tmp, 0xB1);        /* CDAB */
    s1 = _mm_shuffle_epi32(s1, 0x1B);          /* EFGH */
    __m128i s0 = _mm_alignr_epi8(tmp, s1, 8);  /* ABEF */
    s1 = _mm_blend_epi16(s1, tmp, 0xF0);       /* CDGH */
    for (; nblocks; nblocks--, p += 64) {
        __m128i abef = s0, cdgh = s1, w[4];
        for (int i = 0; i < 16; i++) {
            __m128i m;
            if (i < 4) {
                m = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), mask);
            } else {
                m = _mm_sha256msg1_epu32(w[i & 3], w[(i + 1) & 3]);
                m = _mm_add_epi32(m, _mm_alignr_epi8(w[(i + 3) & 3], w[(i + 2) & 3], 4));
                m = _mm_sha256msg2_epu32(m, w[(i + 3) & 3]);
            }
            w[i & 3] = m;
            __m128i msg = _mm_add_epi32(m, _mm_loadu_si128((const __m128i *)&sha256_k[4 * i]));
            s1 = _mm_sha256rnds2_epu32(s1, s0, msg);
            msg = _mm_shuffle_epi32(msg, 0x0E);
            s0 = _mm_sha256rnds2_epu32(s0, s1, msg);
        }
        s0 = _mm_add_epi32(s0, abef);
        s1 = _mm_add_epi32(s1, cdgh);
    }
    tmp = _mm_shuffle_epi32(s0, 0x1B);        /* FEBA */
    s1 = _mm_shuffle_epi32(s1, 0xB1);         /* DCHG */
    s0 = _mm_blend_epi16(tmp, s1, 0xF0);      /* DCBA */
    s1 = _mm_alignr_epi8(s1, tmp, 8);         /* ABEF */
    _mm_storeu_si128((__m128i *)&st[0], s0);
    _mm_storeu_si128((__m128i *)&st[4], s1);
}

static int
cpu_has_sha(void)
{
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 19)) || !(c & (1u << 9)))
        return 0; /* SSE4.1, SSSE3 */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return (b >> 29) & 1;
}
#endif

/* -1: not decided yet; 0: the portable rounds; 1: the SHA extensions */
static int sha_mode = -1;

static void
sha256_blocks(uint32_t st[8], const uint8_t *p, size_t nblocks)
{
#ifdef DPS_SHA_NI
    if (sha_mode < 0)
        sha_mode = cpu_has_sha();
    if (sha_mode == 1) {
        sha256_blocks_shani(st, p, nblocks);
        return;
    }
#endif
    sha256_blocks_portable(st, p, nblocks);
}

static const uint64_t blake2b_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

static const uint8_t blake2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

static inline uint64_t
ror64(uint64_t x, int n)
{
    return (x >> n) | (x << (64 - n));
}

static inline uint64_t
load_le64(const uint8_t *p)
{
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

#define B2G(a, b, c, d, x, y)      \
    do {                           \
        a = a + b + (x);           \
        d = ror64(d ^ a, 32);      \
        c = c + d;                 \
        b = ror64(b ^ c, 24);      \
        a = a + b + (y);           \
        d = ror64(d ^ a, 16);      \
        c = c + d;                 \
        b = ror64(b ^ c, 63);      \
    } while (0)

/* One BLAKE2b compression of the 128-byte block p, t the bytes counted so far. */
static void
blake2b_compress(uint64_t h[8], const uint8_t *p, uint64_t t, int last)
{
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; i++)
        m[i] = load_le64(p + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = blake2b_iv[i];
    }
    v[12] ^= t; /* (messages below 2^64 bytes: the counter's high word stays 0) */
    if (last)
        v[14] = ~v[14];
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 12
#endif
    for (int r = 0; r < 12; r++) {
        const uint8_t *s = blake2b_sigma[r];
        B2G(v[0], v[4], v[8], v[12], m[s[0]], m[s[1]]);
        B2G(v[1], v[5], v[9], v[13], m[s[2]], m[s[3]]);
        B2G(v[2], v[6], v[10], v[14], m[s[4]], m[s[5]]);
        B2G(v[3], v[7], v[11], v[15], m[s[6]], m[s[7]]);
        B2G(v[0], v[5], v[10], v[15], m[s[8]], m[s[9]]);
        B2G(v[1], v[6], v[11], v[12], m[s[10]], m[s[11]]);
        B2G(v[2], v[7], v[8], v[13], m[s[12]], m[s[13]]);
        B2G(v[3], v[4], v[9], v[14], m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++)
        h[i] ^= v[i] ^ v[i + 8];
}

/* A growable scratch buffer for one message. */
typedef struct {
    uint8_t *p;
    size_t cap;
} scratch;

static int
scratch_fit(scratch *s, size_t n)
{
    if (n <= s->cap)
        return 0;
    size_t cap = n < 256 ? 256 : n + n / 2;
    uint8_t *q = PyMem_Realloc(s->p, cap);
    if (!q) {
        PyErr_NoMemory();
        return -1;
    }
    s->p = q;
    s->cap = cap;
    return 0;
}

/* The canonical bytes of ``item`` after its type tag: *tag, *data, *len; *hold is a
 * new reference that keeps *data alive (release it after use) or NULL. The common
 * types here, the others (and the errors) through encode_item (``encode``). */
static int
item_bytes(PyObject *item, PyObject *encode, char *tag, const char **data, Py_ssize_t *len,
           PyObject **hold)
{
    *hold = NULL;
    if (PyUnicode_CheckExact(item)) {
        *tag = 's';
        if (PyUnicode_IS_COMPACT_ASCII(item)) {
            *data = (const char *)PyUnicode_DATA(item);
            *len = PyUnicode_GET_LENGTH(item);
            return 0;
        }
        /* (a new bytes object: AsUTF8 would cache a copy in the str, and refuses
         * lone surrogates, which encode_item keeps with "surrogatepass") */
        *hold = PyUnicode_AsEncodedString(item, "utf-8", "surrogatepass");
    } else if (PyLong_CheckExact(item)) {
        *tag = 'i';
        *hold = PyObject_Str(item); /* str(int(item)): ASCII digits */
        if (!*hold)
            return -1;
        *data = (const char *)PyUnicode_DATA(*hold);
        *len = PyUnicode_GET_LENGTH(*hold);
        return 0;
    } else if (PyBytes_CheckExact(item)) {
        *tag = 'b';
        *data = PyBytes_AS_STRING(item);
        *len = PyBytes_GET_SIZE(item);
        return 0;
    } else {
        PyObject *enc = PyObject_CallOneArg(encode, item);
        if (!enc)
            return -1;
        if (!PyBytes_Check(enc) || PyBytes_GET_SIZE(enc) < 1) {
            Py_DECREF(enc);
            PyErr_SetString(PyExc_TypeError, "encode must return non-empty bytes");
            return -1;
        }
        *tag = PyBytes_AS_STRING(enc)[0];
        *data = PyBytes_AS_STRING(enc) + 1;
        *len = PyBytes_GET_SIZE(enc) - 1;
        *hold = enc;
        return 0;
    }
    if (!*hold)
        return -1;
    *data = PyBytes_AS_STRING(*hold);
    *len = PyBytes_GET_SIZE(*hold);
    return 0;
}

/* The message prefix + tag + data in s, padded for SHA-256; returns its block count. */
static Py_ssize_t
sha256_message(scratch *s, const uint8_t *prefix, size_t plen, char tag, const char *data,
               size_t len)
{
    size_t total = plen + 1 + len;
    size_t nblocks = (total + 8) / 64 + 1;
    if (scratch_fit(s, nblocks * 64) < 0)
        return -1;
    uint8_t *p = s->p;
    memcpy(p, prefix, plen);
    p[plen] = (uint8_t)tag;
    memcpy(p + plen + 1, data, len);
    memset(p + total, 0, nblocks * 64 - total);
    p[total] = 0x80;
    uint64_t bits = (uint64_t)total * 8;
    for (int i = 0; i < 8; i++)
        p[nblocks * 64 - 1 - i] = (uint8_t)(bits >> (8 * i));
    return (Py_ssize_t)nblocks;
}

/* sha256_sum(items, prefix, encode): the sum modulo 2^128 of the first 16 bytes
 * (big-endian) of sha256(prefix + encode_item(item)) over a list or tuple of items,
 * as (high 64 bits, low 64 bits). */
static PyObject *
sha256_sum(PyObject *self, PyObject *args)
{
    PyObject *items, *encode;
    Py_buffer prefix;
    if (!PyArg_ParseTuple(args, "Oy*O", &items, &prefix, &encode))
        return NULL;
    PyObject *seq = PySequence_Fast(items, "items must be a list or a tuple");
    if (!seq) {
        PyBuffer_Release(&prefix);
        return NULL;
    }
    scratch s = {NULL, 0};
    uint64_t hi = 0, lo = 0;
    int ok = 1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *hold;
        Py_INCREF(item);
        char tag;
        const char *data;
        Py_ssize_t len;
        int r = item_bytes(item, encode, &tag, &data, &len, &hold);
        Py_ssize_t nb = r < 0 ? -1
                              : sha256_message(&s, prefix.buf, (size_t)prefix.len, tag, data,
                                               (size_t)len);
        Py_XDECREF(hold);
        Py_DECREF(item);
        if (nb < 0) {
            ok = 0;
            break;
        }
        uint32_t st[8];
        memcpy(st, sha256_iv, sizeof st);
        sha256_blocks(st, s.p, (size_t)nb);
        uint64_t h = ((uint64_t)st[0] << 32) | st[1], l = ((uint64_t)st[2] << 32) | st[3];
        lo += l;
        hi += h + (lo < l);
    }
    PyMem_Free(s.p);
    Py_DECREF(seq);
    PyBuffer_Release(&prefix);
    if (!ok)
        return NULL;
    return Py_BuildValue("(KK)", (unsigned long long)hi, (unsigned long long)lo);
}

/* blake2b_ids(items, key, encode, out): out[i] = the 16-byte digest of
 * blake2b(encode_item(items[i]), key=key, digest_size=16), as two little-endian
 * uint64 words per item (out: uint64, 2 len(items) words). */
static PyObject *
blake2b_ids(PyObject *self, PyObject *args)
{
    PyObject *items, *encode, *outobj;
    Py_buffer key, out;
    if (!PyArg_ParseTuple(args, "Oy*OO", &items, &key, &encode, &outobj))
        return NULL;
    if (key.len < 1 || key.len > 64) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "key must hold 1 to 64 bytes");
        return NULL;
    }
    if (get(outobj, &out, 1, U64, "out") < 0) {
        PyBuffer_Release(&key);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(items, "items must be a list or a tuple");
    if (!seq) {
        PyBuffer_Release(&key);
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int ok = 1;
    if (out.len != n * 16) {
        PyErr_SetString(PyExc_ValueError, "out must hold two words per item");
        ok = 0;
    }
    /* the state after the key block (the message is never empty: the key block is
     * not the last), parameters: digest length 16, key length, fanout 1, depth 1 */
    uint64_t h0[8];
    uint8_t block[128];
    memcpy(h0, blake2b_iv, sizeof h0);
    h0[0] ^= 0x01010000ULL ^ ((uint64_t)key.len << 8) ^ 16u;
    memset(block, 0, sizeof block);
    memcpy(block, key.buf, (size_t)key.len);
    blake2b_compress(h0, block, 128, 0);
    uint64_t *o = out.buf;
    scratch s = {NULL, 0};
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        if (PySequence_Fast_GET_SIZE(seq) != n) {
            PyErr_SetString(PyExc_ValueError, "the items changed while their ids were computed");
            ok = 0;
            break;
        }
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *hold;
        Py_INCREF(item);
        char tag;
        const char *data;
        Py_ssize_t len;
        int r = item_bytes(item, encode, &tag, &data, &len, &hold);
        size_t total = (size_t)len + 1, padded = (total + 127) / 128 * 128;
        if (r == 0 && scratch_fit(&s, padded) < 0)
            r = -1;
        if (r == 0) {
            s.p[0] = (uint8_t)tag;
            memcpy(s.p + 1, data, (size_t)len);
            memset(s.p + total, 0, padded - total);
        }
        Py_XDECREF(hold);
        Py_DECREF(item);
        if (r < 0) {
            ok = 0;
            break;
        }
        uint64_t h[8];
        memcpy(h, h0, sizeof h);
        uint64_t t = 128;
        size_t pos = 0;
        for (; total - pos > 128; pos += 128) {
            t += 128;
            blake2b_compress(h, s.p + pos, t, 0);
        }
        blake2b_compress(h, s.p + pos, t + (total - pos), 1);
        /* the digest's bytes are h[0], h[1] little-endian: as "<u8" words, those values */
        uint8_t *dst = (uint8_t *)(o + 2 * i);
        for (int j = 0; j < 16; j++)
            dst[j] = (uint8_t)(h[j / 8] >> (8 * (j % 8)));
    }
    PyMem_Free(s.p);
    Py_DECREF(seq);
    PyBuffer_Release(&key);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* sha256_portable(flag): with True, SHA-256 uses the portable rounds even where the
 * SHA extensions are there (for the tests, which check both paths); returns whether
 * the extensions were in use before. */
static PyObject *
sha256_portable(PyObject *self, PyObject *arg)
{
    int force = PyObject_IsTrue(arg);
    if (force < 0)
        return NULL;
    int before = 0;
#ifdef DPS_SHA_NI
    if (sha_mode < 0)
        sha_mode = cpu_has_sha();
    before = sha_mode;
    sha_mode = force ? 0 : cpu_has_sha();
#endif
    return PyBool_FromLong(before);
}

/* blt_step(theta, omega, buffers, total, z): one step of the streamed BLT noise over
 * many items, in place, the operations of factorization.stream_step per item and in
 * its order: acc = omega_0 buf_0; acc += omega_i buf_i (i = 1..k-1); u = z - acc;
 * z = u; buf_i = theta_i buf_i; buf_i += u; total += u. ``buffers``: float64 of shape
 * (k, n), each row contiguous (rows may be spaced: a column slice of a wider array);
 * total and z: contiguous float64 of n. */
static PyObject *
blt_step(PyObject *self, PyObject *args)
{
    static const array_spec spec[4] = {{"theta", F64, NULL, 0}, {"omega", F64, NULL, 0},
                                       {"total", F64, NULL, 1}, {"z", F64, NULL, 1}};
    PyObject *objs[4], *bobj;
    Py_buffer a[4], buf;
    if (!PyArg_ParseTuple(args, "OOOOO", &objs[0], &objs[1], &bobj, &objs[2], &objs[3]))
        return NULL;
    /* theta, omega, total, z first, then the buffers (strided: not a get_spec array) */
    if (get_arrays(objs, a, spec, 4) < 0)
        return NULL;
    PyObject *res = NULL;
    if (PyObject_GetBuffer(bobj, &buf, PyBUF_STRIDES | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        release_arrays(a, 4);
        return NULL;
    }
    if (!format_is(&buf, F64) || buf.ndim != 2 ||
        (buf.shape[0] > 0 && (buf.strides[1] != 8 || buf.strides[0] % 8))) {
        PyErr_SetString(PyExc_TypeError, "buffers: float64 rows, each contiguous");
        goto done;
    }
    Py_ssize_t k = a[0].len / 8, n = a[3].len / 8;
    if (a[1].len / 8 != k || buf.shape[0] != k || buf.shape[1] != n || a[2].len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "blt_step: shapes do not agree");
        goto done;
    }
    const double *t = a[0].buf, *o = a[1].buf;
    double *b = buf.buf, *s = a[2].buf, *u = a[3].buf;
    Py_ssize_t row = buf.strides[0] / 8;
    /* (no Python object is touched: the noise kernel's threads step other chunks) */
    Py_BEGIN_ALLOW_THREADS
    if (k == 0) {
        for (Py_ssize_t j = 0; j < n; j++)
            s[j] += u[j];
    } else {
        for (Py_ssize_t j = 0; j < n; j++) {
            double acc = b[j] * o[0];
            for (Py_ssize_t i = 1; i < k; i++) {
                double p = b[i * row + j] * o[i];
                acc += p;
            }
            double v = u[j] - acc;
            u[j] = v;
            for (Py_ssize_t i = 0; i < k; i++) {
                double w = b[i * row + j] * t[i];
                b[i * row + j] = w + v;
            }
            s[j] += v;
        }
    }
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    res = Py_None;
done:
    PyBuffer_Release(&buf);
    release_arrays(a, 4);
    return res;
}

/* event_duplicates(cols, offsets, keep, distinct): keep[i] = 0 when occurrence i
 * repeats an earlier occurrence of its event (same column), else 1; distinct[e] =
 * the kept occurrences of event e; returns the number not kept. The twin of the
 * NumPy path of columns.distinct_in_events, for events of at most 64 items (each
 * occurrence is compared with the earlier ones of its event: O(width^2)); the
 * caller checks the width. cols, offsets, distinct: int64; keep: one byte each. keep
 * and distinct may share no byte with the others (the offsets, checked first, bound
 * the loops). */
static PyObject *
event_duplicates(PyObject *self, PyObject *args)
{
    static const array_spec spec[4] = {{"cols", I64, NULL, 0}, {"offsets", I64, NULL, 0},
                                       {"keep", NULL, NULL, 1}, {"distinct", I64, NULL, 1}};
    PyObject *objs[4];
    Py_buffer b[4];
    if (!PyArg_ParseTuple(args, "OOOO", &objs[0], &objs[1], &objs[2], &objs[3]) ||
        get_disjoint_arrays("event_duplicates", objs, b, spec, 4) < 0)
        return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = b[0].len / 8, ne = b[1].len / 8 - 1;
    const int64_t *col = b[0].buf, *off = b[1].buf;
    if (ne < 0 || b[2].len != n || b[3].len / 8 != ne || off[0] != 0 || off[ne] != n) {
        PyErr_SetString(PyExc_ValueError, "event_duplicates: the arrays do not agree");
        goto done;
    }
    for (Py_ssize_t e = 0; e < ne; e++) {
        if (off[e + 1] < off[e] || off[e + 1] - off[e] > 64) {
            PyErr_SetString(PyExc_ValueError,
                            "event_duplicates: offsets out of order or wider than 64");
            goto done;
        }
    }
    unsigned char *keep = b[2].buf;
    int64_t *dist = b[3].buf, dups = 0;
    for (Py_ssize_t e = 0; e < ne; e++) {
        int64_t kept = 0;
        for (int64_t i = off[e]; i < off[e + 1]; i++) {
            int seen = 0;
            for (int64_t j = off[e]; j < i; j++)
                if (col[j] == col[i]) {
                    seen = 1;
                    break;
                }
            keep[i] = (unsigned char)!seen;
            kept += !seen;
        }
        dist[e] = kept;
        dups += (off[e + 1] - off[e]) - kept;
    }
    res = PyLong_FromLongLong((long long)dups);
done:
    release_arrays(b, 4);
    return res;
}

/* "a ranks below b" in the order of top_k: larger value first, then smaller index. */
static inline int
ranks_below(const double *v, int64_t a, int64_t b)
{
    return v[a] < v[b] || (v[a] == v[b] && a > b);
}

/* Restore the heap (its root the lowest ranked of the kept indices) below slot i. */
static void
sift_down(int64_t *heap, Py_ssize_t k, Py_ssize_t i, const double *v)
{
    for (;;) {
        Py_ssize_t low = i, l = 2 * i + 1, r = l + 1;
        if (l < k && ranks_below(v, heap[l], heap[low]))
            low = l;
        if (r < k && ranks_below(v, heap[r], heap[low]))
            low = r;
        if (low == i)
            return;
        int64_t tmp = heap[i];
        heap[i] = heap[low];
        heap[low] = tmp;
        i = low;
    }
}

/*
 * top_k(values, out): the len(out) indices of the largest values, largest first and,
 * among equal values, the smaller index first (one pass with a heap of len(out)
 * indices: O(n log k) against argpartition's O(n) with a large constant and a copy).
 * Returns False (out unspecified) when a value is NaN: the caller's NumPy twin decides.
 */
static PyObject *
top_k(PyObject *self, PyObject *args)
{
    static const array_spec spec[2] = {{"values", F64, NULL, 0}, {"out", I64, NULL, 1}};
    PyObject *o[2];
    Py_buffer b[2];
    if (!PyArg_ParseTuple(args, "OO", &o[0], &o[1]) ||
        get_disjoint_arrays("top_k", o, b, spec, 2) < 0)
        return NULL;
    const double *v = b[0].buf;
    Py_ssize_t n = b[0].len / 8, k = b[1].len / 8, size = 0;
    int ok = 1;
    if (k > n) {
        PyErr_SetString(PyExc_ValueError, "top_k: more indices asked than values");
        release_arrays(b, 2);
        return NULL;
    }
    /* the heap in memory of its own, copied to out at the end: its entries index the
     * values, and out can be written by another thread while this one runs without
     * the GIL */
    int64_t *heap = PyMem_Malloc((size_t)(k > 0 ? k : 1) * sizeof(int64_t));
    if (heap == NULL) {
        release_arrays(b, 2);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        if (v[i] != v[i]) {
            ok = 0;
        } else if (size < k) {  /* grow the heap: sift the new index up */
            Py_ssize_t j = size++;
            heap[j] = i;
            while (j > 0 && ranks_below(v, heap[j], heap[(j - 1) / 2])) {
                int64_t tmp = heap[j];
                heap[j] = heap[(j - 1) / 2];
                heap[(j - 1) / 2] = tmp;
                j = (j - 1) / 2;
            }
        } else if (k > 0 && ranks_below(v, heap[0], i)) {
            heap[0] = i;
            sift_down(heap, k, 0, v);
        }
    }
    if (ok)  /* heap sort in place: the lowest ranked goes to the end, each in turn */
        for (Py_ssize_t end = k - 1; end > 0; end--) {
            int64_t tmp = heap[0];
            heap[0] = heap[end];
            heap[end] = tmp;
            sift_down(heap, end, 0, v);
        }
    if (ok && k > 0)
        memcpy(b[1].buf, heap, (size_t)k * sizeof(int64_t));
    Py_END_ALLOW_THREADS
    PyMem_Free(heap);
    release_arrays(b, 2);
    return PyBool_FromLong(ok);
}

/* The pair table of mechanisms.user_bounder.ColumnBounder: open addressing over int64
 * keys user << 32 | item (-1: an empty slot), linear probing from the key's home slot
 * (Fibonacci hashing, the top bits of key * 2^64 / phi: _slots_of's), a power-of-two
 * number of slots; the counts beside it, int32 or int64. */
#define PAIR_EMPTY (-1)

static inline Py_ssize_t
pair_home(int64_t key, int bits)
{
    return (Py_ssize_t)(((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
}

static int
table_bits(Py_ssize_t size)
{
    int bits = 0;
    while (((Py_ssize_t)1 << bits) < size)
        bits++;
    return ((Py_ssize_t)1 << bits) == size && bits > 0 ? bits : -1;
}

/* the pair table's counts: int64 or int32 */
#define COUNTS_SPEC(writable) {"counts", I64, "il", writable}

/* a (user, item) pair of user_bound's batch: its key, its place in pair_*, its count */
typedef struct {
    int64_t key, pair, count;
} pair_slot;

#define COUNT_AT(b, i) \
    ((b).itemsize == 8 ? ((const int64_t *)(b).buf)[i] : (int64_t)((const int32_t *)(b).buf)[i])

/* user_bound(keys, counts, n_users, n_items, uidx, user_of, iidx, codes, offsets, first,
 * l0, linf, held, keep, pair_user, pair_code, pair_count, pair_before): first come,
 * first kept over one batch, event by event (ContributionBounder's rule), reading the
 * state's pair table and changing nothing of it. Event e is user uidx[user_of[e]]'s
 * (an index of the state when below n_users, else a user new to it) and holds the
 * items iidx[codes[offsets[e]..offsets[e + 1]]] (the same, against n_items); first
 * (one byte per occurrence, or None: all) marks the occurrences to bound, the others
 * are not kept. held (per user of the batch, int64) holds each user's items held on
 * entry and on return. keep (one byte per occurrence, zeroed) gets 1 per kept
 * occurrence. Per (user, item) pair of the batch that keeps an occurrence, in order
 * of first occurrence: the user's place in uidx, the item's code, its count after the
 * batch and before it (0: not held), into pair_* (int64, room for one pair per
 * occurrence). Returns (those pairs, kept, dropped_new_item, dropped_count). The
 * written arrays may share no byte with any other (the codes, offsets, users and
 * indices are checked first, then read again). */
static PyObject *
user_bound(PyObject *self, PyObject *args)
{
    PyObject *kobj, *cobj, *uobj, *ofobj, *iobj, *codobj, *offobj, *fobj, *hobj, *keepobj;
    PyObject *puobj, *pcobj, *pnobj, *pbobj;
    long long n_users, n_items, l0, linf;
    if (!PyArg_ParseTuple(args, "OOLLOOOOOOLLOOOOOO", &kobj, &cobj, &n_users, &n_items,
                          &uobj, &ofobj, &iobj, &codobj, &offobj, &fobj, &l0, &linf, &hobj,
                          &keepobj, &puobj, &pcobj, &pnobj, &pbobj))
        return NULL;
    enum { KEYS, UIDX, USER_OF, IIDX, CODES, OFFSETS, HELD, PU, PC, PN, PB, COUNTS, KEEP,
           FIRST, NA };
    PyObject *objs[NA] = {kobj,  uobj,  ofobj, iobj,  codobj, offobj,  hobj,
                          puobj, pcobj, pnobj, pbobj, cobj,   keepobj, fobj};
    static const array_spec spec[NA] = {
        {"keys", I64, NULL, 0},       {"uidx", I64, NULL, 0},      {"user_of", I64, NULL, 0},
        {"iidx", I64, NULL, 0},       {"codes", I64, NULL, 0},     {"offsets", I64, NULL, 0},
        {"held", I64, NULL, 1},       {"pair_user", I64, NULL, 1}, {"pair_code", I64, NULL, 1},
        {"pair_count", I64, NULL, 1}, {"pair_before", I64, NULL, 1}, COUNTS_SPEC(0),
        {"keep", NULL, NULL, 1},      {"first", NULL, NULL, 0},
    };
    Py_buffer b[NA];
    int has_first = fobj != Py_None, got = has_first ? NA : FIRST; /* first: None or bytes */
    if (get_disjoint_arrays("user_bound", objs, b, spec, got) < 0)
        return NULL;
    const Py_buffer *cb = &b[COUNTS];
    PyObject *res = NULL;
    pair_slot *local = NULL;
    int64_t *occ = NULL;
    const int64_t *keys = b[KEYS].buf, *uidx = b[UIDX].buf, *user_of = b[USER_OF].buf;
    const int64_t *iidx = b[IIDX].buf, *codes = b[CODES].buf, *off = b[OFFSETS].buf;
    int64_t *held = b[HELD].buf, *pu = b[PU].buf, *pc = b[PC].buf, *pn = b[PN].buf;
    int64_t *pb = b[PB].buf;
    unsigned char *keep = b[KEEP].buf;
    const unsigned char *first = has_first ? b[FIRST].buf : NULL;
    Py_ssize_t size = b[KEYS].len / 8, nu = b[UIDX].len / 8, ne = b[USER_OF].len / 8;
    Py_ssize_t ni = b[IIDX].len / 8, n = b[CODES].len / 8;
    int bits = table_bits(size);
    if (bits < 0 || cb->len / cb->itemsize != size || b[OFFSETS].len / 8 != ne + 1 ||
        b[HELD].len / 8 != nu || b[KEEP].len != n || (has_first && b[FIRST].len != n) ||
        b[PU].len / 8 < n || b[PC].len / 8 < n || b[PN].len / 8 < n || b[PB].len / 8 < n ||
        off[0] != 0 || off[ne] != n) {
        PyErr_SetString(PyExc_ValueError, "user_bound: the arrays do not agree");
        goto done;
    }
    for (Py_ssize_t e = 0; e < ne; e++)
        if (off[e + 1] < off[e] || user_of[e] < 0 || user_of[e] >= nu) {
            PyErr_SetString(PyExc_ValueError, "user_bound: offsets or users out of range");
            goto done;
        }
    for (Py_ssize_t i = 0; i < n; i++)
        if (codes[i] < 0 || codes[i] >= ni) {
            PyErr_SetString(PyExc_ValueError, "user_bound: an item code out of range");
            goto done;
        }
    for (Py_ssize_t j = 0; j < nu; j++)
        if (uidx[j] < 0 || uidx[j] >= ((int64_t)1 << 31)) {
            PyErr_SetString(PyExc_ValueError, "user_bound: a user index out of range");
            goto done;
        }
    for (Py_ssize_t j = 0; j < ni; j++)
        if (iidx[j] < 0 || iidx[j] >= ((int64_t)1 << 32)) {
            PyErr_SetString(PyExc_ValueError, "user_bound: an item index out of range");
            goto done;
        }
    /* the batch's pairs: a local table of their keys, places in pair_* and counts so
     * far (one slot read per occurrence); the counts go to pair_count at the end */
    int lbits = 4;
    while (((Py_ssize_t)1 << lbits) < 2 * n)
        lbits++;
    Py_ssize_t lsize = (Py_ssize_t)1 << lbits, lmask = lsize - 1, mask = size - 1;
    local = PyMem_Malloc(lsize * sizeof(pair_slot));
    if (local == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t s = 0; s < lsize; s++)
        local[s].pair = -1;
    /* each occurrence's user and home slot in the state's table (-1: not looked up
     * there), so that the slot of an occurrence a few ahead is fetched from memory
     * while this one is decided (the table is large, its slots read at random) */
    occ = PyMem_Malloc(2 * (n > 0 ? n : 1) * sizeof(int64_t));
    if (occ == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *occ_user = occ, *occ_home = occ + n;
    for (Py_ssize_t e = 0; e < ne; e++) {
        int64_t j = user_of[e], u = uidx[j];
        for (int64_t o = off[e]; o < off[e + 1]; o++) {
            int64_t i = iidx[codes[o]];
            occ_user[o] = j;
            occ_home[o] = (u < n_users && i < n_items && (first == NULL || first[o]))
                              ? (int64_t)pair_home((u << 32) | i, bits)
                              : -1;
        }
    }
    int64_t pairs = 0, kept = 0, dropped_new = 0, dropped_count = 0;
    const Py_ssize_t ahead = 16;
    for (Py_ssize_t o = 0; o < n; o++) {
        if (o + ahead < n && occ_home[o + ahead] >= 0) {
            __builtin_prefetch(&keys[occ_home[o + ahead]]);
            __builtin_prefetch((const char *)cb->buf + occ_home[o + ahead] * cb->itemsize);
        }
        if (first != NULL && !first[o])
            continue;
        int64_t j = occ_user[o], code = codes[o], key = (uidx[j] << 32) | iidx[code];
        Py_ssize_t s = pair_home(key, lbits);
        while (local[s].pair >= 0 && local[s].key != key)
            s = (s + 1) & lmask;
        pair_slot *slot = &local[s];
        if (slot->pair < 0) { /* the pair's first occurrence in the batch: its count before */
            int64_t c0 = 0;
            if (occ_home[o] >= 0) {
                Py_ssize_t g = occ_home[o], probes = 0;
                while (keys[g] != PAIR_EMPTY && keys[g] != key && ++probes < size)
                    g = (g + 1) & mask;
                if (keys[g] != PAIR_EMPTY && keys[g] != key) { /* no empty slot at all */
                    PyErr_SetString(PyExc_ValueError, "user_bound: the pair table is full");
                    goto done;
                }
                if (keys[g] == key)
                    c0 = COUNT_AT(*cb, g);
            }
            slot->key = key;
            slot->pair = pairs;
            slot->count = c0;
            pu[pairs] = j;
            pc[pairs] = code;
            pb[pairs] = c0;
            pairs++;
        }
        if (slot->count > 0) { /* held: kept while under Linf */
            if (slot->count < linf) {
                slot->count++;
                keep[o] = 1;
                kept++;
            } else
                dropped_count++;
        } else if (held[j] < l0 && linf > 0) { /* a new item, while the user has room */
            held[j]++;
            slot->count = 1;
            keep[o] = 1;
            kept++;
        } else
            dropped_new++;
    }
    for (Py_ssize_t s = 0; s < lsize; s++)
        if (local[s].pair >= 0)
            pn[local[s].pair] = local[s].count;
    int64_t touched = 0; /* the pairs that keep an occurrence, in order, first */
    for (int64_t p = 0; p < pairs; p++)
        if (pn[p] > pb[p]) {
            pu[touched] = pu[p];
            pc[touched] = pc[p];
            pn[touched] = pn[p];
            pb[touched] = pb[p];
            touched++;
        }
    pairs = touched;
    res = Py_BuildValue("LLLL", (long long)pairs, (long long)kept, (long long)dropped_new,
                        (long long)dropped_count);
done:
    PyMem_Free(local);
    PyMem_Free(occ);
    release_arrays(b, got);
    return res;
}

/* pair_store(keys, counts, new_keys, new_counts, filled): set the counts of distinct keys
 * in the pair table, which holds ``filled`` keys, adding the keys it does not hold (the
 * caller leaves room: the table is at most half full after). Returns the number of
 * keys added. keys and counts may share no byte with each other or the new ones. */
static PyObject *
pair_store(PyObject *self, PyObject *args)
{
    static const array_spec spec[4] = {{"keys", I64, NULL, 1}, COUNTS_SPEC(1),
                                       {"new_keys", I64, NULL, 0}, {"new_counts", I64, NULL, 0}};
    PyObject *objs[4];
    Py_ssize_t filled;
    Py_buffer b[4];
    if (!PyArg_ParseTuple(args, "OOOOn", &objs[0], &objs[1], &objs[2], &objs[3], &filled) ||
        get_disjoint_arrays("pair_store", objs, b, spec, 4) < 0)
        return NULL;
    const Py_buffer *c = &b[1];
    PyObject *res = NULL;
    Py_ssize_t size = b[0].len / 8, n = b[2].len / 8;
    int bits = table_bits(size);
    if (bits < 0 || c->len / c->itemsize != size || b[3].len / 8 != n || filled < 0 ||
        filled >= size) {
        PyErr_SetString(PyExc_ValueError, "pair_store: the arrays do not agree");
        goto done;
    }
    int64_t *keys = b[0].buf;
    const int64_t *add = b[2].buf, *val = b[3].buf;
    Py_ssize_t mask = size - 1, free_slots = size - filled, added = 0;
    for (Py_ssize_t x = 0; x < n; x++) {
        int64_t key = add[x];
        if (key == PAIR_EMPTY) {
            PyErr_SetString(PyExc_ValueError, "pair_store: the key -1 marks an empty slot");
            goto done;
        }
        Py_ssize_t s = pair_home(key, bits), probes = 0;
        while (keys[s] != PAIR_EMPTY && keys[s] != key && ++probes < size)
            s = (s + 1) & mask;
        if (keys[s] != PAIR_EMPTY && keys[s] != key) { /* `filled` understated the table */
            PyErr_SetString(PyExc_ValueError, "pair_store: the table is full");
            goto done;
        }
        if (keys[s] == PAIR_EMPTY) {
            if (free_slots <= 1) { /* one empty slot always stays: a probe ends */
                PyErr_SetString(PyExc_ValueError, "pair_store: the table is full");
                goto done;
            }
            keys[s] = key;
            free_slots--;
            added++;
        }
        if (c->itemsize == 8)
            ((int64_t *)c->buf)[s] = val[x];
        else
            ((int32_t *)c->buf)[s] = (int32_t)val[x];
    }
    res = PyLong_FromSsize_t(added);
done:
    release_arrays(b, 4);
    return res;
}

static PyMethodDef methods[] = {
    {"ziggurat", ziggurat, METH_VARARGS,
     "The ziggurat's fast path and wedge test over a chunk (see dpstream.compiled)."},
    {"item_lookup", item_lookup, METH_VARARGS, "Positions of str items in an item table."},
    {"item_insert", item_insert, METH_VARARGS, "Insert stored items into the table's slots."},
    {"item_prefix_equals", item_prefix_equals, METH_VARARGS,
     "Whether a sequence starts with the table's items, in order."},
    {"item_strings", item_strings, METH_VARARGS, "Stored items at positions, as str."},
    {"join_rows", join_rows, METH_VARARGS,
     "first + rows head + item + mid + integer + tail, joined by sep, + last, as bytes."},
    {"set_ndtri", set_ndtri, METH_O, "Use SciPy's ndtri (a cython_special capsule) in C."},
    {"ndtri_into", ndtri_into, METH_VARARGS, "out[i] = ndtri(p[i]) through the ndtri set."},
    {"ziggurat_restarts", ziggurat_restarts, METH_VARARGS,
     "out[pending[i]] = ndtri(uniform(words[i])): the ziggurat's restarts."},
    {"unique_codes", unique_codes, METH_VARARGS,
     "Distinct codes in order of first appearance, and each code's index among them."},
    {"flatten_events", flatten_events, METH_VARARGS,
     "The items of a list of events as one list, and the events' offsets."},
    {"siphash13", py_siphash13, METH_VARARGS, "SipHash-1-3 of bytes under a 16-byte key."},
    {"sha256_sum", sha256_sum, METH_VARARGS,
     "Sum mod 2^128 of the items' SHA-256 fingerprints (prefix + canonical bytes)."},
    {"blake2b_ids", blake2b_ids, METH_VARARGS,
     "Keyed BLAKE2b-128 of the items' canonical bytes, into out."},
    {"event_duplicates", event_duplicates, METH_VARARGS,
     "Which occurrences repeat an earlier one of their event, and each event's distinct."},
    {"blt_step", blt_step, METH_VARARGS,
     "One step of the streamed BLT noise over many items, in place (stream_step's twin)."},
    {"sha256_portable", sha256_portable, METH_O,
     "SHA-256 without the x86 SHA extensions (True) or with them where there (False)."},
    {"top_k", top_k, METH_VARARGS,
     "Indices of the largest values, largest first, ties by smaller index (or False: NaN)."},
    {"user_bound", user_bound, METH_VARARGS,
     "First come, first kept over a batch, against the user bounder's pair table."},
    {"pair_store", pair_store, METH_VARARGS, "Set counts in the user bounder's pair table."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "dpstream._loops",
    "Compiled twins of a few NumPy loops of dpstream, same bits (see dpstream.compiled).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__loops(void)
{
    return PyModule_Create(&module);
}
