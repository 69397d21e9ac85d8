/* One replica's step loop (see engine.h). The Python it mirrors, line for line in effect:
 *   simcore/engine.py Engine.run / _accept          the loop, arrivals, rejection
 *   simcore/policies/continuous_v0.py schedule      V0: whole prompts first, watermark
 *   simcore/policies/continuous.py                  _schedule_running (preempt from the tail),
 *                                                   _admit_waiting (V1, chunked), end_step's KV
 *   simcore/lifecycle.py                            begin_step, emit, finish (what is stamped when)
 *   workloads/arrivals.py open_loop_process         one timeout per distinct planned time
 * SimPy processes events by (time, priority, creation order); every event here is a NORMAL
 * timeout or a triggered wakeup, so two at one instant go in the order they were created
 * (`seq`). Only counts of KV blocks matter without prefix sharing, not which blocks. */
#include <stdlib.h>
#include <string.h>

#include "engine.h"

typedef struct {
    long id, prompt, target, max_tokens;
    long computed, generated, ntok, nblk, preemptions;
    double arrival, first_sched, first_token, last_token;
} kv_req;

enum { ENG_IDLE = 0, ENG_WAKE = 1, ENG_STEP = 2 };
/* where the workload's process stands (workloads/arrivals.py open_loop_process): at the top of
   its loop, about to send (past the timeout, before the hold check), or held (sends late) */
enum { ARR_LOOK = 0, ARR_SEND = 1, ARR_SEND_LATE = 2 };

struct kv_engine {
    kv_engine_config c;
    const kv_pricing *pricing;
    double now;
    unsigned long seq;
    /* requests in the system, by slot */
    kv_req *reqs; long cap_reqs; long *free_slots; long num_free_slots;
    /* waiting: a ring of slots; running: slots in admission order */
    long *wq; long wq_cap, wq_head, wq_len;
    long *sq; long sq_cap, sq_head, sq_len;  /* swapped out, FIFO */
    long *run; long run_len, run_cap;
    /* KV */
    long free_blocks, gpu_tokens, cpu_free;
    /* engine state */
    int eng; double eng_t; unsigned long eng_seq;
    /* the plan of the step in flight */
    long *part_slot, *part_new; long num_parts;
    long *chunk_tokens, *chunk_ctx; long num_chunks;
    long *preempted; long num_preempted; char *by_swap;
    long *swapped_in; long num_swapped_in, num_swap_blocks;
    long *admitted; long num_admitted;
    long num_tokens, num_decode_seqs, decode_ctx, num_sampled;
    double step_start, step_dt, parts_ms[4];
    long *finished;
    /* arrivals */
    double *in_at; long *in_id, *in_prompt, *in_output, *in_max; long in_n, in_pos; int in_last;
    int arr_pending; double arr_t; unsigned long arr_seq; double previous;
    int arr_resume;  /* 1: the arrival process runs now (at `arr_stage`) */
    int arr_stage, late;
    /* Engine.hold_arrivals: `held` while the workload waits for the queue to drain; the drained
       event, once triggered, at (drain_t, drain_seq) */
    int held, drain_pending; double drain_t; unsigned long drain_seq;
    int started;
    /* an open span row: unchanged decode steps recorded as one */
    int span_open, span_blocked; double span_row[KV_STEP_ROW];
    kv_outputs *out;
};

static long blocks_for(const kv_engine *e, long n) { return (n + e->c.block_size - 1) / e->c.block_size; }

kv_engine *kv_engine_new(const kv_engine_config *cfg, const kv_pricing *pricing) {
    kv_engine *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->c = *cfg;
    e->pricing = pricing;
    e->free_blocks = cfg->num_gpu_blocks;
    e->cpu_free = cfg->num_cpu_blocks;
    long m = cfg->max_num_seqs + 2;
    e->part_slot = malloc(sizeof(long) * m); e->part_new = malloc(sizeof(long) * m);
    e->chunk_tokens = malloc(sizeof(long) * m); e->chunk_ctx = malloc(sizeof(long) * m);
    e->preempted = malloc(sizeof(long) * m); e->admitted = malloc(sizeof(long) * m);
    e->finished = malloc(sizeof(long) * m);
    e->swapped_in = malloc(sizeof(long) * m); e->by_swap = malloc(m);
    e->run_cap = m; e->run = malloc(sizeof(long) * m);
    if (!e->part_slot || !e->part_new || !e->chunk_tokens || !e->chunk_ctx || !e->preempted || !e->admitted
        || !e->finished || !e->run || !e->swapped_in || !e->by_swap) { kv_engine_free(e); return NULL; }
    e->eng = ENG_IDLE;
    e->arr_resume = 1;
    return e;
}

