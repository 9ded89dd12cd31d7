/* fastload._native: the per-sample loops of local shard reads, in C.
 *
 * Optional: fastload works without it (fastload/formats/native.py falls back to the Python readers).
 * layout_run() reads consecutive samples of a local tar shard whose index records each sample's fields
 * and member sizes.  One preadv() per batch puts every member's data straight into its own new bytes
 * object (one copy, like cat) and the 512-byte headers and padding into scratch space; each header is then
 * compared with what the index says (name, octal size field, regular-file type, no prefix), as
 * fastload.formats.tar.header.is_header_of does, and with the index's CRC32C of each sample (index v2), the
 * CRC runs over every byte of the sample's range: headers, data and padding.  tfrecord_run() reads consecutive records of a plain
 * TFRecord shard, each value straight into its own bytes, both CRCs checked (see below).  Neither raises
 * for the shard's content: at the first sample that does not match, or a short read, they stop and return
 * how far they got, and the caller hands the rest to the Python reader, which names the problem.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define BLOCK 512
#define MAX_IOV 1020 /* below every platform's IOV_MAX (1024 on Linux and macOS) */

static PyObject *str_key; /* "__key__" */
static PyObject *str_index; /* "__index__" */

static uint32_t crc32c_update(uint32_t crc, const void *data, size_t n); /* below, with TFRecord's */

/* Whether hdr is the plain ustar header of a regular file named key + dotfield with size bytes, exactly as
 * fastload.formats.tar.header.is_header_of decides (name, octal size, type '0', no ustar prefix). */
static int header_matches(const char *hdr, const char *key, Py_ssize_t key_len, const char *dot,
                          Py_ssize_t dot_len, long long size) {
    char want[16];
    Py_ssize_t name_len = key_len + dot_len;
    if (name_len > 100 || size < 0) return 0;
    if (memcmp(hdr, key, (size_t)key_len) != 0 || memcmp(hdr + key_len, dot, (size_t)dot_len) != 0)
        return 0;
    if (name_len < 100 && hdr[name_len] != 0) return 0;
    if (size >= (1LL << 33)) return 0; /* >= 8 GiB: not a plain header */
    for (int d = 10; d >= 0; d--, size >>= 3) want[d] = (char)('0' + (size & 7)); /* "%011llo" */
    if (memcmp(hdr + 124, want, 11) != 0 || hdr[135] != 0) return 0;
    return hdr[156] == '0' && hdr[345] == 0; /* other types, a ustar prefix: the parser's */
}

/* A member's data smaller than this is read with the headers and padding around it into the batch's
 * scratch buffer and copied out (a small copy costs less than an I/O vector of its own); bigger data is
 * read straight into its bytes object. */
#define DIRECT_BYTES 4096

typedef struct {
    Py_ssize_t count;
    PyObject **values; /* count * nfields new references (NULL where not yet made) */
    Py_ssize_t *at;    /* per member: its header's offset in scratch; its padding follows its data */
    char *scratch;     /* every byte of the batch not read into a value: headers, small data, padding */
    struct iovec *iov;
} Batch;

static void batch_clear(Batch *b, Py_ssize_t nvalues) {
    for (Py_ssize_t v = 0; v < nvalues; v++) Py_CLEAR(b->values[v]);
}

/* Where member m's data and padding lie: in scratch after its header when small, else in its value. */
static inline const char *member_data(const Batch *b, Py_ssize_t m, long long size) {
    return size < DIRECT_BYTES ? b->scratch + b->at[m] + BLOCK : PyBytes_AS_STRING(b->values[m]);
}
static inline const char *member_pad(const Batch *b, Py_ssize_t m, long long size) {
    return b->scratch + b->at[m] + BLOCK + (size < DIRECT_BYTES ? size : 0);
}

/* The keys of a run: a list of str, or a key blob (bytes: the UTF-8 keys concatenated) with a list of each
 * key's end in it (index v2 tables keep keys so: no str is made for a key until its sample is). */
typedef struct {
    PyObject *list; /* the list of str, or NULL */
    const char *blob;
    Py_ssize_t blob_len;
    PyObject *ends;
    Py_ssize_t count;
} KeySource;

static int key_source(PyObject *keys, KeySource *ks) {
    memset(ks, 0, sizeof(*ks));
    if (PyList_Check(keys)) {
        ks->list = keys;
        ks->count = PyList_GET_SIZE(keys);
        return 1;
    }
    if (PyTuple_Check(keys) && PyTuple_GET_SIZE(keys) == 2 && PyBytes_Check(PyTuple_GET_ITEM(keys, 0)) &&
        PyList_Check(PyTuple_GET_ITEM(keys, 1))) {
        ks->blob = PyBytes_AS_STRING(PyTuple_GET_ITEM(keys, 0));
        ks->blob_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(keys, 0));
        ks->ends = PyTuple_GET_ITEM(keys, 1);
        ks->count = PyList_GET_SIZE(ks->ends);
        return 1;
    }
    PyErr_SetString(PyExc_TypeError, "layout_run: keys must be a list of str or (bytes, list of ends)");
    return 0;
}

/* Key j's UTF-8 bytes (NULL with an exception when the blob's ends are inconsistent). */
static const char *key_bytes(const KeySource *ks, Py_ssize_t j, Py_ssize_t *len) {
    if (ks->list != NULL) return PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(ks->list, j), len);
    long long a = j ? PyLong_AsLongLong(PyList_GET_ITEM(ks->ends, j - 1)) : 0;
    long long b = PyLong_AsLongLong(PyList_GET_ITEM(ks->ends, j));
    if (PyErr_Occurred()) return NULL;
    if (a < 0 || b < a || b > ks->blob_len) {
        PyErr_SetString(PyExc_ValueError, "layout_run: key ends do not fit the key blob");
        return NULL;
    }
    *len = (Py_ssize_t)(b - a);
    return ks->blob + a;
}

/* Key j as a new reference to a str. */
static PyObject *key_str(const KeySource *ks, Py_ssize_t j) {
    if (ks->list != NULL) {
        PyObject *key = PyList_GET_ITEM(ks->list, j);
        Py_INCREF(key);
        return key;
    }
    Py_ssize_t len;
    const char *at = key_bytes(ks, j, &len);
    return at == NULL ? NULL : PyUnicode_DecodeUTF8(at, len, "strict");
}

/* layout_run(fd, offsets, keys, key_base, rows, fields, dot_fields, crcs, first, stop, max_bytes)
 *   -> (samples, next, ok)
 * samples: dicts {"__key__", "__index__", field: bytes...} for first..next-1 (one batch of at most about
 * max_bytes); ok False: sample `next` did not match the index (its headers, or its CRC32C in crcs), or the
 * file ended early (read it with the parsing reader).  Sample i's key is keys[i - key_base] (a list of
 * str), or the (i - key_base)th of keys = (blob, ends) (see KeySource); crcs empty: no CRC check.  One preadv() per batch: each big member's data into its own bytes object, everything
 * between two of them (headers, small members, padding) into one stretch of scratch. */
