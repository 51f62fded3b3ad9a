/* The readers' per-entry and per-message loops in C (C99, CPython C API only): tieredcore/formats/native.py.
 *
 * columns(): whole entries of an EntryBatch into Arrow buffers (tieredcore.query.rows.message_batches);
 * frames(): the offload reader's walk over [length][entry id][payload] frames.
 *
 * The protobuf parser accepts a subset of what upb accepts and reads it the same way; anything else is
 * refused (CODE_PARSE or CODE_UNSUPPORTED), never guessed: groups, a known field with an unexpected wire
 * type, varints longer than 10 bytes, strings that are not valid UTF-8. What it refuses, the Python reader
 * (the reference) reads, raising the exact MessageFormatError or accepting it.
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

typedef struct {
    span key, okey;
    uint64_t evt, seq;
    int64_t payload_size;
    int has_key, has_okey, has_evt, has_seq, has_ps, null_key, compacted_out;
} smm;

/* ---- columns: whole entries straight into Arrow buffers ---------------------------------------------
 *
 * columns(buf, starts, lengths, index, verify, inflate)
 *   -> (stop, code, reason, n, buffers)
 *
 * reads entries index.. of an EntryBatch (each buf[starts[i] : starts[i] + lengths[i]]): the frame
 * (optional broker entry metadata, optional CRC32C, checked when verify), MessageMetadata, the payload
 * (inflated by calling inflate(kind, view, size) when compressed), and, for a batch, every message, and
 * writes each message's fields into Arrow-layout buffers (bytearrays; see tieredcore.query.rows). It stops
 * at the first entry it does not take (code != 0: damaged, or outside the common case this reader
 * handles: encrypted or chunked entries, invalid UTF-8, unusual protobuf); ``stop`` is that entry's index,
 * and buffers hold the messages of the entries before it. The caller reads that entry in Python
 * (decode_columns, the reference, which raises the exact error or reads it) and calls again after it.
 * code LIMIT: stopped before entry ``stop`` because the payload buffer would pass 32-bit offsets.
 * code 0: every entry read; stop == len(starts).
 *
 * items (a 7th argument, true): topic compaction's phase one instead of the messages (put_item; the same
 * frame checks, and whatever this reader declines left to Python's compaction_items the same way): a
 * marker gives nothing, an entry that is no batch one item (batch index -1, its partition_key, its
 * uncompressed_size or else the stored payload's length), a batch one item per message not compacted_out
 * (its partition_key, its payload_size). Encrypted entries are declined (UNSUPPORTED), as for messages.
 */

enum { CODE_LIMIT = 8, CODE_FRAME = 9 };

typedef struct {
    PyObject *ba; /* a bytearray, grown by doubling, cut to n at the end */
    char *p;
    Py_ssize_t n, cap;
} gbuf;

static int
gb_init(gbuf *b, Py_ssize_t cap)
{
    if (cap < 64)
        cap = 64;
    b->ba = PyByteArray_FromStringAndSize(NULL, cap);
    if (b->ba == NULL)
        return -1;
    b->p = PyByteArray_AS_STRING(b->ba);
    b->n = 0;
    b->cap = cap;
    return 0;
}

static int
gb_grow(gbuf *b, Py_ssize_t more)
{
    Py_ssize_t want = b->n + more, cap = b->cap;
    while (cap < want)
        cap = cap < ((Py_ssize_t)1 << 40) ? cap * 2 : want;
    if (PyByteArray_Resize(b->ba, cap) < 0)
        return -1;
    b->p = PyByteArray_AS_STRING(b->ba);
    b->cap = cap;
    return 0;
}

static inline int
gb_put(gbuf *b, const void *src, Py_ssize_t n)
{
    if (b->n + n > b->cap && gb_grow(b, n) < 0)
        return -1;
    if (n)
        memcpy(b->p + b->n, src, (size_t)n);
    b->n += n;
    return 0;
}

#define GB_PUT_VALUE(b, T, v)          \
    do {                               \
        T v_ = (v);                    \
        if (gb_put((b), &v_, sizeof v_) < 0) \
            goto pyerror;              \
    } while (0)

/* CRC32C (Castagnoli), reflected; SSE4.2's crc32 instruction when the CPU has it. */
static uint32_t crc_table[256];
static int crc_hw;

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t
crc_sse42(const uint8_t *p, size_t n)
{
    uint64_t c = 0xffffffffu;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32 ^ 0xffffffffu;
}
#endif

static uint32_t
crc32c_of(const uint8_t *p, size_t n)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (crc_hw)
        return crc_sse42(p, n);
#endif
    uint32_t c = 0xffffffffu;
    while (n--)
        c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