void kv_engine_free(kv_engine *e) {
    if (!e) return;
    free(e->reqs); free(e->free_slots); free(e->wq); free(e->run);
    free(e->part_slot); free(e->part_new); free(e->chunk_tokens); free(e->chunk_ctx);
    free(e->preempted); free(e->admitted); free(e->finished); free(e->swapped_in); free(e->by_swap); free(e->sq);
    free(e->in_at); free(e->in_id); free(e->in_prompt); free(e->in_output); free(e->in_max);
    free(e);
}

int kv_engine_feed(kv_engine *e, long n, const double *at, const long *ids, const long *prompt,
                   const long *output, const long *max_tokens, int last) {
    free(e->in_at); free(e->in_id); free(e->in_prompt); free(e->in_output); free(e->in_max);
    e->in_n = e->in_pos = 0;  /* nothing to read until the copy below is whole */
    if (n < 0) n = 0;
    e->in_at = malloc(sizeof(double) * (n ? n : 1)); e->in_id = malloc(sizeof(long) * (n ? n : 1));
    e->in_prompt = malloc(sizeof(long) * (n ? n : 1)); e->in_output = malloc(sizeof(long) * (n ? n : 1));
    e->in_max = malloc(sizeof(long) * (n ? n : 1));
    if (!e->in_at || !e->in_id || !e->in_prompt || !e->in_output || !e->in_max) return KV_NOMEM;
    if (n) {  /* the last, empty feed passes NULL arrays: memcpy from NULL is undefined even for 0 bytes */
        memcpy(e->in_at, at, sizeof(double) * n); memcpy(e->in_id, ids, sizeof(long) * n);
        memcpy(e->in_prompt, prompt, sizeof(long) * n); memcpy(e->in_output, output, sizeof(long) * n);
        memcpy(e->in_max, max_tokens, sizeof(long) * n);
    }
    e->in_n = n; e->in_pos = 0; e->in_last = last;
    return 0;
}

/* -- queues ------------------------------------------------------------------------------- */
static int wq_reserve(kv_engine *e) {
    if (e->wq_len < e->wq_cap) return 1;
    long nc = e->wq_cap ? 2 * e->wq_cap : 256;
    long *q = malloc(sizeof(long) * nc);
    if (!q) return 0;
    for (long i = 0; i < e->wq_len; i++) q[i] = e->wq[(e->wq_head + i) % e->wq_cap];
    free(e->wq); e->wq = q; e->wq_cap = nc; e->wq_head = 0;
    return 1;
}
static long wq_at(const kv_engine *e, long i) { return e->wq[(e->wq_head + i) % e->wq_cap]; }
static void wq_push_back(kv_engine *e, long s) { e->wq[(e->wq_head + e->wq_len++) % e->wq_cap] = s; }
static void wq_push_front(kv_engine *e, long s) {
    e->wq_head = (e->wq_head + e->wq_cap - 1) % e->wq_cap; e->wq[e->wq_head] = s; e->wq_len++;
}
static long wq_pop_front(kv_engine *e) {
    long s = e->wq[e->wq_head]; e->wq_head = (e->wq_head + 1) % e->wq_cap; e->wq_len--; return s;
}