static PyObject *layout_run(PyObject *Py_UNUSED(self), PyObject *args) {
    int fd;
    PyObject *offsets, *keys, *rows, *fields, *dot_fields, *crcs;
    Py_ssize_t key_base, first, stop, max_bytes;
    if (!PyArg_ParseTuple(args, "iO!OnO!O!O!O!nnn", &fd, &PyList_Type, &offsets, &keys, &key_base,
                          &PyList_Type, &rows, &PyList_Type, &fields, &PyList_Type, &dot_fields, &PyList_Type,
                          &crcs, &first, &stop, &max_bytes))
        return NULL;
    /* keys: a list of str, or (blob, ends): the keys' UTF-8 bytes concatenated and where each ends */
    KeySource ks;
    if (!key_source(keys, &ks)) return NULL;
    Py_ssize_t nf = PyList_GET_SIZE(fields);
    if (nf < 1 || PyList_GET_SIZE(dot_fields) != nf || 3 * nf > MAX_IOV) {
        PyErr_SetString(PyExc_ValueError, "layout_run: fields and dot_fields must match (1 to 340)");
        return NULL;
    }
    int check = PyList_GET_SIZE(crcs) > 0;
    if (first < 0 || key_base < 0 || first < key_base || stop - key_base > ks.count ||
        first >= stop || PyList_GET_SIZE(offsets) < stop || PyList_GET_SIZE(rows) < stop ||
        (check && PyList_GET_SIZE(crcs) < stop)) {
        PyErr_SetString(PyExc_ValueError, "layout_run: bad sample range");
        return NULL;
    }
    /* the batch: samples first..last-1, contiguous in the file, within max_bytes and MAX_IOV */
    Py_ssize_t cap = stop - first;
    if (cap > MAX_IOV / (3 * nf)) cap = MAX_IOV / (3 * nf);
    Batch b = {0, NULL, NULL, NULL, NULL};
    Py_ssize_t last = first;
    int niov = 0;
    int ok = 1;
    b.values = PyMem_Calloc((size_t)(cap * nf), sizeof(PyObject *));
    b.at = PyMem_Malloc((size_t)(cap * nf) * sizeof(Py_ssize_t));
    b.iov = PyMem_Malloc((size_t)(cap * nf * 3) * sizeof(struct iovec));
    PyObject *result = NULL, *samples = NULL;
    if (b.values == NULL || b.at == NULL || b.iov == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    long long start = PyLong_AsLongLong(PyList_GET_ITEM(offsets, first));
    if (start < 0 && PyErr_Occurred()) goto done;
    long long pos = start;
    Py_ssize_t scratch_bytes = 0;
    /* first pass: the samples of the batch, each member's place in scratch, the big members' values */
    for (; last < first + cap; last++) {
        if (last > first) {
            long long off = PyLong_AsLongLong(PyList_GET_ITEM(offsets, last));
            if (off == -1 && PyErr_Occurred()) goto done;
            if (off != pos || pos - start >= max_bytes) break;
        }
        PyObject *row = PyList_GET_ITEM(rows, last);
        /* (a list or a tuple: index v2 tables give tuples, which the cyclic GC need not track) */
        if (!(PyList_Check(row) || PyTuple_Check(row)) || PySequence_Fast_GET_SIZE(row) != nf) {
            ok = last == first ? 0 : 1; /* not this reader's business: the parsing reader decides */
            break;
        }
        Py_ssize_t s = last - first;
        for (Py_ssize_t k = 0; k < nf; k++) {
            long long size = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(row, k));
            if (size == -1 && PyErr_Occurred()) goto done;
            if (size < 0) {
                PyErr_SetString(PyExc_ValueError, "layout_run: negative member size");
                goto done;
            }
            long long pad = (BLOCK - size % BLOCK) % BLOCK;
            b.at[s * nf + k] = scratch_bytes;
            scratch_bytes += BLOCK + pad + (size < DIRECT_BYTES ? (Py_ssize_t)size : 0);
            if (size >= DIRECT_BYTES) {
                PyObject *value = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
                if (value == NULL) goto done;
                b.values[s * nf + k] = value;
            }
            pos += BLOCK + size + pad;
        }
    }
    b.count = last - first;
    if (b.count == 0) { /* the first row is malformed: hand it over */
        result = Py_BuildValue("([]nO)", first, Py_False);
        goto done;
    }
    b.scratch = PyMem_Malloc((size_t)scratch_bytes);
    if (b.scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* the I/O vectors, in file order: scratch stretches between the big members' data */
    {
        Py_ssize_t from = 0; /* the scratch stretch not yet given a vector */
        for (Py_ssize_t m = 0; m < b.count * nf; m++) {
            PyObject *value = b.values[m];
            if (value == NULL) continue; /* small: header, data and padding in scratch */
            Py_ssize_t upto = b.at[m] + BLOCK; /* this member's header included */
            b.iov[niov].iov_base = b.scratch + from;
            b.iov[niov++].iov_len = (size_t)(upto - from);
            b.iov[niov].iov_base = PyBytes_AS_STRING(value);
            b.iov[niov++].iov_len = (size_t)PyBytes_GET_SIZE(value);
            from = upto;
        }
        if (scratch_bytes > from) {
            b.iov[niov].iov_base = b.scratch + from;
            b.iov[niov++].iov_len = (size_t)(scratch_bytes - from);
        }
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
            const char *key = key_bytes(&ks, i - key_base, &key_len);
            if (key == NULL) goto done;
            PyObject *row = PyList_GET_ITEM(rows, i);
            int match = 1;
            for (Py_ssize_t k = 0; k < nf && match; k++) {
                PyObject *dot = PyList_GET_ITEM(dot_fields, k);
                if (!PyBytes_Check(dot)) {
                    PyErr_SetString(PyExc_TypeError, "layout_run: dot_fields must be bytes");
                    goto done;
                }
                long long size = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(row, k));
                end += BLOCK + size + (BLOCK - size % BLOCK) % BLOCK;
                match = end <= start + got &&
                        header_matches(b.scratch + b.at[good * nf + k], key, key_len, PyBytes_AS_STRING(dot),
                                       PyBytes_GET_SIZE(dot), size);
            }
            if (match && check) { /* every byte of the sample's range, in order */
                unsigned long want_crc = PyLong_AsUnsignedLong(PyList_GET_ITEM(crcs, i));
                if (want_crc == (unsigned long)-1 && PyErr_Occurred()) goto done;
                uint32_t crc = 0;
                for (Py_ssize_t k = 0; k < nf; k++) {
                    Py_ssize_t m = good * nf + k;
                    long long size = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(row, k));
                    size_t pad = (size_t)((BLOCK - size % BLOCK) % BLOCK);
                    if (size < DIRECT_BYTES) { /* header, data and padding: one stretch of scratch */
                        crc = crc32c_update(crc, b.scratch + b.at[m], BLOCK + (size_t)size + pad);
                        continue;
                    }
                    crc = crc32c_update(crc, b.scratch + b.at[m], BLOCK);
                    crc = crc32c_update(crc, member_data(&b, m, size), (size_t)size);
                    crc = crc32c_update(crc, member_pad(&b, m, size), pad);
                }
                match = crc == (uint32_t)want_crc;
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
        PyObject *key = key_str(&ks, first + s - key_base);
        if (key == NULL) {
            Py_DECREF(index);
            goto done;
        }
        int err = PyDict_SetItem(d, str_key, key) || PyDict_SetItem(d, str_index, index);
        Py_DECREF(index);
        Py_DECREF(key);
        if (err) goto done;
        PyObject *row = PyList_GET_ITEM(rows, first + s);
        for (Py_ssize_t k = 0; k < nf; k++) {
            Py_ssize_t m = s * nf + k;
            if (b.values[m] == NULL) { /* small: copied out of scratch */
                Py_ssize_t size = (Py_ssize_t)PyLong_AsLongLong(PySequence_Fast_GET_ITEM(row, k));
                b.values[m] = PyBytes_FromStringAndSize(b.scratch + b.at[m] + BLOCK, size);
                if (b.values[m] == NULL) goto done;
            }
            if (PyDict_SetItem(d, PyList_GET_ITEM(fields, k), b.values[m])) goto done;
        }
    }
    result = Py_BuildValue("(OnO)", samples, first + good, ok ? Py_True : Py_False);
done:
    Py_XDECREF(samples);
    if (b.values) batch_clear(&b, cap * nf);
    PyMem_Free(b.values);
    PyMem_Free(b.at);
    PyMem_Free(b.scratch);
    PyMem_Free(b.iov);
    return result;
}


/* ---- CRC32C (TFRecord's checksum) ------------------------------------------------------------------------
 * The crc32c package's function: crc32c(crc, data) continues the CRC32C `crc` over data.  On x86-64: with
 * AVX-512 VPCLMULQDQ, 256 bytes at a time folded by carry-less multiplication (~4x the crc32 instruction);
 * else with SSE4.2, three interleaved streams of the crc32 instruction combined by shift tables (Mark
 * Adler's method); elsewhere a byte-wise table. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(FASTLOAD_CRC_TABLE_ONLY)
#define HAVE_SSE42 1
#if defined(__clang__) ? __clang_major__ >= 8 : __GNUC__ >= 9
#define HAVE_VPCLMUL 1
#endif
#endif
#define CRC_POLY 0x82F63B78u        /* reflected */
#define CRC_POLY_NORMAL 0x1EDC6F41u /* the same, bit 31 first */
#define CRC_LONG 8192
#define CRC_SHORT 256
enum { CRC_TABLE, CRC_SSE42, CRC_VPCLMUL };

