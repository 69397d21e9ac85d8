/* Step pricing in C: see pricing.h. Each function below names the Python it mirrors
   (simcore/latency.py); the arithmetic is written in Python's order, one IEEE operation at a time.

   Blob layout (float64; counts are whole numbers):
     magic, abi, num_layers,
     host: per_step_ms, per_seq_ms, per_prefill_step_ms, per_prefill_token_ms,
     prefill_ratio (StepLatencyModel.prefill_ratio: 1.0 unless an error band scaled the phases apart),
     collectives: mode (0 none, 1 all_reduce per call vs bytes, 2 v1 `collective` per layer vs
                  tokens), calls_per_layer, token_bytes, logit_bytes,
     occupancy: present (0/1), tile_tokens, ctas_per_tile, num_sms, launch_floor_ms,
     tables: linear, lm_head, [collective table if mode != 0] (1-D), prefill, decode (2-D)
       1-D: n, lo, hi, log(x)[n], log(monotone y)[n]                       (Table1D.lx, .ly)
       2-D: na, nb, a_lo, a_hi, b_lo, b_hi, log(a)[na], log1p(b)[nb], z[na][nb] (Table2D.la, .lb, .lz)
     ASYNC (ABI 3): hidden_per_step_ms, hidden_per_seq_ms (HostOverhead's CPU work overlapped with the
                    GPU under async scheduling; both 0: none)
   The logarithms of the grids are Python's, so C never recomputes them. */
#include "pricing.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GRID 1000000L
#define A_MEMO 1024       /* per 2-D table: a's segment and weight, direct-mapped by a (power of two) */
#define SHAPE_MEMO 2048   /* a step shape's GEMM, collectives and host ms, direct-mapped (power of two) */

/* What depends on a alone (Table2D._a_terms): kept, never different from working it out again. */
typedef struct {
    long a;  /* 0: empty (only a > 0 is kept) */
    long i, i1;
    double s;
} a_terms;

/* StepLatencyModel.fixed_parts_ms of one step shape, kept as Python keeps it (_fixed_memo). */
typedef struct {
    long key[4];  /* num_tokens, num_decode_seqs, num_chunks, num_sampled */
    double gemm, coll, host;
    int linear_out, valid;
} shape_terms;

typedef struct {
    long n;
    double lo, hi;
    const double *lx, *ly;
} table1d;

typedef struct {
    long na, nb;
    double a_lo, a_hi, b_lo, b_hi;
    const double *la, *lb, *lz;  /* lz row-major: lz[i * nb + j] */
    double *dlb;                 /* lb[j + 1] - lb[j], nb - 1 of them (Table2D._dlb) */
    double *dlz;                 /* each row's steps, its last one 0.0 (Table2D._dlz) */
    a_terms *memo;               /* A_MEMO slots, written by t2_call (the table itself is const) */
} table2d;

struct kv_pricing {
    double num_layers;
    double per_step_ms, per_seq_ms, per_prefill_step_ms, per_prefill_token_ms;
    double prefill_ratio;
    double hidden_per_step_ms, hidden_per_seq_ms;  /* ASYNC */
    int has_hidden;                                /* ASYNC: HostOverhead.overlaps */
    int cold;  /* ASYNC: StepLatencyModel.cold, the step follows an idle engine (kv_pricing_set_cold) */
    int coll_mode;
    double calls_per_layer, token_bytes, logit_bytes;
    int has_occupancy;
    double tile, ctas, sms, floor_ms;
    table1d linear, lm_head, coll;
    table2d prefill, decode;
    double *store;  /* the blob's copy, then the 2-D tables' differences */
    shape_terms *shapes;  /* SHAPE_MEMO slots, written by kv_step_parts */
    a_terms *a_memo;      /* both 2-D tables' memo slots, one allocation */
};

long kv_pricing_abi(void) { return KV_PRICING_ABI; }

/* --- Python's building blocks ------------------------------------------------------------- */