static int sq_push_back(kv_engine *e, long s) {
    if (e->sq_len == e->sq_cap) {
        long nc = e->sq_cap ? 2 * e->sq_cap : 64;
        long *q = malloc(sizeof(long) * nc);
        if (!q) return 0;
        for (long i = 0; i < e->sq_len; i++) q[i] = e->sq[(e->sq_head + i) % e->sq_cap];
        free(e->sq); e->sq = q; e->sq_cap = nc; e->sq_head = 0;
    }
    e->sq[(e->sq_head + e->sq_len++) % e->sq_cap] = s;
    return 1;
}
static long sq_at(const kv_engine *e, long i) { return e->sq[(e->sq_head + i) % e->sq_cap]; }

static long new_slot(kv_engine *e) {
    if (!e->num_free_slots) {
        long old = e->cap_reqs, nc = old ? 2 * old : 256;
        kv_req *r = realloc(e->reqs, sizeof(kv_req) * nc);
        long *f = realloc(e->free_slots, sizeof(long) * nc);
        if (!r || !f) { if (r) e->reqs = r; if (f) e->free_slots = f; return -1; }
        e->reqs = r; e->free_slots = f; e->cap_reqs = nc;
        for (long s = nc - 1; s >= old; s--) e->free_slots[e->num_free_slots++] = s;
    }
    return e->free_slots[--e->num_free_slots];
}

/* -- outputs ------------------------------------------------------------------------------ */
static void put_req(kv_engine *e, const kv_req *r, int rejected, long kind, long output) {
    double *row = e->out->req + KV_REQ_ROW * e->out->req_n++;
    row[0] = (double)r->id; row[1] = 0; row[2] = rejected ? 1 : 0; row[3] = rejected ? 0 : -1;
    row[4] = r->arrival; row[5] = r->first_sched; row[6] = r->first_token;
    row[7] = rejected ? -1.0 : e->now; row[8] = (double)r->prompt; row[9] = (double)r->generated;
    row[10] = (double)r->max_tokens; row[11] = 1; row[12] = 1; row[13] = (double)r->preemptions;
    row[14] = (double)kind; row[15] = (double)output; row[16] = (double)e->out->num_arrived;
    e->out->num_done++;
}

/* -- arrival (Engine._accept) --------------------------------------------------------------- */
static int send(kv_engine *e, long i, double stamp) {
    kv_req r;
    memset(&r, 0, sizeof r);
    r.id = e->in_id[i]; r.prompt = e->in_prompt[i]; r.max_tokens = e->in_max[i];
    long room = e->c.max_model_len - r.prompt, out = e->in_output[i];
    r.target = out < room ? out : room;
    if (r.target < 1) r.target = 1;
    r.arrival = stamp; r.first_sched = r.first_token = r.last_token = -1.0;
    e->out->arr[e->out->arr_n++] = stamp;
    e->out->num_arrived++;
    long final_len = r.prompt + r.target - 1, need = blocks_for(e, final_len), kind = KV_REJECT_NONE;
    if (r.prompt > e->c.max_model_len) kind = KV_REJECT_MODEL_LEN;
    else if (!e->c.chunked_prefill && r.prompt > e->c.max_num_batched_tokens) kind = KV_REJECT_BUDGET;
    else if (need > e->c.num_gpu_blocks) kind = KV_REJECT_CACHE;
    else if (!e->c.chunked_prefill && need > e->c.num_gpu_blocks - e->c.watermark_blocks) kind = KV_REJECT_WATERMARK;
    if (kind) { put_req(e, &r, 1, kind, out); return 0; }
    long s = new_slot(e);
    if (s < 0 || !wq_reserve(e)) return KV_NOMEM;
    e->reqs[s] = r;
    wq_push_back(e, s);
    if (e->eng == ENG_IDLE) { e->eng = ENG_WAKE; e->eng_t = e->now; e->eng_seq = e->seq++; }
    return 0;
}

/* The arrival process, from where it stands: send the requests planned at the same time, then
   wait (one timeout) for the next planned time; while the queue is past the hold threshold, wait
   for it to drain, then send what was held with its planned time. Returns 0 (it waits),
   KV_NEED_INPUT or KV_FULL (resumed where it stopped), or an error. */