/* Strict UTF-8 (what Python's decoder accepts: no overlongs, no surrogates, nothing past U+10FFFF). */
static int
utf8_ok(const uint8_t *p, Py_ssize_t n)
{
    const uint8_t *e = p + n;
    while (p < e) {
        if (e - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            if (!(w & 0x8080808080808080ULL)) {
                p += 8;
                continue;
            }
        }
        uint8_t c = *p;
        if (c < 0x80) {
            p++;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (e - p < 2 || (p[1] & 0xC0) != 0x80)
                return 0;
            p += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (e - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] > 0x9F))
                return 0;
            p += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (e - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] > 0x8F))
                return 0;
            p += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

typedef struct {
    span k, v;
} kv;

typedef struct {
    kv *a;
    Py_ssize_t n, cap;
} kvlist;

static int
kv_push(kvlist *l, span k, span v)
{
    if (l->n == l->cap) {
        Py_ssize_t cap = l->cap ? l->cap * 2 : 16;
        kv *a = PyMem_Realloc(l->a, (size_t)cap * sizeof(kv));
        if (a == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        l->a = a;
        l->cap = cap;
    }
    l->a[l->n].k = k;
    l->a[l->n].v = v;
    l->n++;
    return 0;
}

/* One KeyValue into l; required: both present (MessageMetadata's, which Pulsar's reader checks) or ""
 * when absent (SingleMessageMetadata's: upb does not check). Returns 0, -1 with f set, -2 Python error. */
static int
kv_parse(span m, kvlist *l, int required, fail *f)
{
    const uint8_t *p = m.p, *e = m.p + m.n;
    span key = {(const uint8_t *)"", 0}, val = {(const uint8_t *)"", 0};
    int has = 0;
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
            has |= num;
        } else if (skip_field(&p, e, wt, f) < 0) {
            return -1;
        }
    }
    if ((required && has != 3) || !utf8_ok(key.p, key.n) || !utf8_ok(val.p, val.n)) {
        f->code = CODE_UNSUPPORTED;
        f->reason = "a property to check in Python";
        return -1;
    }
    return kv_push(l, key, val) < 0 ? -2 : 0;
}

/* Properties l->a[start:] with a key given twice kept once, where it came first, with its last value
 * (decode_columns' dict(zip(keys, values)); Pulsar's MessageImpl.getProperties). */
static void
kv_dedupe(kvlist *l, Py_ssize_t start)
{
    Py_ssize_t n = l->n - start, out = start;
    if (n < 2)
        return;
    kv *a = l->a;
    for (Py_ssize_t i = start; i < l->n; i++) {
        Py_ssize_t j;
        for (j = start; j < out; j++)
            if (a[j].k.n == a[i].k.n && memcmp(a[j].k.p, a[i].k.p, (size_t)a[i].k.n) == 0)
                break;
        if (j < out)
            a[j].v = a[i].v; /* seen: the last value wins, the first place stays */
        else
            a[out++] = a[i];
    }
    l->n = out;
}

/* MessageMetadata's fields this reader takes; anything else it sends to Python. */
typedef struct {
    span producer, key, okey;
    uint64_t seq, pub, evt;
    uint32_t usize;
    int32_t nmb, chunks;
    int compression, has_producer, has_seq, has_pub, has_key, has_okey, has_nmb, null_key, has_usize, has_marker;
} mmeta;

/* wire types of MessageMetadata's fields 1..30 (-1: not a field) */
static const signed char MM_WT[31] = {-1, 2, 0, 0, 2, 2, 2, 2, 0, 0, -1, 0, 0, 2, 2, 2, 2, 0, 2, 0, 0,
                                      -1, 0, 0, 0, 0, 2, 0, 0, 0, 0};

static int
parse_mm(const uint8_t *p, const uint8_t *e, mmeta *m, kvlist *props, fail *f)
{
    memset(m, 0, sizeof *m);
    while (p < e) {
        uint32_t num;
        unsigned wt;
        uint64_t v = 0;
        span s;
        if (read_tag(&p, e, &num, &wt, f) < 0)
            return -1;
        if (num > 30 || MM_WT[num] < 0) {
            if (skip_field(&p, e, wt, f) < 0)
                return -1;
            continue;
        }
        if ((int)wt != MM_WT[num])
            WRONG_TYPE();
        if (wt == 0) {
            if (read_varint(&p, e, &v) < 0) {
                f->code = CODE_PARSE;
                f->reason = "malformed varint";
                return -1;
            }
        } else if (read_bytes(&p, e, &s, f) < 0) {
            return -1;
        }
        switch (num) {
        case 1: m->producer = s; m->has_producer = 1; break;
        case 2: m->seq = v; m->has_seq = 1; break;
        case 3: m->pub = v; m->has_pub = 1; break;
        case 4: {
            int r = kv_parse(s, props, 1, f);
            if (r < 0)
                return r;
            break;
        }
        case 6: m->key = s; m->has_key = 1; break;
        case 8:
            if (v > 4) { /* a codec this reader does not know: Python says so */
                f->code = CODE_UNSUPPORTED;
                f->reason = "unknown compression";
                return -1;
            }
            m->compression = (int)v;
            break;
        case 9: m->usize = (uint32_t)v; m->has_usize = 1; break;
        case 11: m->nmb = (int32_t)(uint32_t)v; m->has_nmb = 1; break;
        case 12: m->evt = v; break;
        case 13:
            f->code = CODE_UNSUPPORTED;
            f->reason = "encrypted";
            return -1;
        case 18: m->okey = s; m->has_okey = 1; break;
        case 20: m->has_marker = 1; break;
        case 27: m->chunks = (int32_t)(uint32_t)v; break;
        case 30: m->null_key = v != 0; break;
        default: break;
        }
    }
    if (!m->has_producer || !m->has_seq || !m->has_pub || m->chunks > 1 ||
        !utf8_ok(m->producer.p, m->producer.n) || (m->has_key && !utf8_ok(m->key.p, m->key.n))) {
        f->code = CODE_UNSUPPORTED;
        f->reason = "metadata to read in Python";
        return -1;
    }
    return 0;
}

