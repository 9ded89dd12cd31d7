/* fastload._native: the per-sample loop of local tar reads with a member layout, in C.
 *
 * Optional: fastload works without it (fastload/io/native.py falls back to the Python reader).
 * One function, layout_run(), reads consecutive samples of a local tar shard whose index records each
 * sample's fields and member sizes.  One preadv() per batch puts every member's data straight into its own
 * new bytes object (one copy, like cat) and the 512-byte headers and padding into scratch space; each
 * header is then compared with what the index says (name, octal size field, regular-file type), as
 * fastload.core.tar.is_header_of does.  It never raises for the shard's content: at the first header that
 * does not match, or a short read, it stops and returns how far it got, and the caller hands the rest to
 * the parsing reader, which names the problem.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define BLOCK 512
#define MAX_IOV 1020 /* below every platform's IOV_MAX (1024 on Linux and macOS) */

static PyObject *str_key; /* "__key__" */
static PyObject *str_index; /* "__index__" */
static char pad_sink[BLOCK];

/* Whether hdr is the plain ustar header of a regular file named key + dotfield with size bytes. */
static int header_matches(const char *hdr, const char *key, Py_ssize_t key_len, const char *dot,
                          Py_ssize_t dot_len, long long size) {
    char want[16];
    Py_ssize_t name_len = key_len + dot_len;
    if (name_len > 100 || size < 0) return 0;
    if (memcmp(hdr, key, (size_t)key_len) != 0 || memcmp(hdr + key_len, dot, (size_t)dot_len) != 0)
        return 0;
    if (name_len < 100 && hdr[name_len] != 0) return 0;
    if (snprintf(want, sizeof want, "%011llo", size) != 11) return 0; /* >= 8 GiB: not a plain header */
    if (memcmp(hdr + 124, want, 11) != 0 || hdr[135] != 0) return 0;
    return hdr[156] == '0' || hdr[156] == 0;
}

typedef struct {
    Py_ssize_t count;
    PyObject **values; /* count * nfields new references (NULL where not yet made) */
    char *headers;     /* count * nfields * BLOCK */
    struct iovec *iov;
} Batch;

static void batch_clear(Batch *b, Py_ssize_t nvalues) {
    for (Py_ssize_t v = 0; v < nvalues; v++) Py_CLEAR(b->values[v]);
}

/* layout_run(fd, offsets, keys, rows, fields, dot_fields, first, stop, max_bytes)
 *   -> (samples, next, ok)
 * samples: dicts {"__key__", "__index__", field: bytes...} for first..next-1 (one batch of at most about
 * max_bytes); ok False: sample `next` did not match the index or the file ended early (read it with the
 * parsing reader). */