static uint32_t crc_table[256];
static uint32_t crc_long[4][256];  /* appends CRC_LONG zero bytes to a CRC register */
static uint32_t crc_short[4][256]; /* appends CRC_SHORT zero bytes */
static uint64_t fold_256[2], fold_64[2]; /* carry-less multipliers moving 16 bytes on by 256 / 64 bytes */
static int crc_level;                    /* the best of the enum above this CPU has */

static uint32_t crc32c_table(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n--) crc = crc_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* GF(2) 32x32 matrices (one column a word) for the zeros operators */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* tables applying `len` (a power of two) zero bytes to a CRC register, a byte of it at a time */
static void crc_zeros_tables(uint32_t zeros[4][256], size_t len) {
    uint32_t odd[32], even[32];
    odd[0] = CRC_POLY; /* one zero bit */
    for (int n = 1; n < 32; n++) odd[n] = 1u << (n - 1);
    gf2_square(even, odd); /* two bits */
    gf2_square(odd, even); /* four bits */
    uint32_t *op = odd;
    for (size_t bits = 8; bits <= 8 * len; bits <<= 1) { /* 8, 16, ... bits: alternate the two */
        uint32_t *to = op == odd ? even : odd;
        gf2_square(to, op);
        op = to;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 0; k < 4; k++) zeros[k][n] = gf2_times(op, n << (8 * k));
}

static inline uint32_t crc_shift(uint32_t zeros[4][256], uint32_t crc) {
    return zeros[0][crc & 0xFF] ^ zeros[1][(crc >> 8) & 0xFF] ^ zeros[2][(crc >> 16) & 0xFF] ^
           zeros[3][crc >> 24];
}

/* x^e mod P, bit-reflected (bit j: the coefficient of x^(31-j)) */
static uint64_t xpow_reflected(int e) {
    uint64_t r = 1;
    for (; e > 0; e--) r = r << 1 & 0x100000000u ? (r << 1 ^ CRC_POLY_NORMAL) & 0xFFFFFFFFu : r << 1;
    uint64_t out = 0;
    for (int j = 0; j < 32; j++) out |= (r >> j & 1) << (31 - j);
    return out;
}

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ CRC_POLY : c >> 1;
        crc_table[n] = c;
    }
    crc_zeros_tables(crc_long, CRC_LONG);
    crc_zeros_tables(crc_short, CRC_SHORT);
    /* 16 bytes (first half L, second H) moved on by d bytes: L * x^(8d + 64) + H * x^(8d) mod P; a
     * carry-less product of reflected values carries a factor x^33 here, hence the exponents */
    fold_256[0] = xpow_reflected(8 * 256 + 64 - 33);
    fold_256[1] = xpow_reflected(8 * 256 - 33);
    fold_64[0] = xpow_reflected(8 * 64 + 64 - 33);
    fold_64[1] = xpow_reflected(8 * 64 - 33);
#ifdef HAVE_SSE42
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) crc_level = CRC_SSE42;
#ifdef HAVE_VPCLMUL
    if (crc_level == CRC_SSE42 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq"))
        crc_level = CRC_VPCLMUL;
#endif
#endif
}

#ifdef HAVE_SSE42
#include <immintrin.h>