/* SingleMessageMetadata into s, its properties into props; 0, -1 with f set, -2 Python error. */
static int
parse_smm(const uint8_t *p, const uint8_t *e, smm *s, kvlist *props, fail *f)
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
        case 1: {
            if (wt != 2)
                WRONG_TYPE();
            if (read_bytes(&p, e, &m, f) < 0)
                return -1;
            int r = kv_parse(m, props, 0, f);
            if (r < 0)
                return r;
            break;
        }
        case 2:
        case 7:
            if (wt != 2)
                WRONG_TYPE();
            if (read_bytes(&p, e, num == 2 ? &s->key : &s->okey, f) < 0)
                return -1;
            if (num == 2)
                s->has_key = 1;
            else
                s->has_okey = 1;
            break;
        case 3: case 4: case 5: case 6: case 8: case 9: case 10:
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
            } else if (num == 4) {
                s->compacted_out = v != 0;
            }
            break;
        default:
            if (skip_field(&p, e, wt, f) < 0)
                return -1;
        }
    }
    if (s->has_key && !utf8_ok(s->key.p, s->key.n)) {
        f->code = CODE_UNSUPPORTED;
        f->reason = "a key to check in Python";
        return -1;
    }
    return 0;
}

#define MS_LIMIT ((uint64_t)(INT64_MAX / 1000))
#define NBUF 22

/* the buffers, in the order columns() returns them */
enum {
    B_EID, B_BIDX, B_PUB, B_PUBV, B_EVT, B_EVTV, B_KOFF, B_KDATA, B_KV, B_OOFF, B_ODATA, B_OV,
    B_POFF, B_PDATA, B_SEQ, B_YOFF, B_YDATA, B_MOFF, B_MKOFF, B_MKDATA, B_MVOFF, B_MVDATA
};

typedef struct {
    gbuf b[NBUF];
    Py_ssize_t n;
} cols;

/* One message's fields. Returns 0 or -1 (Python error). */
static int
put_message(cols *c, int64_t eid, int32_t bidx, uint64_t pub, uint64_t evt, const span *key, const span *okey,
            span producer, uint64_t seq, span payload, const kvlist *props, Py_ssize_t pstart)
{
    gbuf *b = c->b;
    GB_PUT_VALUE(&b[B_EID], int64_t, eid);
    GB_PUT_VALUE(&b[B_BIDX], int32_t, bidx);
    GB_PUT_VALUE(&b[B_PUB], int64_t, pub <= MS_LIMIT ? (int64_t)pub * 1000 : 0);
    GB_PUT_VALUE(&b[B_PUBV], uint8_t, pub <= MS_LIMIT);
    GB_PUT_VALUE(&b[B_EVT], int64_t, evt && evt <= MS_LIMIT ? (int64_t)evt * 1000 : 0);
    GB_PUT_VALUE(&b[B_EVTV], uint8_t, evt && evt <= MS_LIMIT);
    if (key && gb_put(&b[B_KDATA], key->p, key->n) < 0)
        goto pyerror;
    GB_PUT_VALUE(&b[B_KOFF], int32_t, (int32_t)b[B_KDATA].n);
    GB_PUT_VALUE(&b[B_KV], uint8_t, key != NULL);
    if (okey && gb_put(&b[B_ODATA], okey->p, okey->n) < 0)
        goto pyerror;
    GB_PUT_VALUE(&b[B_OOFF], int32_t, (int32_t)b[B_ODATA].n);
    GB_PUT_VALUE(&b[B_OV], uint8_t, okey != NULL);
    if (gb_put(&b[B_PDATA], producer.p, producer.n) < 0)
        goto pyerror;
    GB_PUT_VALUE(&b[B_POFF], int32_t, (int32_t)b[B_PDATA].n);
    GB_PUT_VALUE(&b[B_SEQ], int64_t, (int64_t)seq); /* Java's long: uint64 read as two's complement */
    if (gb_put(&b[B_YDATA], payload.p, payload.n) < 0)
        goto pyerror;
    GB_PUT_VALUE(&b[B_YOFF], int32_t, (int32_t)b[B_YDATA].n);
    for (Py_ssize_t i = pstart; i < props->n; i++) {
        if (gb_put(&b[B_MKDATA], props->a[i].k.p, props->a[i].k.n) < 0 ||
            gb_put(&b[B_MVDATA], props->a[i].v.p, props->a[i].v.n) < 0)
            goto pyerror;
        GB_PUT_VALUE(&b[B_MKOFF], int32_t, (int32_t)b[B_MKDATA].n);
        GB_PUT_VALUE(&b[B_MVOFF], int32_t, (int32_t)b[B_MVDATA].n);
    }
    GB_PUT_VALUE(&b[B_MOFF], int32_t, (int32_t)(b[B_MKOFF].n / 4 - 1));
    c->n++;
    return 0;
pyerror:
    return -1;
}