static int arrivals_continue(kv_engine *e) {
    kv_outputs *o = e->out;
    for (;;) {
        if (e->arr_stage == ARR_LOOK) {
            if (e->in_pos >= e->in_n) {
                if (e->in_last) { e->arr_pending = 0; e->arr_resume = 0; return 0; }
                return KV_NEED_INPUT;
            }
            double at = 0.0 + e->in_at[e->in_pos];
            if (at > e->previous) {
                if (!(e->late && at <= e->now)) {
                    e->late = 0;
                    double delay = at - e->now;
                    if (delay < 0.0) delay = 0.0;
                    e->arr_pending = 1; e->arr_t = e->now + delay; e->arr_seq = e->seq++;
                    e->previous = at; e->arr_stage = ARR_SEND; e->arr_resume = 0;
                    return 0;
                }
                e->previous = at;
            }
            e->arr_stage = ARR_SEND;
        }
        if (e->arr_stage == ARR_SEND && e->wq_len >= e->c.hold_at) {
            e->held = 1; o->num_holds++;
            e->arr_stage = ARR_SEND_LATE; e->arr_resume = 0;
            return 0;
        }
        if (o->arr_n >= o->arr_cap || o->req_n >= o->req_cap) return KV_FULL;
        int rc = send(e, e->in_pos, e->late ? 0.0 + e->in_at[e->in_pos] : e->now);
        if (rc) return rc;
        e->in_pos++;
        e->arr_stage = ARR_LOOK;
    }
}

/* -- scheduling ----------------------------------------------------------------------------- */
static void plan_reset(kv_engine *e) {
    e->num_parts = e->num_chunks = e->num_preempted = e->num_admitted = 0;
    e->num_swapped_in = e->num_swap_blocks = 0;
    e->num_tokens = e->num_decode_seqs = e->decode_ctx = e->num_sampled = 0;
}

/* ContinuousPagedPolicy._add: a decode when one new token after generated ones, else a chunk */
static void plan_add(kv_engine *e, long s, long num_new, long computed) {
    const kv_req *r = &e->reqs[s];
    e->part_slot[e->num_parts] = s; e->part_new[e->num_parts++] = num_new;
    if (num_new == 1 && r->generated) {
        e->num_tokens += 1; e->num_decode_seqs += 1; e->decode_ctx += r->computed + 1; e->num_sampled += 1;
    } else {
        e->num_tokens += num_new;
        e->chunk_tokens[e->num_chunks] = num_new; e->chunk_ctx[e->num_chunks++] = computed;
        if (computed + num_new == r->prompt + r->generated) e->num_sampled += 1;
    }
}

static void release(kv_engine *e, kv_req *r) {
    e->free_blocks += r->nblk; e->gpu_tokens -= r->ntok; r->nblk = 0; r->ntok = 0;
}

/* append_slots: all or nothing */
static int grow_seq(kv_engine *e, kv_req *r, long num_new) {
    long need = blocks_for(e, r->ntok + num_new) - r->nblk;
    if (need > e->free_blocks) return 0;
    e->free_blocks -= need; r->nblk += need; r->ntok += num_new; e->gpu_tokens += num_new;
    return 1;
}

/* _schedule_running over a copy of `running` (its length `*n` shrinks as the tail is preempted) */
static long schedule_running(kv_engine *e, long *n, long budget) {
    long i = 0;
    while (i < *n && budget > 0) {
        long s = e->run[i];
        kv_req *r = &e->reqs[s];
        long left = r->prompt + r->generated - r->computed;
        long num_new = left < budget ? left : budget;
        int ok = grow_seq(e, r, num_new);
        while (!ok) {  /* ContinuousPagedPolicy._preempt: swap while the CPU pool has room */
            long v = e->run[--*n];
            kv_req *vr = &e->reqs[v];
            int swap = e->c.swap && vr->nblk <= e->cpu_free;
            if (swap) {
                e->free_blocks += vr->nblk; e->cpu_free -= vr->nblk; e->gpu_tokens -= vr->ntok;
                e->num_swap_blocks += vr->nblk;
            } else {
                release(e, vr);
            }
            e->by_swap[e->num_preempted] = (char)swap;
            e->preempted[e->num_preempted++] = v;
            if (v == s) break;
            ok = grow_seq(e, r, num_new);
        }
        if (!ok) break;
        plan_add(e, s, num_new, r->computed);
        budget -= num_new;
        i++;
    }
    return budget;
}

