/* The per-message part of tieredcore.formats.messages.decode_columns in C (C99, CPython C API only).
 *
 * split(payload, count, seq, evt, eid, pub, prod,
 *       eids, bidx, pubs, prods, seqs, evts, keys, okeys, pays, poff, pkeys, pvals)
 *
 * walks an inflated batch, [uint32 BE size][SingleMessageMetadata][payload] x count, parsing each
 * SingleMessageMetadata's protobuf wire format itself, and appends every message's fields to the column
 * lists as messages._singles + decode_columns do (payloads up to 64 KiB as bytes copies, larger ones as
 * memoryview slices of ``payload``). Returns None when the whole batch was read, else a tuple
 * (code, message index, reason): the caller drops what was appended for the entry and reads it again in
 * Python, which raises the exact MessageFormatError (or accepts what this reader is stricter about).
 *
 * The parser accepts a subset of what upb accepts and reads it the same way; anything else is refused
 * (CODE_PARSE or CODE_UNSUPPORTED), never guessed: groups, a known field with an unexpected wire type,
 * varints longer than 10 bytes, strings that are not valid UTF-8, a sequence id that would pass 2**64.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum {
    CODE_OK = 0,
    CODE_TRUNCATED = 1,      /* the batch ends before message k */
    CODE_META_OVERRUN = 2,   /* its metadata overruns the batch */
    CODE_PARSE = 3,          /* SingleMessageMetadata does not parse (as far as this reader knows) */
    CODE_NO_PAYLOAD_SIZE = 4,
    CODE_PAYLOAD_OVERRUN = 5,
    CODE_UNSUPPORTED = 6,    /* valid perhaps, but left to the Python reader */
    CODE_PYERROR = 7         /* a Python error other than the above (memory): raised as is */
};

typedef struct {
    const uint8_t *p;
    Py_ssize_t n;
} span;

typedef struct {
    const char *reason;
    int code;
} fail;

/* A varint at *pp (before e): 0 and *v on success, -1 when truncated or longer than 10 bytes. Bits past
 * the 64th are dropped, as upb does. */
static inline int
read_varint(const uint8_t **pp, const uint8_t *e, uint64_t *v)
{
    const uint8_t *p = *pp;
    uint64_t r = 0;
    int shift = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= e)
            return -1;
        uint8_t b = *p++;
        if (i == 9 && b > 1)
            return -1; /* past 64 bits: left to upb (refused here, never read differently) */
        if (shift < 64)
            r |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) {
            *v = r;
            *pp = p;
            return 0;
        }
    }
    return -1;
}

/* Skips an unknown field of wire type wt; 0 on success, else sets f. */
static inline int
skip_field(const uint8_t **pp, const uint8_t *e, unsigned wt, fail *f)
{
    uint64_t v;
    switch (wt) {
    case 0:
        if (read_varint(pp, e, &v) < 0) {
            f->code = CODE_PARSE;
            f->reason = "malformed varint";
            return -1;
        }
        return 0;
    case 1:
        if (e - *pp < 8) {
            f->code = CODE_PARSE;
            f->reason = "truncated fixed64";
            return -1;
        }
        *pp += 8;
        return 0;
    case 5:
        if (e - *pp < 4) {
            f->code = CODE_PARSE;
            f->reason = "truncated fixed32";
            return -1;
        }
        *pp += 4;
        return 0;
    case 2:
        if (read_varint(pp, e, &v) < 0) {
            f->code = CODE_PARSE;
            f->reason = "malformed length";
            return -1;
        }
        if (v > (uint64_t)(e - *pp)) {
            f->code = CODE_PARSE;
            f->reason = "length-delimited field overruns";
            return -1;
        }
        *pp += v;
        return 0;
    case 3:
    case 4:
        f->code = CODE_UNSUPPORTED;
        f->reason = "group";
        return -1;
    default:
        f->code = CODE_PARSE;
        f->reason = "invalid wire type";
        return -1;
    }
}

/* A tag: field number and wire type; 0 on success. */
static inline int
read_tag(const uint8_t **pp, const uint8_t *e, uint32_t *num, unsigned *wt, fail *f)
{
    uint64_t t;
    if (read_varint(pp, e, &t) < 0 || t > 0xffffffffu) {
        f->code = CODE_PARSE;
        f->reason = "malformed tag";
        return -1;
    }
    *num = (uint32_t)(t >> 3);
    *wt = (unsigned)(t & 7);
    if (*num == 0) {
        f->code = CODE_PARSE;
        f->reason = "field number 0";
        return -1;
    }
    return 0;
}

