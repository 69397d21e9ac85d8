/* Speculative decoding's hooks (spec.h). What each function mirrors:
 *   kv_spec_drafts / _verify / _drafting    policies/speculative.py _schedule_running, _add_verify, _add
 *   draw (in kv_spec_price)                 speculative.py SpeculativeConfig.sample_accepted, and
 *                                           policies/speculative.py _draw_acceptance (its counters)
 *   kv_spec_price                           speculative_cost.py SpeculativeStepCost.step_time_s,
 *                                           _attention_ms, _draft_ms, _head_collectives_ms
 * The arithmetic is Python's, one IEEE operation at a time in its order (setup.py: no FMA). */
#include "spec.h"

#include <stdlib.h>
#include <string.h>

struct kv_spec {
    kv_spec_config c;
    double *rates;
    const kv_pricing *target, *draft;
    unsigned long st_hi, st_lo, inc_hi, inc_lo;  /* PCG64's 128-bit state and increment */
    long cap;
    /* the plan: verifies in schedule order (their part, drafts, computed before) and by part */
    long *v_part, *v_drafts, *v_computed, nv;
    long *acc;  /* by part: accepted drafts, -1 when the part is no verify */
    long num_draft_tokens, verify_ctx, num_drafting, drafting_ctx;
    long *ct, *cc;  /* the step's chunks: prompt chunks, then verifies (1 + drafts over computed) */
    /* totals (vLLM's spec-decode counters; the pricer's sums) */
    long drafts, draft_tokens, accepted, *accepted_at, *drafted_at;
    double verify_ms, draft_ms;
};

kv_spec *kv_spec_new(const kv_spec_config *c, const double *rates, const unsigned long *rng,
                     const kv_pricing *target, const kv_pricing *draft, long max_parts) {
    if (c->k < 1 || max_parts < 1 || (c->method == KV_SPEC_DRAFT_MODEL && !draft)) return NULL;
    kv_spec *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->c = *c; s->target = target; s->draft = draft; s->cap = max_parts;
    s->st_hi = rng[0]; s->st_lo = rng[1]; s->inc_hi = rng[2]; s->inc_lo = rng[3];
    size_t m = (size_t)max_parts, k = (size_t)c->k;
    s->rates = malloc(sizeof(double) * k);
    s->v_part = malloc(sizeof(long) * m); s->v_drafts = malloc(sizeof(long) * m); s->v_computed = malloc(sizeof(long) * m);
    s->acc = malloc(sizeof(long) * m);
    s->ct = malloc(sizeof(long) * 2 * m); s->cc = malloc(sizeof(long) * 2 * m);
    s->accepted_at = calloc(k, sizeof(long)); s->drafted_at = calloc(k, sizeof(long));
    if (!s->rates || !s->v_part || !s->v_drafts || !s->v_computed || !s->acc || !s->ct || !s->cc || !s->accepted_at
        || !s->drafted_at) { kv_spec_free(s); return NULL; }
    memcpy(s->rates, rates, sizeof(double) * k);
    for (long i = 0; i < max_parts; i++) s->acc[i] = -1;
    return s;
}

void kv_spec_free(kv_spec *s) {
    if (!s) return;
    free(s->rates); free(s->v_part); free(s->v_drafts); free(s->v_computed); free(s->acc); free(s->ct); free(s->cc);
    free(s->accepted_at); free(s->drafted_at);
    free(s);
}

void kv_spec_reset(kv_spec *s) {
    for (long v = 0; v < s->nv; v++) s->acc[s->v_part[v]] = -1;
    s->nv = 0;
    s->num_draft_tokens = s->verify_ctx = s->num_drafting = s->drafting_ctx = 0;
}

long kv_spec_drafts(const kv_spec *s, long left, long budget) {
    long d = s->c.k;
    if (left < d) d = left;
    if (budget < d) d = budget;
    return d > 0 ? d : 0;
}

void kv_spec_verify(kv_spec *s, long part, long num_drafts, long computed) {
    long v = s->nv++;
    s->v_part[v] = part; s->v_drafts[v] = num_drafts; s->v_computed[v] = computed;
    s->acc[part] = 0;  /* drawn when the step is priced */
    s->verify_ctx += computed + 1;
    s->num_draft_tokens += num_drafts;
}

void kv_spec_drafting(kv_spec *s, long context) {
    s->num_drafting += 1;
    s->drafting_ctx += context;
}

long kv_spec_accepted(const kv_spec *s, long part) { return s->acc[part]; }

