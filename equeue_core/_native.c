/* equeue_core._native: the per-record loops of equeue_core/record.py and the consumer's
 * decode_batch (equeue_core/client/message.py), in C.
 *
 * Why: at batch rates the broker's per-message cost is these Python loops (stamp a batch and crc
 * it, scan it, build its index entries, verify what a read serves) and the consumer's is decoding
 * a pull answer. docs/format.md is the reference for the bytes; record.py keeps the pure-Python
 * versions, which stay the specification: every function here returns bit-identical results and
 * raises the same typed errors with the same messages (tests/test_record_impls.py runs both).
 *
 * How the guarantee is kept simple: each function handles the ordinary domain (a contiguous byte
 * buffer, ints in range, records laid out one after another) and hands every other call to the
 * Python version it replaces (bound by record.py through _bind), unchanged, before touching any
 * byte. So an odd argument behaves exactly as it does in Python, by construction.
 *
 * crc32c (Castagnoli, the same function as the `crc32c` package): the SSE4.2 `crc32` instruction
 * when the CPU has it (checked at run time), else slicing-by-8 tables.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define EQ_HAVE_SSE42_PATH 1
#include <nmmintrin.h>
#endif

#define HEADER_SIZE 76
#define MAGIC 0xE7
#define VERSION 1
#define CRC_FROM 12
#define INDEX_ENTRY_SIZE 20
/* Past this many bytes of crc work, let other threads run (the buffer stays exported, so it
 * cannot be resized or freed meanwhile). */
#define RELEASE_GIL_BYTES (64 * 1024)

/* ------------------------------------------------------------------ little-endian fields */

static inline uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | ((uint64_t)ld32(p + 4) << 32); }
static inline void st32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline void st64(uint8_t *p, uint64_t v) { st32(p, (uint32_t)v); st32(p + 4, (uint32_t)(v >> 32)); }

/* ------------------------------------------------------------------ crc32c */

static uint32_t crc_table[8][256];

static void crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32c_table(uint32_t crc, const uint8_t *p, size_t n)
{
    uint32_t c = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo = ld32(p) ^ c, hi = ld32(p + 4);
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF]
            ^ crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF]
            ^ crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return ~c;
}

#ifdef EQ_HAVE_SSE42_PATH
/* The crc32 instruction has a latency of 3 cycles and a throughput of 1: three independent lanes
 * of LANE bytes run at once, then the lane crcs are combined. The register after n zero bytes is a
 * linear function of the register before (a multiplication by x^8n mod P), tabulated per byte
 * for n = LANE and LONG_LANE. Reaching B's end from A's: R(a, B) = shift(a) ^ R(0, B). */
#define LANE 128         /* records of a few hundred bytes and up */
#define LONG_LANE 4096   /* whole chunks: the combine step costs less per byte */
static uint32_t shift_lane[4][256], shift_long_lane[4][256];

static void shift_table_init(uint32_t table[4][256], int lane)
{
    /* linear: shift each of the 32 register bits through `lane` zero bytes, then XOR them per entry */
    uint32_t basis[32];
    for (int bit = 0; bit < 32; bit++) {
        uint32_t r = (uint32_t)1 << bit;
        for (int z = 0; z < lane; z++)
            r = crc_table[0][r & 0xFF] ^ (r >> 8);
        basis[bit] = r;
    }
    for (int k = 0; k < 4; k++) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t r = 0;
            for (int bit = 0; bit < 8; bit++)
                if (i & (1u << bit))
                    r ^= basis[8 * k + bit];
            table[k][i] = r;
        }
    }
}

static inline uint32_t shift_by(uint32_t table[4][256], uint32_t x)
{
    return table[0][x & 0xFF] ^ table[1][(x >> 8) & 0xFF] ^ table[2][(x >> 16) & 0xFF] ^ table[3][x >> 24];
}

/* Three lanes of `lane` bytes from p, starting from register c; returns the register after them. */
__attribute__((target("sse4.2")))
static inline uint64_t crc_three_lanes(uint64_t c, const uint8_t *p, size_t lane, uint32_t table[4][256])
{
    uint64_t a = c, b = 0, d = 0;
    for (size_t i = 0; i < lane; i += 8) {
        uint64_t wa, wb, wd;
        memcpy(&wa, p + i, 8);
        memcpy(&wb, p + lane + i, 8);
        memcpy(&wd, p + 2 * lane + i, 8);
        a = _mm_crc32_u64(a, wa);
        b = _mm_crc32_u64(b, wb);
        d = _mm_crc32_u64(d, wd);
    }
    return shift_by(table, shift_by(table, (uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)d;
}

__attribute__((target("sse4.2")))
static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c = (uint32_t)~crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    for (; n >= 3 * LONG_LANE; p += 3 * LONG_LANE, n -= 3 * LONG_LANE)
        c = crc_three_lanes(c, p, LONG_LANE, shift_long_lane);
    for (; n >= 3 * LANE; p += 3 * LANE, n -= 3 * LANE)
        c = crc_three_lanes(c, p, LANE, shift_lane);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

static uint32_t (*crc32c_fn)(uint32_t, const uint8_t *, size_t) = crc32c_table;
static const char *crc32c_name = "table";

static void crc_select(void)
{
    crc_table_init();
#ifdef EQ_HAVE_SSE42_PATH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        shift_table_init(shift_lane, LANE);
        shift_table_init(shift_long_lane, LONG_LANE);
        crc32c_fn = crc32c_sse42;
        crc32c_name = "sse4.2";
    }
#endif
}

/* ------------------------------------------------------------------ bound Python objects */

/* The Python versions (fallbacks) and the error classes, set by record.py / message.py. */
enum { FB_SCAN, FB_STAMP_BATCH, FB_INDEX_ENTRIES, FB_INDEX_RUNS, FB_VERIFY, FB_DAMAGE, FB_CRC_SPANS, FB_DECODE_BATCH, FB_ENCODE_RECORD,
       FB_TAG_HASH, FB_PROPS_ENCODE, FB_MSG_IDS, FB_GATHER_RUNS, FB_COUNT };
static const char *const fb_names[FB_COUNT] = {
    "scan", "stamp_batch", "index_entries", "index_runs", "verify", "damage", "crc_spans", "decode_batch", "encode_record",
    "tag_hash", "props_encode", "msg_ids", "gather_runs",
};
static PyObject *fallback[FB_COUNT];
static PyObject *CorruptRecordError, *InvalidMessageError, *MessageTooLargeError;
static PyObject *u32_array; /* a callable: u32_array(bytes) -> array('I') (record.py binds it) */

/* decode_batch's pieces (message.py binds them). */
static PyTypeObject *received_cls;
static PyObject *props_decode;
#define RM_FIELDS 12
static const char *const rm_names[RM_FIELDS] = {
    "topic", "queue_id", "queue_offset", "msg_id", "tag", "keys", "properties", "body", "born_ts",
    "store_ts", "reconsume_times", "source_topic",
};
static Py_ssize_t rm_offsets[RM_FIELDS]; /* slot offsets, or rm_offsets[0] == 0: call the class */
static PyObject *str_retry_topic, *str_key_sep, *empty_tuple;

static PyObject *call_fallback(int which, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (fallback[which] == NULL) {
        PyErr_Format(PyExc_RuntimeError, "equeue_core._native.%s: record.py did not bind its Python version",
                     fb_names[which]);
        return NULL;
    }
    return PyObject_Vectorcall(fallback[which], args, (size_t)nargs, kwnames);
}

/* Raise cls(message) (the EQueueError subclasses take the message as their first argument). */
static void raise_msg(PyObject *cls, PyObject *msg)
{
    if (msg == NULL)
        return;
    PyObject *exc = PyObject_CallOneArg(cls, msg);
    Py_DECREF(msg);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

/* ------------------------------------------------------------------ argument helpers */

/* Fill out[0..n) from fast-call arguments (all positional-or-keyword); NULL where not given. */
static int parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      const char *const *names, Py_ssize_t n, Py_ssize_t required, PyObject **out)
{
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = NULL;
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %zd arguments (%zd given)", fname, n, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    if (kwnames != NULL) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; k++) {
            PyObject *key = PyTuple_GET_ITEM(kwnames, k);
            Py_ssize_t j = 0;
            while (j < n && PyUnicode_CompareWithASCIIString(key, names[j]) != 0)
                j++;
            if (j == n) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname, key);
                return -1;
            }
            if (out[j] != NULL) {
                PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname, names[j]);
                return -1;
            }
            out[j] = args[nargs + k];
        }
    }
    for (Py_ssize_t i = 0; i < required; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[i]);
            return -1;
        }
    }
    return 0;
}