/* One compaction item (items mode: tieredcore.formats.compacted.compaction_items' view of a message):
 * B_EID the entry's index, B_BIDX its batch index (-1: the entry whole), the key (NULL: none) in the key
 * buffers, and the size phase one tests in B_SEQ. Returns 0 or -1 (Python error). */
static int
put_item(cols *c, int64_t eid, int32_t bidx, const span *key, int64_t size)
{
    gbuf *b = c->b;
    GB_PUT_VALUE(&b[B_EID], int64_t, eid);
    GB_PUT_VALUE(&b[B_BIDX], int32_t, bidx);
    if (key && gb_put(&b[B_KDATA], key->p, key->n) < 0)
        goto pyerror;
    GB_PUT_VALUE(&b[B_KOFF], int32_t, (int32_t)b[B_KDATA].n);
    GB_PUT_VALUE(&b[B_KV], uint8_t, key != NULL);
    GB_PUT_VALUE(&b[B_SEQ], int64_t, size);
    c->n++;
    return 0;
pyerror:
    return -1;
}

/* the columns' state at a point, to drop what an entry appended when it turns out not to be taken */
typedef struct {
    Py_ssize_t len[NBUF], n;
} mark;

static void
cols_mark(const cols *c, mark *m)
{
    for (int i = 0; i < NBUF; i++)
        m->len[i] = c->b[i].n;
    m->n = c->n;
}

static void
cols_reset(cols *c, const mark *m)
{
    for (int i = 0; i < NBUF; i++)
        c->b[i].n = m->len[i];
    c->n = m->n;
}

static Py_ssize_t
seq_item(PyObject *fast, Py_ssize_t i)
{
    return PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i));
}

#define ENTRY_FAIL(c_, r_)  \
    do {                    \
        f.code = (c_);      \
        f.reason = (r_);    \
        goto entry_failed;  \
    } while (0)