static inline int
read_bytes(const uint8_t **pp, const uint8_t *e, span *out, fail *f)
{
    uint64_t n;
    if (read_varint(pp, e, &n) < 0) {
        f->code = CODE_PARSE;
        f->reason = "malformed length";
        return -1;
    }
    if (n > (uint64_t)(e - *pp)) {
        f->code = CODE_PARSE;
        f->reason = "length-delimited field overruns";
        return -1;
    }
    out->p = *pp;
    out->n = (Py_ssize_t)n;
    *pp += n;
    return 0;
}

#define WRONG_TYPE()                              \
    do {                                          \
        f->code = CODE_UNSUPPORTED;               \
        f->reason = "unexpected wire type";       \
        return -1;                                \
    } while (0)

static PyObject *
utf8(span s, fail *f)
{
    PyObject *o = PyUnicode_DecodeUTF8((const char *)s.p, s.n, NULL);
    if (o == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            f->code = CODE_UNSUPPORTED;
            f->reason = "a string that is not UTF-8";
        } else {
            f->code = CODE_PYERROR;
            f->reason = "python error";
        }
    }
    return o;
}

static int
append_new(PyObject *list, PyObject *o, fail *f)
{
    if (o == NULL) {
        if (f->code == CODE_OK) {
            f->code = CODE_PYERROR;
            f->reason = "python error";
        }
        return -1;
    }
    int r = PyList_Append(list, o);
    Py_DECREF(o);
    if (r < 0) {
        f->code = CODE_PYERROR;
        f->reason = "python error";
    }
    return r;
}

/* Property keys seen in this batch (a producer's messages mostly carry the same few): one str each. */
#define KEY_CACHE 8
typedef struct {
    int n;
    span keys[KEY_CACHE];
    PyObject *objs[KEY_CACHE];
} key_cache;

static PyObject *
cached_key(key_cache *c, span s, fail *f)
{
    for (int i = 0; i < c->n; i++) {
        if (c->keys[i].n == s.n && memcmp(c->keys[i].p, s.p, (size_t)s.n) == 0) {
            Py_INCREF(c->objs[i]);
            return c->objs[i];
        }
    }
    PyObject *o = utf8(s, f);
    if (o != NULL && c->n < KEY_CACHE) {
        c->keys[c->n] = s;
        Py_INCREF(o);
        c->objs[c->n++] = o;
    }
    return o;
}

static void
key_cache_clear(key_cache *c)
{
    for (int i = 0; i < c->n; i++)
        Py_DECREF(c->objs[i]);
    c->n = 0;
}

/* One KeyValue: appends its key and value (strings, "" when absent: upb does not check required). */
static int
parse_kv(span m, PyObject *pkeys, PyObject *pvals, key_cache *kc, fail *f)
{
    const uint8_t *p = m.p, *e = m.p + m.n;
    span key = {(const uint8_t *)"", 0}, val = {(const uint8_t *)"", 0};
    while (p < e) {
        uint32_t num;
        unsigned wt;
        if (read_tag(&p, e, &num, &wt, f) < 0)
            return -1;
        if (num == 1 || num == 2) {
            if (wt != 2)
                WRONG_TYPE();
            if (read_bytes(&p, e, num == 1 ? &key : &val, f) < 0)
                return -1;
        } else if (skip_field(&p, e, wt, f) < 0) {
            return -1;
        }
    }
    if (append_new(pkeys, cached_key(kc, key, f), f) < 0)
        return -1;
    return append_new(pvals, utf8(val, f), f);
}

#define SMALL_PAYLOAD 65536

/* A message's properties pkeys[start:] (and pvals) with a key given twice once, in the place it came
 * first, with its last value: what decode_columns' dict(zip(keys, values)) makes (Pulsar's
 * MessageImpl.getProperties). Equal str objects here are equal UTF-8 bytes: strict decoding. */
static int
dedupe(PyObject *pkeys, PyObject *pvals, Py_ssize_t start, fail *f)
{
    Py_ssize_t end = PyList_GET_SIZE(pkeys), n = end - start;
    if (n < 2)
        return 0;
    if (n <= 16) { /* the usual few: pairwise, no dict */
        int repeated = 0;
        for (Py_ssize_t i = start + 1; i < end && !repeated; i++) {
            PyObject *a = PyList_GET_ITEM(pkeys, i);
            for (Py_ssize_t j = start; j < i; j++) {
                PyObject *b = PyList_GET_ITEM(pkeys, j);
                if (a == b || (PyUnicode_GET_LENGTH(a) == PyUnicode_GET_LENGTH(b) &&
                               PyUnicode_Compare(a, b) == 0)) {
                    repeated = 1;
                    break;
                }
            }
        }
        if (PyErr_Occurred())
            goto error;
        if (!repeated)
            return 0;
    }
    PyObject *last = PyDict_New();
    if (last == NULL)
        goto error;
    for (Py_ssize_t i = start; i < end; i++) {
        if (PyDict_SetItem(last, PyList_GET_ITEM(pkeys, i), PyList_GET_ITEM(pvals, i)) < 0) {
            Py_DECREF(last);
            goto error;
        }
    }
    if (PyDict_GET_SIZE(last) < n) {
        if (PyList_SetSlice(pkeys, start, end, NULL) < 0 || PyList_SetSlice(pvals, start, end, NULL) < 0) {
            Py_DECREF(last);
            goto error;
        }
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(last, &pos, &k, &v)) {
            if (PyList_Append(pkeys, k) < 0 || PyList_Append(pvals, v) < 0) {
                Py_DECREF(last);
                goto error;
            }
        }
    }
    Py_DECREF(last);
    return 0;