/* bisect.bisect_right(a, x, lo, hi) */
static long bisect_right(const double *a, double x, long lo, long hi) {
    while (lo < hi) {
        long mid = (lo + hi) / 2;
        if (x < a[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* math.log1p (CPython returns a zero argument itself, keeping its sign) */
static double py_log1p(double x) { return x == 0.0 ? x : log1p(x); }

/* Table1D.__call__ / _eval */
static double t1_call(const table1d *t, double x) {
    if (!(x > 0))
        return 0.0;
    if (t->n == 1)
        return exp(t->ly[0]) * x / t->lo;
    double v = log(x);
    long i = bisect_right(t->lx, v, 1, t->n - 1) - 1;
    double s = (v - t->lx[i]) / (t->lx[i + 1] - t->lx[i]);
    return exp(t->ly[i] + s * (t->ly[i + 1] - t->ly[i]));
}

/* Table1D.outside */
static int t1_outside(const table1d *t, double x) { return x > 0 && (x < t->lo || x > t->hi); }

/* Table2D.__call__ (with _a_terms and _locate) */
static double t2_call(const table2d *t, long a, double b) {
    if (a <= 0)
        return 0.0;
    a_terms *m = &t->memo[(unsigned long)a & (A_MEMO - 1)];
    if (m->a != a) {
        long i = 0;
        double s = 0.0;
        if (t->na > 1) {
            double va = log((double)a);
            i = bisect_right(t->la, va, 0, t->na) - 1;
            if (i < 0)
                i = 0;
            if (i > t->na - 2)
                i = t->na - 2;
            s = (va - t->la[i]) / (t->la[i + 1] - t->la[i]);
        }
        m->a = a;
        m->i = i;
        m->i1 = i + 1 < t->na - 1 ? i + 1 : t->na - 1;
        m->s = s;
    }
    long i = m->i, i1 = m->i1;
    double s = m->s;
    double v = py_log1p(b);
    long j = 0;
    double u = 0.0;
    if (t->nb > 1) {
        j = bisect_right(t->lb, v, 1, t->nb - 1) - 1;
        u = (v - t->lb[j]) / t->dlb[j];
    }
    double top = t->lz[i * t->nb + j] + u * t->dlz[i * t->nb + j];
    double bot = t->lz[i1 * t->nb + j] + u * t->dlz[i1 * t->nb + j];
    return exp(top + s * (bot - top));
}

/* Table2D.outside */
static int t2_outside(const table2d *t, double a, double b) {
    return !(t->a_lo <= a && a <= t->a_hi && t->b_lo <= b && b <= t->b_hi);
}

/* --- the blob ----------------------------------------------------------------------------- */

typedef struct {
    const double *v;
    long len, pos;
    int bad;
} reader;

static double take(reader *r) {
    if (r->pos >= r->len) {
        r->bad = 1;
        return 0.0;
    }
    return r->v[r->pos++];
}

static long take_count(reader *r) {
    double x = take(r);
    if (!(x >= 1 && x <= MAX_GRID) || x != floor(x)) {
        r->bad = 1;
        return 1;
    }
    return (long)x;
}

static const double *take_array(reader *r, long n) {
    if (r->bad || n > r->len - r->pos) {
        r->bad = 1;
        return r->v;
    }
    const double *out = r->v + r->pos;
    r->pos += n;
    return out;
}

static void read_t1(reader *r, table1d *t) {
    t->n = take_count(r);
    t->lo = take(r);
    t->hi = take(r);
    t->lx = take_array(r, t->n);
    t->ly = take_array(r, t->n);
}

static void read_t2(reader *r, table2d *t) {
    t->na = take_count(r);
    t->nb = take_count(r);
    t->a_lo = take(r);
    t->a_hi = take(r);
    t->b_lo = take(r);
    t->b_hi = take(r);
    t->la = take_array(r, t->na);
    t->lb = take_array(r, t->nb);
    if (!r->bad && t->na > MAX_GRID / t->nb)
        r->bad = 1;
    t->lz = take_array(r, r->bad ? 0 : t->na * t->nb);
}

/* The differences Table2D.__init__ keeps (_dlb, _dlz), into `mem`; returns the doubles used. */
static long fill_t2(table2d *t, double *mem) {
    long nb = t->nb;
    t->dlb = mem;
    for (long j = 0; j + 1 < nb; j++)
        t->dlb[j] = t->lb[j + 1] - t->lb[j];
    t->dlz = mem + nb;
    for (long i = 0; i < t->na; i++) {
        const double *row = t->lz + i * nb;
        for (long j = 0; j + 1 < nb; j++)
            t->dlz[i * nb + j] = row[j + 1] - row[j];
        t->dlz[i * nb + nb - 1] = 0.0;
    }
    return nb + t->na * nb;
}

/* Reads the blob into p (its arrays pointing into `v`); 0 if malformed. */
static int parse(kv_pricing *p, const double *v, long len) {
    reader r = {v, len, 2, 0};
    p->num_layers = take(&r);
    p->per_step_ms = take(&r);
    p->per_seq_ms = take(&r);
    p->per_prefill_step_ms = take(&r);
    p->per_prefill_token_ms = take(&r);
    p->prefill_ratio = take(&r);
    double mode = take(&r);
    p->calls_per_layer = take(&r);
    p->token_bytes = take(&r);
    p->logit_bytes = take(&r);
    double occ = take(&r);
    p->tile = take(&r);
    p->ctas = take(&r);
    p->sms = take(&r);
    p->floor_ms = take(&r);
    if (!(mode == 0.0 || mode == 1.0 || mode == 2.0) || !(occ == 0.0 || occ == 1.0)
        || !(p->prefill_ratio > 0.0 && p->prefill_ratio < INFINITY))
        return 0;
    p->coll_mode = (int)mode;
    p->has_occupancy = occ == 1.0;
    read_t1(&r, &p->linear);
    read_t1(&r, &p->lm_head);
    if (p->coll_mode != 0)
        read_t1(&r, &p->coll);
    read_t2(&r, &p->prefill);
    read_t2(&r, &p->decode);
    p->hidden_per_step_ms = take(&r);  /* ASYNC */
    p->hidden_per_seq_ms = take(&r);
    p->has_hidden = p->hidden_per_step_ms != 0.0 || p->hidden_per_seq_ms != 0.0;
    return !r.bad && r.pos == len;
}

kv_pricing *kv_pricing_new(const double *blob, long len) {
    if (blob == NULL || len < 3 || blob[0] != KV_BLOB_MAGIC || blob[1] != (double)KV_PRICING_ABI)
        return NULL;
    kv_pricing *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    if (!parse(p, blob, len)) {  /* validate (and size the differences) on the caller's blob */
        free(p);
        return NULL;
    }
    long extra = p->prefill.nb * (1 + p->prefill.na) + p->decode.nb * (1 + p->decode.na);
    p->store = malloc((size_t)(len + extra) * sizeof *p->store);
    p->shapes = calloc(SHAPE_MEMO, sizeof *p->shapes);
    p->a_memo = calloc(2 * A_MEMO, sizeof *p->a_memo);
    if (p->store == NULL || p->shapes == NULL || p->a_memo == NULL) {
        kv_pricing_free(p);
        return NULL;
    }
    memcpy(p->store, blob, (size_t)len * sizeof *p->store);
    parse(p, p->store, len);  /* the same blob again: now pointing into our copy */
    long used = fill_t2(&p->prefill, p->store + len);
    fill_t2(&p->decode, p->store + len + used);
    p->prefill.memo = p->a_memo;
    p->decode.memo = p->a_memo + A_MEMO;
    return p;
}

void kv_pricing_free(kv_pricing *p) {
    if (p != NULL) {
        free(p->store);
        free(p->shapes);
        free(p->a_memo);
        free(p);
    }
}

/* --- a step ------------------------------------------------------------------------------- */

/* HostOverhead.ms */
static double host_ms(const kv_pricing *p, long num_seqs, long num_prefill_tokens) {
    double ms = p->per_step_ms + p->per_seq_ms * (double)num_seqs;
    if (num_prefill_tokens != 0)
        ms += p->per_prefill_step_ms + p->per_prefill_token_ms * (double)num_prefill_tokens;
    return ms;
}

/* ASYNC: StepLatencyModel.excess_ms, the hidden CPU work's excess over the GPU's step (0 if none),
   all of it after an idle engine (cold) */
static double hidden_excess(const kv_pricing *p, long num_seqs, double gpu_ms) {
    double excess = (p->hidden_per_step_ms + p->hidden_per_seq_ms * (double)num_seqs) - (p->cold ? 0.0 : gpu_ms);
    return excess > 0.0 ? excess : 0.0;
}

/* StepLatencyModel.collectives_ms */
static double collectives_ms(const kv_pricing *p, long num_tokens, long num_sampled) {
    double ms = 0.0;
    if (p->coll_mode == 1) {
        ms = p->num_layers * p->calls_per_layer * t1_call(&p->coll, (double)num_tokens * p->token_bytes);
        if (num_sampled != 0)
            ms += t1_call(&p->coll, (double)num_sampled * p->logit_bytes / 2.0);
    } else if (p->coll_mode == 2) {
        ms = p->num_layers * t1_call(&p->coll, (double)num_tokens);
    }
    return ms;
}

/* PrefillOccupancy.share */
static double occupancy_share(const kv_pricing *p, long num_chunks, const long *chunk_tokens) {
    double tiles = 0.0;  /* a whole number, as Python's int */
    for (long k = 0; k < num_chunks; k++)
        tiles += ceil((double)chunk_tokens[k] / p->tile);
    double ctas = tiles * p->ctas;
    return ctas / (ceil(ctas / p->sms) * p->sms);
}

/* One layer's attention as a step's parts work it out (before the num_layers factor):
   SpeculativeStepCost._attention_ms too. Returns KV_OUT_PREFILL / KV_OUT_DECODE bits. */
static int attention_parts(const kv_pricing *p, long num_chunks, const long *chunk_tokens, const long *chunk_context,
                           long num_decode_seqs, long decode_context_tokens, double *ms_out, long *prefill_out) {
    int mask = 0;
    long prefill_outside = 0;
    double ms = 0.0;
    if (num_chunks > 0) {
        for (long k = 0; k < num_chunks; k++) {
            ms += t2_call(&p->prefill, chunk_tokens[k], (double)chunk_context[k]);
            if (t2_outside(&p->prefill, (double)chunk_tokens[k], (double)chunk_context[k]))
                prefill_outside++;
        }
        if (p->has_occupancy)
            ms = p->floor_ms + ms / occupancy_share(p, num_chunks, chunk_tokens);
    }
    if (num_decode_seqs != 0) {
        double mean_ctx = (double)decode_context_tokens / (double)num_decode_seqs;
        ms += t2_call(&p->decode, num_decode_seqs, mean_ctx);
        if (t2_outside(&p->decode, (double)num_decode_seqs, mean_ctx))
            mask |= KV_OUT_DECODE;
    }
    if (prefill_outside)
        mask |= KV_OUT_PREFILL;
    *ms_out = ms;
    *prefill_out = prefill_outside;
    return mask;
}

/* StepLatencyModel._parts_ms's factor of a step with prompt tokens (1.0: none, or phases not apart) */
static double prefill_factor(const kv_pricing *p, long num_prefill_tokens, long num_tokens) {
    if (p->prefill_ratio == 1.0 || num_prefill_tokens <= 0)
        return 1.0;
    return 1.0 + (p->prefill_ratio - 1.0) * ((double)num_prefill_tokens / (double)num_tokens);
}

/* StepLatencyModel._parts_ms (with fixed_parts_ms) */
int kv_step_parts(const kv_pricing *p, long num_tokens, long num_chunks, const long *chunk_tokens,
                  const long *chunk_context, long num_decode_seqs, long decode_context_tokens,
                  long num_sampled, double out[4], long *prefill_out) {
    unsigned long h = (unsigned long)num_tokens * 2654435761UL + (unsigned long)num_decode_seqs * 40503UL
                      + (unsigned long)num_chunks * 97UL + (unsigned long)num_sampled * 7919UL;
    shape_terms *f = &p->shapes[(h ^ (h >> 13)) & (SHAPE_MEMO - 1)];
    long key[4] = {num_tokens, num_decode_seqs, num_chunks, num_sampled};
    if (!f->valid || memcmp(f->key, key, sizeof key) != 0) {
        f->gemm = p->num_layers * t1_call(&p->linear, (double)num_tokens) + t1_call(&p->lm_head, (double)num_sampled);
        f->coll = collectives_ms(p, num_tokens, num_sampled);
        f->host = host_ms(p, num_chunks + num_decode_seqs, num_tokens - num_decode_seqs);
        f->linear_out = t1_outside(&p->linear, (double)num_tokens);
        memcpy(f->key, key, sizeof key);
        f->valid = 1;
    }
    out[0] = f->gemm;
    out[2] = f->coll;
    out[3] = f->host;
    long prefill_outside = 0;
    double ms = 0.0;
    int mask = (f->linear_out ? KV_OUT_LINEAR : 0)
               | attention_parts(p, num_chunks, chunk_tokens, chunk_context, num_decode_seqs,
                                 decode_context_tokens, &ms, &prefill_outside);
    out[1] = p->num_layers * ms;
    if (p->has_hidden)  /* ASYNC: host + max(0, hidden - GPU) */
        out[3] = f->host + hidden_excess(p, num_chunks + num_decode_seqs, out[0] + out[1] + out[2]);
    if (p->prefill_ratio != 1.0 && num_tokens > num_decode_seqs) {
        double m = prefill_factor(p, num_tokens - num_decode_seqs, num_tokens);
        out[0] *= m;
        out[1] *= m;
        out[2] *= m;
        out[3] *= m;
    }
    if (prefill_out != NULL)
        *prefill_out = prefill_outside;
    return mask;
}

/* --- building blocks for csrc/spec.c (a speculative step is priced from the same tables) --- */

double kv_p_layers(const kv_pricing *p) { return p->num_layers; }
double kv_p_linear(const kv_pricing *p, long n) { return t1_call(&p->linear, (double)n); }
int kv_p_linear_outside(const kv_pricing *p, long n) { return t1_outside(&p->linear, (double)n); }
double kv_p_lm_head(const kv_pricing *p, long n) { return t1_call(&p->lm_head, (double)n); }
double kv_p_decode(const kv_pricing *p, long num_seqs, double context) { return t2_call(&p->decode, num_seqs, context); }
int kv_p_decode_outside(const kv_pricing *p, long num_seqs, double context) {  /* csrc/pipeline.c */
    return t2_outside(&p->decode, (double)num_seqs, context);
}
double kv_p_collectives(const kv_pricing *p, long num_tokens, long num_sampled) {
    return collectives_ms(p, num_tokens, num_sampled);
}
double kv_p_host(const kv_pricing *p, long num_seqs, long num_prefill_tokens) {
    return host_ms(p, num_seqs, num_prefill_tokens);
}
void kv_pricing_set_cold(kv_pricing *p, int cold) { p->cold = cold; }  /* ASYNC */
double kv_p_hidden_excess(const kv_pricing *p, long num_seqs, double gpu_ms) {  /* ASYNC */
    return p->has_hidden ? hidden_excess(p, num_seqs, gpu_ms) : 0.0;
}
double kv_p_prefill_factor(const kv_pricing *p, long num_prefill_tokens, long num_tokens) {
    return prefill_factor(p, num_prefill_tokens, num_tokens);
}

/* attention_parts for csrc/spec.c (a speculative step prices its attention from the same tables):
   SpeculativeStepCost._attention_ms. Returns KV_OUT_PREFILL / KV_OUT_DECODE bits. */
int kv_p_attention(const kv_pricing *p, long num_chunks, const long *chunk_tokens, const long *chunk_context,
                   long num_decode_seqs, long decode_context_tokens, double *ms_out, long *prefill_out) {
    return attention_parts(p, num_chunks, chunk_tokens, chunk_context, num_decode_seqs, decode_context_tokens,
                           ms_out, prefill_out);
}