static PyObject *
columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "columns takes 6 or 7 arguments");
        return NULL;
    }
    PyObject *bufobj = args[0], *inflate = args[5];
    Py_ssize_t index = PyLong_AsSsize_t(args[3]);
    int verify = PyObject_IsTrue(args[4]);
    int items = nargs == 7 ? PyObject_IsTrue(args[6]) : 0;
    if ((index == -1 || verify < 0 || items < 0) && PyErr_Occurred())
        return NULL;
    PyObject *starts = PySequence_Fast(args[1], "columns: starts must be a sequence");
    if (starts == NULL)
        return NULL;
    PyObject *lengths = PySequence_Fast(args[2], "columns: lengths must be a sequence");
    if (lengths == NULL) {
        Py_DECREF(starts);
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(starts);
    if (PySequence_Fast_GET_SIZE(lengths) != count || index < 0 || index > count) {
        Py_DECREF(starts);
        Py_DECREF(lengths);
        PyErr_SetString(PyExc_ValueError, "columns: starts and lengths differ in size, or a bad index");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(bufobj, &view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(starts);
        Py_DECREF(lengths);
        return NULL;
    }
    const uint8_t *base = (const uint8_t *)view.buf;
    cols c;
    memset(&c, 0, sizeof c);
    kvlist props = {NULL, 0, 0};
    PyObject *result = NULL;
    fail f = {NULL, CODE_OK};
    Py_ssize_t i = index;
    Py_ssize_t guess = count - index;
    for (int k = 0; k < NBUF; k++) {
        Py_ssize_t cap = (k == B_YDATA) ? view.len / 2 : (k == B_EID || k == B_PUB || k == B_EVT || k == B_SEQ) ? guess * 64 : guess * 16;
        if (gb_init(&c.b[k], cap) < 0)
            goto done;
    }
    GB_PUT_VALUE(&c.b[B_KOFF], int32_t, 0);
    GB_PUT_VALUE(&c.b[B_OOFF], int32_t, 0);
    GB_PUT_VALUE(&c.b[B_POFF], int32_t, 0);
    GB_PUT_VALUE(&c.b[B_YOFF], int32_t, 0);
    GB_PUT_VALUE(&c.b[B_MOFF], int32_t, 0);
    GB_PUT_VALUE(&c.b[B_MKOFF], int32_t, 0);
    GB_PUT_VALUE(&c.b[B_MVOFF], int32_t, 0);

    for (; i < count; i++) {
        Py_ssize_t s0 = seq_item(starts, i), len = seq_item(lengths, i);
        if ((s0 == -1 || len == -1) && PyErr_Occurred())
            goto done;
        if (s0 < 0 || len < 0 || s0 > view.len || len > view.len - s0) {
            PyErr_SetString(PyExc_ValueError, "columns: an entry outside the buffer");
            goto done;
        }
        mark before;
        cols_mark(&c, &before);
        PyObject *inflated = NULL;
        Py_buffer iview;
        int have_iview = 0;
        const uint8_t *p = base + s0, *e = p + len;
        if (e - p < 4)
            ENTRY_FAIL(CODE_FRAME, "short");
        uint16_t head = (uint16_t)((p[0] << 8) | p[1]);
        if (head == 0x0e02) { /* broker entry metadata: walked (it must parse), not kept */
            if (e - p < 6)
                ENTRY_FAIL(CODE_FRAME, "broker");
            uint32_t bsz = ((uint32_t)p[2] << 24) | ((uint32_t)p[3] << 16) | ((uint32_t)p[4] << 8) | p[5];
            if ((int64_t)bsz > (int64_t)(e - p) - 10)
                ENTRY_FAIL(CODE_FRAME, "broker");
            const uint8_t *q = p + 6, *qe = p + 6 + bsz;
            while (q < qe) {
                uint32_t num;
                unsigned wt;
                if (read_tag(&q, qe, &num, &wt, &f) < 0)
                    goto entry_failed;
                if ((num == 1 || num == 2) && wt != 0)
                    ENTRY_FAIL(CODE_UNSUPPORTED, "broker wire type");
                if (skip_field(&q, qe, wt, &f) < 0)
                    goto entry_failed;
            }
            p = qe;
            head = (uint16_t)((p[0] << 8) | p[1]);
        }
        uint32_t msize;
        if (head == 0x0e01) {
            if (e - p < 10)
                ENTRY_FAIL(CODE_FRAME, "checksum");
            uint32_t stored = ((uint32_t)p[2] << 24) | ((uint32_t)p[3] << 16) | ((uint32_t)p[4] << 8) | p[5];
            p += 6;
            if (verify && crc32c_of(p, (size_t)(e - p)) != stored)
                ENTRY_FAIL(CODE_FRAME, "checksum mismatch");
        }
        msize = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
        if ((int64_t)msize > (int64_t)(e - p) - 4)
            ENTRY_FAIL(CODE_FRAME, "metadata overruns");
        mmeta m;
        Py_ssize_t pstart = props.n = 0;
        {
            int r = parse_mm(p + 4, p + 4 + msize, &m, &props, &f);
            if (r == -2)
                goto done;
            if (r < 0)
                goto entry_failed;
        }
        span payload = {p + 4 + msize, e - (p + 4 + msize)};
        if (items && (m.has_marker || !m.has_nmb)) {
            /* a marker: no item; an entry that is no batch: one item, its key and size as stored */
            if (!m.has_marker && put_item(&c, i, -1, m.has_key ? &m.key : NULL,
                                          m.has_usize ? (int64_t)m.usize : (int64_t)payload.n) < 0)
                goto entry_pyerror;
            goto entry_ok;
        }
        if (items && !m.compression && (!m.has_usize || (Py_ssize_t)m.usize != payload.n))
            /* a batch whose size is not its metadata's: compaction_items' codec check, in Python */
            ENTRY_FAIL(CODE_UNSUPPORTED, "uncompressed size");
        if (m.compression) {
            PyObject *mv = PyMemoryView_FromMemory((char *)payload.p, payload.n, PyBUF_READ);
            if (mv == NULL)
                goto done;
            inflated = PyObject_CallFunction(inflate, "iOI", m.compression, mv, (unsigned int)m.usize);
            Py_DECREF(mv);
            if (inflated == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_Exception))
                    goto done;
                PyErr_Clear();
                ENTRY_FAIL(CODE_FRAME, "inflate");
            }
            if (PyObject_GetBuffer(inflated, &iview, PyBUF_SIMPLE) < 0) {
                PyErr_Clear();
                Py_DECREF(inflated);
                inflated = NULL;
                ENTRY_FAIL(CODE_UNSUPPORTED, "inflated buffer");
            }
            have_iview = 1;
            payload.p = (const uint8_t *)iview.buf;
            payload.n = iview.len;
        }
        if (!m.has_nmb) {
            kv_dedupe(&props, pstart);
            int null_key = !m.has_key || m.null_key;
            if (put_message(&c, i, -1, m.pub, m.evt, null_key ? NULL : &m.key, m.has_okey ? &m.okey : NULL,
                            m.producer, m.seq, payload, &props, pstart) < 0)
                goto entry_pyerror;
        } else {
            if (m.nmb <= 0)
                ENTRY_FAIL(CODE_FRAME, "batch count");
            const uint8_t *q = payload.p, *qe = payload.p + payload.n;
            for (int32_t k = 0; k < m.nmb; k++) {
                if (qe - q < 4)
                    ENTRY_FAIL(CODE_TRUNCATED, "truncated");
                uint32_t size = ((uint32_t)q[0] << 24) | ((uint32_t)q[1] << 16) | ((uint32_t)q[2] << 8) | q[3];
                q += 4;
                if ((int64_t)size > (int64_t)(qe - q))
                    ENTRY_FAIL(CODE_META_OVERRUN, "metadata overruns");
                smm s;
                props.n = 0;
                int r = parse_smm(q, q + size, &s, &props, &f);
                if (r == -2)
                    goto entry_pyerror;
                if (r < 0)
                    goto entry_failed;
                kv_dedupe(&props, 0);
                q += size;
                if (!s.has_ps)
                    ENTRY_FAIL(CODE_NO_PAYLOAD_SIZE, "no payload_size");
                if (s.payload_size < 0 || s.payload_size > qe - q)
                    ENTRY_FAIL(CODE_PAYLOAD_OVERRUN, "payload overruns");
                span body = {q, s.payload_size};
                int null_key = !s.has_key || s.null_key;
                if (items) {
                    if (!s.compacted_out && put_item(&c, i, k, s.has_key ? &s.key : NULL, s.payload_size) < 0)
                        goto entry_pyerror;
                } else if (put_message(&c, i, k, m.pub, s.has_evt ? s.evt : m.evt, null_key ? NULL : &s.key,
                                s.has_okey ? &s.okey : NULL, m.producer,
                                s.has_seq ? s.seq : m.seq + (uint64_t)k, body, &props, 0) < 0)
                    goto entry_pyerror;
                q += s.payload_size;
            }
        }
    entry_ok:
        if (have_iview)
            PyBuffer_Release(&iview);
        Py_XDECREF(inflated);
        if (c.b[B_KDATA].n > INT32_MAX || c.b[B_ODATA].n > INT32_MAX || c.b[B_PDATA].n > INT32_MAX ||
            c.b[B_YDATA].n > INT32_MAX || c.b[B_MKDATA].n > INT32_MAX || c.b[B_MVDATA].n > INT32_MAX) {
            /* past 32-bit offsets: this entry starts the next call (alone: left to Python) */
            cols_reset(&c, &before);
            f.code = c.n ? CODE_LIMIT : CODE_UNSUPPORTED;
            f.reason = "past 32-bit offsets";
            break;
        }
        continue;
    entry_pyerror:
        if (have_iview)
            PyBuffer_Release(&iview);
        Py_XDECREF(inflated);
        goto done;
    entry_failed:
        if (have_iview)
            PyBuffer_Release(&iview);
        Py_XDECREF(inflated);
        cols_reset(&c, &before);
        break;
    }
    {
        PyObject *bufs = PyTuple_New(NBUF);
        if (bufs == NULL)
            goto done;
        for (int k = 0; k < NBUF; k++) {
            if (PyByteArray_Resize(c.b[k].ba, c.b[k].n) < 0) {
                Py_DECREF(bufs);
                goto done;
            }
            PyTuple_SET_ITEM(bufs, k, c.b[k].ba);
            c.b[k].ba = NULL;
        }
        result = Py_BuildValue("(nisnN)", i, f.code, f.reason ? f.reason : "", c.n, bufs);
    }
    goto done;
