/* The reservation policies in the compiled core: static batching (simcore/policies/static.py),
 * dynamic batching (policies/dynamic.py, early TGI) and Orca (policies/orca.py), each over
 * contiguous first-fit reservations (simcore/contiguous.py) with their KV ledger
 * (policies/reserved.py ReservationLedger). engine.c keeps the event loop, the queues, token
 * emission and the step rows; it calls these hooks (marked "bt:" there). Included at the end of
 * engine.c (it uses its static helpers), as disagg.c is.
 *
 * Static batching's idle engine waits for its wakeup or the batch timer, whichever comes first
 * (simcore/engine.py: `_first_of`): one more event hop than a plain wakeup, replayed here so
 * events at one instant keep SimPy's order. */
#include <math.h>

#include "batching.h"

struct kv_batch {
    kv_batch_config c;
    /* contiguous.py ContiguousAllocator: free extents by address, none touching */
    long *fs, *fl; long fn, fcap; long num_free;
    /* the reservation of the request in each slot (running; a static batch's finished members
       keep theirs in the batch) */
    long *r_start, *r_len, *r_final; long r_cap;
    /* ReservationLedger's sums */
    long running_reserved, running_final, stale, live;
    long mem[7];  /* the last step's MemorySnapshot: allocated, live, future, internal, stale, external, unshared */
    /* static: the batch in flight (its members' slots, extents, finished or not) */
    long *b_slot, *b_start, *b_len; char *b_done; long b_n, padded_len, decode_steps, unfinished;
    unsigned long gen;  /* idle periods: a timer or hop of an older one is stale */
    int first;          /* 1: this idle period's `first` event has been triggered */
    /* dynamic */
    long waiting_steps; int just_prefilled;
};

static void bt_free(struct kv_batch *b) {
    if (!b) return;
    free(b->fs); free(b->fl); free(b->r_start); free(b->r_len); free(b->r_final);
    free(b->b_slot); free(b->b_start); free(b->b_len); free(b->b_done);
    free(b);
}

/* -- the allocator (first fit; a freed extent merges with its neighbours) ------------------ */
static long al_reserve(struct kv_batch *b, long n) {  /* its start, or -1: no extent holds it */
    if (n == 0) return 0;
    for (long i = 0; i < b->fn; i++) {
        if (b->fl[i] < n) continue;
        long start = b->fs[i];
        if (b->fl[i] == n) {
            memmove(b->fs + i, b->fs + i + 1, sizeof(long) * (size_t)(b->fn - i - 1));
            memmove(b->fl + i, b->fl + i + 1, sizeof(long) * (size_t)(b->fn - i - 1));
            b->fn--;
        } else { b->fs[i] += n; b->fl[i] -= n; }
        b->num_free -= n;
        return start;
    }
    return -1;
}

static int al_free(struct kv_batch *b, long start, long len) {
    if (len == 0) return 0;
    long lo = 0, hi = b->fn;  /* bisect_left(starts, start) */
    while (lo < hi) { long mid = (lo + hi) / 2; if (b->fs[mid] < start) lo = mid + 1; else hi = mid; }
    long i = lo;
    int left = i > 0 && b->fs[i - 1] + b->fl[i - 1] == start, right = i < b->fn && start + len == b->fs[i];
    if (left && right) {
        b->fl[i - 1] += len + b->fl[i];
        memmove(b->fs + i, b->fs + i + 1, sizeof(long) * (size_t)(b->fn - i - 1));
        memmove(b->fl + i, b->fl + i + 1, sizeof(long) * (size_t)(b->fn - i - 1));
        b->fn--;
    } else if (left) b->fl[i - 1] += len;
    else if (right) { b->fs[i] = start; b->fl[i] += len; }
    else {
        if (b->fn == b->fcap) {
            long nc = 2 * b->fcap;
            long *s = realloc(b->fs, sizeof(long) * (size_t)nc);
            if (!s) return KV_NOMEM;
            b->fs = s;
            long *l = realloc(b->fl, sizeof(long) * (size_t)nc);
            if (!l) return KV_NOMEM;
            b->fl = l; b->fcap = nc;
        }
        memmove(b->fs + i + 1, b->fs + i, sizeof(long) * (size_t)(b->fn - i));
        memmove(b->fl + i + 1, b->fl + i, sizeof(long) * (size_t)(b->fn - i));
        b->fs[i] = start; b->fl[i] = len; b->fn++;
    }
    b->num_free += len;
    return 0;
}

static long al_external(const struct kv_batch *b, long head) {  /* external_fragmentation_tokens */
    if (head <= 0) return 0;
    long sum = 0;
    for (long i = 0; i < b->fn; i++) if (b->fl[i] < head) sum += b->fl[i];
    return sum;
}