/* A contiguous view of unsigned bytes, or 0 (and no error set) if obj is anything else. */
static int byte_view(PyObject *obj, Py_buffer *view, int writable)
{
    /* PyBUF_ND with PyBUF_FORMAT: a memoryview refuses a format request without a shape
     * ("cannot cast to unsigned bytes if the format flag is present"), which sent every
     * memoryview (a pull answer's body, a small frame's body) to the Python version. */
    if (PyObject_GetBuffer(obj, view, PyBUF_ND | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (view->ndim != 1 || view->itemsize != 1 || (view->format != NULL && strcmp(view->format, "B") != 0)) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* An int argument as a Py_ssize_t; 0 (no error set) if it is not an int or out of range. */
static int as_ssize(PyObject *obj, Py_ssize_t *out)
{
    if (!PyLong_CheckExact(obj)) /* a bool or an int subclass prints differently: Python decides */
        return 0;
    Py_ssize_t v = PyLong_AsSsize_t(obj);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return 1;
}

static int as_u64(PyObject *obj, uint64_t *out)
{
    if (!PyLong_CheckExact(obj)) /* a bool or an int subclass prints differently: Python decides */
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return 1;
}

static int as_i64(PyObject *obj, int64_t *out)
{
    if (!PyLong_CheckExact(obj)) /* a bool or an int subclass prints differently: Python decides */
        return 0;
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return 1;
}

/* The items of an exact list or tuple (borrowed, valid while no Python code runs), or 0 (no error
 * set) if seq is anything else: then the caller hands the call to Python. */
static int ints_from_sequence(PyObject *seq, Py_ssize_t *n_out, PyObject *const **items_out)
{
    if (PyList_CheckExact(seq)) {
        *n_out = PyList_GET_SIZE(seq);
        *items_out = (PyObject *const *)((PyListObject *)seq)->ob_item;
        return 1;
    }
    if (PyTuple_CheckExact(seq)) {
        *n_out = PyTuple_GET_SIZE(seq);
        *items_out = (PyObject *const *)((PyTupleObject *)seq)->ob_item;
        return 1;
    }
    return 0;
}

/* Integers of a list/tuple, or of a buffer of 4- or 8-byte ints (numpy int32/int64/uint64 arrays,
 * array('q')...), as int64. Returns 1 and a malloc'd array, 0 if the object is of another kind or an
 * item is out of int64 range (no error set), -1 on a memory error. */
static int int64_items(PyObject *obj, Py_ssize_t *n_out, int64_t **out)
{
    Py_ssize_t n;
    PyObject *const *items;
    if (ints_from_sequence(obj, &n, &items)) {
        int64_t *a = PyMem_Malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
        if (a == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t v;
            if (!as_i64(items[i], &v)) {
                PyMem_Free(a);
                return 0;
            }
            a[i] = v;
        }
        *n_out = n;
        *out = a;
        return 1;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = view.format ? view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    int is_signed;
    if (view.ndim > 1 || f[0] == '\0' || f[1] != '\0' || (view.itemsize != 4 && view.itemsize != 8)
        || !strchr("iIlLqQnN", f[0])) {
        PyBuffer_Release(&view);
        return 0;
    }
    is_signed = strchr("ilqn", f[0]) != NULL;
    n = view.len / view.itemsize;
    int64_t *a = PyMem_Malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (a == NULL) {
        PyBuffer_Release(&view);
        PyErr_NoMemory();
        return -1;
    }
    const char *p = view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (view.itemsize == 4) {
            if (is_signed) {
                int32_t v;
                memcpy(&v, p + 4 * i, 4);
                a[i] = v;
            } else {
                uint32_t v;
                memcpy(&v, p + 4 * i, 4);
                a[i] = v;
            }
        } else if (is_signed) {
            memcpy(&a[i], p + 8 * i, 8);
        } else {
            uint64_t v;
            memcpy(&v, p + 8 * i, 8);
            if (v > (uint64_t)INT64_MAX) {
                PyMem_Free(a);
                PyBuffer_Release(&view);
                return 0;
            }
            a[i] = (int64_t)v;
        }
    }
    PyBuffer_Release(&view);
    *n_out = n;
    *out = a;
    return 1;
}

/* ------------------------------------------------------------------ crc32c functions */

static PyObject *n_crc32c_with(uint32_t (*fn)(uint32_t, const uint8_t *, size_t), PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t c;
    if (view.len > RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        c = fn(0, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        c = fn(0, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *n_crc32c(PyObject *self, PyObject *arg) { return n_crc32c_with(crc32c_fn, arg); }
static PyObject *n_crc32c_table(PyObject *self, PyObject *arg) { return n_crc32c_with(crc32c_table, arg); }

static PyObject *n_crc32c_sse42(PyObject *self, PyObject *arg)
{
#ifdef EQ_HAVE_SSE42_PATH
    if (crc32c_fn == crc32c_sse42)
        return n_crc32c_with(crc32c_sse42, arg);
#endif
    PyErr_SetString(PyExc_RuntimeError, "this CPU (or build) has no SSE4.2 crc32 instruction");
    return NULL;
}

static PyObject *n_crc32c_implementation(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(crc32c_name);
}

/* ------------------------------------------------------------------ scan */

static const char *const scan_kw[] = {"buf", "start", "end", "topic", "max_body"};

static PyObject *n_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[5];
    if (parse_args("scan", args, nargs, kwnames, scan_kw, 5, 1, a) < 0)
        return NULL;
    Py_buffer view;
    if (!byte_view(a[0], &view, 0))
        return call_fallback(FB_SCAN, args, nargs, kwnames);
    const uint8_t *b = view.buf;
    Py_ssize_t start = 0, end = view.len;
    long long max_body = 0;
    int has_max = 0;
    const char *topic = NULL;
    Py_ssize_t topic_len = 0;
    if ((a[1] != NULL && !as_ssize(a[1], &start)) || (a[2] != NULL && a[2] != Py_None && !as_ssize(a[2], &end))
        || start < 0 || end > view.len)
        goto fallback;
    if (a[3] != NULL && a[3] != Py_None) {
        if (!PyBytes_CheckExact(a[3]))
            goto fallback;
        topic = PyBytes_AS_STRING(a[3]);
        topic_len = PyBytes_GET_SIZE(a[3]);
    }
    if (a[4] != NULL && a[4] != Py_None) {
        int64_t v;
        if (!as_i64(a[4], &v))
            goto fallback;
        max_body = v;
        has_max = 1;
    }
    PyObject *starts = PyList_New(0);
    if (starts == NULL)
        goto error;
    Py_ssize_t pos = start;
    while (pos < end) {
        if (end - pos < HEADER_SIZE) {
            raise_msg(CorruptRecordError, PyUnicode_FromFormat("truncated record header at %zd", pos));
            goto error_list;
        }
        const uint8_t *r = b + pos;
        uint32_t size = ld32(r);
        if (r[4] != MAGIC || r[5] != VERSION) {
            raise_msg(CorruptRecordError, PyUnicode_FromFormat("bad magic/version at %zd", pos));
            goto error_list;
        }
        if (size < HEADER_SIZE || pos + (Py_ssize_t)size > end) {
            raise_msg(CorruptRecordError, PyUnicode_FromFormat("bad record size %lu at %zd", (unsigned long)size, pos));
            goto error_list;
        }
        uint32_t tlen = ld16(r + 60), body_len = ld32(r + 72);
        uint64_t total = (uint64_t)HEADER_SIZE + tlen + ld16(r + 62) + ld32(r + 64) + ld32(r + 68) + body_len;
        if (total != size) {
            raise_msg(CorruptRecordError, PyUnicode_FromFormat("record lengths do not add up at %zd", pos));
            goto error_list;
        }
        if (has_max && (long long)body_len > max_body) {
            PyObject *msg = PyUnicode_FromFormat("message body of %lu bytes is over the maximum of %S",
                                                 (unsigned long)body_len, a[4]);
            PyObject *kw = msg ? Py_BuildValue("{s:k,s:O}", "size", (unsigned long)body_len, "max", a[4]) : NULL;
            PyObject *margs = kw ? PyTuple_Pack(1, msg) : NULL;
            PyObject *exc = margs ? PyObject_Call(MessageTooLargeError, margs, kw) : NULL;
            if (exc != NULL) {
                PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
                Py_DECREF(exc);
            }
            Py_XDECREF(margs);
            Py_XDECREF(kw);
            Py_XDECREF(msg);
            goto error_list;
        }
        if (topic != NULL && (tlen != topic_len || memcmp(r + HEADER_SIZE, topic, tlen) != 0)) {
            raise_msg(InvalidMessageError,
                      PyUnicode_FromString("a record in the batch names another topic than the request"));
            goto error_list;
        }
        PyObject *at = PyLong_FromSsize_t(pos);
        if (at == NULL || PyList_Append(starts, at) < 0) {
            Py_XDECREF(at);
            goto error_list;
        }
        Py_DECREF(at);
        pos += size;
    }
    PyBuffer_Release(&view);
    return starts;
error_list:
    Py_DECREF(starts);
error:
    PyBuffer_Release(&view);
    return NULL;
fallback:
    PyBuffer_Release(&view);
    return call_fallback(FB_SCAN, args, nargs, kwnames);
}

/* ------------------------------------------------------------------ stamp_batch */

static const char *const stamp_kw[] = {"buf", "starts", "positions", "first_queue_offset", "queue_id", "store_ts"};

static PyObject *n_stamp_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[6];
    if (parse_args("stamp_batch", args, nargs, kwnames, stamp_kw, 6, 6, a) < 0)
        return NULL;
    Py_buffer view;
    if (!byte_view(a[0], &view, 1))
        return call_fallback(FB_STAMP_BATCH, args, nargs, kwnames);
    uint8_t *b = view.buf;
    Py_ssize_t n, m;
    PyObject *const *st, *const *ps;
    uint64_t first, queue_id;
    int64_t store_ts;
    Py_ssize_t *starts = NULL;
    uint64_t *positions = NULL;
    if (!ints_from_sequence(a[1], &n, &st) || !ints_from_sequence(a[2], &m, &ps) || n != m
        || !as_u64(a[3], &first) || !as_u64(a[4], &queue_id) || queue_id > 0xFFFFFFFFu
        || !as_i64(a[5], &store_ts) || first > UINT64_MAX - (uint64_t)n)
        goto fallback;
    starts = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n ? n : 1));
    positions = PyMem_Malloc(sizeof(uint64_t) * (size_t)(n ? n : 1));
    if (starts == NULL || positions == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    /* Every record must lie inside buf, after the one before it (as scan found them): then no
     * stamp touches another record's size field and the crc covers exactly what Python's would. */
    Py_ssize_t prev_end = 0, total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t s;
        if (!as_ssize(st[i], &s) || !as_u64(ps[i], &positions[i]) || s < prev_end || s > view.len - HEADER_SIZE)
            goto fallback;
        uint32_t size = ld32(b + s);
        if (size < HEADER_SIZE || (Py_ssize_t)size > view.len - s)
            goto fallback;
        starts[i] = s;
        prev_end = s + size;
        total += size;
    }
    int release = total > RELEASE_GIL_BYTES;
    PyThreadState *ts = release ? PyEval_SaveThread() : NULL;
    uint64_t qoff = first;
    for (Py_ssize_t i = 0; i < n; i++, qoff++) {
        uint8_t *r = b + starts[i];
        st64(r + 12, positions[i]);
        st64(r + 20, qoff);
        st32(r + 28, (uint32_t)queue_id);
        st64(r + 44, (uint64_t)store_ts);
        st32(r + 8, crc32c_fn(0, r + CRC_FROM, ld32(r) - CRC_FROM));
    }
    if (release)
        PyEval_RestoreThread(ts);
    PyMem_Free(starts);
    PyMem_Free(positions);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
error:
    PyMem_Free(starts);
    PyMem_Free(positions);
    PyBuffer_Release(&view);
    return NULL;
fallback:
    PyMem_Free(starts);
    PyMem_Free(positions);
    PyBuffer_Release(&view);
    return call_fallback(FB_STAMP_BATCH, args, nargs, kwnames);
}

/* ------------------------------------------------------------------ index_entries */

static const char *const index_kw[] = {"batch", "starts", "positions"};

static PyObject *n_index_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[3];
    if (parse_args("index_entries", args, nargs, kwnames, index_kw, 3, 3, a) < 0)
        return NULL;
    Py_buffer view;
    if (!byte_view(a[0], &view, 0))
        return call_fallback(FB_INDEX_ENTRIES, args, nargs, kwnames);
    Py_ssize_t n, m;
    PyObject *const *st, *const *ps;
    if (!ints_from_sequence(a[1], &n, &st) || !ints_from_sequence(a[2], &m, &ps) || n != m
        || n > PY_SSIZE_T_MAX / INDEX_ENTRY_SIZE)
        goto fallback;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * INDEX_ENTRY_SIZE);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    uint8_t *o = (uint8_t *)PyByteArray_AS_STRING(out);
    const uint8_t *b = view.buf;
    for (Py_ssize_t i = 0; i < n; i++, o += INDEX_ENTRY_SIZE) {
        Py_ssize_t s;
        uint64_t p;
        if (!as_ssize(st[i], &s) || !as_u64(ps[i], &p) || s < 0 || s > view.len - 60) {
            Py_DECREF(out);
            goto fallback;
        }
        st64(o, p);
        st32(o + 8, ld32(b + s));
        st64(o + 12, ld64(b + s + 52));
    }
    PyBuffer_Release(&view);
    return out;
fallback:
    PyBuffer_Release(&view);
    return call_fallback(FB_INDEX_ENTRIES, args, nargs, kwnames);
}

/* ------------------------------------------------------------------ index_runs */

static const char *const runs_kw[] = {"entries", "max_count", "max_bytes", "tag_hashes"};

/* Append (start, end) to runs; -1 on error. */
static int add_run(PyObject *runs, uint64_t start, uint64_t end)
{
    PyObject *run = Py_BuildValue("(KK)", (unsigned long long)start, (unsigned long long)end);
    if (run == NULL)
        return -1;
    int r = PyList_Append(runs, run);
    Py_DECREF(run);
    return r;
}

static PyObject *n_index_runs(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[4];
    if (parse_args("index_runs", args, nargs, kwnames, runs_kw, 4, 3, a) < 0)
        return NULL;
    PyObject *tags = (a[3] == NULL || a[3] == Py_None) ? NULL : a[3];
    Py_ssize_t max_count, max_bytes;
    if (!as_ssize(a[1], &max_count) || !as_ssize(a[2], &max_bytes) || (tags != NULL && !PyAnySet_Check(tags)))
        return call_fallback(FB_INDEX_RUNS, args, nargs, kwnames);
    Py_buffer view;
    if (!byte_view(a[0], &view, 0))
        return call_fallback(FB_INDEX_RUNS, args, nargs, kwnames);
    if (view.len % INDEX_ENTRY_SIZE) {
        PyBuffer_Release(&view);
        return call_fallback(FB_INDEX_RUNS, args, nargs, kwnames);
    }
    PyObject *runs = PyList_New(0);
    if (runs == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *e = view.buf, *end = e + view.len;
    /* total counts at most max_count sizes of u32 past a total <= max_bytes: no u64 overflow, so
     * the comparisons come out as Python's unbounded ints do. */
    int have_run = 0;
    uint64_t run_start = 0, run_end = 0;
    Py_ssize_t count = 0, scanned = 0;
    unsigned long long total = 0;
    for (; e < end; e += INDEX_ENTRY_SIZE) {
        uint64_t pos = ld64(e);
        uint32_t size = ld32(e + 8);
        if (tags != NULL) {
            PyObject *th = PyLong_FromUnsignedLongLong(ld64(e + 12));
            if (th == NULL)
                goto error;
            int in = PySet_Contains(tags, th);
            Py_DECREF(th);
            if (in < 0)
                goto error;
            if (!in) {
                scanned++;
                continue;
            }
        }
        if (count && (max_bytes < 0 || total + size > (unsigned long long)max_bytes))
            break;
        scanned++;
        count++;
        total += size;
        if (have_run && pos == run_end) {
            run_end += size;
        } else {
            if (have_run && add_run(runs, run_start, run_end) < 0)
                goto error;
            run_start = pos;
            run_end = pos + size;
            have_run = 1;
        }
        if (count >= max_count)
            break;
    }
    if (have_run && add_run(runs, run_start, run_end) < 0)
        goto error;
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nnn)", runs, count, scanned);
error:
    Py_DECREF(runs);
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------ gather_runs */

static const char *const gather_kw[] = {"ring", "runs", "page", "held"};

/* Every slot the spans touch holds its page (record.py _spans_held); -1 (no error set) if a slot's
 * value is not an exact int: the Python version compares it then. */
static int spans_held(const int64_t *span, Py_ssize_t n, Py_ssize_t page, PyObject *held)
{
    Py_ssize_t slots = PyList_GET_SIZE(held);
    for (Py_ssize_t i = 0; i < n; i++) {
        for (int64_t k = span[2 * i] / page; k <= (span[2 * i + 1] - 1) / page; k++) {
            PyObject *v = PyList_GET_ITEM(held, (Py_ssize_t)(k % slots));
            if (!PyLong_CheckExact(v))
                return -1;
            int overflow;
            long long have = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow || have != k)
                return 0;
        }
    }
    return 1;
}

static PyObject *n_gather_runs(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[4];
    if (parse_args("gather_runs", args, nargs, kwnames, gather_kw, 4, 4, a) < 0)
        return NULL;
    Py_ssize_t page;
    if (!as_ssize(a[2], &page) || page <= 0 || !PyList_CheckExact(a[1]) || !PyList_CheckExact(a[3]))
        return call_fallback(FB_GATHER_RUNS, args, nargs, kwnames);
    Py_buffer view;
    if (!byte_view(a[0], &view, 0))
        return call_fallback(FB_GATHER_RUNS, args, nargs, kwnames);
    Py_ssize_t size = view.len, slots = PyList_GET_SIZE(a[3]), n = PyList_GET_SIZE(a[1]);
    if (slots == 0 || size / slots != page || size % slots != 0) { /* Python words the ValueError */
        PyBuffer_Release(&view);
        return call_fallback(FB_GATHER_RUNS, args, nargs, kwnames);
    }
    int64_t *span = PyMem_Malloc(sizeof(int64_t) * 2 * (size_t)(n ? n : 1));
    if (span == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    PyObject *out = NULL;
    int fallback_now = 0, none = 0;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n && !fallback_now; i++) {
        PyObject *run = PyList_GET_ITEM(a[1], i);
        Py_ssize_t start, end;
        if (!PyTuple_CheckExact(run) || PyTuple_GET_SIZE(run) != 2 || !as_ssize(PyTuple_GET_ITEM(run, 0), &start)
            || !as_ssize(PyTuple_GET_ITEM(run, 1), &end)) {
            fallback_now = 1; /* anything but (int, int): Python's unpacking and comparisons decide */
            break;
        }
        if (start < 0 || end <= start || end - start > size - page)
            none = 1; /* (every span is still parsed: a malformed later one is Python's error) */
        else
            total += end - start; /* each at most size: no overflow for any list that fits in memory */
        span[2 * i] = start;
        span[2 * i + 1] = end;
    }
    if (fallback_now)
        goto fallback;
    if (none)
        goto none;
    int held = spans_held(span, n, page, a[3]);
    if (held < 0)
        goto fallback;
    if (!held)
        goto none;
    if ((out = PyBytes_FromStringAndSize(NULL, total)) == NULL)
        goto done;
    char *dst = PyBytes_AS_STRING(out);
    const char *ring = view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len = (Py_ssize_t)(span[2 * i + 1] - span[2 * i]), at = (Py_ssize_t)(span[2 * i] % size);
        if (at + len <= size) {
            memcpy(dst, ring + at, (size_t)len);
        } else {
            memcpy(dst, ring + at, (size_t)(size - at));
            memcpy(dst + (size - at), ring, (size_t)(len - (size - at)));
        }
        dst += len;
    }
    /* Checked again after the copy, as the Python version does: a writer that lapped the ring
     * meanwhile leaves a slot's page changed (nothing here releases the GIL, but the check does
     * not lean on that). */
    if ((held = spans_held(span, n, page, a[3])) != 1) {
        Py_CLEAR(out);
        if (held < 0)
            goto fallback;
        goto none;
    }
    goto done;
none:
    out = Py_NewRef(Py_None);
done:
    PyMem_Free(span);
    PyBuffer_Release(&view);
    return out;
fallback:
    PyMem_Free(span);
    PyBuffer_Release(&view);
    return call_fallback(FB_GATHER_RUNS, args, nargs, kwnames);
}

