/* Pipeline parallelism in the compiled core: simcore/pipeline.py's PipelineLatency, in C. A step
 * of B sequences is a round of m = min(pp, B) micro-batches, priced on the fullest one (the
 * base model's terms from pricing.c, its decode context a float as Python divides it), and each
 * scheduled entry's token leaves the last stage with its micro-batch (emit_offsets_ms). engine.c
 * calls these hooks (marked "pp:" there); included at its end (it uses its static helpers). The
 * hand-offs come as tables by micro-batch tokens, computed in Python by the model itself. */
#include "pipeline.h"

struct kv_pipe {
    long pp, max_tokens;
    long *layers, *crosses;
    double *handoff[2];
    double off_ms[64];  /* the step in flight: micro-batch j leaves the last stage off_ms[j] after its start */
    long m;
    double emit_start;  /* its start (plus swap time) */
};

static void pp_free(struct kv_pipe *q) {
    if (!q) return;
    free(q->layers); free(q->crosses); free(q->handoff[0]); free(q->handoff[1]);
    free(q);
}

/* PipelineLatency.step_time_s + step_breakdown_ms, then start_step's bookkeeping */
static int pp_start_step(kv_rep *e) {
    kv_engine *S = e->S;
    struct kv_pipe *q = e->pp;
    const kv_pricing *p = e->pricing;
    long num_seqs = e->num_chunks + e->num_decode_seqs;
    if (num_seqs < 1) num_seqs = 1;
    long m = q->pp < num_seqs ? q->pp : num_seqs;
    /* the fullest micro-batch: whole chunks dealt round-robin (the first gets the most) */
    long nch = 0, tokens = 0;
    for (long k = 0; k < e->num_chunks; k += m) {
        e->chunk_tokens[nch] = e->chunk_tokens[k]; e->chunk_ctx[nch] = e->chunk_ctx[k];  /* (in place: k >= nch) */
        tokens += e->chunk_tokens[nch++];
    }
    long decodes = (e->num_decode_seqs + m - 1) / m;
    tokens += decodes;
    if (tokens < 1) tokens = 1;
    double ctx = (double)e->decode_ctx / (double)m;
    long sampled = e->num_sampled ? (e->num_sampled + m - 1) / m : 0;
    if (tokens >= q->max_tokens) return KV_STALL;  /* fastcore sized the tables for every step: never */
    /* StepLatencyModel._parts_ms of it (counting extrapolation) */
    double layers = kv_p_layers(p);
    double g = layers * kv_p_linear(p, tokens) + kv_p_lm_head(p, sampled);
    double c = kv_p_collectives(p, tokens, sampled);
    double h = kv_p_host(p, nch + decodes, tokens - decodes);
    int mask = kv_p_linear_outside(p, tokens) ? KV_OUT_LINEAR : 0;
    double ms;
    long prefill_out = 0;
    mask |= kv_p_attention(p, nch, e->chunk_tokens, e->chunk_ctx, 0, 0, &ms, &prefill_out);
    if (decodes) {
        double mean_ctx = ctx / (double)decodes;
        ms += kv_p_decode(p, decodes, mean_ctx);
        if (kv_p_decode_outside(p, decodes, mean_ctx)) mask |= KV_OUT_DECODE;
    }
    double a = layers * ms;
    h += kv_p_hidden_excess(p, nch + decodes, g + a + c);  /* ASYNC: as _parts_ms (0 without hidden terms) */
    if (tokens > decodes) {  /* (_parts_ms's factor of a step with prompt tokens) */
        double f = kv_p_prefill_factor(p, tokens - decodes, tokens);
        if (f != 1.0) { g *= f; a *= f; c *= f; h *= f; }
    }
    long *x = S->out->extrap;
    if (mask & KV_OUT_LINEAR) x[1]++;
    x[2] += prefill_out;
    if (mask & KV_OUT_DECODE) x[3]++;
    if (mask || prefill_out) x[0]++;
    /* the stages and hand-offs (stage_times_ms), the round and when each micro-batch leaves */
    double head = kv_p_lm_head(p, sampled);
    double per_layer = (g - head + a + c) / layers;
    double stage_sum = 0.0, pace = 0.0, handoffs = 0.0;
    for (long s = 0; s < q->pp; s++) {
        double t = (double)q->layers[s] * per_layer;
        if (s == 0) t += h;
        if (s == q->pp - 1) t += head;
        stage_sum += t;  /* sum(stages), left to right */
        if (s == 0 || t > pace) pace = t;  /* max(stages) */
    }
    for (long s = 0; s < q->pp - 1; s++) handoffs += q->handoff[q->crosses[s] ? 1 : 0][tokens];
    double busy = (double)m * pace, latency = stage_sum + handoffs;
    double round_ms = latency > busy ? latency : busy;
    for (long j = 0; j < m && j < 64; j++) q->off_ms[j] = round_ms - (double)(m - 1 - j) * pace;
    q->m = m;
    double kernels = (double)m * (g + a), coll = (double)m * c + handoffs * (double)m, host = (double)m * h;
    double total = kernels + coll + host;
    double *pm = e->parts_ms;
    if (total > 0) { pm[0] = kernels * round_ms / total; pm[2] = coll * round_ms / total; pm[3] = host * round_ms / total; }
    else { pm[0] = round_ms; pm[2] = 0.0; pm[3] = 0.0; }
    pm[1] = 0.0;  /* record_step's kernels: pm[0] + pm[1] */
    e->step_start = S->now;
    double swap_s = (double)e->num_swap_blocks * e->c.swap_block_s;
    e->step_dt = round_ms / 1000.0 + swap_s;
    q->emit_start = S->now + swap_s;
    e->eng = ENG_STEP;
    return ev_push(S, S->now + e->step_dt, EV_ENGINE, e->index);
}

/* PipelineLatency.emit_times_s: when the step's k-th scheduled entry leaves the last stage */
static double pp_emit_time(const kv_rep *e, long k) {
    const struct kv_pipe *q = e->pp;
    return q->emit_start + q->off_ms[k % q->m] / 1000.0;
}

int kv_engine_pipeline(kv_engine *S, long pp, const long *layers, const long *crosses, long max_tokens,
                       const double *intra_ms, const double *inter_ms) {
    if (pp < 2 || pp > 64) return KV_STALL;
    for (long i = 0; i < S->nrep; i++) {
        kv_rep *e = &S->reps[i];
        struct kv_pipe *q = calloc(1, sizeof *q);
        if (!q) return KV_NOMEM;
        pp_free(e->pp);
        e->pp = q;
        q->pp = pp; q->max_tokens = max_tokens;
        q->layers = malloc(sizeof(long) * (size_t)pp); q->crosses = malloc(sizeof(long) * (size_t)pp);
        q->handoff[0] = malloc(sizeof(double) * (size_t)max_tokens);
        q->handoff[1] = malloc(sizeof(double) * (size_t)max_tokens);
        if (!q->layers || !q->crosses || !q->handoff[0] || !q->handoff[1]) return KV_NOMEM;
        memcpy(q->layers, layers, sizeof(long) * (size_t)pp);
        memcpy(q->crosses, crosses, sizeof(long) * (size_t)(pp - 1));
        memcpy(q->handoff[0], intra_ms, sizeof(double) * (size_t)max_tokens);
        memcpy(q->handoff[1], inter_ms, sizeof(double) * (size_t)max_tokens);
    }
    return 0;
}