static long admit_one(kv_engine *e, long s, long num_new) {
    kv_req *r = &e->reqs[s];
    long need = blocks_for(e, num_new);
    e->free_blocks -= need; r->nblk = need; r->ntok = num_new; e->gpu_tokens += num_new;
    e->admitted[e->num_admitted++] = s;
    plan_add(e, s, num_new, 0);
    return num_new;
}

/* ContinuousPagedPolicy._swap_in: the head of the swapped queue back while it fits (its blocks
   and the step's new tokens), appended to the running set (length *n) */
static long swap_in(kv_engine *e, long *n, long budget) {
    long j = 0;
    while (j < e->sq_len && budget > 0 && *n < e->c.max_num_seqs) {
        long s = sq_at(e, j);
        kv_req *r = &e->reqs[s];
        long left = r->prompt + r->generated - r->computed;
        long num_new = left < budget ? left : budget;
        if (e->free_blocks < blocks_for(e, r->computed + num_new) || 1 > budget) break;
        e->cpu_free += r->nblk; e->free_blocks -= r->nblk; e->gpu_tokens += r->ntok;
        e->num_swap_blocks += r->nblk;
        e->swapped_in[e->num_swapped_in++] = s;
        e->run[(*n)++] = s;
        j++;
        grow_seq(e, r, num_new);  /* checked: it fits */
        plan_add(e, s, num_new, r->computed);
        budget -= num_new;
    }
    return budget;
}

/* returns 1 when a step is planned */
static int schedule(kv_engine *e) {
    plan_reset(e);
    long n = e->run_len, budget = e->c.max_num_batched_tokens;
    if (!e->c.chunked_prefill) {  /* VllmV0PagedPolicy.schedule */
        if (!e->sq_len && e->wq_len) {
            long num_seqs = n;
            for (long j = 0; j < e->wq_len; j++) {
                long s = wq_at(e, j);
                const kv_req *r = &e->reqs[s];
                long num_tokens = r->prompt + r->generated;
                if (num_tokens > budget || num_seqs + 1 > e->c.max_num_seqs) break;
                if (e->free_blocks - blocks_for(e, num_tokens) < e->c.watermark_blocks) break;
                admit_one(e, s, num_tokens);
                num_seqs += 1;
                budget -= num_tokens;
            }
            if (e->num_parts) return 1;
        }
        budget = schedule_running(e, &n, budget);
        if (e->sq_len && !e->num_preempted) swap_in(e, &n, budget);
        e->run_len = n;  /* the preempted were its tail; the swapped in follow */
        return e->num_parts > 0;
    }
    /* ContinuousPagedPolicy.schedule: running first; admission only if nobody was preempted */
    budget = schedule_running(e, &n, budget);
    e->run_len = n;
    if (e->num_preempted) return e->num_parts > 0;
    if (e->sq_len) {
        budget = swap_in(e, &n, budget);
        e->run_len = n;
        if (e->num_swapped_in < e->sq_len) return e->num_parts > 0;
    }
    long num_seqs = n;
    for (long j = 0; j < e->wq_len; j++) {
        long s = wq_at(e, j);
        const kv_req *r = &e->reqs[s];
        if (budget <= 0 || num_seqs + 1 > e->c.max_num_seqs) break;
        long num_new = r->prompt + r->generated;
        if (num_new > budget) num_new = budget;
        if (blocks_for(e, num_new) > e->free_blocks) break;
        admit_one(e, s, num_new);
        num_seqs += 1;
        budget -= num_new;
    }
    return e->num_parts > 0;
}