/* ------------------------------------------------------------------ verify, damage */

static const char *const verify_kw[] = {"buf", "start", "limit"};

static PyObject *n_verify(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[3];
    if (parse_args("verify", args, nargs, kwnames, verify_kw, 3, 1, a) < 0)
        return NULL;
    Py_buffer view;
    if (!byte_view(a[0], &view, 0))
        return call_fallback(FB_VERIFY, args, nargs, kwnames);
    Py_ssize_t start = 0, limit = view.len;
    if ((a[1] != NULL && !as_ssize(a[1], &start)) || (a[2] != NULL && a[2] != Py_None && !as_ssize(a[2], &limit))
        || start < 0 || limit > view.len) {
        PyBuffer_Release(&view);
        return call_fallback(FB_VERIFY, args, nargs, kwnames);
    }
    const uint8_t *r = (const uint8_t *)view.buf + start;
    PyObject *msg = NULL;
    uint32_t size = 0;
    if (limit - start < HEADER_SIZE) {
        msg = PyUnicode_FromFormat("truncated header at %zd", start);
    } else if ((size = ld32(r)) < HEADER_SIZE || (Py_ssize_t)size > limit - start) {
        msg = PyUnicode_FromFormat("bad size %lu at %zd", (unsigned long)size, start);
    } else if (r[4] != MAGIC || r[5] != VERSION) {
        msg = PyUnicode_FromFormat("bad magic/version at %zd", start);
    } else if ((uint64_t)HEADER_SIZE + ld16(r + 60) + ld16(r + 62) + ld32(r + 64) + ld32(r + 68) + ld32(r + 72)
               != size) {
        msg = PyUnicode_FromFormat("record lengths do not add up at %zd", start);
    } else {
        uint32_t c;
        if (size > RELEASE_GIL_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            c = crc32c_fn(0, r + CRC_FROM, size - CRC_FROM);
            Py_END_ALLOW_THREADS
        } else {
            c = crc32c_fn(0, r + CRC_FROM, size - CRC_FROM);
        }
        if (c != ld32(r + 8))
            msg = PyUnicode_FromFormat("crc mismatch at %zd", start);
    }
    PyBuffer_Release(&view);
    if (msg != NULL || PyErr_Occurred()) {
        raise_msg(CorruptRecordError, msg);
        return NULL;
    }
    return PyLong_FromUnsignedLong(size);
}

