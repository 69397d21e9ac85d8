/* Per-request token times (tokens.h). */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "tokens.h"

typedef struct { double *v; long n, cap; } tok_buf;

struct kv_tokens {
    tok_buf *slot; long nslot;    /* the times of the request in each slot, so far */
    tok_buf span;                 /* a decode span's step ends */
    tok_buf all;                  /* the requests that left, one after another */
    long *ids, *counts; long nreq, req_cap;
};

static int buf_grow(tok_buf *b, long more) {
    if (b->n + more <= b->cap) return 0;
    long nc = b->cap ? 2 * b->cap : 64;
    while (nc < b->n + more) nc *= 2;
    double *v = realloc(b->v, sizeof(double) * (size_t)nc);
    if (!v) return KV_NOMEM;
    b->v = v; b->cap = nc;
    return 0;
}

kv_tokens *kv_tok_new(void) { return calloc(1, sizeof(kv_tokens)); }

void kv_tok_free(kv_tokens *t) {
    if (!t) return;
    for (long i = 0; i < t->nslot; i++) free(t->slot[i].v);
    free(t->slot); free(t->span.v); free(t->all.v); free(t->ids); free(t->counts);
    free(t);
}

static tok_buf *slot_buf(kv_tokens *t, long slot) {
    if (slot >= t->nslot) {
        long nc = t->nslot ? 2 * t->nslot : 256;
        while (nc <= slot) nc *= 2;
        tok_buf *s = realloc(t->slot, sizeof(tok_buf) * (size_t)nc);
        if (!s) return NULL;
        memset(s + t->nslot, 0, sizeof(tok_buf) * (size_t)(nc - t->nslot));
        t->slot = s; t->nslot = nc;
    }
    return &t->slot[slot];
}

int kv_tok_put(kv_tokens *t, long slot, double at, long count) {
    tok_buf *b = slot_buf(t, slot);
    if (!b || buf_grow(b, count)) return KV_NOMEM;
    for (long k = 0; k < count; k++) b->v[b->n++] = at;
    return 0;
}

int kv_tok_span_step(kv_tokens *t, double at) {
    if (buf_grow(&t->span, 1)) return KV_NOMEM;
    t->span.v[t->span.n++] = at;
    return 0;
}

int kv_tok_span_apply(kv_tokens *t, long slot) {
    long n = t->span.n;
    if (!n) return 0;
    tok_buf *b = slot_buf(t, slot);
    if (!b || buf_grow(b, n)) return KV_NOMEM;
    memcpy(b->v + b->n, t->span.v, sizeof(double) * (size_t)n);
    b->n += n;
    return 0;
}

void kv_tok_span_end(kv_tokens *t) { t->span.n = 0; }

int kv_tok_leave(kv_tokens *t, long slot, long id) {
    tok_buf *b = slot_buf(t, slot);
    if (!b) return KV_NOMEM;
    if (!b->n) return 0;  /* no token (never here: a request leaves after its last) */
    if (t->nreq == t->req_cap) {
        long nc = t->req_cap ? 2 * t->req_cap : 1024;
        long *ids = realloc(t->ids, sizeof(long) * (size_t)nc);
        if (!ids) return KV_NOMEM;
        t->ids = ids;
        long *counts = realloc(t->counts, sizeof(long) * (size_t)nc);
        if (!counts) return KV_NOMEM;
        t->counts = counts; t->req_cap = nc;
    }
    if (buf_grow(&t->all, b->n)) return KV_NOMEM;
    memcpy(t->all.v + t->all.n, b->v, sizeof(double) * (size_t)b->n);
    t->all.n += b->n;
    t->ids[t->nreq] = id; t->counts[t->nreq++] = b->n;
    free(b->v); b->v = NULL; b->n = b->cap = 0;  /* only requests in flight hold a buffer */
    return 0;
}

long kv_tok_table(const kv_tokens *t, long *ntimes, long *ids, long *counts, double *times) {
    if (ntimes) *ntimes = t ? t->all.n : 0;
    if (!t) return 0;
    if (ids && t->nreq) memcpy(ids, t->ids, sizeof(long) * (size_t)t->nreq);
    if (counts && t->nreq) memcpy(counts, t->counts, sizeof(long) * (size_t)t->nreq);
    if (times && t->all.n) memcpy(times, t->all.v, sizeof(double) * (size_t)t->all.n);
    return t->nreq;
}