pyerror:
done:
    for (int k = 0; k < NBUF; k++)
        Py_XDECREF(c.b[k].ba);
    PyMem_Free(props.a);
    PyBuffer_Release(&view);
    Py_DECREF(starts);
    Py_DECREF(lengths);
    return result;
}


/* ---- frames: the offload reader's walk over [int32 length][int64 entry id][payload] frames ----------
 *
 * frames(buf, rel, eid, stop, lim) -> (rel, eid, lengths)
 *
 * tieredcore.offload.reader._frames_in's loop: frames of entries eid..stop from buf[rel:] while each
 * frame's id is the next one and its length is 0 <= length <= lim - rel (so the next header lies inside
 * buf: the caller's lim is at most len(buf) - 24 and rel + 12 <= len(buf) on entry). Returns where it
 * stopped, the entry id there, and the lengths taken as native int32s (array('i').frombytes).
 */
static PyObject *
frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "frames takes 5 arguments");
        return NULL;
    }
    Py_ssize_t rel = PyLong_AsSsize_t(args[1]);
    long long eid = PyLong_AsLongLong(args[2]), stop = PyLong_AsLongLong(args[3]);
    Py_ssize_t lim = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (rel < 0 || rel + 12 > view.len || lim > view.len - 24) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "frames: rel or lim outside the buffer");
        return NULL;
    }
    const uint8_t *b = (const uint8_t *)view.buf;
    Py_ssize_t cap = stop >= eid ? (Py_ssize_t)(stop - eid + 1) : 0;
    Py_ssize_t most = (view.len - rel) / 12 + 1;
    if (cap > most)
        cap = most;
    PyObject *out = PyBytes_FromStringAndSize(NULL, cap * 4);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int32_t *lengths = (int32_t *)PyBytes_AS_STRING(out);
    Py_ssize_t n = 0;
    for (; eid <= stop && n < cap; eid++) {
        const uint8_t *h = b + rel;
        int32_t length = (int32_t)(((uint32_t)h[0] << 24) | ((uint32_t)h[1] << 16) | ((uint32_t)h[2] << 8) | h[3]);
        uint64_t id = 0;
        for (int k = 4; k < 12; k++)
            id = (id << 8) | h[k];
        if ((long long)id != eid || length < 0 || length > lim - rel)
            break;
        lengths[n++] = length;
        rel += 12 + length;
    }
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&out, n * 4) < 0)
        return NULL;
    return Py_BuildValue("(nLN)", rel, eid, out);
}