/* Lifecycle.begin_step: preemptions (to the front of waiting, newest first), then admissions */
static int begin_step(kv_engine *e) {
    for (long k = 0; k < e->num_preempted; k++) {
        kv_req *r = &e->reqs[e->preempted[k]];
        r->preemptions++;
        if (e->by_swap[k]) {
            if (!sq_push_back(e, e->preempted[k])) return KV_NOMEM;
            continue;
        }
        r->computed = 0;
        if (!wq_reserve(e)) return KV_NOMEM;
        wq_push_front(e, e->preempted[k]);
    }
    for (long k = 0; k < e->num_swapped_in; k++) {  /* already in `run` (swap_in put them there) */
        e->sq_head = (e->sq_head + 1) % e->sq_cap; e->sq_len--;
    }
    for (long k = 0; k < e->num_admitted; k++) {
        long s = wq_pop_front(e);
        kv_req *r = &e->reqs[s];
        r->computed = 0;
        if (r->first_sched < 0) r->first_sched = e->now;
        e->run[e->run_len++] = s;
    }
    return 0;
}

static void start_step(kv_engine *e) {
    long prefill_out = 0;
    int mask = kv_step_parts(e->pricing, e->num_tokens, e->num_chunks, e->chunk_tokens, e->chunk_ctx,
                             e->num_decode_seqs, e->decode_ctx, e->num_sampled, e->parts_ms, &prefill_out);
    long *x = e->out->extrap;
    if (mask & KV_OUT_LINEAR) x[1]++;
    x[2] += prefill_out;
    if (mask & KV_OUT_DECODE) x[3]++;
    if (mask || prefill_out) x[0]++;
    double *p = e->parts_ms;
    e->step_start = e->now;
    e->step_dt = (p[3] + p[0] + p[1] + p[2]) / 1000.0 + (double)e->num_swap_blocks * e->c.swap_block_s;
    e->eng = ENG_STEP; e->eng_t = e->now + e->step_dt; e->eng_seq = e->seq++;
}

static void flush_span(kv_engine *e) {
    if (!e->span_open) return;
    memcpy(e->out->step + KV_STEP_ROW * e->out->step_n++, e->span_row, sizeof e->span_row);
    e->span_open = 0;
}

/* Lifecycle.emit + policy.end_step + Lifecycle.finish + StepRecorder.record (a run of
   decode steps that changes nothing but the contexts goes into one row when aggregating) */
static void end_step(kv_engine *e) {
    kv_outputs *o = e->out;
    double t = e->now;
    long nf = 0;
    for (long k = 0; k < e->num_parts; k++) {
        kv_req *r = &e->reqs[e->part_slot[k]];
        r->computed += e->part_new[k];
        if (r->computed == r->prompt + r->generated) {  /* == num_tokens: a token out */
            if (r->generated) o->itl[o->itl_n++] = t - r->last_token;
            else r->first_token = t;
            r->last_token = t;
            r->generated++;
            if (r->target - r->generated <= 0) e->finished[nf++] = e->part_slot[k];
        }
    }
    /* end_step's snapshot, before the finished let go: nothing shared, so the unfilled
       slots are the allocated ones less the written ones */
    long allocated = (e->c.num_gpu_blocks - e->free_blocks) * e->c.block_size;
    long internal = allocated - e->gpu_tokens;
    for (long k = 0; k < nf; k++) {
        kv_req *r = &e->reqs[e->finished[k]];
        release(e, r);
        put_req(e, r, 0, KV_REJECT_NONE, 0);
        e->free_slots[e->num_free_slots++] = e->finished[k];
        r->id = -1;  /* finished: dropped from running below */
    }
    if (nf) {
        long w = 0;
        for (long k = 0; k < e->run_len; k++)
            if (e->reqs[e->run[k]].id >= 0) e->run[w++] = e->run[k];
        e->run_len = w;
    }
    o->num_steps++;
    double dt = e->step_dt, *p = e->parts_ms;
    double kernels = p[0] + p[1], coll = p[2], host = p[3];
    /* StepRecorder._fold's KV-blocked step (nothing swapped, no external fragmentation here) */
    int blocked = e->c.kv_capacity && (e->wq_len || e->sq_len)
                  && (e->num_preempted || e->c.kv_capacity - allocated < e->c.kv_unit);
    double row[KV_STEP_ROW] = {
        e->step_start, dt, 1, (double)e->num_parts, (double)(e->num_tokens - e->num_decode_seqs),
        (double)e->num_decode_seqs, (double)e->run_len, (double)e->wq_len, (double)e->sq_len,
        (double)e->num_preempted, (double)e->num_swap_blocks,
        (double)allocated, (double)(allocated - internal), 0, (double)internal, 0, 0, (double)allocated,
        kernels, coll, host, (double)allocated * dt, (double)internal * dt, blocked ? dt : 0.0, 0,
    };
    int decode_only = !e->num_chunks && !e->num_preempted && !e->num_admitted && !nf && !e->num_swapped_in;
    if (e->c.aggregate && decode_only) {
        double *s = e->span_row;
        /* the same batch, one step on, and KV-blocked as its steps were (so the row's end state
           classifies each of its steps as reports.regime would one by one) */
        if (e->span_open && (long)s[3] == e->num_parts && blocked == e->span_blocked) {
            s[1] += dt; s[2] += 1; s[6] = row[6]; s[7] = row[7]; s[8] = row[8];
            s[11] = row[11]; s[12] = row[12]; s[14] = row[14]; s[17] = row[17];
            s[18] += kernels; s[19] += coll; s[20] += host;
            s[21] += row[21]; s[22] += row[22]; s[23] += row[23]; s[24] = 1;
            return;
        }
        flush_span(e);
        memcpy(s, row, sizeof row);
        e->span_open = 1; e->span_blocked = blocked;
        return;
    }
    flush_span(e);
    memcpy(o->step + KV_STEP_ROW * o->step_n++, row, sizeof row);
}