/* -- reservations by slot, and the ledger ------------------------------------------------- */
static int r_room(struct kv_batch *b, long slot) {
    if (slot < b->r_cap) return 0;
    long nc = b->r_cap ? 2 * b->r_cap : 256;
    while (nc <= slot) nc *= 2;
    long *s = realloc(b->r_start, sizeof(long) * (size_t)nc); if (!s) return KV_NOMEM; b->r_start = s;
    long *l = realloc(b->r_len, sizeof(long) * (size_t)nc); if (!l) return KV_NOMEM; b->r_len = l;
    long *f = realloc(b->r_final, sizeof(long) * (size_t)nc); if (!f) return KV_NOMEM; b->r_final = f;
    b->r_cap = nc;
    return 0;
}

/* ReservationLedger.reserve: 1 reserved, 0 no extent fits, or an error */
static int led_reserve(kv_rep *e, long slot, long tokens, long final) {
    struct kv_batch *b = e->bt;
    if (r_room(b, slot)) return KV_NOMEM;
    long start = al_reserve(b, tokens);
    if (start < 0) return 0;
    b->r_start[slot] = start; b->r_len[slot] = tokens; b->r_final[slot] = final;
    b->running_reserved += tokens; b->running_final += final;
    return 1;
}

static void led_drop(kv_rep *e, long slot) {  /* _drop_running */
    struct kv_batch *b = e->bt;
    b->running_reserved -= b->r_len[slot]; b->running_final -= b->r_final[slot];
    b->live -= e->reqs[slot].computed;
}

/* reservation_size: tokens a request reserves (>= its final length) */
static long bt_size(const kv_rep *e, const kv_req *r) {
    long mml = e->c.max_model_len, want;
    if (r->prompt >= mml) return mml;
    switch (e->bt->c.kind) {
    case KV_BT_DYNAMIC: want = r->prompt + (r->max_tokens > r->target ? r->max_tokens : r->target); break;
    case KV_BT_STATIC: return e->bt->c.slot_tokens;
    default:
        if (e->bt->c.reservation == KV_RES_MAX) want = mml;
        else if (e->bt->c.reservation == KV_RES_ORACLE) want = r->prompt + r->target;
        else {  /* pow2: the next power of two >= the output */
            long p = 1;
            while (p < r->target) p <<= 1;
            want = r->prompt + p;
        }
    }
    return want < mml ? want : mml;
}

/* -- hooks --------------------------------------------------------------------------------- */
/* the policy's check on arrival: a reject kind, or KV_REJECT_NONE (the reason's words come from
   the Python policy: fastcore._reason) */
static long bt_check(kv_rep *e, const kv_req *r) {
    const kv_batch_config *c = &e->bt->c;
    if (c->kind == KV_BT_DYNAMIC && r->prompt > c->max_prefill_tokens) return KV_REJECT_BUDGET;
    if (c->kind == KV_BT_ORCA && !e->c.chunked_prefill && r->prompt > e->c.max_num_batched_tokens)
        return KV_REJECT_BUDGET;
    return bt_size(e, r) > c->capacity ? KV_REJECT_CACHE : KV_REJECT_NONE;
}

/* StaticPolicy._launch: up to a full batch from the queue's head, prompts padded, prefilled together */
static int st_launch(kv_rep *e) {
    struct kv_batch *b = e->bt;
    long n = e->wq_len < b->c.num_slots ? e->wq_len : b->c.num_slots, padded = 0;
    for (long j = 0; j < n; j++) {
        long p = e->reqs[wq_at(e, j)].prompt;
        if (p > padded) padded = p;
    }
    long cap = b->c.slot_tokens - padded;
    for (long j = 0; j < n; j++) {
        long s = wq_at(e, j);
        kv_req *r = &e->reqs[s];
        long out = r->target < cap ? r->target : cap;
        if (out < 1) out = 1;
        int ok = led_reserve(e, s, b->c.slot_tokens, r->prompt + out - 1);
        if (ok < 0) return ok;
        if (!ok) return KV_STALL;  /* an empty cache holds num_slots slots: never */
        r->target = out;  /* Lifecycle.admit's output cap, max(1, slot - padded) */
        r->adm_cached = 0;
        e->admitted[e->num_admitted++] = s;
        e->part_slot[e->num_parts] = s; e->part_new[e->num_parts++] = r->prompt;
        e->chunk_tokens[e->num_chunks] = padded; e->chunk_ctx[e->num_chunks++] = 0;
        b->b_slot[j] = s; b->b_start[j] = b->r_start[s]; b->b_len[j] = b->c.slot_tokens; b->b_done[j] = 0;
    }
    e->num_tokens = n * padded;
    e->num_sampled = n;
    b->b_n = b->unfinished = n;
    b->padded_len = padded;
    b->decode_steps = 0;
    return 0;
}