error:
    f->code = CODE_PYERROR;
    f->reason = "python error";
    return -1;
}

typedef struct {
    span key, okey;
    uint64_t evt, seq;
    int64_t payload_size;
    int has_key, has_okey, has_evt, has_seq, has_ps, null_key;
} smm;

static int
parse_smm(const uint8_t *p, const uint8_t *e, smm *s, PyObject *pkeys, PyObject *pvals, key_cache *kc,
          fail *f)
{
    memset(s, 0, sizeof *s);
    while (p < e) {
        uint32_t num;
        unsigned wt;
        uint64_t v;
        span m;
        if (read_tag(&p, e, &num, &wt, f) < 0)
            return -1;
        switch (num) {
        case 1: /* properties */
            if (wt != 2)
                WRONG_TYPE();
            if (read_bytes(&p, e, &m, f) < 0 || parse_kv(m, pkeys, pvals, kc, f) < 0)
                return -1;
            break;
        case 2: /* partition_key */
        case 7: /* ordering_key */
            if (wt != 2)
                WRONG_TYPE();
            if (read_bytes(&p, e, num == 2 ? &s->key : &s->okey, f) < 0)
                return -1;
            if (num == 2)
                s->has_key = 1;
            else
                s->has_okey = 1;
            break;
        case 3:  /* payload_size (int32) */
        case 4:  /* compacted_out */
        case 5:  /* event_time */
        case 6:  /* partition_key_b64_encoded */
        case 8:  /* sequence_id */
        case 9:  /* null_value */
        case 10: /* null_partition_key */
            if (wt != 0)
                WRONG_TYPE();
            if (read_varint(&p, e, &v) < 0) {
                f->code = CODE_PARSE;
                f->reason = "malformed varint";
                return -1;
            }
            if (num == 3) {
                s->payload_size = (int32_t)(uint32_t)v;
                s->has_ps = 1;
            } else if (num == 5) {
                s->evt = v;
                s->has_evt = 1;
            } else if (num == 8) {
                s->seq = v;
                s->has_seq = 1;
            } else if (num == 10) {
                s->null_key = v != 0;
            }
            break;
        default:
            if (skip_field(&p, e, wt, f) < 0)
                return -1;
        }
    }
    return 0;
}