static int has_room(const kv_engine *e) {
    const kv_outputs *o = e->out;
    long m = e->c.max_num_seqs + 1;
    return o->itl_cap - o->itl_n >= m && o->req_cap - o->req_n >= m && o->step_cap - o->step_n >= 2
           && o->arr_cap - o->arr_n >= 1;
}

int kv_engine_run(kv_engine *e, kv_outputs *out) {
    e->out = out;
    if (!e->started) {  /* time 0: the engine finds nothing to do; the workload starts */
        e->started = 1; e->now = 0.0; e->previous = 0.0; e->eng = ENG_IDLE; e->arr_resume = 1;
        e->arr_stage = ARR_LOOK;
    }
    for (;;) {
        if (!has_room(e))
            return out->itl_n || out->req_n || out->step_n || out->arr_n ? KV_FULL : KV_NOROOM;
        if (e->arr_resume) {
            int rc = arrivals_continue(e);
            if (rc) return rc;
            continue;
        }
        /* the next event: SimPy's order, by time and then creation */
        int which = 0;  /* 1 engine, 2 arrival, 3 drained */
        double t = 0.0; unsigned long q = 0;
        if (e->eng != ENG_IDLE) { which = 1; t = e->eng_t; q = e->eng_seq; }
        if (e->arr_pending && (!which || e->arr_t < t || (e->arr_t == t && e->arr_seq < q))) {
            which = 2; t = e->arr_t; q = e->arr_seq;
        }
        if (e->drain_pending && (!which || e->drain_t < t || (e->drain_t == t && e->drain_seq < q))) {
            which = 3; t = e->drain_t; q = e->drain_seq;
        }
        if (!which) {
            if (e->run_len || e->wq_len || e->sq_len || e->held) return KV_STALL;
            flush_span(e);
            return KV_DONE;
        }
        if (which == 2) {
            e->now = e->arr_t; e->arr_pending = 0; e->arr_resume = 1;
            continue;
        }
        if (which == 3) {
            e->now = e->drain_t; e->drain_pending = 0; e->late = 1; e->arr_resume = 1;
            continue;
        }
        e->now = e->eng_t;
        if (e->eng == ENG_STEP) end_step(e);
        if (schedule(e)) {
            int rc = begin_step(e);
            if (rc) return rc;
            if (e->held && e->wq_len <= e->c.hold_at / 2) {  /* the held workload may go on */
                e->held = 0; e->drain_pending = 1; e->drain_t = e->now; e->drain_seq = e->seq++;
            }
            start_step(e);
        } else {
            if (e->num_preempted) return KV_STALL;  /* a plan of preemptions alone: never in V0/V1 here */
            e->eng = ENG_IDLE;
        }
    }
}