/* the policy's schedule: fills the plan as engine.c's schedule does; 1 when a step is planned
   (negative: an error) */
static int bt_schedule(kv_rep *e) {
    struct kv_batch *b = e->bt;
    plan_reset(e);
    if (b->c.kind == KV_BT_STATIC) {
        if (b->b_n) {  /* _decode_plan: every slot decodes, finished or not; the unfinished emit */
            for (long k = 0; k < e->run_len; k++) { e->part_slot[e->num_parts] = e->run[k]; e->part_new[e->num_parts++] = 1; }
            e->num_tokens = e->num_decode_seqs = e->num_sampled = b->b_n;
            e->decode_ctx = b->b_n * (b->padded_len + b->decode_steps + 1);
            return 1;
        }
        if (!e->wq_len) return 0;
        double deadline = e->reqs[wq_at(e, 0)].arrival + b->c.batch_timeout_s;
        if (e->wq_len < b->c.num_slots && e->S->now < deadline - KV_BT_EPS_S) return 0;
        int rc = st_launch(e);
        return rc ? rc : 1;
    }
    if (b->c.kind == KV_BT_DYNAMIC) {
        if (e->run_len && b->just_prefilled) goto decode;
        if (e->wq_len) {
            long min_size = 1;
            if (e->run_len && b->waiting_steps < b->c.max_waiting_tokens) {
                min_size = (long)floor((double)e->run_len * b->c.waiting_served_ratio);
                if (min_size < 1) min_size = 1;
            }
            if (e->wq_len >= min_size) {  /* _admit: a prefill-only step for the queue's head */
                long room = e->c.max_num_seqs - e->run_len, tokens = 0, n = 0;
                for (long j = 0; j < e->wq_len; j++) {
                    long s = wq_at(e, j);
                    kv_req *r = &e->reqs[s];
                    if (n >= room || tokens + r->prompt > b->c.max_prefill_tokens) break;
                    int ok = led_reserve(e, s, bt_size(e, r), r->prompt + r->target - 1);
                    if (ok < 0) return ok;
                    if (!ok) break;
                    e->admitted[n++] = s;
                    tokens += r->prompt;
                }
                if (n < min_size) {  /* too few: every reservation back (the free list is as before) */
                    for (long k = 0; k < n; k++) {
                        long s = e->admitted[k];
                        led_drop(e, s);
                        int rc = al_free(b, b->r_start[s], b->r_len[s]);
                        if (rc) return rc;
                    }
                } else {
                    for (long k = 0; k < n; k++) {
                        long s = e->admitted[k];
                        e->reqs[s].adm_cached = 0;
                        plan_add(e, s, e->reqs[s].prompt, 0);
                    }
                    e->num_admitted = n;
                    return 1;
                }
            }
        }
        if (!e->run_len) return 0;
    decode:
        for (long k = 0; k < e->run_len; k++) plan_add(e, e->run[k], 1, e->reqs[e->run[k]].computed);
        return 1;
    }
    /* Orca: the running first (a decode, or their next chunk), then the queue in order */
    long budget = e->c.max_num_batched_tokens;
    for (long k = 0; k < e->run_len; k++) {
        if (budget <= 0) break;
        kv_req *r = &e->reqs[e->run[k]];
        long left = r->prompt + r->generated - r->computed, num_new = left < budget ? left : budget;
        plan_add(e, e->run[k], num_new, r->computed);
        budget -= num_new;
    }
    long num_running = e->run_len;
    for (long j = 0; j < e->wq_len; j++) {
        if (budget <= 0 || num_running >= e->c.max_num_seqs) break;
        long s = wq_at(e, j);
        kv_req *r = &e->reqs[s];
        long num_new = r->prompt + r->generated;
        if (num_new > budget) {
            if (!e->c.chunked_prefill) break;
            num_new = budget;
        }
        int ok = led_reserve(e, s, bt_size(e, r), r->prompt + r->target - 1);
        if (ok < 0) return ok;
        if (!ok) break;
        r->adm_cached = 0;
        e->admitted[e->num_admitted++] = s;
        num_running++;
        plan_add(e, s, num_new, 0);
        budget -= num_new;
    }
    return e->num_parts > 0;
}

/* the policy's end_step, after the step's tokens (`nf` finished, in e->finished), before they
   leave: the ledger advances, its snapshot is the step's KV, the finished let go (a static
   batch's stay, stale, until its last member finishes) */