static PyObject *layout_run(PyObject *Py_UNUSED(self), PyObject *args) {
    int fd;
    PyObject *offsets, *keys, *rows, *fields, *dot_fields;
    Py_ssize_t first, stop, max_bytes;
    if (!PyArg_ParseTuple(args, "iO!O!O!O!O!nnn", &fd, &PyList_Type, &offsets, &PyList_Type, &keys,
                          &PyList_Type, &rows, &PyList_Type, &fields, &PyList_Type, &dot_fields, &first,
                          &stop, &max_bytes))
        return NULL;
    Py_ssize_t nf = PyList_GET_SIZE(fields);
    if (nf < 1 || PyList_GET_SIZE(dot_fields) != nf || 3 * nf > MAX_IOV) {
        PyErr_SetString(PyExc_ValueError, "layout_run: fields and dot_fields must match (1 to 340)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (first < 0 || stop > n || first >= stop || PyList_GET_SIZE(offsets) < stop ||
        PyList_GET_SIZE(rows) < stop) {
        PyErr_SetString(PyExc_ValueError, "layout_run: bad sample range");
        return NULL;
    }
    /* the batch: samples first..last-1, contiguous in the file, within max_bytes and MAX_IOV */
    Py_ssize_t cap = stop - first;
    if (cap > MAX_IOV / (3 * nf)) cap = MAX_IOV / (3 * nf);
    Batch b = {0, NULL, NULL, NULL};
    Py_ssize_t last = first;
    int niov = 0;
    int ok = 1;
    b.values = PyMem_Calloc((size_t)(cap * nf), sizeof(PyObject *));
    b.headers = PyMem_Malloc((size_t)(cap * nf * BLOCK));
    b.iov = PyMem_Malloc((size_t)(cap * nf * 3) * sizeof(struct iovec));
    PyObject *result = NULL, *samples = NULL;
    if (b.values == NULL || b.headers == NULL || b.iov == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    long long start = PyLong_AsLongLong(PyList_GET_ITEM(offsets, first));
    if (start < 0 && PyErr_Occurred()) goto done;
    long long pos = start;
    for (; last < first + cap; last++) {
        if (last > first) {
            long long off = PyLong_AsLongLong(PyList_GET_ITEM(offsets, last));
            if (off == -1 && PyErr_Occurred()) goto done;
            if (off != pos || pos - start >= max_bytes) break;
        }
        PyObject *row = PyList_GET_ITEM(rows, last);
        if (!PyList_Check(row) || PyList_GET_SIZE(row) != nf) {
            ok = last == first ? 0 : 1; /* not this reader's business: the parsing reader decides */
            break;
        }
        Py_ssize_t s = last - first;
        for (Py_ssize_t k = 0; k < nf; k++) {
            long long size = PyLong_AsLongLong(PyList_GET_ITEM(row, k));
            if (size == -1 && PyErr_Occurred()) goto done;
            if (size < 0) {
                PyErr_SetString(PyExc_ValueError, "layout_run: negative member size");
                goto done;
            }
            PyObject *value = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
            if (value == NULL) goto done;
            b.values[s * nf + k] = value;
            b.iov[niov].iov_base = b.headers + (s * nf + k) * BLOCK;
            b.iov[niov++].iov_len = BLOCK;
            if (size > 0) {
                b.iov[niov].iov_base = PyBytes_AS_STRING(value);
                b.iov[niov++].iov_len = (size_t)size;
            }
            long long pad = (BLOCK - size % BLOCK) % BLOCK;
            if (pad) {
                b.iov[niov].iov_base = pad_sink;
                b.iov[niov++].iov_len = (size_t)pad;
            }
            pos += BLOCK + size + pad;
        }
    }
    b.count = last - first;
    if (b.count == 0) { /* the first row is malformed: hand it over */
        result = Py_BuildValue("([]nO)", first, Py_False);
        goto done;
    }
    long long want = pos - start, got = 0;
    {
        int i = 0;
        struct iovec *iov = b.iov;
        int left = niov;
        while (left > 0 && got < want) {
            ssize_t r;
            Py_BEGIN_ALLOW_THREADS
            r = preadv(fd, iov + i, left - i > 0 ? left - i : 0, (off_t)(start + got));
            Py_END_ALLOW_THREADS
            if (r < 0) {
                if (errno == EINTR) {
                    if (PyErr_CheckSignals() < 0) goto done;
                    continue;
                }
                PyErr_SetFromErrno(PyExc_OSError);
                goto done;
            }
            if (r == 0) break; /* end of file: short */
            got += r;
            /* a partial read (rare on regular files): skip the filled iovecs, trim the one cut */
            size_t adv = (size_t)r;
            while (i < left && adv >= iov[i].iov_len) adv -= iov[i++].iov_len;
            if (i < left && adv) {
                iov[i].iov_base = (char *)iov[i].iov_base + adv;
                iov[i].iov_len -= adv;
            }
        }
    }
    /* compare headers; stop at the first sample that does not match or was not read whole */
    Py_ssize_t good = 0;
    {
        long long end = start;
        for (; good < b.count; good++) {
            Py_ssize_t i = first + good;
            Py_ssize_t key_len;
            const char *key = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(keys, i), &key_len);
            if (key == NULL) goto done;
            int match = 1;
            for (Py_ssize_t k = 0; k < nf && match; k++) {
                PyObject *dot = PyList_GET_ITEM(dot_fields, k);
                if (!PyBytes_Check(dot)) {
                    PyErr_SetString(PyExc_TypeError, "layout_run: dot_fields must be bytes");
                    goto done;
                }
                Py_ssize_t size = PyBytes_GET_SIZE(b.values[good * nf + k]);
                end += BLOCK + size + (BLOCK - size % BLOCK) % BLOCK;
                match = end <= start + got &&
                        header_matches(b.headers + (good * nf + k) * BLOCK, key, key_len,
                                       PyBytes_AS_STRING(dot), PyBytes_GET_SIZE(dot), (long long)size);
            }
            if (!match) break;
        }
    }
    if (good < b.count) ok = 0;
    samples = PyList_New(good);
    if (samples == NULL) goto done;
    for (Py_ssize_t s = 0; s < good; s++) {
        PyObject *d = PyDict_New();
        if (d == NULL) goto done;
        PyList_SET_ITEM(samples, s, d);
        PyObject *index = PyLong_FromSsize_t(first + s);
        if (index == NULL) goto done;
        int err = PyDict_SetItem(d, str_key, PyList_GET_ITEM(keys, first + s)) ||
                  PyDict_SetItem(d, str_index, index);
        Py_DECREF(index);
        if (err) goto done;
        for (Py_ssize_t k = 0; k < nf; k++)
            if (PyDict_SetItem(d, PyList_GET_ITEM(fields, k), b.values[s * nf + k])) goto done;
    }
    result = Py_BuildValue("(OnO)", samples, first + good, ok ? Py_True : Py_False);
done:
    Py_XDECREF(samples);
    if (b.values) batch_clear(&b, cap * nf);
    PyMem_Free(b.values);
    PyMem_Free(b.headers);
    PyMem_Free(b.iov);
    return result;
}

static PyMethodDef methods[] = {
    {"layout_run", layout_run, METH_VARARGS,
     "layout_run(fd, offsets, keys, rows, fields, dot_fields, first, stop, max_bytes) -> "
     "(samples, next, ok): one batch of samples of a local tar shard read by its member layout."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fastload._native",
                                    "fastload's optional C reader for local tar shards with a member layout.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    str_key = PyUnicode_InternFromString("__key__");
    str_index = PyUnicode_InternFromString("__index__");
    if (str_key == NULL || str_index == NULL) return NULL;
    return PyModule_Create(&module);
}