static const char *const damage_kw[] = {"buf", "start", "size", "position"};

static PyObject *n_damage(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[4];
    if (parse_args("damage", args, nargs, kwnames, damage_kw, 4, 4, a) < 0)
        return NULL;
    Py_buffer view;
    if (!byte_view(a[0], &view, 0))
        return call_fallback(FB_DAMAGE, args, nargs, kwnames);
    Py_ssize_t start, size;
    uint64_t position;
    /* The common case (an intact record, one unpack and one crc); anything else asks Python why. */
    if (as_ssize(a[1], &start) && as_ssize(a[2], &size) && as_u64(a[3], &position) && start >= 0
        && size >= HEADER_SIZE && start <= view.len && view.len - start >= size) {
        const uint8_t *r = (const uint8_t *)view.buf + start;
        if (ld32(r) == (uint64_t)size && r[4] == MAGIC && r[5] == VERSION && ld64(r + 12) == position) {
            uint32_t c;
            if (size > RELEASE_GIL_BYTES) {
                Py_BEGIN_ALLOW_THREADS
                c = crc32c_fn(0, r + CRC_FROM, (size_t)size - CRC_FROM);
                Py_END_ALLOW_THREADS
            } else {
                c = crc32c_fn(0, r + CRC_FROM, (size_t)size - CRC_FROM);
            }
            if (c == ld32(r + 8)) {
                PyBuffer_Release(&view);
                Py_RETURN_NONE;
            }
        }
    }
    PyBuffer_Release(&view);
    return call_fallback(FB_DAMAGE, args, nargs, kwnames);
}

/* ------------------------------------------------------------------ crc_spans */

static const char *const spans_kw[] = {"data", "starts", "ends"};

static PyObject *n_crc_spans(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[3];
    if (parse_args("crc_spans", args, nargs, kwnames, spans_kw, 3, 3, a) < 0)
        return NULL;
    if (u32_array == NULL)
        return call_fallback(FB_CRC_SPANS, args, nargs, kwnames);
    Py_buffer view;
    if (PyObject_GetBuffer(a[0], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return call_fallback(FB_CRC_SPANS, args, nargs, kwnames);
    }
    int64_t *starts = NULL, *ends = NULL;
    Py_ssize_t n = 0, m = 0;
    int ok = int64_items(a[1], &n, &starts);
    if (ok == 1)
        ok = int64_items(a[2], &m, &ends);
    if (ok < 0)
        goto error;
    if (ok == 0 || n != m)
        goto fallback;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (starts[i] < 0 || starts[i] > ends[i] || ends[i] > view.len)
            goto fallback; /* Python says which span, in its words */
        total += ends[i] - starts[i];
    }
    PyObject *raw = PyBytes_FromStringAndSize(NULL, 4 * n);
    if (raw == NULL)
        goto error;
    uint32_t *out = (uint32_t *)PyBytes_AS_STRING(raw);
    const uint8_t *b = view.buf;
    PyThreadState *ts = total > RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = crc32c_fn(0, b + starts[i], (size_t)(ends[i] - starts[i]));
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    PyMem_Free(starts);
    PyMem_Free(ends);
    PyBuffer_Release(&view);
    PyObject *arr = PyObject_CallOneArg(u32_array, raw);
    Py_DECREF(raw);
    return arr;
error:
    PyMem_Free(starts);
    PyMem_Free(ends);
    PyBuffer_Release(&view);
    return NULL;
fallback:
    PyMem_Free(starts);
    PyMem_Free(ends);
    PyBuffer_Release(&view);
    return call_fallback(FB_CRC_SPANS, args, nargs, kwnames);
}

/* ------------------------------------------------------------------ decode_batch */

/* A ReceivedMessage from its 12 field values (references stolen, every one non-NULL). */
static PyObject *new_received(PyObject **v)
{
    PyObject *o;
    if (rm_offsets[0] != 0) {
        o = received_cls->tp_alloc(received_cls, 0);
        if (o != NULL) {
            for (int i = 0; i < RM_FIELDS; i++)
                *(PyObject **)((char *)o + rm_offsets[i]) = v[i];
            return o;
        }
    } else {
        o = PyObject_Vectorcall((PyObject *)received_cls, v, RM_FIELDS, NULL);
    }
    for (int i = 0; i < RM_FIELDS; i++)
        Py_DECREF(v[i]);
    return o;
}

/* The msg id: id_prefix (ASCII) and the position as 16 upper-case hex digits. */
static PyObject *msg_id(PyObject *prefix, uint64_t position)
{
    static const char hex[] = "0123456789ABCDEF";
    Py_ssize_t plen = PyUnicode_GET_LENGTH(prefix);
    PyObject *s = PyUnicode_New(plen + 16, 127);
    if (s == NULL)
        return NULL;
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(s);
    memcpy(d, PyUnicode_1BYTE_DATA(prefix), (size_t)plen);
    for (int i = 15; i >= 0; i--, position >>= 4)
        d[plen + i] = (Py_UCS1)hex[position & 0xF];
    return s;
}