/* ---- rebatch: topic compaction's phase two over one batch ---------------------------------------------
 *
 * rebatch(raw, count, kept, retain_null_key) -> (code, body or None, retained)
 *
 * The loop of tieredcore.formats.compacted.rebatch over an inflated batch ``raw`` of ``count`` messages:
 * message i is retained (its [size][SingleMessageMetadata][payload] as it was) when it is not compacted_out
 * and either has no partition_key and retain_null_key, or has one, i is in ``kept`` (a bytes object of
 * sorted native int32 batch indexes: the positions of retained values) and its payload is not empty; any
 * other message becomes the placeholder [4][payload_size = 0, compacted_out = true]. body is None when no
 * message is retained. The Python loop re-serializes a retained message's metadata; a copy is the same
 * bytes only when they are what upb writes, so this reader takes only that (known fields of their wire
 * types in field-number order, only properties repeated, each KeyValue exactly key then value, varints and
 * lengths in their fewest bytes, bools 0 or 1, payload_size an int32 >= 0): anything else, and any damage,
 * is code UNSUPPORTED, left to the Python loop (which raises the exact error or writes it).
 */

/* a varint in its fewest bytes (what an encoder writes) */
static inline int
read_min_varint(const uint8_t **pp, const uint8_t *e, uint64_t *v)
{
    const uint8_t *p0 = *pp;
    if (read_varint(pp, e, v) < 0)
        return -1;
    Py_ssize_t n = *pp - p0;
    return (n > 1 && (*pp)[-1] == 0) ? -1 : 0;
}

static int
keyvalue_canonical(const uint8_t *p, const uint8_t *e)
{
    uint64_t v;
    for (int f = 1; f <= 2; f++) {
        if (p >= e || *p != (uint8_t)(f << 3 | 2))
            return 0;
        p++;
        if (read_min_varint(&p, e, &v) < 0 || v > (uint64_t)(e - p))
            return 0;
        p += v;
    }
    return p == e;
}

/* 1: the metadata is canonical (*has_key, *psize, *cout set); 0: not, or damaged */
static int
smm_canonical(const uint8_t *p, const uint8_t *e, int *has_key, int64_t *psize, int *cout)
{
    static const signed char WT[11] = {-1, 2, 2, 0, 0, 0, 0, 2, 0, 0, 0};
    uint32_t last = 0;
    int has_ps = 0;
    *has_key = *cout = 0;
    *psize = 0;
    while (p < e) {
        uint64_t t, v;
        if (read_min_varint(&p, e, &t) < 0 || t > 0xffffffffu)
            return 0;
        uint32_t num = (uint32_t)(t >> 3);
        unsigned wt = (unsigned)(t & 7);
        if (num < 1 || num > 10 || (int)wt != WT[num] || num < last || (num == last && num != 1))
            return 0;
        last = num;
        if (read_min_varint(&p, e, &v) < 0)
            return 0;
        if (wt == 2) {
            if (v > (uint64_t)(e - p))
                return 0;
            if (num == 1 && !keyvalue_canonical(p, p + v))
                return 0;
            if (num == 2)
                *has_key = 1;
            p += v;
            continue;
        }
        switch (num) {
        case 3:
            if (v > INT32_MAX)
                return 0;
            *psize = (int64_t)v;
            has_ps = 1;
            break;
        case 4: case 6: case 9: case 10:
            if (v > 1)
                return 0;
            if (num == 4)
                *cout = (int)v;
            break;
        default:
            break; /* 5, 8: uint64 */
        }
    }
    return has_ps;
}