/* -- numpy's PCG64 (pcg_setseq_128_xsl_rr_64) and Generator.random's double ------------------ */
static void mul64(unsigned long a, unsigned long b, unsigned long *hi, unsigned long *lo) {
    unsigned long a0 = a & 0xffffffffUL, a1 = a >> 32, b0 = b & 0xffffffffUL, b1 = b >> 32;
    unsigned long p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    unsigned long mid = (p00 >> 32) + (p01 & 0xffffffffUL) + (p10 & 0xffffffffUL);
    *lo = (mid << 32) | (p00 & 0xffffffffUL);
    *hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

static double next_double(kv_spec *s) {
    /* state = state * PCG_DEFAULT_MULTIPLIER_128 + inc (mod 2^128) */
    const unsigned long m_hi = 0x2360ED051FC65DA4UL, m_lo = 0x4385DF649FCCF645UL;
    unsigned long hi, lo;
    mul64(s->st_lo, m_lo, &hi, &lo);
    hi += s->st_hi * m_lo + s->st_lo * m_hi;
    unsigned long nlo = lo + s->inc_lo;
    hi += s->inc_hi + (nlo < lo);
    s->st_hi = hi; s->st_lo = nlo;
    unsigned long x = hi ^ nlo;
    unsigned rot = (unsigned)(hi >> 58);
    unsigned long out = (x >> rot) | (x << ((64 - rot) & 63));
    return (double)(out >> 11) * (1.0 / 9007199254740992.0);
}

/* SpeculativeConfig.sample_accepted: one uniform per draft position and verify, in schedule
   order; the leading run of positions under their rates, at most the verify's drafts */
static void draw(kv_spec *s) {
    long k = s->c.k;
    for (long v = 0; v < s->nv; v++) {
        long run = 0, alive = 1, d = s->v_drafts[v];
        for (long i = 0; i < k; i++) {
            double u = next_double(s);
            if (alive && u < s->rates[i]) run++;
            else alive = 0;
        }
        long a = run < d ? run : d;
        s->acc[s->v_part[v]] = a;
        for (long i = 0; i < a; i++) s->accepted_at[i]++;
        for (long i = 0; i < d; i++) s->drafted_at[i]++;
        s->drafts++; s->draft_tokens += d; s->accepted += a;
        s->num_drafting += 1;
        s->drafting_ctx += s->v_computed[v] + 1 + a;
    }
}

/* _head_collectives_ms */
static double head_coll(const kv_spec *s, long num_tokens, long num_sampled) {
    const kv_pricing *p = s->target;
    double layers_only = kv_p_collectives(p, num_tokens, 0);
    return layers_only / kv_p_layers(p) * s->c.head_layers + kv_p_collectives(p, num_tokens, num_sampled) - layers_only;
}

int kv_spec_price(kv_spec *s, long num_tokens, long num_chunks, const long *chunk_tokens, const long *chunk_ctx,
                  long num_decode_seqs, long decode_ctx, long num_sampled, double parts[4], long *prefill_out,
                  double *total_ms) {
    if (s->nv) draw(s);
    const kv_pricing *p = s->target;
    long T = num_tokens + s->num_draft_tokens, S = num_sampled + s->num_draft_tokens;
    long n = num_chunks + s->nv;
    memcpy(s->ct, chunk_tokens, sizeof(long) * (size_t)num_chunks);
    memcpy(s->cc, chunk_ctx, sizeof(long) * (size_t)num_chunks);
    for (long v = 0; v < s->nv; v++) { s->ct[num_chunks + v] = 1 + s->v_drafts[v]; s->cc[num_chunks + v] = s->v_computed[v]; }
    long num_plain = num_decode_seqs - s->nv, plain_ctx = decode_ctx - s->verify_ctx;
    double L = kv_p_layers(p), att;
    int mask = kv_p_linear_outside(p, T) ? KV_OUT_LINEAR : 0;
    mask |= kv_p_attention(p, n, s->ct, s->cc, num_plain, plain_ctx, &att, prefill_out);
    double kernels = L * kv_p_linear(p, T) + kv_p_lm_head(p, S) + L * att;
    double coll = kv_p_collectives(p, T, S);
    double host = kv_p_host(p, num_chunks + num_decode_seqs, num_tokens - num_decode_seqs);
    if (num_tokens > num_decode_seqs) {  /* the verify pass's prompt tokens (SpeculativeStepCost.step_time_s) */
        double m = kv_p_prefill_factor(p, num_tokens - num_decode_seqs, T);
        if (m != 1.0) { kernels *= m; coll *= m; host *= m; }
    }
    /* _draft_ms */
    double dk = 0.0, dc = 0.0, dh = 0.0;
    long seqs = s->num_drafting, k = s->c.k;
    if (seqs && s->c.method == KV_SPEC_NGRAM) {
        dh = s->c.ngram_ms_per_seq * (double)seqs;
    } else if (seqs && s->c.method == KV_SPEC_DRAFT_MODEL) {
        double q[4];
        long out;
        kv_step_parts(s->draft, T, n, s->ct, s->cc, num_plain, plain_ctx, seqs, q, &out);
        dk = q[0] + q[1]; dc = q[2];
        for (long j = 1; j < k; j++) {
            kv_step_parts(s->draft, seqs, 0, s->ct, s->cc, seqs, s->drafting_ctx + j * seqs, seqs, q, &out);
            dk += q[0] + q[1];
            dc += q[2];
        }
    } else if (seqs) {
        double h = s->c.head_layers, mean = (double)s->drafting_ctx / (double)seqs;
        dk = h * kv_p_linear(p, T) + att + kv_p_lm_head(p, seqs);
        dc = head_coll(s, T, seqs);
        for (long j = 1; j < k; j++) {
            dk += h * kv_p_linear(p, seqs) + kv_p_decode(p, seqs, mean + (double)j) + kv_p_lm_head(p, seqs);
            dc += head_coll(s, seqs, seqs);
        }
    }
    /* ASYNC: the hidden CPU work's excess over the whole GPU step (SpeculativeStepCost.step_time_s) */
    host += kv_p_hidden_excess(p, num_chunks + num_decode_seqs, kernels + coll + dk + dc);
    s->verify_ms += kernels + coll + host;
    s->draft_ms += dk + dc + dh;
    parts[0] = kernels + dk; parts[1] = 0.0; parts[2] = coll + dc; parts[3] = host + dh;
    *total_ms = kernels + coll + host + dk + dc + dh;
    return mask;
}

void kv_spec_stats(const kv_spec *s, long *ints, double *sums) {
    ints[0] = s->drafts; ints[1] = s->draft_tokens; ints[2] = s->accepted;
    for (long i = 0; i < s->c.k; i++) { ints[KV_SPEC_INTS + i] = s->accepted_at[i]; ints[KV_SPEC_INTS + s->c.k + i] = s->drafted_at[i]; }
    sums[0] = s->verify_ms; sums[1] = s->draft_ms;
}