static const char *const decode_kw[] = {"buf", "id_prefix"};

static PyObject *n_decode_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    if (parse_args("decode_batch", args, nargs, kwnames, decode_kw, 2, 2, a) < 0)
        return NULL;
    if (received_cls == NULL || !PyUnicode_CheckExact(a[1]) || !PyUnicode_IS_ASCII(a[1]))
        return call_fallback(FB_DECODE_BATCH, args, nargs, kwnames);
    Py_buffer view;
    if (!byte_view(a[0], &view, 0))
        return call_fallback(FB_DECODE_BATCH, args, nargs, kwnames);
    const uint8_t *b = view.buf;
    Py_ssize_t end = view.len, pos = 0;
    PyObject *out = PyList_New(0);
    /* Consecutive records nearly always share a topic: decode it once. */
    PyObject *topic = NULL;
    const uint8_t *topic_at = NULL;
    uint32_t topic_len = 0;
    PyObject *tag = NULL; /* and often a tag */
    const uint8_t *tag_at = NULL;
    uint32_t tag_len = 0;
    if (out == NULL)
        goto error;
    while (pos < end) {
        if (end - pos < HEADER_SIZE) {
            raise_msg(CorruptRecordError, PyUnicode_FromFormat("truncated record header at %zd", pos));
            goto error;
        }
        const uint8_t *r = b + pos;
        uint32_t size = ld32(r), tlen = ld16(r + 60), taglen = ld16(r + 62), klen = ld32(r + 64);
        uint32_t plen = ld32(r + 68), blen = ld32(r + 72);
        if ((uint64_t)HEADER_SIZE + tlen + taglen + klen + plen + blen != size || (Py_ssize_t)size > end - pos) {
            raise_msg(CorruptRecordError, PyUnicode_FromFormat("bad record size %lu at %zd", (unsigned long)size, pos));
            goto error;
        }
        const uint8_t *p = r + HEADER_SIZE;
        if (topic == NULL || tlen != topic_len || memcmp(p, topic_at, tlen) != 0) {
            PyObject *t = PyUnicode_DecodeUTF8((const char *)p, tlen, NULL);
            if (t == NULL)
                goto error;
            Py_XSETREF(topic, t);
            topic_at = p;
            topic_len = tlen;
        }
        p += tlen;
        PyObject *v[RM_FIELDS] = {0};
        if (taglen) {
            if (tag == NULL || taglen != tag_len || memcmp(p, tag_at, taglen) != 0) {
                PyObject *t = PyUnicode_DecodeUTF8((const char *)p, taglen, NULL);
                if (t == NULL)
                    goto error_fields;
                Py_XSETREF(tag, t);
                tag_at = p;
                tag_len = taglen;
            }
            v[4] = Py_NewRef(tag);
        } else {
            v[4] = Py_NewRef(Py_None);
        }
        if (v[4] == NULL)
            goto error_fields;
        p += taglen;
        if (klen) {
            PyObject *ks = PyUnicode_DecodeUTF8((const char *)p, klen, NULL);
            PyObject *parts = ks ? PyUnicode_Split(ks, str_key_sep, -1) : NULL;
            Py_XDECREF(ks);
            v[5] = parts ? PyList_AsTuple(parts) : NULL;
            Py_XDECREF(parts);
        } else {
            v[5] = Py_NewRef(empty_tuple);
        }
        if (v[5] == NULL)
            goto error_fields;
        p += klen;
        if (plen) {
            PyObject *mv = PyMemoryView_FromMemory((char *)p, plen, PyBUF_READ);
            v[6] = mv ? PyObject_CallOneArg(props_decode, mv) : NULL;
            Py_XDECREF(mv);
        } else {
            v[6] = PyDict_New();
        }
        if (v[6] == NULL)
            goto error_fields;
        p += plen;
        PyObject *shown = topic, *found = NULL;
        if (plen && ((tlen >= 7 && memcmp(topic_at, "%RETRY%", 7) == 0) || (tlen >= 5 && memcmp(topic_at, "%DLQ%", 5) == 0))) {
            /* props.get("RETRY_TOPIC", topic): a retry or dead letter shows its original topic */
            found = PyObject_CallMethod(v[6], "get", "OO", str_retry_topic, topic);
            if (found == NULL)
                goto error_fields;
            shown = found;
        }
        v[0] = found != NULL ? found : Py_NewRef(shown);
        v[1] = PyLong_FromUnsignedLong(ld32(r + 28));
        v[2] = PyLong_FromUnsignedLongLong(ld64(r + 20));
        v[3] = msg_id(a[1], ld64(r + 12));
        v[7] = PyBytes_FromStringAndSize((const char *)p, blen);
        v[8] = PyLong_FromLongLong((int64_t)ld64(r + 36));
        v[9] = PyLong_FromLongLong((int64_t)ld64(r + 44));
        v[10] = PyLong_FromUnsignedLong(ld32(r + 32));
        v[11] = Py_NewRef(topic);
        for (int i = 0; i < RM_FIELDS; i++)
            if (v[i] == NULL)
                goto error_fields;
        PyObject *m = new_received(v);
        if (m == NULL)
            goto error;
        int rc = PyList_Append(out, m);
        Py_DECREF(m);
        if (rc < 0)
            goto error;
        pos += size;
        continue;
    error_fields:
        for (int i = 0; i < RM_FIELDS; i++)
            Py_XDECREF(v[i]);
        goto error;
    }
    Py_XDECREF(topic);
    Py_XDECREF(tag);
    PyBuffer_Release(&view);
    return out;
error:
    Py_XDECREF(topic);
    Py_XDECREF(tag);
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}


/* ------------------------------------------------------------------ encode_record */

#include <time.h>

/* tag -> tag_hash(tag) (blake2b, computed by record.tag_hash): producers use few tags. */
static PyObject *tag_hashes;
#define TAG_HASH_CACHE_MAX 4096

static int tag_hash_of(PyObject *tag, uint64_t *out)
{
    PyObject *h = PyDict_GetItemWithError(tag_hashes, tag);
    if (h == NULL) {
        if (PyErr_Occurred())
            return -1;
        PyObject *const one[1] = {tag};
        h = call_fallback(FB_TAG_HASH, one, 1, NULL);
        if (h == NULL)
            return -1;
        if (PyDict_GET_SIZE(tag_hashes) >= TAG_HASH_CACHE_MAX)
            PyDict_Clear(tag_hashes);
        int rc = PyDict_SetItem(tag_hashes, tag, h);
        Py_DECREF(h);
        if (rc < 0)
            return -1;
    }
    if (!as_u64(h, out)) {
        PyErr_SetString(PyExc_RuntimeError, "tag_hash did not return a u64");
        return -1;
    }
    return 0;
}

static const char *const encode_kw[] = {"topic", "body", "tag", "keys", "properties", "queue_id", "born_ts",
                                        "reconsume"};