static PyObject *
split(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 19) {
        PyErr_SetString(PyExc_TypeError, "split takes 19 arguments");
        return NULL;
    }
    PyObject *payload = args[0];
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    unsigned long long seq = PyLong_AsUnsignedLongLong(args[2]);
    if (seq == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    unsigned long long evt = PyLong_AsUnsignedLongLong(args[3]);
    if (evt == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    PyObject *eid = args[4], *pub = args[5], *prod = args[6];
    PyObject *eids = args[7], *bidx = args[8], *pubs = args[9], *prods = args[10], *seqs = args[11],
             *evts = args[12], *keys = args[13], *okeys = args[14], *pays = args[15], *poff = args[16],
             *pkeys = args[17], *pvals = args[18];
    for (int i = 7; i < 19; i++) {
        if (!PyList_CheckExact(args[i])) {
            PyErr_SetString(PyExc_TypeError, "split: the columns must be lists");
            return NULL;
        }
    }

    fail f = {NULL, CODE_OK};
    Py_ssize_t k = 0;
    Py_buffer view;
    if (PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return Py_BuildValue("(ins)", CODE_UNSUPPORTED, (Py_ssize_t)0, "not a simple buffer");
    }
    if (count < 0 || (unsigned long long)count > 0xffffffffffffffffULL - seq) {
        PyBuffer_Release(&view);
        return Py_BuildValue("(ins)", CODE_UNSUPPORTED, (Py_ssize_t)0, "sequence ids past 2**64");
    }
    const uint8_t *base = (const uint8_t *)view.buf;
    const Py_ssize_t end = view.len;
    Py_ssize_t q = 0;
    PyObject *evt_entry = NULL; /* the entry's event time (None for 0), made once */
    key_cache kc;
    kc.n = 0;

    for (k = 0; k < count; k++) {
        if (end - q < 4) {
            f.code = CODE_TRUNCATED;
            f.reason = "truncated";
            break;
        }
        uint32_t size = ((uint32_t)base[q] << 24) | ((uint32_t)base[q + 1] << 16) |
                        ((uint32_t)base[q + 2] << 8) | (uint32_t)base[q + 3];
        q += 4;
        if ((Py_ssize_t)size > end - q) {
            f.code = CODE_META_OVERRUN;
            f.reason = "metadata overruns";
            break;
        }
        smm s;
        Py_ssize_t pstart = PyList_GET_SIZE(pkeys);
        if (parse_smm(base + q, base + q + size, &s, pkeys, pvals, &kc, &f) < 0 ||
            dedupe(pkeys, pvals, pstart, &f) < 0)
            break;
        q += size;
        if (!s.has_ps) {
            f.code = CODE_NO_PAYLOAD_SIZE;
            f.reason = "no payload_size";
            break;
        }
        if (s.payload_size < 0 || s.payload_size > end - q) {
            f.code = CODE_PAYLOAD_OVERRUN;
            f.reason = "payload overruns";
            break;
        }
        Py_ssize_t n = (Py_ssize_t)s.payload_size;

        if (PyList_Append(eids, eid) < 0 || append_new(bidx, PyLong_FromSsize_t(k), &f) < 0 ||
            PyList_Append(pubs, pub) < 0 || PyList_Append(prods, prod) < 0) {
            f.code = CODE_PYERROR;
            break;
        }
        if (append_new(seqs, PyLong_FromUnsignedLongLong(s.has_seq ? s.seq : seq + (unsigned long long)k),
                       &f) < 0)
            break;
        if (s.has_evt) {
            if (s.evt == 0 ? PyList_Append(evts, Py_None) < 0
                           : append_new(evts, PyLong_FromUnsignedLongLong(s.evt), &f) < 0) {
                f.code = CODE_PYERROR;
                break;
            }
        } else {
            if (evt_entry == NULL) {
                if (evt == 0) {
                    evt_entry = Py_None;
                    Py_INCREF(evt_entry);
                } else if ((evt_entry = PyLong_FromUnsignedLongLong(evt)) == NULL) {
                    f.code = CODE_PYERROR;
                    break;
                }
            }
            if (PyList_Append(evts, evt_entry) < 0) {
                f.code = CODE_PYERROR;
                break;
            }
        }
        if (s.has_key && !s.null_key) {
            if (append_new(keys, utf8(s.key, &f), &f) < 0)
                break;
        } else if (PyList_Append(keys, Py_None) < 0) {
            f.code = CODE_PYERROR;
            break;
        }
        if (s.has_okey) {
            if (append_new(okeys, PyBytes_FromStringAndSize((const char *)s.okey.p, s.okey.n), &f) < 0)
                break;
        } else if (PyList_Append(okeys, Py_None) < 0) {
            f.code = CODE_PYERROR;
            break;
        }
        /* a small payload copied into bytes (not tracked by the garbage collector, joined fast), a large
         * one a memoryview slice (no copy) */
        if (append_new(pays, n <= SMALL_PAYLOAD ? PyBytes_FromStringAndSize((const char *)base + q, n)
                                                : PySequence_GetSlice(payload, q, q + n), &f) < 0)
            break;
        if (append_new(poff, PyLong_FromSsize_t(PyList_GET_SIZE(pkeys)), &f) < 0)
            break;
        q += n;
    }
    Py_XDECREF(evt_entry);
    key_cache_clear(&kc);
    PyBuffer_Release(&view);
    if (f.code == CODE_OK)
        Py_RETURN_NONE;
    if (f.code == CODE_PYERROR && PyErr_Occurred())
        return NULL;
    PyErr_Clear();
    return Py_BuildValue("(ins)", f.code, k, f.reason ? f.reason : "");
}

static PyMethodDef methods[] = {
    {"split", (PyCFunction)(void (*)(void))split, METH_FASTCALL,
     "split(payload, count, seq, evt, eid, pub, prod, eids, bidx, pubs, prods, seqs, evts, keys, okeys, "
     "pays, poff, pkeys, pvals) -> None | (code, index, reason): append an inflated batch's messages to "
     "the columns (see tieredcore.formats.messages.decode_columns)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tieredcore.formats.cbatch",
    "The per-message loop of decode_columns over an inflated batch, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit_cbatch(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "TRUNCATED", CODE_TRUNCATED) < 0 ||
        PyModule_AddIntConstant(m, "META_OVERRUN", CODE_META_OVERRUN) < 0 ||
        PyModule_AddIntConstant(m, "PARSE", CODE_PARSE) < 0 ||
        PyModule_AddIntConstant(m, "NO_PAYLOAD_SIZE", CODE_NO_PAYLOAD_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "PAYLOAD_OVERRUN", CODE_PAYLOAD_OVERRUN) < 0 ||
        PyModule_AddIntConstant(m, "UNSUPPORTED", CODE_UNSUPPORTED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