static inline uint64_t load64(const unsigned char *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

/* three streams of `block` bytes each, then the registers combined: c0 holds the CRC of all three */
#define CRC_3WAY(block, zeros)                                                          \
    while (n >= 3 * (block)) {                                                          \
        uint64_t c1 = 0, c2 = 0;                                                        \
        const unsigned char *end = p + (block);                                         \
        do {                                                                            \
            c0 = _mm_crc32_u64(c0, load64(p));                                          \
            c1 = _mm_crc32_u64(c1, load64(p + (block)));                                \
            c2 = _mm_crc32_u64(c2, load64(p + 2 * (block)));                            \
            p += 8;                                                                     \
        } while (p < end);                                                              \
        c0 = crc_shift(zeros, (uint32_t)c0) ^ (uint32_t)c1;                             \
        c0 = crc_shift(zeros, (uint32_t)c0) ^ (uint32_t)c2;                             \
        p += 2 * (block);                                                               \
        n -= 3 * (block);                                                               \
    }

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const unsigned char *p,
                                                                size_t n) {
    uint64_t c0 = ~crc;
    for (; n && ((uintptr_t)p & 7); n--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    CRC_3WAY(CRC_LONG, crc_long)
    CRC_3WAY(CRC_SHORT, crc_short)
    for (; n >= 8; n -= 8, p += 8) c0 = _mm_crc32_u64(c0, load64(p));
    for (; n; n--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return ~(uint32_t)c0;
}

#ifdef HAVE_VPCLMUL
#define VP_TARGET __attribute__((target("avx512f,vpclmulqdq,sse4.2")))

/* each 16 bytes of x moved on by the multiplier's distance, plus data */
VP_TARGET static inline __m512i fold(__m512i x, __m512i k, __m512i data) {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
                                     _mm512_clmulepi64_epi128(x, k, 0x11), data, 0x96);
}

/* Four registers of 64 bytes folded on over the data, 256 bytes a step, then into one; its 64 bytes have
 * the CRC of all read so far (the initial CRC register is xored into the first 4 bytes), and the crc32
 * instruction takes them and the rest. */
VP_TARGET static uint32_t crc32c_vpclmul(uint32_t crc, const unsigned char *p, size_t n) {
    if (n < 512) return crc32c_sse42(crc, p, n);
    __m512i k256 = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)fold_256[1], (long long)fold_256[0]));
    __m512i k64 = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)fold_64[1], (long long)fold_64[0]));
    __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                          0, 0, 0, 0, (int)~crc));
    __m512i x1 = _mm512_loadu_si512(p + 64), x2 = _mm512_loadu_si512(p + 128),
            x3 = _mm512_loadu_si512(p + 192);
    for (p += 256, n -= 256; n >= 256; p += 256, n -= 256) {
        x0 = fold(x0, k256, _mm512_loadu_si512(p));
        x1 = fold(x1, k256, _mm512_loadu_si512(p + 64));
        x2 = fold(x2, k256, _mm512_loadu_si512(p + 128));
        x3 = fold(x3, k256, _mm512_loadu_si512(p + 192));
    }
    x0 = fold(fold(fold(x0, k64, x1), k64, x2), k64, x3);
    for (; n >= 64; p += 64, n -= 64) x0 = fold(x0, k64, _mm512_loadu_si512(p));
    unsigned char last[64];
    _mm512_storeu_si512(last, x0);
    uint64_t c = 0;
    for (int j = 0; j < 64; j += 8) c = _mm_crc32_u64(c, load64(last + j));
    for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, load64(p));
    for (; n; n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif
#endif

/* crc32c with the given method (at most crc_level) */
static uint32_t crc32c_with(int level, uint32_t crc, const void *data, size_t n) {
#ifdef HAVE_SSE42
#ifdef HAVE_VPCLMUL
    if (level >= CRC_VPCLMUL) return crc32c_vpclmul(crc, data, n);
#endif
    if (level >= CRC_SSE42) return crc32c_sse42(crc, data, n);
#endif
    (void)level;
    return crc32c_table(crc, data, n);
}

static uint32_t crc32c_update(uint32_t crc, const void *data, size_t n) {
    return crc32c_with(crc_level, crc, data, n);
}

/* TensorFlow's mask of a CRC stored in a record */
static uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* crc32c(data, value=0, level=crc32c_hardware) -> int: for tests (against the crc32c package) */
static PyObject *crc32c_py(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data;
    unsigned int value = 0;
    int level = crc_level;
    if (!PyArg_ParseTuple(args, "y*|Ii", &data, &value, &level)) return NULL;
    if (level > crc_level) level = crc_level;
    uint32_t crc = crc32c_with(level, value, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

/* ---- TFRecord records ------------------------------------------------------------------------------------
 * tfrecord_run() reads consecutive records of a plain local TFRecord shard whose Examples have the common
 * shape (fastload.core.tfrecord.simple_example: every feature one BytesList of one value, written
 * canonically).  Big records: a small read of the head (the bytes before the first big value), then each
 * value that the head does not hold read straight into its own bytes object together with the bytes after
 * it (one preadv); small records several at a time into a scratch buffer.  Both CRCs, the header's length
 * against the index's size and each key against the index's are checked; at the first record that does
 * not match, or has another shape, or that the file cuts short, it stops (the caller's Python reader reads
 * the rest or names the problem). */
#define TFR_HEADER 12
#define TFR_OVERHEAD 16
#define TFR_BIG (16 << 10)        /* a record at least this big is read value by value */
#define TFR_SMALL_READ (256 << 10) /* small records: read up to this much at a time */
#define TFR_HEAD_READ (1 << 10)    /* a big record's head */
#define TFR_BUF (TFR_SMALL_READ + TFR_BIG + TFR_HEAD_READ)
#define TFR_NAMES 64 /* feature names remembered per call (as str) */

enum { ENTRY_SIMPLE, ENTRY_CUT, ENTRY_OTHER };

/* A length varint (at most 5 bytes, as core.tfrecord reads lengths) at p, `avail` bytes there: its size in
 * bytes, 0 if cut off, -1 if longer. */
static int read_length(const unsigned char *p, Py_ssize_t avail, uint64_t *value) {
    uint64_t v = 0;
    for (int k = 0; k < 5; k++) {
        if (k >= avail) return 0;
        v |= (uint64_t)(p[k] & 0x7F) << (7 * k);
        if (p[k] < 0x80) {
            *value = v;
            return k + 1;
        }
    }
    return -1;
}

/* A tag byte and a length at p + *k: advance *k past them; ENTRY_SIMPLE, or why not. */
static int tagged_length(const unsigned char *p, Py_ssize_t avail, uint64_t *k, unsigned char tag,
                         uint64_t *size) {
    if ((Py_ssize_t)*k >= avail) return ENTRY_CUT;
    if (p[*k] != tag) return ENTRY_OTHER;
    int n = read_length(p + *k + 1, avail - (Py_ssize_t)*k - 1, size);
    if (n <= 0) return n == 0 ? ENTRY_CUT : ENTRY_OTHER;
    *k += 1 + (uint64_t)n;
    return ENTRY_SIMPLE;
}

typedef struct {
    uint64_t name_at, name_len, value_at, stop; /* from the entry's start */
} Entry;

/* The Features map entry at p (as core.tfrecord.simple_entry), `avail` bytes of it in the buffer, `left`
 * bytes left in the payload: ENTRY_SIMPLE (e filled), ENTRY_CUT (the buffer cuts off its head) or
 * ENTRY_OTHER. */
static int simple_entry(const unsigned char *p, Py_ssize_t avail, uint64_t left, Entry *e) {
    static const unsigned char value_tags[3] = {0x12, 0x0A, 0x0A}; /* Feature, BytesList, its value */
    uint64_t k = 0, size;
    int st = tagged_length(p, avail, &k, 0x0A, &size);
    if (st != ENTRY_SIMPLE) return st;
    if (k > left || size > left - k) return ENTRY_OTHER;
    e->stop = k + size;
    if ((st = tagged_length(p, avail, &k, 0x0A, &size)) != ENTRY_SIMPLE) return st; /* the name */
    if (k >= e->stop || size >= e->stop - k) return ENTRY_OTHER;
    e->name_at = k;
    e->name_len = size;
    k += size;
    for (int t = 0; t < 3; t++) {
        if ((st = tagged_length(p, avail, &k, value_tags[t], &size)) != ENTRY_SIMPLE) return st;
        if (k > e->stop || size != e->stop - k) return ENTRY_OTHER;
    }
    e->value_at = k;
    return ENTRY_SIMPLE;
}

typedef struct {
    int fd;
    PyObject *offsets, *sizes;
    Py_ssize_t first, stop;
    long long run_end;     /* the end of the batch's last record */
    long long file_size;
    unsigned char *buf;    /* the shard's bytes [b0, b0 + blen) */
    long long b0, blen;
    PyObject *names[TFR_NAMES];
    int nnames;
} Tfr;

/* whether bytes [at, at + size) are in a file of file_size bytes */
static int within(long long at, long long size, long long file_size) {
    return at >= 0 && size >= 0 && at <= file_size && size <= file_size - at;
}

static long long list_ll(PyObject *list, Py_ssize_t i) { return PyLong_AsLongLong(PyList_GET_ITEM(list, i)); }

/* preadv() all of iov (GIL released): the bytes read (fewer at the end of the file), or -1 with an
 * exception set. */
static long long read_all(int fd, struct iovec *iov, int niov, long long offset) {
    long long got = 0;
    int i = 0;
    while (i < niov) {
        ssize_t r;
        Py_BEGIN_ALLOW_THREADS
        r = preadv(fd, iov + i, niov - i, (off_t)(offset + got));
        Py_END_ALLOW_THREADS
        if (r < 0) {
            if (errno == EINTR) {
                if (PyErr_CheckSignals() < 0) return -1;
                continue;
            }
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        if (r == 0) break;
        got += r;
        size_t adv = (size_t)r; /* skip the filled iovecs, trim the one cut */
        while (i < niov && adv >= iov[i].iov_len) adv -= iov[i++].iov_len;
        if (i < niov && adv) {
            iov[i].iov_base = (char *)iov[i].iov_base + adv;
            iov[i].iov_len -= adv;
        }
    }
    return got;
}

/* Where a read into the buffer from `pos` (in record i) should end: a big record's next head; else the
 * rest of record i with the small records after it (up to TFR_SMALL_READ) and the next record's head. */
static long long fill_end(Tfr *t, long long pos, Py_ssize_t i) {
    long long end = list_ll(t->offsets, i) + list_ll(t->sizes, i);
    if (end - pos > TFR_HEAD_READ && list_ll(t->sizes, i) >= TFR_BIG) {
        end = pos + TFR_HEAD_READ;
    } else {
        for (Py_ssize_t j = i + 1; j < t->stop; j++) {
            long long at = list_ll(t->offsets, j), size = list_ll(t->sizes, j);
            if (at != end || size >= TFR_BIG || at + size > pos + TFR_SMALL_READ) break;
            end = at + size;
        }
        end += TFR_HEAD_READ;
    }
    if (end > t->run_end) end = t->run_end;
    if (end - pos > TFR_BUF) end = pos + TFR_BUF;
    return end > pos ? end : pos;
}

/* Read the buffer anew from pos; -1 with an exception set on an I/O error. */
static int refill(Tfr *t, long long pos, Py_ssize_t i) {
    struct iovec iov = {t->buf, (size_t)(fill_end(t, pos, i) - pos)};
    long long got = read_all(t->fd, &iov, 1, pos);
    if (got < 0) return -1;
    t->b0 = pos;
    t->blen = got;
    return 0;
}

/* A feature name (UTF-8 bytes) as a new reference to a str, remembered for the call; NULL (no exception
 * set) if it is not UTF-8. */
static PyObject *feature_name(Tfr *t, const unsigned char *raw, Py_ssize_t len) {
    for (int k = 0; k < t->nnames; k++) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(t->names[k], &n);
        if (s != NULL && n == len && memcmp(s, raw, (size_t)len) == 0) return Py_NewRef(t->names[k]);
    }
    PyObject *name = PyUnicode_DecodeUTF8((const char *)raw, len, NULL);
    if (name == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyUnicode_InternInPlace(&name);
    if (t->nnames < TFR_NAMES) t->names[t->nnames++] = Py_NewRef(name);
    return name;
}

/* Whether raw is the UTF-8 of the str key (the index's). */
static int same_key(const unsigned char *raw, Py_ssize_t len, PyObject *key) {
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(key, &n);
    if (s == NULL) {
        PyErr_Clear();
        return 0;
    }
    return n == len && memcmp(s, raw, (size_t)len) == 0;
}

/* Whether key is record i's key when it has no __key__ feature: "<stem>/<i:06d>" (derived_key() in
 * core.tfrecord). */
static int derived_key_is(PyObject *key, PyObject *stem, Py_ssize_t i) {
    Py_ssize_t n, stem_len;
    const char *s = PyUnicode_AsUTF8AndSize(key, &n), *st = PyUnicode_AsUTF8AndSize(stem, &stem_len);
    char number[32];
    if (s == NULL || st == NULL) {
        PyErr_Clear();
        return 0;
    }
    int len = snprintf(number, sizeof number, "/%06zd", i);
    return n == stem_len + len && memcmp(s, st, (size_t)stem_len) == 0 &&
           memcmp(s + stem_len, number, (size_t)len) == 0;
}

enum { RECORD_ERROR = -1, RECORD_STOP = 0, RECORD_OK = 1 };

/* Record i (key: the index's) into *out as a sample dict: RECORD_OK, RECORD_STOP if it is not as
 * expected, RECORD_ERROR with an exception set. */
static int read_record(Tfr *t, Py_ssize_t i, PyObject *key, PyObject *stem, PyObject **out) {
    long long at = list_ll(t->offsets, i), size = list_ll(t->sizes, i);
    if ((at == -1 || size == -1) && PyErr_Occurred()) return RECORD_ERROR;
    if (size < TFR_OVERHEAD || !within(at, size, t->file_size)) return RECORD_STOP;
    /* the record's head (a big one) or all of it (a small one) in the buffer */
    long long need = size >= TFR_BIG ? TFR_HEADER + 16 : size;
    if (!(t->b0 <= at && at + need <= t->b0 + t->blen) && refill(t, at, i) < 0) return RECORD_ERROR;
    if (at + TFR_HEADER > t->b0 + t->blen) return RECORD_STOP;
    const unsigned char *h = t->buf + (at - t->b0);
    uint64_t length = 0;
    for (int k = 7; k >= 0; k--) length = length << 8 | h[k];
    if (le32(h + 8) != masked(crc32c_update(0, h, 8)) || length != (uint64_t)(size - TFR_OVERHEAD))
        return RECORD_STOP;

    long long start = at + TFR_HEADER, end = start + (long long)length;
    long long crc_at = start; /* the payload's CRC covers [start, crc_at) */
    uint32_t crc = 0;
    int has_key = 0, status = RECORD_STOP;
    PyObject *d = PyDict_New();
    if (d == NULL || PyDict_SetItem(d, str_key, key)) goto error;
    if (length > 0) { /* the Example's one field, `features`, all of the payload */
        uint64_t k = 0, features;
        if (tagged_length(h + TFR_HEADER, t->b0 + t->blen - start, &k, 0x0A, &features) != ENTRY_SIMPLE ||
            k + features != length)
            goto done;
        for (long long pos = start + (long long)k; pos < end;) {
            Entry e;
            int st = simple_entry(t->buf + (pos - t->b0), t->b0 + t->blen - pos, (uint64_t)(end - pos), &e);
            if (st == ENTRY_CUT && t->b0 + t->blen < end) { /* read on from the entry */
                crc = crc32c_update(crc, t->buf + (crc_at - t->b0), (size_t)(pos - crc_at));
                crc_at = pos;
                if (refill(t, pos, i) < 0) goto error;
                st = simple_entry(t->buf, t->blen, (uint64_t)(end - pos), &e);
            }
            if (st != ENTRY_SIMPLE) goto done;
            const unsigned char *p = t->buf + (pos - t->b0);
            long long a = pos + (long long)e.value_at, b = pos + (long long)e.stop;
            int is_key = e.name_len == 7 && memcmp(p + e.name_at, "__key__", 7) == 0;
            PyObject *name = is_key ? NULL : feature_name(t, p + e.name_at, (Py_ssize_t)e.name_len);
            if (!is_key && name == NULL) goto done;
            const unsigned char *data = p + e.value_at; /* the value's bytes, where they are */
            PyObject *value = NULL;
            if (b > t->b0 + t->blen) { /* the part in the buffer, the rest read straight into the value */
                value = PyBytes_FromStringAndSize(NULL, b - a);
                if (value == NULL) {
                    Py_XDECREF(name);
                    goto error;
                }
                crc = crc32c_update(crc, t->buf + (crc_at - t->b0), (size_t)(a - crc_at));
                char *v = PyBytes_AS_STRING(value);
                long long have = t->b0 + t->blen - a, after = fill_end(t, b, i);
                memcpy(v, data, (size_t)have);
                struct iovec iov[2] = {{v + have, (size_t)(b - a - have)}, {t->buf, (size_t)(after - b)}};
                long long got = read_all(t->fd, iov, after > b ? 2 : 1, a + have); /* (and what follows) */
                if (got < b - a - have) {
                    Py_DECREF(value);
                    Py_XDECREF(name);
                    if (got < 0) goto error;
                    goto done; /* short */
                }
                t->b0 = b;
                t->blen = got - (b - a - have);
                crc = crc32c_update(crc, v, (size_t)(b - a));
                crc_at = b;
                data = (const unsigned char *)v;
            } else if (!is_key) {
                value = PyBytes_FromStringAndSize((const char *)data, b - a);
            }
            if (is_key) {
                int same = same_key(data, b - a, key);
                Py_XDECREF(value);
                if (!same) goto done;
                has_key = 1;
            } else {
                int err = value == NULL || PyDict_SetItem(d, name, value);
                Py_XDECREF(value);
                Py_DECREF(name);
                if (err) goto error;
            }
            pos = b;
        }
    }
    crc = crc32c_update(crc, t->buf + (crc_at - t->b0), (size_t)(end - crc_at));
    if (end + 4 > t->b0 + t->blen) { /* the footer (and what follows) */
        if (refill(t, end, i) < 0) goto error;
        if (end + 4 > t->b0 + t->blen) goto done;
    }
    if (le32(t->buf + (end - t->b0)) != masked(crc)) goto done;
    if (!has_key && !derived_key_is(key, stem, i)) goto done;
    PyObject *index = PyLong_FromSsize_t(i);
    if (index == NULL) goto error;
    int err = PyDict_SetItem(d, str_index, index);
    Py_DECREF(index);
    if (err) goto error;
    *out = d;
    return RECORD_OK;
error:
    status = RECORD_ERROR;
done:
    Py_XDECREF(d);
    return status;
}

/* tfrecord_run(fd, offsets, sizes, keys, stem, first, stop, max_bytes) -> (samples, next, ok)
 * samples: dicts {"__key__", field: bytes..., "__index__"} of records first..next-1 (a batch of about
 * max_bytes, at least one record); ok False: record `next` is not as expected (read it with the Python
 * reader). stem: the shard's name without its suffix, for the keys of records without a __key__. */
static PyObject *tfrecord_run(PyObject *Py_UNUSED(self), PyObject *args) {
    Tfr t;
    memset(&t, 0, sizeof t);
    PyObject *keys, *stem;
    Py_ssize_t max_bytes;
    if (!PyArg_ParseTuple(args, "iO!O!O!Unnn", &t.fd, &PyList_Type, &t.offsets, &PyList_Type, &t.sizes,
                          &PyList_Type, &keys, &stem, &t.first, &t.stop, &max_bytes))
        return NULL;
    if (t.first < 0 || t.first >= t.stop || PyList_GET_SIZE(keys) < t.stop ||
        PyList_GET_SIZE(t.offsets) < t.stop || PyList_GET_SIZE(t.sizes) < t.stop) {
        PyErr_SetString(PyExc_ValueError, "tfrecord_run: bad record range");
        return NULL;
    }
    struct stat st;
    if (fstat(t.fd, &st) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    t.file_size = (long long)st.st_size;
    /* the batch: first..last-1, about max_bytes, up to a record that the file cannot hold (read_record()
     * stops there) */
    Py_ssize_t last = t.first;
    for (long long total = 0; last < t.stop && (last == t.first || total < max_bytes); last++) {
        long long at = list_ll(t.offsets, last), size = list_ll(t.sizes, last);
        if ((at == -1 || size == -1) && PyErr_Occurred()) return NULL;
        if (!within(at, size, t.file_size)) {
            last++;
            break;
        }
        total += size;
        if (at + size > t.run_end) t.run_end = at + size;
    }
    t.stop = last; /* (no reading ahead past the batch) */
    PyObject *samples = PyList_New(0), *result = NULL;
    t.buf = PyMem_Malloc(TFR_BUF);
    if (samples == NULL || t.buf == NULL) {
        if (t.buf == NULL) PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t i = t.first;
    int status = RECORD_OK;
    for (; i < last; i++) {
        /* (a reference of our own to the key: other threads run during the reads) */
        PyObject *sample = NULL, *key = Py_NewRef(PyList_GET_ITEM(keys, i));
        status = read_record(&t, i, key, stem, &sample);
        Py_DECREF(key);
        if (status == RECORD_ERROR) goto done;
        if (status == RECORD_STOP) break;
        int err = PyList_Append(samples, sample);
        Py_DECREF(sample);
        if (err) goto done;
    }
    result = Py_BuildValue("(OnO)", samples, i, status == RECORD_OK ? Py_True : Py_False);
done:
    Py_XDECREF(samples);
    PyMem_Free(t.buf);
    for (int k = 0; k < t.nnames; k++) Py_DECREF(t.names[k]);
    return result;
}

/* ---- tar shard writing -----------------------------------------------------------------------------------
 * tar_fill() puts whole samples of local files into a shard writer's buffer as tar members, with the GIL
 * released for the whole batch (so writer threads scale with cores).  Per sample: every member opened and
 * fstat'ed (its size must be the listed one), then each member's ustar header (the bytes of
 * fastload.formats.tar.header.member_header for a plain name), its data read straight into the buffer and
 * its zero padding; then every member fstat'ed again (size, mtime and ctime: a file written to while read
 * is read again from a fresh open, up to `attempts` times: GNU tar's "file changed as we read it") and the
 * CRC32C of the sample's bytes taken while they are in cache.  A sample that fails is rolled back out of
 * the buffer and reported by member and cause, for the caller to name.  It stops before a sample that does
 * not fit the room left (the caller flushes the buffer and calls again), or that needs the Python writer
 * (a pax header: a long or non-ASCII name, a size of 8 GiB or more; more bytes than the buffer holds; more
 * than TAR_MAX_MEMBERS members), or after a failed open that says this process is out of descriptors. */
#include <fcntl.h>

enum { TAR_OK, TAR_OPEN, TAR_LISTED, TAR_READ, TAR_SHRUNK, TAR_CHANGED };
enum { FILL_MORE, FILL_FULL, FILL_PYTHON, FILL_STOP }; /* why tar_fill returned */

#define TAR_MAX_MEMBERS 64
#define TAR_BATCH_MEMBERS 4096 /* members prepared per call (the GIL is taken again between calls) */
#define TAR_MAX_OCTAL 077777777777LL

typedef struct {
    const char *path, *name;
    Py_ssize_t name_len;
    long long size;
} TarIn;

typedef struct {
    int kind, err;
    Py_ssize_t member;
    long long a; /* TAR_OK: the sample's offset in the buffer; TAR_LISTED: the size now; TAR_SHRUNK: bytes read */
    long long size;
    uint32_t crc;
} TarOut;

static void octal(char *p, long long value, int digits) { /* "%0*llo\0" */
    for (int d = digits - 1; d >= 0; d--, value >>= 3) p[d] = (char)('0' + (value & 7));
    p[digits] = 0;
}

/* the 512-byte header member_header writes for a plain name: mode 0644, uid/gid 0, mtime fixed */
static void ustar_header(char *h, const char *name, Py_ssize_t name_len, long long size, long long mtime) {
    memset(h, 0, BLOCK);
    memcpy(h, name, (size_t)name_len);
    octal(h + 100, 0644, 7);
    octal(h + 108, 0, 7);
    octal(h + 116, 0, 7);
    octal(h + 124, size, 11);
    octal(h + 136, mtime, 11);
    memset(h + 148, ' ', 8);
    h[156] = '0';
    memcpy(h + 257, "ustar\0" "00", 8);
    octal(h + 329, 0, 7);
    octal(h + 337, 0, 7);
    unsigned sum = 0;
    for (int i = 0; i < BLOCK; i++) sum += (unsigned char)h[i];
    octal(h + 148, sum, 6); /* "%06o\0 " */
    h[155] = ' ';
}

static int same_stat(const struct stat *a, const struct stat *b) {
    return a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
           a->st_mtim.tv_nsec == b->st_mtim.tv_nsec && a->st_ctim.tv_sec == b->st_ctim.tv_sec &&
           a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* One attempt at one sample of n members at buf + *pos (GIL released); TAR_OK or the first failure. */
static void tar_sample(char *buf, long long *pos, const TarIn *in, Py_ssize_t n, long long mtime, TarOut *o) {
    int fds[TAR_MAX_MEMBERS];
    struct stat before[TAR_MAX_MEMBERS], now;
    Py_ssize_t opened = 0, j;
    o->kind = TAR_OK, o->err = 0, o->a = 0;
    for (j = 0; j < n; j++) { /* open all first, as fastload.storage.inputs.open_sample does */
        int fd;
        do fd = open(in[j].path, O_RDONLY | O_CLOEXEC);
        while (fd < 0 && errno == EINTR);
        if (fd < 0) {
            o->kind = TAR_OPEN, o->err = errno;
            break;
        }
        fds[opened++] = fd;
        if (fstat(fd, &before[j]) != 0) {
            o->kind = TAR_OPEN, o->err = errno;
            break;
        }
        if (S_ISDIR(before[j].st_mode)) { /* (Python's open refuses a folder) */
            o->kind = TAR_OPEN, o->err = EISDIR;
            break;
        }
        if ((long long)before[j].st_size != in[j].size) {
            o->kind = TAR_LISTED, o->a = (long long)before[j].st_size;
            break;
        }
    }
    for (Py_ssize_t k = 0; o->kind == TAR_OK && k < n; k++) {
        long long size = in[k].size, got = 0;
        ustar_header(buf + *pos, in[k].name, in[k].name_len, size, mtime);
        *pos += BLOCK;
        while (got < size) {
            size_t want = (size_t)(size - got) > (1u << 30) ? (1u << 30) : (size_t)(size - got);
            ssize_t r = read(fds[k], buf + *pos + got, want);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                o->kind = TAR_READ, o->err = errno;
                break;
            }
            if (r == 0) {
                o->kind = TAR_SHRUNK, o->a = got;
                break;
            }
            got += r;
        }
        if (o->kind != TAR_OK) {
            j = k;
            break;
        }
        long long pad = (BLOCK - size % BLOCK) % BLOCK;
        memset(buf + *pos + size, 0, (size_t)pad);
        *pos += size + pad;
    }
    for (Py_ssize_t k = 0; o->kind == TAR_OK && k < n; k++) /* after every read, as changed_while_read */
        if (fstat(fds[k], &now) != 0 || !same_stat(&now, &before[k])) o->kind = TAR_CHANGED, j = k;
    o->member = j;
    for (Py_ssize_t k = 0; k < opened; k++) close(fds[k]);
}

/* tar_fill(buffer, fill, paths, names, sizes, counts, first, member, stop, mtime, attempts)
 *   -> (fill, next, next_member, status, results) */
static PyObject *tar_fill(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer buf;
    Py_ssize_t fill, first, member, stop;
    PyObject *paths, *names, *sizes, *counts;
    long long mtime;
    int attempts;
    if (!PyArg_ParseTuple(args, "w*nO!O!O!O!nnnLi", &buf, &fill, &PyList_Type, &paths, &PyList_Type, &names,
                          &PyList_Type, &sizes, &PyList_Type, &counts, &first, &member, &stop, &mtime,
                          &attempts))
        return NULL;
    PyObject *result = NULL, *results = NULL, **held = NULL;
    TarIn *in = NULL;
    TarOut *outs = NULL;
    Py_ssize_t *nmem = NULL, nsamples = 0, nin = 0, nheld = 0;
    int status = FILL_MORE;
    if (fill < 0 || fill > buf.len || first < 0 || member < 0 || stop > PyList_GET_SIZE(counts) ||
        mtime < 0 || mtime > TAR_MAX_OCTAL || attempts < 1) {
        PyErr_SetString(PyExc_ValueError, "tar_fill: bad arguments");
        goto done;
    }
    Py_ssize_t cap = stop - first < TAR_BATCH_MEMBERS ? (stop > first ? stop - first : 1) : TAR_BATCH_MEMBERS;
    in = PyMem_Malloc(sizeof(TarIn) * TAR_BATCH_MEMBERS);
    held = PyMem_Malloc(sizeof(PyObject *) * TAR_BATCH_MEMBERS);
    outs = PyMem_Malloc(sizeof(TarOut) * (size_t)cap);
    nmem = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)cap);
    if (in == NULL || held == NULL || outs == NULL || nmem == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* which samples fit (GIL held: the lists are read, paths encoded) */
    long long room = (long long)(buf.len - fill);
    Py_ssize_t m = member;
    for (Py_ssize_t i = first; i < stop; i++) {
        Py_ssize_t c = PyLong_AsSsize_t(PyList_GET_ITEM(counts, i));
        if (c == -1 && PyErr_Occurred()) goto done;
        if (c < 0 || c > TAR_MAX_MEMBERS || m + c > PyList_GET_SIZE(paths) || m + c > PyList_GET_SIZE(names) ||
            m + c > PyList_GET_SIZE(sizes)) {
            status = FILL_PYTHON;
            break;
        }
        if (nin + c > TAR_BATCH_MEMBERS || nsamples == cap) break; /* (the caller calls again) */
        long long total = 0;
        int plain = 1;
        for (Py_ssize_t j = 0; j < c && plain; j++) {
            PyObject *name = PyList_GET_ITEM(names, m + j);
            long long size = PyLong_AsLongLong(PyList_GET_ITEM(sizes, m + j));
            if (size == -1 && PyErr_Occurred()) goto done;
            plain = PyUnicode_Check(name) && PyUnicode_IS_ASCII(name) && PyUnicode_GET_LENGTH(name) <= 100 &&
                    size >= 0 && size <= TAR_MAX_OCTAL;
            total += BLOCK + (size + BLOCK - 1) / BLOCK * BLOCK;
        }
        if (!plain || total > (long long)buf.len) {
            status = FILL_PYTHON;
            break;
        }
        if (total > room) {
            status = FILL_FULL;
            break;
        }
        room -= total;
        for (Py_ssize_t j = 0; j < c; j++, nin++) {
            PyObject *path = NULL;
            if (!PyUnicode_FSConverter(PyList_GET_ITEM(paths, m + j), &path)) goto done;
            held[nheld++] = path;
            in[nin].path = PyBytes_AS_STRING(path);
            in[nin].name = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(names, m + j), &in[nin].name_len);
            if (in[nin].name == NULL) goto done;
            in[nin].size = PyLong_AsLongLong(PyList_GET_ITEM(sizes, m + j));
        }
        nmem[nsamples++] = c;
        m += c;
    }
    /* the I/O (GIL released) */
    long long pos = (long long)fill;
    Py_ssize_t done_samples = 0;
    Py_BEGIN_ALLOW_THREADS
    const TarIn *at = in;
    for (Py_ssize_t s = 0; s < nsamples; s++) {
        TarOut *o = &outs[s];
        long long start = pos;
        for (int attempt = 1;; attempt++) {
            pos = start;
            tar_sample((char *)buf.buf, &pos, at, nmem[s], mtime, o);
            if (o->kind != TAR_CHANGED || attempt >= attempts) break;
        }
        at += nmem[s];
        done_samples = s + 1;
        if (o->kind != TAR_OK) {
            pos = start;
            if (o->kind == TAR_OPEN && (o->err == EMFILE || o->err == ENFILE)) break;
            continue;
        }
        o->a = start;
        o->size = pos - start;
        o->crc = crc32c_update(0, (const char *)buf.buf + start, (size_t)(pos - start));
    }
    Py_END_ALLOW_THREADS
    if (done_samples < nsamples) status = FILL_STOP;
    Py_ssize_t next_member = member;
    for (Py_ssize_t s = 0; s < done_samples; s++) next_member += nmem[s];
    results = PyList_New(done_samples);
    if (results == NULL) goto done;
    for (Py_ssize_t s = 0; s < done_samples; s++) {
        TarOut *o = &outs[s];
        PyObject *t = o->kind == TAR_OK
                          ? Py_BuildValue("(niLLk)", first + s, o->kind, o->a, o->size, (unsigned long)o->crc)
                          : Py_BuildValue("(ninLi)", first + s, o->kind, o->member, o->a, o->err);
        if (t == NULL) goto done;
        PyList_SET_ITEM(results, s, t);
    }
    result = Py_BuildValue("(LnnnO)", pos, first + done_samples, next_member, (Py_ssize_t)status, results);
done:
    for (Py_ssize_t k = 0; k < nheld; k++) Py_DECREF(held[k]);
    Py_XDECREF(results);
    PyMem_Free(in);
    PyMem_Free(held);
    PyMem_Free(outs);
    PyMem_Free(nmem);
    PyBuffer_Release(&buf);
    return result;
}

/* ---- the bounded sample shuffle --------------------------------------------------------------------------
 * buffer_shuffle() is fastload.core.shuffle._buffer_shuffle_loop (the definition) in C, drawing from the
 * Python random.Random's own Mersenne Twister state as CPython does: randrange(m) = getrandbits(k) until
 * below m, k = m.bit_length(), getrandbits(k <= 32) = the top k bits of one 32-bit output; shuffle() swaps
 * x[i] with x[randbelow(i + 1)] for i from the end down to 1.  The caller checks once per process that it
 * gives the loop's permutation (fastload.core.shuffle.use_native). */
#define MT_N 624
#define MT_M 397

typedef struct {
    uint32_t mt[MT_N];
    Py_ssize_t pos;
} Mt;

/* gcc: vectorise the Mersenne Twister's word loops (the build's -O2 does not); other compilers ignore it */
#if defined(__GNUC__) && !defined(__clang__)
#define VECTORISE __attribute__((optimize("O3")))
#else
#define VECTORISE
#endif

/* one step of the recurrence, branch-free (as mag01[y & 1]) */
#define MT_STEP(a, b, c) ((c) ^ ((((a) & 0x80000000u) | ((b) & 0x7fffffffu)) >> 1) ^ (-((b) & 1u) & 0x9908b0dfu))

VECTORISE static void mt_twist(Mt *g) {
    uint32_t *mt = g->mt;
    int k;
    for (k = 0; k < MT_N - MT_M; k++) mt[k] = MT_STEP(mt[k], mt[k + 1], mt[k + MT_M]);
    for (; k < MT_N - 1; k++) mt[k] = MT_STEP(mt[k], mt[k + 1], mt[k + (MT_M - MT_N)]);
    mt[MT_N - 1] = MT_STEP(mt[MT_N - 1], mt[0], mt[MT_M - 1]);
    g->pos = 0;
}

static inline uint32_t mt_temper(uint32_t y) {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

static inline uint32_t mt_next(Mt *g) {
    if (g->pos >= MT_N) mt_twist(g);
    return mt_temper(g->mt[g->pos++]);
}

/* CPython's _randbelow_with_getrandbits for 2 <= m < 2**32 */
static inline uint32_t mt_below(Mt *g, uint32_t m, int shift) {
    uint32_t r;
    do r = mt_next(g) >> shift;
    while (r >= m);
    return r;
}

/* The next `need` values of mt_below(g, m, shift) into d, without a branch per word: the words of a block
 * are tempered and shifted at once (vectorised), then each one's value is written and kept (k advances)
 * when below m.  The state is left after the last word used, as mt_below leaves it. */
VECTORISE static void mt_below_many(Mt *g, uint32_t m, int shift, uint32_t *d, Py_ssize_t need) {
    uint32_t r[MT_N];
    Py_ssize_t k = 0;
    while (k < need) {
        if (g->pos >= MT_N) mt_twist(g);
        Py_ssize_t p = g->pos, q;
        for (q = p; q < MT_N; q++) r[q] = mt_temper(g->mt[q]) >> shift;
        if (need - k >= MT_N - p) { /* every word left in this block is used: no check per word */
            for (; p < MT_N; p++) {
                d[k] = r[p];
                k += r[p] < m;
            }
        } else {
            for (; p < MT_N && k < need; p++) {
                d[k] = r[p];
                k += r[p] < m;
            }
        }
        g->pos = p;
    }
}

static int bit_length(uint64_t m) {
    int k = 0;
    while (m) {
        k++;
        m >>= 1;
    }
    return k;
}

#define DRAWS 4096 /* slots drawn per block */

/* The buffer is full: step i (sample i, i >= last) draws a slot j; slot `last` is sample i itself (given out
 * at once), any other gives out what it holds and keeps sample i.  Writing i to slot `last` first makes both
 * one branch-free step.  Output o = i - last goes to out[o]. */
static void shuffle_steps(Mt *g, int64_t *pending, int64_t last, int64_t n, uint32_t *draws, int64_t *out) {
    const int shift = 32 - bit_length((uint64_t)last + 1);
    for (int64_t i = last; i < n;) {
        Py_ssize_t got = n - i < DRAWS ? (Py_ssize_t)(n - i) : DRAWS;
        mt_below_many(g, (uint32_t)(last + 1), shift, draws, got);
        for (Py_ssize_t c = 0; c < got; c++, i++) {
            uint32_t j = draws[c];
            pending[last] = i;
            *out++ = pending[j];
            pending[j] = i;
        }
    }
}

/* shuffle_steps giving out only outputs at[0..nat) (ascending) into vals: between two of them a step only
 * stores (no load, no output), so the outputs nobody asked for cost little.  Returns how many were set. */
static Py_ssize_t shuffle_steps_at(Mt *g, int64_t *pending, int64_t last, int64_t n, uint32_t *draws,
                                   const int64_t *at, Py_ssize_t nat, int64_t *vals) {
    const int shift = 32 - bit_length((uint64_t)last + 1);
    Py_ssize_t w = 0;
    for (int64_t i = last; i < n;) {
        Py_ssize_t got = n - i < DRAWS ? (Py_ssize_t)(n - i) : DRAWS, c = 0;
        mt_below_many(g, (uint32_t)(last + 1), shift, draws, got);
        while (c < got) {
            Py_ssize_t stop = got; /* the block's next wanted step, or its end */
            if (w < nat && at[w] - (i - last) < (int64_t)(got - c)) stop = c + (Py_ssize_t)(at[w] - (i - last));
            for (; c < stop; c++, i++) pending[draws[c]] = i;
            if (c < got) {
                uint32_t j = draws[c];
                int64_t v = j == last ? i : pending[j];
                while (w < nat && at[w] == i - last) vals[w++] = v;
                pending[j] = i;
                c++;
                i++;
            }
        }
    }
    return w;
}

/* buffer_shuffle(n, buffer, key, pos[, at]) -> (order, key, pos): order is a bytearray of n native int64, or
 * with `at` (native int64 positions, ascending) only the order's values at those positions. */
static PyObject *buffer_shuffle_py(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_ssize_t n, buffer, pos;
    Py_buffer key, atbuf = {0};
    if (!PyArg_ParseTuple(args, "nny*n|y*", &n, &buffer, &key, &pos, &atbuf)) return NULL;
    Mt g;
    const int64_t *at = atbuf.buf;
    Py_ssize_t nat = atbuf.buf != NULL ? atbuf.len / 8 : 0;
    int bad_at = atbuf.buf != NULL && atbuf.len % 8 != 0;
    for (Py_ssize_t w = 0; w < nat && !bad_at; w++)
        bad_at = at[w] < 0 || at[w] >= n || (w > 0 && at[w] < at[w - 1]);
    if (key.len != (Py_ssize_t)sizeof(g.mt) || pos < 0 || pos > MT_N || n < 0 || buffer < 2 ||
        (uint64_t)buffer > 0xffffffffu || n > PY_SSIZE_T_MAX / 8 || bad_at) {
        PyBuffer_Release(&key);
        if (atbuf.buf != NULL) PyBuffer_Release(&atbuf);
        PyErr_SetString(PyExc_ValueError, "buffer_shuffle: need n >= 0, 2 <= buffer < 2**32, a 624-word key, "
                                          "positions (native int64) ascending within [0, n)");
        return NULL;
    }
    memcpy(g.mt, key.buf, sizeof(g.mt));
    PyBuffer_Release(&key);
    g.pos = pos;
    PyObject *order = PyByteArray_FromStringAndSize(NULL, (atbuf.buf != NULL ? nat : n) * 8);
    int64_t *pending = PyMem_RawMalloc((size_t)buffer * sizeof(int64_t));
    uint32_t *draws = PyMem_RawMalloc(DRAWS * sizeof(uint32_t));
    if (order == NULL || pending == NULL || draws == NULL) {
        Py_XDECREF(order);
        PyMem_RawFree(pending);
        PyMem_RawFree(draws);
        if (atbuf.buf != NULL) PyBuffer_Release(&atbuf);
        return PyErr_NoMemory();
    }
    int64_t *out = (int64_t *)PyByteArray_AS_STRING(order);
    Py_BEGIN_ALLOW_THREADS
    const int64_t last = buffer - 1;
    const int64_t cnt = n < last ? n : last, steps = n - cnt;
    for (int64_t i = 0; i < cnt; i++) pending[i] = i;
    Py_ssize_t w = 0;
    if (atbuf.buf == NULL)
        shuffle_steps(&g, pending, last, n, draws, out);
    else
        w = shuffle_steps_at(&g, pending, last, n, draws, at, nat, out);
    for (int64_t i = cnt - 1; i >= 1; i--) { /* random.shuffle of what is left */
        int64_t j = mt_below(&g, (uint32_t)(i + 1), 32 - bit_length((uint64_t)(i + 1)));
        int64_t t = pending[i];
        pending[i] = pending[j];
        pending[j] = t;
    }
    if (atbuf.buf == NULL)
        memcpy(out + steps, pending, (size_t)cnt * sizeof(int64_t));
    else
        for (; w < nat; w++) out[w] = pending[at[w] - steps];
    Py_END_ALLOW_THREADS
    PyMem_RawFree(pending);
    PyMem_RawFree(draws);
    if (atbuf.buf != NULL) PyBuffer_Release(&atbuf);
    PyObject *newkey = PyBytes_FromStringAndSize((const char *)g.mt, sizeof(g.mt));
    if (newkey == NULL) {
        Py_DECREF(order);
        return NULL;
    }
    return Py_BuildValue("(NNn)", order, newkey, g.pos);
}

static PyMethodDef methods[] = {
    {"layout_run", layout_run, METH_VARARGS,
     "layout_run(fd, offsets, keys, key_base, rows, fields, dot_fields, crcs, first, stop, max_bytes) -> "
     "(samples, next, ok): one batch of samples of a local tar shard read by its member layout."},
    {"tfrecord_run", tfrecord_run, METH_VARARGS,
     "tfrecord_run(fd, offsets, sizes, keys, stem, first, stop, max_bytes) -> (samples, next, ok): one "
     "batch of records of a plain local TFRecord shard of common Examples, both CRCs checked."},
    {"crc32c", crc32c_py, METH_VARARGS,
     "crc32c(data, value=0, level=crc32c_hardware) -> int: the CRC32C of data continuing value (as the "
     "crc32c package's), by a method of at most that level (0: a table, 1: crc32, 2: VPCLMULQDQ)."},
    {"tar_fill", tar_fill, METH_VARARGS,
     "tar_fill(buffer, fill, paths, names, sizes, counts, first, member, stop, mtime, attempts) -> (fill, "
     "next, next_member, status, results): whole samples of local files written into buffer as tar members "
     "(GIL released), each sample's CRC32C; see fastload/formats/tar/writer.py."},
    {"buffer_shuffle", buffer_shuffle_py, METH_VARARGS,
     "buffer_shuffle(n, buffer, key, pos[, at]) -> (order, key, pos): the bounded sample shuffle's "
     "permutation (fastload.core.shuffle) from a Mersenne Twister state (624 native uint32 words and a "
     "position) as random.Random draws, and the state it leaves; with at (native int64 positions, "
     "ascending) only the permutation's values there."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fastload._native",
                                    "fastload's optional C readers: local tar shards with a member layout, "
                                    "plain TFRecord shards.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    str_key = PyUnicode_InternFromString("__key__");
    str_index = PyUnicode_InternFromString("__index__");
    if (str_key == NULL || str_index == NULL) return NULL;
    crc_init();
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "crc32c_hardware", crc_level) < 0)
        Py_CLEAR(m);
    return m;
}