static PyObject *n_encode_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[8];
    if (parse_args("encode_record", args, nargs, kwnames, encode_kw, 8, 2, a) < 0)
        return NULL;
    PyObject *topic = a[0], *body = a[1], *tag = a[2], *keys = a[3], *props = a[4];
    uint64_t queue_id = 0, reconsume = 0;
    int64_t born = 0;
    Py_ssize_t topic_len, tag_len = 0, nkeys = 0, keys_len = 0, props_len = 0;
    const char *topic_b, *tag_b = NULL;
    PyObject *const *key_items = NULL;
    PyObject *props_b = NULL, *out = NULL, *keys_t = NULL;
    /* Only the plain cases here: str topic/tag/keys that encode, a dict of properties, bytes or
     * bytearray body, ints in range; Python does (and words the errors of) everything else. */
    if (!PyUnicode_CheckExact(topic) || (tag != NULL && tag != Py_None && !PyUnicode_CheckExact(tag))
        || (props != NULL && props != Py_None && !PyDict_CheckExact(props))
        || (a[5] != NULL && (!as_u64(a[5], &queue_id) || queue_id > 0xFFFFFFFFu))
        || (a[7] != NULL && (!as_u64(a[7], &reconsume) || reconsume > 0xFFFFFFFFu))
        || (a[6] != NULL && a[6] != Py_None && !as_i64(a[6], &born))
        || !(PyBytes_CheckExact(body) || PyByteArray_CheckExact(body)))
        goto fallback;
    if (keys != NULL && !ints_from_sequence(keys, &nkeys, &key_items))
        goto fallback;
    if (nkeys > 0 && PyList_CheckExact(keys)) {
        /* a tuple copy: tag_hash (Python) runs below, and meanwhile the list could change */
        if ((keys_t = PyList_AsTuple(keys)) == NULL)
            return NULL;
        nkeys = PyTuple_GET_SIZE(keys_t);
        key_items = (PyObject *const *)((PyTupleObject *)keys_t)->ob_item;
    }
    if ((topic_b = PyUnicode_AsUTF8AndSize(topic, &topic_len)) == NULL)
        goto fallback_clear;
    if (tag != NULL && tag != Py_None && PyUnicode_GET_LENGTH(tag) > 0
        && (tag_b = PyUnicode_AsUTF8AndSize(tag, &tag_len)) == NULL)
        goto fallback_clear;
    for (Py_ssize_t i = 0; i < nkeys; i++) {
        Py_ssize_t n;
        if (!PyUnicode_CheckExact(key_items[i]))
            goto fallback;
        if (PyUnicode_FindChar(key_items[i], 0x1F, 0, PyUnicode_GET_LENGTH(key_items[i]), 1) != -1) {
            raise_msg(InvalidMessageError, PyUnicode_FromString("a key may not contain the 0x1F separator"));
            goto error;
        }
        if (PyUnicode_AsUTF8AndSize(key_items[i], &n) == NULL)
            goto fallback_clear;
        keys_len += n + (i > 0);
    }
    if (props != NULL && props != Py_None && PyDict_GET_SIZE(props) > 0) {
        PyObject *const one[1] = {props};
        props_b = call_fallback(FB_PROPS_ENCODE, one, 1, NULL);
        if (props_b == NULL)
            goto error;
        if (!PyBytes_CheckExact(props_b)) {
            Py_DECREF(props_b);
            goto fallback;
        }
        props_len = PyBytes_GET_SIZE(props_b);
    }
    Py_ssize_t body_len = PyBytes_CheckExact(body) ? PyBytes_GET_SIZE(body) : PyByteArray_GET_SIZE(body);
    const char *body_b = PyBytes_CheckExact(body) ? PyBytes_AS_STRING(body) : PyByteArray_AS_STRING(body);
    uint64_t size = (uint64_t)HEADER_SIZE + topic_len + tag_len + keys_len + props_len + body_len;
    if (size > 0xFFFFFFFFu || topic_len > 0xFFFF || tag_len > 0xFFFF)
        goto fallback_props;
    uint64_t th = 0;
    if (tag_b != NULL && tag_hash_of(tag, &th) < 0)
        goto error;
    if (a[6] == NULL || a[6] == Py_None) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        int64_t ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
        born = ns >= 0 ? ns / 1000000 : -((-ns + 999999) / 1000000);  /* floor, as time.time_ns() // 10**6 */
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (out == NULL)
        goto error;
    uint8_t *r = (uint8_t *)PyBytes_AS_STRING(out);
    memset(r, 0, HEADER_SIZE);
    st32(r, (uint32_t)size);
    r[4] = MAGIC;
    r[5] = VERSION;
    st32(r + 28, (uint32_t)queue_id);
    st32(r + 32, (uint32_t)reconsume);
    st64(r + 36, (uint64_t)born);
    st64(r + 52, th);
    r[60] = (uint8_t)topic_len;
    r[61] = (uint8_t)(topic_len >> 8);
    r[62] = (uint8_t)tag_len;
    r[63] = (uint8_t)(tag_len >> 8);
    st32(r + 64, (uint32_t)keys_len);
    st32(r + 68, (uint32_t)props_len);
    st32(r + 72, (uint32_t)body_len);
    uint8_t *p = r + HEADER_SIZE;
    memcpy(p, topic_b, (size_t)topic_len);
    p += topic_len;
    if (tag_len)
        memcpy(p, tag_b, (size_t)tag_len);
    p += tag_len;
    for (Py_ssize_t i = 0; i < nkeys; i++) {
        Py_ssize_t n;
        const char *k = PyUnicode_AsUTF8AndSize(key_items[i], &n); /* cached by the first call */
        if (i > 0)
            *p++ = 0x1F;
        memcpy(p, k, (size_t)n);
        p += n;
    }
    if (props_len)
        memcpy(p, PyBytes_AS_STRING(props_b), (size_t)props_len);
    p += props_len;
    memcpy(p, body_b, (size_t)body_len);
    Py_XDECREF(props_b);
    Py_XDECREF(keys_t);
    return out;
error:
    Py_XDECREF(props_b);
    Py_XDECREF(keys_t);
    return NULL;
fallback_clear:
    PyErr_Clear();
    goto fallback;
fallback_props:
    Py_XDECREF(props_b);
fallback:
    Py_XDECREF(keys_t);
    return call_fallback(FB_ENCODE_RECORD, args, nargs, kwnames);
}

/* ------------------------------------------------------------------ send_async answers */

static const char *const msg_ids_kw[] = {"id_prefix", "positions"};

/* msg_ids(id_prefix, positions) -> [id_prefix + 16 upper-case hex digits of each position]: the
 * ids of a SEND answer's messages (client.message.msg_ids), made once per answered batch. */
static PyObject *n_msg_ids(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    Py_ssize_t n;
    PyObject *const *items;
    if (parse_args("msg_ids", args, nargs, kwnames, msg_ids_kw, 2, 2, a) < 0)
        return NULL;
    if (!PyUnicode_CheckExact(a[0]) || !PyUnicode_IS_ASCII(a[0]) || !ints_from_sequence(a[1], &n, &items))
        return call_fallback(FB_MSG_IDS, args, nargs, kwnames);
    uint64_t *pos = PyMem_Malloc(sizeof(uint64_t) * (size_t)(n ? n : 1));
    if (pos == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!as_u64(items[i], &pos[i])) { /* a negative or odd position: Python words the error */
            PyMem_Free(pos);
            return call_fallback(FB_MSG_IDS, args, nargs, kwnames);
        }
    }
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *id = msg_id(a[0], pos[i]);
        if (id == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, id);
    }
    PyMem_Free(pos);
    return out;
}

/* BatchSlot(batch, index): a message's place in an automatically batched send (the base of the
 * producer's SendFuture, whose methods are Python). One per send_async call, so it is made in C:
 * no Python __init__ frame per message. Read-only: `_batch` (any object) and `_index` (an int).
 *
 * Born untracked by the cyclic GC, as CPython's dicts are until they hold something that can be
 * in a cycle: a producer that keeps its futures (20k in a window) had every one of them scanned
 * and promoted by each collection, and full collections followed (docs/benchmarks.md, "Futures
 * the collector need not count"). A cycle through a slot needs a path from its batch back to it,
 * and the batch (producer.py _OpenBatch) reaches user objects only through what the future's own
 * calls put there: a done callback, an await, a raised or returned error whose traceback holds a
 * frame with the future. Each of those calls `_track()` first (producer.py SendFuture), and from
 * then on the collector sees the slot, its reference to its batch (tp_traverse) and the batch. */
typedef struct {
    PyObject_HEAD
    PyObject *batch;
    Py_ssize_t index;
} BatchSlotObject;

static PyObject *batch_slot_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *batch, *index;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds) != 0) || !PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 2) {
        PyErr_Format(PyExc_TypeError, "%s(batch, index) takes exactly two positional arguments", type->tp_name);
        return NULL;
    }
    batch = PyTuple_GET_ITEM(args, 0);
    index = PyTuple_GET_ITEM(args, 1);
    Py_ssize_t i = PyNumber_AsSsize_t(index, PyExc_OverflowError);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    BatchSlotObject *o = (BatchSlotObject *)type->tp_alloc(type, 0);
    if (o == NULL)
        return NULL;
    o->batch = Py_NewRef(batch);
    o->index = i;
    PyObject_GC_UnTrack(o); /* see above: _track() when it can be part of a cycle */
    return (PyObject *)o;
}

/* The cyclic GC sees obj (a GC type) from now on, if it did not already. */
static void gc_track_once(PyObject *obj)
{
    if (PyObject_IS_GC(obj) && !PyObject_GC_IsTracked(obj))
        PyObject_GC_Track(obj);
}

/* BatchSlot._track(): from now on the cyclic GC sees this slot and its batch (which producer.py
 * also leaves out of it until then: _OpenBatch). */
static PyObject *batch_slot_track(BatchSlotObject *self, PyObject *Py_UNUSED(ignored))
{
    gc_track_once((PyObject *)self);
    if (self->batch != NULL)
        gc_track_once(self->batch);
    Py_RETURN_NONE;
}

static int batch_slot_traverse(BatchSlotObject *o, visitproc visit, void *arg)
{
    Py_VISIT(o->batch);
    if (Py_TYPE(o)->tp_flags & Py_TPFLAGS_HEAPTYPE)
        Py_VISIT(Py_TYPE(o)); /* an instance of a heap subclass (SendFuture) owns a reference to it */
    return 0;
}

static int batch_slot_clear(BatchSlotObject *o)
{
    Py_CLEAR(o->batch);
    return 0;
}

static void batch_slot_dealloc(BatchSlotObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    batch_slot_clear(o);
    tp->tp_free((PyObject *)o);
}

static PyMemberDef batch_slot_members[] = {
    {"_batch", T_OBJECT_EX, offsetof(BatchSlotObject, batch), READONLY, "the batch the message is in"},
    {"_index", T_PYSSIZET, offsetof(BatchSlotObject, index), READONLY, "the message's index in its batch"},
    {NULL, 0, 0, 0, NULL},
};