static int bt_end(kv_rep *e, long nf) {
    struct kv_batch *b = e->bt;
    for (long k = 0; k < e->num_parts; k++) b->live += e->part_new[k];
    long head = 0;
    if (e->wq_len) head = b->c.kind == KV_BT_STATIC ? b->c.slot_tokens : bt_size(e, &e->reqs[wq_at(e, 0)]);
    long allocated = b->c.capacity - b->num_free;
    b->mem[0] = allocated; b->mem[1] = b->live; b->mem[2] = b->running_final - b->live;
    b->mem[3] = b->running_reserved - b->running_final; b->mem[4] = b->stale; b->mem[5] = al_external(b, head);
    b->mem[6] = allocated;
    if (b->c.kind == KV_BT_STATIC) {
        if (e->num_decode_seqs) b->decode_steps++;
        for (long k = 0; k < nf; k++) {  /* retire: the reservation turns stale */
            long s = e->finished[k];
            led_drop(e, s);
            b->stale += b->r_len[s];
            for (long j = 0; j < b->b_n; j++) if (b->b_slot[j] == s && !b->b_done[j]) { b->b_done[j] = 1; break; }
        }
        b->unfinished -= nf;
        if (!b->unfinished) {  /* the longest sequence ended: the batch lets go of its slots */
            for (long j = 0; j < b->b_n; j++) {
                b->stale -= b->b_len[j];
                int rc = al_free(b, b->b_start[j], b->b_len[j]);
                if (rc) return rc;
            }
            b->b_n = 0;
        }
        return 0;
    }
    if (b->c.kind == KV_BT_DYNAMIC) {
        if (e->num_decode_seqs) { b->waiting_steps++; b->just_prefilled = 0; }
        else { b->waiting_steps = 1; b->just_prefilled = 1; }
    }
    for (long k = 0; k < nf; k++) {
        long s = e->finished[k];
        led_drop(e, s);
        int rc = al_free(b, b->r_start[s], b->r_len[s]);
        if (rc) return rc;
    }
    return 0;
}

/* the step row's KV columns: the policy's snapshot */
static void bt_row(const kv_rep *e, double *row) {
    for (int k = 0; k < 7; k++) row[11 + k] = (double)e->bt->mem[k];
}

/* Nothing to schedule: static batching with a queue and no batch waits for its wakeup or the
   batch timer (StaticPolicy.idle_timeout); 1 when it does (else a plain idle) */
static int bt_idle(kv_rep *e) {
    struct kv_batch *b = e->bt;
    if (b->c.kind != KV_BT_STATIC || b->b_n || !e->wq_len) return 0;
    kv_engine *S = e->S;
    double delay = e->reqs[wq_at(e, 0)].arrival + b->c.batch_timeout_s - S->now;
    if (delay < 0.0) delay = 0.0;
    b->gen++; b->first = 0;
    e->eng = ENG_TIMED;
    fail(e, ev_push(S, S->now + delay, EV_BT_TIMER, (long)b->gen * S->nrep + e->index));
    return 1;
}

/* an arrival at an engine waiting on its timer: its wakeup succeeds (processed next) */
static int bt_wake(kv_rep *e) {
    if (e->eng != ENG_TIMED) return 0;
    e->eng = ENG_TIMED_W;
    return ev_push(e->S, e->S->now, EV_BT_WAKE, (long)e->bt->gen * e->S->nrep + e->index);
}

/* the timer, or the wakeup, processed: the first of them triggers `first`, whose processing
   resumes the engine; anything of an older idle period is stale */
static int bt_event(kv_engine *S, const kv_event *ev) {
    kv_rep *e = &S->reps[ev->arg % S->nrep];
    struct kv_batch *b = e->bt;
    if ((unsigned long)(ev->arg / S->nrep) != b->gen || b->first || (e->eng != ENG_TIMED && e->eng != ENG_TIMED_W))
        return 0;
    b->first = 1;
    e->eng = ENG_WAKE;
    return ev_push(S, S->now, EV_ENGINE, e->index);
}

int kv_engine_batching(kv_engine *S, const kv_batch_config *c) {
    for (long i = 0; i < S->nrep; i++) {
        kv_rep *e = &S->reps[i];
        struct kv_batch *b = calloc(1, sizeof *b);
        if (!b) return KV_NOMEM;
        bt_free(e->bt);
        e->bt = b;
        b->c = *c;
        long m = e->c.max_num_seqs + 2;
        b->fcap = 64;
        b->fs = malloc(sizeof(long) * 64); b->fl = malloc(sizeof(long) * 64);
        b->b_slot = malloc(sizeof(long) * (size_t)m); b->b_start = malloc(sizeof(long) * (size_t)m);
        b->b_len = malloc(sizeof(long) * (size_t)m); b->b_done = malloc((size_t)m);
        if (!b->fs || !b->fl || !b->b_slot || !b->b_start || !b->b_len || !b->b_done) return KV_NOMEM;
        b->fs[0] = 0; b->fl[0] = c->capacity; b->fn = c->capacity > 0; b->num_free = c->capacity;
    }
    return 0;
}
