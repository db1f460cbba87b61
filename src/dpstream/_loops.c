/*
 * dpstream._loops: compiled twins of a few NumPy loops of dpstream, same bits.
 *
 * Optional: when this module is not built, dpstream runs the NumPy code it stands
 * in for (see dpstream/compiled.py). Every loop performs, per element, the IEEE
 * double operations of its NumPy twin in the same order. It must be compiled
 * without contraction into fused multiply-adds (-ffp-contract=off, set in
 * pyproject.toml) and without fast-math; tests/test_compiled.py checks the bits
 * against the NumPy path.
 *
 * Arrays are taken through the buffer protocol (C-contiguous, 8-byte items), so
 * the module needs only Python's headers, not NumPy's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* the last character of a struct format: 'Q' (uint64), 'd' (double), 'q' (int64);
 * NumPy writes longs as 'L'/'l' on some platforms */
static int
format_is(const Py_buffer *b, const char *accepted)
{
    const char *f = b->format ? b->format : "B";
    size_t n = strlen(f);
    return n > 0 && strchr(accepted, f[n - 1]) != NULL && b->itemsize == 8;
}

static int
get(PyObject *obj, Py_buffer *b, int writable, const char *accepted, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, flags) < 0)
        return -1;
    if (!format_is(b, accepted)) {
        PyErr_Format(PyExc_TypeError, "%s: wrong item type (format %s)", name,
                     b->format ? b->format : "B");
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

#define U64 "QL"
#define F64 "d"
#define I64 "ql"

/*
 * ziggurat(blocks, out, scaled, limit, bottom, rise, pending, close)
 *     -> (n_restart, n_tail, n_close)
 *
 * blocks: (c, 2) uint64; out: c float64; scaled, limit: 512 float64 (region and
 * sign); bottom, rise: 256 float64; pending, close: c int64. See
 * dpstream.ziggurat.normals_into for the method and dpstream.compiled.ziggurat
 * for what is left to the caller.
 */
static PyObject *
ziggurat(PyObject *self, PyObject *args)
{
    PyObject *o[8];
    Py_buffer b[8];
    static const char *names[8] = {"blocks", "out", "scaled", "limit",
                                   "bottom", "rise", "pending", "close"};
    static const char *types[8] = {U64, F64, F64, F64, F64, F64, I64, I64};
    static const int writable[8] = {0, 1, 0, 0, 0, 0, 1, 1};
    int got = 0;
    PyObject *result = NULL;

    if (!PyArg_ParseTuple(args, "OOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6], &o[7]))
        return NULL;
    for (; got < 8; got++)
        if (get(o[got], &b[got], writable[got], types[got], names[got]) < 0)
            goto done;

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
        if (layer == 0) {  /* the tail beyond r: drawn by the caller */
            pending[c - 1 - n_tail++] = a;
            continue;
        }
        double x = fabs(value);
        double v = ((double)(int64_t)(blocks[2 * a + 1] >> 11) + 0.5) * 0x1p-53;
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
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&b[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"ziggurat", ziggurat, METH_VARARGS,
     "The ziggurat's fast path and wedge test over a chunk (see dpstream.compiled)."},
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