/* BatchSlot.result(timeout=None): the message's SendResult once its batch is answered, made here
 * from the answer's fields (`ids`, made here by the batch's first result, `topic`, `queue_id`,
 * `first_offset`, `broker`) with the SendResult slots filled directly, as the dataclass __init__
 * would. Anything else -- no answer yet (wait, or raise the send's error), SendResult not bound
 * as plain slots -- is the bound Python version's (producer.py), called as
 * python_result(self, timeout). */
static PyObject *slow_result;
static PyTypeObject *send_result_cls;
#define SR_FIELDS 5
static const char *const sr_names[SR_FIELDS] = {"msg_id", "topic", "queue_id", "queue_offset", "broker"};
static Py_ssize_t sr_offsets[SR_FIELDS];
static PyObject *str_answer, *str_ids, *str_topic, *str_queue_id, *str_first_offset, *str_broker, *str_id_prefix,
    *str_positions;

static PyObject *batch_slot_slow_result(BatchSlotObject *self, PyObject *const *args, Py_ssize_t nargs,
                                        PyObject *kwnames)
{
    if (slow_result == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "BatchSlot.result: producer.py did not bind its Python version");
        return NULL;
    }
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *stack[8];
    if (nargs + nk > 7) {
        PyErr_SetString(PyExc_TypeError, "result() takes at most one argument (timeout)");
        return NULL;
    }
    stack[0] = (PyObject *)self;
    for (Py_ssize_t i = 0; i < nargs + nk; i++)
        stack[i + 1] = args[i];
    return PyObject_Vectorcall(slow_result, stack, (size_t)(nargs + 1), kwnames);
}

/* The ids of an answer (_BatchAnswer) whose `ids` is still None: msg_ids(answer.id_prefix,
 * answer.positions), stored as answer.ids for the batch's other results. Two threads may both
 * make them: the same strings (as _BatchAnswer.result in Python). Here rather than through the
 * Python version: with many topics a batch holds few messages, and that call was a batch's
 * largest cost in the caller's thread after its records (docs/benchmarks.md). */
static PyObject *answer_ids(PyObject *answer)
{
    PyObject *a[2] = {NULL, NULL}, *ids = NULL;
    if ((a[0] = PyObject_GetAttr(answer, str_id_prefix)) != NULL
        && (a[1] = PyObject_GetAttr(answer, str_positions)) != NULL
        && (ids = n_msg_ids(NULL, a, 2, NULL)) != NULL && PyObject_SetAttr(answer, str_ids, ids) < 0)
        Py_CLEAR(ids);
    if (ids != NULL)
        PyObject_GC_UnTrack(ids); /* strs only: in no cycle, and kept as long as the futures are */
    Py_XDECREF(a[0]);
    Py_XDECREF(a[1]);
    return ids;
}

/* A SendResult from its 5 field values (references stolen, every one non-NULL; slots bound),
 * untracked by the cyclic GC: it is frozen and holds only strs and ints, so it is in no reference
 * cycle, and a send_batch's 1000 results are then nothing a collection scans or promotes. */
static PyObject *new_send_result(PyObject **v)
{
    PyObject *r = send_result_cls->tp_alloc(send_result_cls, 0);
    if (r == NULL) {
        for (int i = 0; i < SR_FIELDS; i++)
            Py_DECREF(v[i]);
        return NULL;
    }
    for (int i = 0; i < SR_FIELDS; i++)
        *(PyObject **)((char *)r + sr_offsets[i]) = v[i]; /* references moved */
    PyObject_GC_UnTrack(r);
    return r;
}

static PyObject *batch_slot_result(BatchSlotObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    PyObject *answer = NULL, *ids = NULL, *v[SR_FIELDS] = {0}, *first = NULL, *index = NULL;
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nk > 1 || (nk == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "timeout") != 0)
        || sr_offsets[0] == 0)
        return batch_slot_slow_result(self, args, nargs, kwnames); /* Python words any argument error */
    if ((answer = PyObject_GetAttr(self->batch, str_answer)) == NULL)
        return NULL;
    if (answer == Py_None)
        goto slow;
    if ((ids = PyObject_GetAttr(answer, str_ids)) == NULL)
        goto error;
    if (ids == Py_None) { /* the batch's first result asked for: every id of the batch, made once */
        Py_DECREF(ids);
        if ((ids = answer_ids(answer)) == NULL)
            goto error;
    }
    if (!PyList_CheckExact(ids) || self->index < 0 || self->index >= PyList_GET_SIZE(ids))
        goto slow;
    v[0] = Py_NewRef(PyList_GET_ITEM(ids, self->index));
    if ((v[1] = PyObject_GetAttr(answer, str_topic)) == NULL || (v[2] = PyObject_GetAttr(answer, str_queue_id)) == NULL
        || (first = PyObject_GetAttr(answer, str_first_offset)) == NULL
        || (v[4] = PyObject_GetAttr(answer, str_broker)) == NULL || (index = PyLong_FromSsize_t(self->index)) == NULL
        || (v[3] = PyNumber_Add(first, index)) == NULL)
        goto error;
    Py_DECREF(first);
    Py_DECREF(index);
    Py_DECREF(ids);
    Py_DECREF(answer);
    return new_send_result(v);
slow:
    Py_XDECREF(ids);
    Py_DECREF(answer);
    return batch_slot_slow_result(self, args, nargs, kwnames);
error:
    for (int i = 0; i < SR_FIELDS; i++)
        Py_XDECREF(v[i]);
    Py_XDECREF(first);
    Py_XDECREF(index);
    Py_XDECREF(ids);
    Py_XDECREF(answer);
    return NULL;
}

/* gc_untrack(obj) -> obj: obj left out of the cyclic GC from now on (if it is a GC type). Only for
 * objects the caller knows can be in no reference cycle, or whose every way into one tracks them
 * again first (gc_track): the producer's batches and their answers, which with many topics were
 * a fifth of a send_async's tracked garbage (producer.py _OpenBatch). */
static PyObject *n_gc_untrack(PyObject *self, PyObject *obj)
{
    if (PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj))
        PyObject_GC_UnTrack(obj);
    return Py_NewRef(obj);
}

/* gc_track(obj): the cyclic GC sees obj again (a GC type left out by gc_untrack). */
static PyObject *n_gc_track(PyObject *self, PyObject *obj)
{
    gc_track_once(obj);
    Py_RETURN_NONE;
}

static PyMethodDef batch_slot_methods[] = {
    {"result", (PyCFunction)(void (*)(void))batch_slot_result, METH_FASTCALL | METH_KEYWORDS,
     "result(timeout=None) -> SendResult: the message's result once its batch is answered (else waits)."},
    {"_track", (PyCFunction)batch_slot_track, METH_NOARGS,
     "_track(): let the cyclic GC see this slot and its batch (before anything that can put them in a cycle)."},
    {NULL, NULL, 0, NULL},
};

/* Slot offsets of a class's fields if each is a plain writable slot and instances are made by
 * PyType_GenericAlloc (what _bind_received checks for ReceivedMessage); 0 if not. */
static int plain_slot_offsets(PyTypeObject *cls, const char *const *names, int n, Py_ssize_t *offsets)
{
    if (cls->tp_dictoffset != 0 || cls->tp_alloc != PyType_GenericAlloc)
        return 0;
    for (int i = 0; i < n; i++) {
        PyObject *d = PyDict_GetItemString(cls->tp_dict, names[i]);
        if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type)
            return 0;
        PyMemberDef *md = ((PyMemberDescrObject *)d)->d_member;
        if (md->type != T_OBJECT_EX || (md->flags & READONLY) || md->offset <= 0)
            return 0;
        offsets[i] = md->offset;
    }
    return 1;
}

/* send_results(id_prefix, positions, topic, queue_id, first_offset, broker) -> [SendResult]: the
 * results of a SEND answer's messages (producer.py _BatchAnswer.results), made as BatchSlot.result
 * makes one (new_send_result: untracked by the GC). Only after _bind_send_future said "slots"
 * (RuntimeError before). */