static PyObject *
rebatch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "rebatch takes 4 arguments");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    int retain_null = PyObject_IsTrue(args[3]);
    if ((count == -1 || retain_null < 0) && PyErr_Occurred())
        return NULL;
    Py_buffer view, kview;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[2], &kview, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    static const uint8_t PLACEHOLDER[8] = {0, 0, 0, 4, 0x18, 0x00, 0x20, 0x01};
    const int32_t *kept = (const int32_t *)kview.buf;
    Py_ssize_t nkept = kview.len / 4, ki = 0;
    const uint8_t *q = (const uint8_t *)view.buf, *qe = q + view.len;
    gbuf out = {NULL, NULL, 0, 0};
    PyObject *result = NULL;
    Py_ssize_t retained = 0;
    int code = CODE_OK;
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "rebatch: a negative count");
        goto failed;
    }
    if (gb_init(&out, view.len + 8 * (count < 1024 ? count : 1024)) < 0)
        goto failed;
    for (Py_ssize_t k = 0; k < count; k++) {
        if (qe - q < 4) {
            code = CODE_UNSUPPORTED;
            break;
        }
        uint32_t size = ((uint32_t)q[0] << 24) | ((uint32_t)q[1] << 16) | ((uint32_t)q[2] << 8) | q[3];
        const uint8_t *m = q + 4;
        int has_key, cout;
        int64_t psize;
        if ((int64_t)size > (int64_t)(qe - m) || !smm_canonical(m, m + size, &has_key, &psize, &cout) ||
            psize > (int64_t)(qe - (m + size))) {
            code = CODE_UNSUPPORTED;
            break;
        }
        const uint8_t *next = m + size + psize;
        while (ki < nkept && kept[ki] < k)
            ki++;
        int take;
        if (cout)
            take = 0;
        else if (!has_key)
            take = retain_null;
        else
            take = ki < nkept && kept[ki] == k && psize > 0;
        if (take) {
            retained++;
            if (gb_put(&out, q, next - q) < 0)
                goto failed;
        } else if (gb_put(&out, PLACEHOLDER, sizeof PLACEHOLDER) < 0) {
            goto failed;
        }
        q = next;
    }
    if (code != CODE_OK || !retained) {
        result = Py_BuildValue("(iOn)", code, Py_None, retained);
    } else if (PyByteArray_Resize(out.ba, out.n) == 0) {
        PyObject *body = PyBytes_FromStringAndSize(PyByteArray_AS_STRING(out.ba), out.n);
        if (body != NULL)
            result = Py_BuildValue("(iNn)", code, body, retained);
    }
failed:
    Py_XDECREF(out.ba);
    PyBuffer_Release(&kview);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"columns", (PyCFunction)(void (*)(void))columns, METH_FASTCALL,
     "columns(buf, starts, lengths, index, verify, inflate[, items]) -> (stop, code, reason, n, buffers): "
     "entries index.. of an EntryBatch into Arrow buffers (see tieredcore.query.rows.message_batches); with "
     "items, topic compaction's items instead (see tieredcore.query.rows.compaction_item_batches)."},
    {"rebatch", (PyCFunction)(void (*)(void))rebatch, METH_FASTCALL,
     "rebatch(raw, count, kept, retain_null_key) -> (code, body or None, retained): topic compaction's "
     "rewrite of one inflated batch (see tieredcore.formats.compacted.rewrite_entry_at)."},
    {"frames", (PyCFunction)(void (*)(void))frames, METH_FASTCALL,
     "frames(buf, rel, eid, stop, lim) -> (rel, eid, lengths): the offload reader's frame walk "
     "(see tieredcore.offload.reader._frames_in)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tieredcore.formats.cbatch",
    "The readers' per-entry and per-message loops, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit_cbatch(void)
{
    crc_init();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "TRUNCATED", CODE_TRUNCATED) < 0 ||
        PyModule_AddIntConstant(m, "META_OVERRUN", CODE_META_OVERRUN) < 0 ||
        PyModule_AddIntConstant(m, "PARSE", CODE_PARSE) < 0 ||
        PyModule_AddIntConstant(m, "NO_PAYLOAD_SIZE", CODE_NO_PAYLOAD_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "PAYLOAD_OVERRUN", CODE_PAYLOAD_OVERRUN) < 0 ||
        PyModule_AddIntConstant(m, "UNSUPPORTED", CODE_UNSUPPORTED) < 0 ||
        PyModule_AddIntConstant(m, "LIMIT", CODE_LIMIT) < 0 || PyModule_AddIntConstant(m, "FRAME", CODE_FRAME) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