static PyObject *n_send_results(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "send_results(id_prefix, positions, topic, queue_id, first_offset, broker)");
        return NULL;
    }
    if (sr_offsets[0] == 0 || send_result_cls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "send_results: SendResult is not bound as plain slots");
        return NULL;
    }
    long long first = PyLong_AsLongLong(args[4]);
    if (first == -1 && PyErr_Occurred())
        return NULL;
    PyObject *ids = n_msg_ids(NULL, args, 2, NULL);
    if (ids == NULL)
        return NULL;
    if (!PyList_CheckExact(ids)) {
        Py_DECREF(ids);
        PyErr_SetString(PyExc_TypeError, "send_results: msg_ids gave no list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(ids);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *offset = PyLong_FromLongLong(first + i);
        if (offset == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyObject *v[SR_FIELDS] = {Py_NewRef(PyList_GET_ITEM(ids, i)), Py_NewRef(args[2]), Py_NewRef(args[3]),
                                  offset, Py_NewRef(args[5])};
        PyObject *r = new_send_result(v);
        if (r == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, r);
    }
    Py_DECREF(ids);
    return out;
}

static PyObject *n_bind_send_future(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* _bind_send_future(python_result, SendResult, field_names) -> "slots" | "python": how
     * BatchSlot.result will answer (with plain slots it fills SendResult's directly). */
    if (nargs != 3 || !PyCallable_Check(args[0]) || !PyType_Check(args[1]) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "_bind_send_future(python_result, SendResult, field_names: tuple)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[1];
    int ok = PyTuple_GET_SIZE(args[2]) == SR_FIELDS;
    for (int i = 0; ok && i < SR_FIELDS; i++)
        ok = PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(args[2], i), sr_names[i]) == 0;
    Py_ssize_t offsets[SR_FIELDS];
    ok = ok && plain_slot_offsets(cls, sr_names, SR_FIELDS, offsets);
    Py_XSETREF(slow_result, Py_NewRef(args[0]));
    Py_XSETREF(send_result_cls, (PyTypeObject *)Py_NewRef(cls));
    for (int i = 0; i < SR_FIELDS; i++)
        sr_offsets[i] = ok ? offsets[i] : 0;
    return PyUnicode_FromString(ok ? "slots" : "python");
}

static PyTypeObject BatchSlotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "equeue_core._native.BatchSlot",
    .tp_basicsize = sizeof(BatchSlotObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "BatchSlot(batch, index): a message's place in a batch (base of the producer's SendFuture).",
    .tp_new = batch_slot_new,
    .tp_traverse = (traverseproc)batch_slot_traverse,
    .tp_clear = (inquiry)batch_slot_clear,
    .tp_dealloc = (destructor)batch_slot_dealloc,
    .tp_members = batch_slot_members,
    .tp_methods = batch_slot_methods,
};

/* ------------------------------------------------------------------ binding */

static PyObject *n_bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* _bind(name=callable, ...): the Python versions to fall back to; u32_array=callable. */
    if (nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "_bind() takes keyword arguments only");
        return NULL;
    }
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k), *val = args[k];
        if (PyUnicode_CompareWithASCIIString(key, "u32_array") == 0) {
            Py_XSETREF(u32_array, Py_NewRef(val));
            continue;
        }
        int j = 0;
        while (j < FB_COUNT && PyUnicode_CompareWithASCIIString(key, fb_names[j]) != 0)
            j++;
        if (j == FB_COUNT) {
            PyErr_Format(PyExc_TypeError, "_bind(): unknown name '%U'", key);
            return NULL;
        }
        Py_XSETREF(fallback[j], Py_NewRef(val));
    }
    Py_RETURN_NONE;
}

static PyObject *n_bind_received(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* _bind_received(cls, field_names, props_decode) -> "slots" | "call": how decode_batch will
     * build messages. With the 12 expected fields as plain slots it fills them directly (what the
     * dataclass __init__ would do); otherwise it calls the class with the 12 values. */
    if (nargs != 3 || !PyType_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_bind_received(cls, field_names: tuple, props_decode)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *names = args[1];
    if (PyTuple_GET_SIZE(names) != RM_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "_bind_received: ReceivedMessage's fields changed; update _native.c");
        return NULL;
    }
    for (int i = 0; i < RM_FIELDS; i++) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(names, i), rm_names[i]) != 0) {
            PyErr_SetString(PyExc_ValueError, "_bind_received: ReceivedMessage's fields changed; update _native.c");
            return NULL;
        }
    }
    Py_ssize_t offsets[RM_FIELDS];
    int slots = cls->tp_dictoffset == 0 && cls->tp_alloc == PyType_GenericAlloc;
    for (int i = 0; slots && i < RM_FIELDS; i++) {
        PyObject *d = PyDict_GetItemString(cls->tp_dict, rm_names[i]);
        if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type) {
            slots = 0;
            break;
        }
        PyMemberDef *md = ((PyMemberDescrObject *)d)->d_member;
        if (md->type != T_OBJECT_EX || (md->flags & READONLY) || md->offset <= 0)
            slots = 0;
        else
            offsets[i] = md->offset;
    }
    Py_XSETREF(received_cls, (PyTypeObject *)Py_NewRef(cls));
    Py_XSETREF(props_decode, Py_NewRef(args[2]));
    for (int i = 0; i < RM_FIELDS; i++)
        rm_offsets[i] = slots ? offsets[i] : 0;
    return PyUnicode_FromString(slots ? "slots" : "call");
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))n_scan, METH_FASTCALL | METH_KEYWORDS, "record.scan, in C."},
    {"stamp_batch", (PyCFunction)(void (*)(void))n_stamp_batch, METH_FASTCALL | METH_KEYWORDS,
     "record.stamp_batch, in C."},
    {"index_entries", (PyCFunction)(void (*)(void))n_index_entries, METH_FASTCALL | METH_KEYWORDS,
     "record.index_entries, in C."},
    {"gather_runs", (PyCFunction)(void (*)(void))n_gather_runs, METH_FASTCALL | METH_KEYWORDS,
     "record.gather_runs, in C."},
    {"index_runs", (PyCFunction)(void (*)(void))n_index_runs, METH_FASTCALL | METH_KEYWORDS,
     "record.index_runs, in C."},
    {"verify", (PyCFunction)(void (*)(void))n_verify, METH_FASTCALL | METH_KEYWORDS, "record.verify, in C."},
    {"damage", (PyCFunction)(void (*)(void))n_damage, METH_FASTCALL | METH_KEYWORDS, "record.damage, in C."},
    {"crc_spans", (PyCFunction)(void (*)(void))n_crc_spans, METH_FASTCALL | METH_KEYWORDS,
     "record.crc_spans, in C."},
    {"decode_batch", (PyCFunction)(void (*)(void))n_decode_batch, METH_FASTCALL | METH_KEYWORDS,
     "client.message.decode_batch, in C."},
    {"encode_record", (PyCFunction)(void (*)(void))n_encode_record, METH_FASTCALL | METH_KEYWORDS,
     "record.encode_record, in C."},
    {"msg_ids", (PyCFunction)(void (*)(void))n_msg_ids, METH_FASTCALL | METH_KEYWORDS,
     "client.message.msg_ids, in C."},
    {"crc32c", n_crc32c, METH_O, "crc32c(data) -> int, with the fastest code this CPU runs."},
    {"crc32c_table", n_crc32c_table, METH_O, "crc32c(data) -> int with the slicing-by-8 tables (for tests)."},
    {"crc32c_sse42", n_crc32c_sse42, METH_O,
     "crc32c(data) -> int with the SSE4.2 instruction; RuntimeError where the CPU lacks it (for tests)."},
    {"crc32c_implementation", n_crc32c_implementation, METH_NOARGS, "'sse4.2' or 'table'."},
    {"_bind", (PyCFunction)(void (*)(void))n_bind, METH_FASTCALL | METH_KEYWORDS,
     "record.py binds the Python versions (fallbacks) here."},
    {"send_results", (PyCFunction)(void (*)(void))n_send_results, METH_FASTCALL,
     "send_results(id_prefix, positions, topic, queue_id, first_offset, broker) -> [SendResult], untracked by the GC."},
    {"_bind_send_future", (PyCFunction)(void (*)(void))n_bind_send_future, METH_FASTCALL,
     "producer.py binds SendFuture's Python result() and SendResult here."},
    {"_bind_received", (PyCFunction)(void (*)(void))n_bind_received, METH_FASTCALL,
     "message.py binds ReceivedMessage and the properties decoder here."},
    {"gc_untrack", n_gc_untrack, METH_O,
     "gc_untrack(obj) -> obj, left out of the cyclic GC (only what can be in no cycle until gc_track)."},
    {"gc_track", n_gc_track, METH_O, "gc_track(obj): the cyclic GC sees obj again."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "equeue_core._native",
    "The per-record hot path of equeue_core.record and client.message.decode_batch, in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    crc_select();
    PyObject *errors = PyImport_ImportModule("equeue_core.errors");
    if (errors == NULL)
        return NULL;
    CorruptRecordError = PyObject_GetAttrString(errors, "CorruptRecordError");
    InvalidMessageError = PyObject_GetAttrString(errors, "InvalidMessageError");
    MessageTooLargeError = PyObject_GetAttrString(errors, "MessageTooLargeError");
    Py_DECREF(errors);
    if (!CorruptRecordError || !InvalidMessageError || !MessageTooLargeError)
        return NULL;
    str_retry_topic = PyUnicode_InternFromString("RETRY_TOPIC");
    str_key_sep = PyUnicode_FromString("\x1f");
    empty_tuple = PyTuple_New(0);
    tag_hashes = PyDict_New();
    if (!str_retry_topic || !str_key_sep || !empty_tuple || !tag_hashes)
        return NULL;
    str_answer = PyUnicode_InternFromString("answer");
    str_ids = PyUnicode_InternFromString("ids");
    str_id_prefix = PyUnicode_InternFromString("id_prefix");
    str_positions = PyUnicode_InternFromString("positions");
    str_topic = PyUnicode_InternFromString("topic");
    str_queue_id = PyUnicode_InternFromString("queue_id");
    str_first_offset = PyUnicode_InternFromString("first_offset");
    str_broker = PyUnicode_InternFromString("broker");
    if (!str_answer || !str_ids || !str_topic || !str_queue_id || !str_first_offset || !str_broker || !str_id_prefix
        || !str_positions)
        return NULL;
    if (PyType_Ready(&BatchSlotType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "BatchSlot", (PyObject *)&BatchSlotType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
