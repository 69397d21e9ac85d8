/* Replicas' step loops (see engine.h). The Python they mirror, line for line in effect:
 *   simcore/engine.py Engine.run / _accept          the loop, arrivals, rejection
 *   simcore/router.py Router._pick                  round-robin, least-loaded (lowest index)
 *   simcore/policies/continuous_v0.py schedule      V0: whole prompts first, watermark; vLLM 0.6's
 *                                                   multi-step decode rounds (hooks marked "ms:")
 *   simcore/policies/continuous.py                  _schedule_running (preempt from the tail),
 *                                                   _admit_waiting (V1, chunked), end_step's KV
 *   simcore/block_pool.py                           prefix caching: hashed blocks, LRU eviction
 *   simcore/lifecycle.py                            begin_step, emit, finish (what is stamped when)
 *   workloads/arrivals.py open_loop_process         one timeout per distinct planned time
 *                         closed_loop_process       clients: submit, wait, think, next
 * SimPy processes events by (time, priority, creation order); every event here is a NORMAL
 * timeout or a triggered event (a wakeup, a request's done), so two at one instant go in the
 * order they were created (`seq`, one counter for the whole run, one heap). The URGENT process
 * starts at time 0 come first: the engines idle, then the workload (a closed loop's clients, in
 * order). Without prefix caching only counts of KV blocks matter, not which blocks. */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "sessions.h"  /* sessions, the CPU KV tier, block-hash keys (sessions.c): hooks marked SESSIONS */
#include "fleet.h"
#include "spec.h"  /* speculative decoding: csrc/spec.c (hooks marked "spec:") */
#include "batching.h"  /* static / dynamic batching, Orca: csrc/batching.c (hooks marked "bt:") */
#include "pipeline.h"  /* pipeline parallelism: csrc/pipeline.c (hooks marked "pp:") */
#include "tokens.h"  /* per-request token times (--save-result): csrc/tokens.c (hooks marked "tokens:") */

typedef struct {
    /* what a decode step reads and writes, first (one cache line) */
    long prompt, target, computed, generated, ntok, nblk; double last_token; long id;
    long max_tokens, preemptions;
    long client;  /* closed loop: the client waiting for it; -1: nobody waits */
    /* prefix caching: its prefix group (-1: none) and tokens, the full blocks of the prefix
       (npb: the content keys (g, 0..npb-1)), the handles of its first npb blocks (kv_blk), the
       tokens adopted from the cache when admitted this step */
    long g, npt, npb, adm_cached; long *pt;
    double arrival, first_sched, first_token;
    /* SESSIONS: a conversation's turn (tok): its blocks are keyed by hk[i] (hash ids of its
       session's blocks) in the replica's hash group; a load from the CPU tier in flight */
    const long *hk; long tok, off_cached, off_loaded, off_rest; double ready, load_start;
    int loading;  /* 1: loading; 2: admitted, its load done, this step */
    long dg_state, dg_tag;  /* disaggregated (disagg.c): a decode instance's remote-KV state, the proxy's entry */
    long k, gsh, gown; int forked;  /* sg: its width (n), a forked group's shared and own blocks (seqgroup.c) */
} kv_req;

enum { ENG_IDLE = 0, ENG_WAKE = 1, ENG_STEP = 2,  /* (batching.h: 3, 4) */
       ENG_IDLE_T = 5, ENG_HOPPING = 6 };  /* SESSIONS: idle until a wakeup or a CPU-tier load's end, and woken */
/* where the workload's process stands (workloads/arrivals.py open_loop_process): at the top of
   its loop, about to send (past the timeout, before the hold check), or held (sends late) */
enum { ARR_LOOK = 0, ARR_SEND = 1, ARR_SEND_LATE = 2 };
/* events in the heap: a replica's wakeup or step end (arg: the replica), the open loop's next
   timeout, the held workload's drained event, a closed-loop client's request done or its think
   time over (arg: the client) */
enum { EV_ENGINE = 0, EV_ARRIVAL = 1, EV_DRAIN = 2, EV_DONE = 3, EV_THINK = 4, EV_FLEET = 32 /* fleet.c (disagg.c uses 16-19) */ };

/* Prefix caching (simcore/block_pool.py): only blocks that are or may become cached need an
   identity, those at a request's first npb positions; a handle stands for one. Uncached free
   blocks are interchangeable (a count); cached free ones are evictable, least recently freed
   first (`prev` / `next` links of the LRU list). */
typedef struct { long g, i, ref, prev, next; } kv_blk;  /* g < 0: not cached */
typedef struct { long *h; long n; } kv_group;           /* content key (g, i) -> handle, -1: none */

typedef struct { double t; unsigned long seq; int kind; long arg; } kv_event;

typedef struct kv_rep kv_rep;

#define KV_GAP_BUF 512  /* inter-token gaps binned a batch at a time */

/* One replica (one simcore.engine.Engine and its Lifecycle and policy) */
struct kv_rep {
    kv_engine *S;
    kv_engine_config c;
    const kv_pricing *pricing;
    long index;
    /* requests in the system, by slot */
    kv_req *reqs; long cap_reqs; long *free_slots; long num_free_slots;
    /* waiting: a ring of slots; running: slots in admission order */
    long *wq; long wq_cap, wq_head, wq_len;
    long *sq; long sq_cap, sq_head, sq_len;  /* swapped out, FIFO */
    long *run; long run_len, run_cap;
    /* KV */
    long free_blocks, gpu_tokens, cpu_free;
    /* engine state: idle, or its one event (wakeup or step end) is in the heap */
    int eng;
    /* the plan of the step in flight */
    long *part_slot, *part_new; long num_parts;
    long *chunk_tokens, *chunk_ctx; long num_chunks;
    long *preempted; long num_preempted; char *by_swap;
    long *swapped_in; long num_swapped_in, num_swap_blocks;
    long *admitted; long num_admitted;
    long num_tokens, num_decode_seqs, decode_ctx, num_sampled;
    double step_start, step_dt, parts_ms[4];
    long *finished;
    long *filling; long num_filling;  /* planned requests writing shared-prefix blocks */
    /* prefix caching: free GPU blocks = uncached_free + the evictable (LRU list) */
    int pc; kv_blk *blk; long blk_n, blk_cap; long *hfree; long hfree_n, hfree_cap;
    long uncached_free, lru_head, lru_tail, num_cached; kv_group *groups; long ngroups;
    long prefix_query_tokens, prefix_hit_tokens;
    /* an open span row: unchanged decode steps recorded as one */
    int span_open, span_blocked; double span_row[KV_STEP_ROW];
    int cold;  /* ASYNC: the replica idled since its last step (start_step prices the next one cold) */
    long num_arrived, num_done, num_holds;
    /* inter-token gaps (simcore.records.Samples past its cap): every one binned here */
    long itl_count, itl_zeros, itl_blk_n; double itl_total, itl_min, itl_max, *itl_blk;
    long *hist, hist_key0, hist_n;
    double *itl_vals; long itl_vals_cap;  /* every gap while at most itl_cap; dropped past it */
    double itl_last; long itl_last_key;   /* the last gap binned and its key (-1: zero): a decode
                                             step's gaps mostly repeat the one before */
    /* folded step rows (simcore.metrics.StepRecorder): rows not sealed yet, the kept table,
       how often it was halved; the totals (StepTotals) */
    double *chunk; long chunk_n; double *kept; long kept_n, kept_cap, halvings; int coalesced, streaming;
    long t_steps, t_seq_steps, t_max_running, t_kv_max, t_preempted; double t_sums[3 + KV_STEP_KINDS];
    int itl_done;  /* the last partial block is in the sum */
    /* SESSIONS: the CPU KV tier (NULL: none), when its host link is free, what it loaded; the
       idle timer's generation (a stale timer does nothing) */
    kv_tier *tier; double link_free, off_wait_s; long off_hit_tokens, off_loaded_blocks, idle_gen, load_reserved;
    long *loads; long nload, load_cap;  /* slots loading, in the order their loads started */
    long *phase_count;  /* decode spans: requests by the step at which they need a block (mod block size) */
    double gap[KV_GAP_BUF]; long gap_n;  /* gaps not binned yet (itl_put, itl_flush) */
    kv_spec *sp;  /* spec: speculative decoding's state (csrc/spec.c); NULL: none */
    struct kv_batch *bt;  /* bt: a reservation policy's state (csrc/batching.c); NULL: paged continuous batching */
    struct kv_pipe *pp;  /* pp: pipeline stages' rounds (csrc/pipeline.c); NULL: one stage */
    kv_tokens *tt;  /* tokens: every token's time by request (csrc/tokens.c); NULL: not kept */
    /* sg: parallel sampling (seqgroup.c): sequences past the first of forked groups, forked
       groups (running or swapped), the snapshot's shared slots, groups emitting this step */
    long sg_extra, sg_forked, sg_saved; long *sg_emit; long sg_nemit, sg_emit_cap;
    /* ms: multi-step scheduling (VllmV0PagedPolicy's round): steps of the round still to plan, the
       finished sequences it still computes and their next contexts summed; while a round's first
       step is planned, the lookahead slots and the free blocks held back for them */
    long ms_left, ms_ghosts, ms_ghost_ctx, ms_ahead, ms_reserved;
};

struct kv_engine {
    kv_engine_config c;
    const kv_pricing *pricing;
    double now;
    unsigned long seq;
    kv_rep *reps; long nrep; long rr_next;
    kv_event *heap; long heap_n, heap_cap;
    /* arrivals */
    double *in_at, *in_think; long *in_id, *in_prompt, *in_output, *in_max, *in_pid, *in_npt;
    long in_n, in_pos; int in_last;
    /* prefix ids -> dense groups (open addressing; keys + 1, 0: empty) */
    long *pid_keys, *pid_vals; long pid_cap, pid_n;
    double previous;
    int arr_resume;  /* 1: the arrival process runs now (at `arr_stage`) */
    int arr_stage, late;
    /* Engine.hold_arrivals (one replica): `held` while the workload waits for the queue to drain */
    int held;
    /* closed loop: clients still to start (time 0), the client that takes the next request now,
       each client's think time after its request in flight */
    long clients_to_start, next_client, taking; double *client_think;
    int started;
    int err;  /* an allocation failed inside an event (KV_NOMEM): the run stops with it */
    kv_outputs *out;
    /* SESSIONS: the session workload (NULL: arrays), the group keyed by hash ids (-1: none yet),
       the CPU tier's size per replica, seconds per block loaded, keys */
    kv_sessions *sess; long hash_group; long tier_blocks; double load_block_s; long nkeys;
    kv_fleet *fleet;  /* fleet.c: autoscaling (which replicas serve); NULL: all of them */
    struct kv_disagg *dg;  /* disaggregated prefill/decode (disagg.c); NULL: none */
    long *in_w; long sg_next;  /* sg: the chunk's widths (NULL: all 1), the next request's */
};

/* hooks of disaggregated prefill/decode (disagg.c, included at the end of this file) */
static int dg_accept(kv_engine *S, long i, double stamp, long client);
static int dg_left(kv_rep *e, kv_req *r);
static int dg_holds(const kv_rep *e);
static int dg_admit(kv_rep *e, long s, long *num_seqs, long *budget);
static int dg_event(kv_engine *S, const kv_event *ev);
static long *dg_extrap(kv_rep *e);
static void dg_free(kv_engine *S);
static void wq_remove(kv_rep *e, long s);
/* hooks of the reservation policies (batching.c, included at the end of this file) */
struct kv_batch;
static void bt_free(struct kv_batch *b);
static long bt_check(kv_rep *e, const kv_req *r);
static int bt_schedule(kv_rep *e);
static int bt_end(kv_rep *e, long nf);
static void bt_row(const kv_rep *e, double *row);
static int bt_idle(kv_rep *e);
static int bt_wake(kv_rep *e);
static int bt_event(kv_engine *S, const kv_event *ev);
/* hooks of parallel sampling (seqgroup.c, included at the end of this file) */
static long sg_check(const kv_rep *e, const kv_req *r);
static void sg_plan_decode(kv_rep *e, const kv_req *r);
static int sg_emitting(kv_rep *e, long s);
static int sg_grow(kv_rep *e, kv_req *r);
static void sg_release(kv_rep *e, kv_req *r);
static int sg_swap_out(kv_rep *e, kv_req *r);
static long sg_swap_in(kv_rep *e, kv_req *r, long n, long budget);
static void sg_end(kv_rep *e, long *internal);
/* hooks of pipeline parallelism (pipeline.c, included at the end of this file) */
struct kv_pipe;
static void pp_free(struct kv_pipe *q);
static int pp_start_step(kv_rep *e);
static double pp_emit_time(const kv_rep *e, long k);

/* -- the event heap: SimPy's order, by time and then creation (`seq`) ----------------------- */
static int ev_before(const kv_event *a, const kv_event *b) {
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int ev_push(kv_engine *S, double t, int kind, long arg) {
    if (S->heap_n == S->heap_cap) {
        long nc = S->heap_cap ? 2 * S->heap_cap : 16;
        kv_event *h = realloc(S->heap, sizeof(kv_event) * nc);
        if (!h) return KV_NOMEM;
        S->heap = h; S->heap_cap = nc;
    }
    kv_event ev = { t, S->seq++, kind, arg };
    long i = S->heap_n++;
    while (i > 0) {
        long p = (i - 1) / 2;
        if (!ev_before(&ev, &S->heap[p])) break;
        S->heap[i] = S->heap[p]; i = p;
    }
    S->heap[i] = ev;
    return 0;
}

static kv_event ev_pop(kv_engine *S) {
    kv_event top = S->heap[0], last = S->heap[--S->heap_n];
    long n = S->heap_n, i = 0;
    for (;;) {
        long l = 2 * i + 1, m = i;
        if (l >= n) break;
        m = (l + 1 < n && ev_before(&S->heap[l + 1], &S->heap[l])) ? l + 1 : l;
        if (!ev_before(&S->heap[m], &last)) break;
        S->heap[i] = S->heap[m]; i = m;
    }
    if (n) S->heap[i] = last;
    return top;
}

static long blocks_for(const kv_rep *e, long n) { return (n + e->c.block_size - 1) / e->c.block_size; }

static void rep_free(kv_rep *e) {
    if (e->reqs)
        for (long i = 0; i < e->cap_reqs; i++) free(e->reqs[i].pt);  /* calloc'd: NULL where unused */
    free(e->phase_count);
    free(e->blk); free(e->hfree); free(e->filling); free(e->itl_blk); free(e->hist); free(e->itl_vals); free(e->chunk); free(e->kept);
    if (e->groups)
        for (long i = 0; i < e->ngroups; i++) free(e->groups[i].h);
    free(e->groups);
    free(e->reqs); free(e->free_slots); free(e->wq); free(e->run);
    free(e->sg_emit);  /* sg */
    free(e->part_slot); free(e->part_new); free(e->chunk_tokens); free(e->chunk_ctx);
    free(e->preempted); free(e->admitted); free(e->finished); free(e->swapped_in); free(e->by_swap); free(e->sq);
    if (e->tier) { kvt_free(e->tier); free(e->tier); }
    free(e->loads);
    kv_spec_free(e->sp);
    kv_tok_free(e->tt);
    bt_free(e->bt);
    pp_free(e->pp);
}

static int rep_init(kv_rep *e, kv_engine *S, long index) {
    const kv_engine_config *cfg = &S->c;
    e->S = S; e->c = *cfg; e->pricing = S->pricing; e->index = index;
    e->free_blocks = cfg->num_gpu_blocks;
    e->cpu_free = cfg->num_cpu_blocks;
    long m = cfg->max_num_seqs + 2;
    e->part_slot = malloc(sizeof(long) * m); e->part_new = malloc(sizeof(long) * m);
    e->chunk_tokens = malloc(sizeof(long) * m); e->chunk_ctx = malloc(sizeof(long) * m);
    e->preempted = malloc(sizeof(long) * m); e->admitted = malloc(sizeof(long) * m);
    e->finished = malloc(sizeof(long) * m);
    e->swapped_in = malloc(sizeof(long) * m); e->by_swap = malloc(m);
    e->run_cap = m; e->run = malloc(sizeof(long) * m);
    e->filling = malloc(sizeof(long) * m);
    if (e->c.itl_block < 1) e->c.itl_block = 1 << 16;
    e->itl_blk = malloc(sizeof(double) * (size_t)e->c.itl_block);
    e->itl_min = 1.0 / 0.0; e->itl_max = -1.0 / 0.0;
    if (e->c.fold_steps) {
        if (e->c.step_chunk < 1) e->c.step_chunk = 1 << 14;
        if (e->c.step_cap < 1) e->c.step_cap = 1 << 17;
        e->chunk = malloc(sizeof(double) * KV_STEP_COLUMNS * (size_t)e->c.step_chunk);
        if (!e->chunk) return 0;
    }
    e->eng = ENG_IDLE;
    e->cold = 1;  /* ASYNC: it starts idle */
    e->pc = cfg->prefix_caching != 0;
    e->uncached_free = cfg->num_gpu_blocks; e->lru_head = e->lru_tail = -1;
    return e->itl_blk && e->filling && e->part_slot && e->part_new && e->chunk_tokens && e->chunk_ctx && e->preempted && e->admitted
           && e->finished && e->run && e->swapped_in && e->by_swap;
}

kv_engine *kv_engine_new(const kv_engine_config *cfg, const kv_pricing *pricing) {
    if (cfg->num_replicas < 0 || cfg->clients < 0) return NULL;
    kv_engine *S = calloc(1, sizeof *S);
    if (!S) return NULL;
    S->c = *cfg;
    S->pricing = pricing;
    S->nrep = cfg->num_replicas ? cfg->num_replicas : 1;
    S->reps = calloc((size_t)S->nrep, sizeof(kv_rep));
    if (cfg->clients) S->client_think = calloc((size_t)cfg->clients, sizeof(double));
    if (!S->reps || (cfg->clients && !S->client_think)) { kv_engine_free(S); return NULL; }
    for (long i = 0; i < S->nrep; i++)
        if (!rep_init(&S->reps[i], S, i)) { kv_engine_free(S); return NULL; }
    S->arr_resume = 1;
    S->taking = -1;
    S->hash_group = -1;
    return S;
}

static void free_input(kv_engine *S) {
    free(S->in_at); free(S->in_think); free(S->in_id); free(S->in_prompt); free(S->in_output); free(S->in_max);
    free(S->in_pid); free(S->in_npt);
    S->in_at = S->in_think = NULL;
    S->in_id = S->in_prompt = S->in_output = S->in_max = S->in_pid = S->in_npt = NULL;
    free(S->in_w); S->in_w = NULL;  /* sg: kv_engine_feed_widths follows the feed */
}

void kv_engine_free(kv_engine *S) {
    if (!S) return;
    if (S->reps)
        for (long i = 0; i < S->nrep; i++) rep_free(&S->reps[i]);
    kv_fleet_free(S->fleet);
    free(S->reps); free(S->heap); free(S->client_think); free(S->pid_keys); free(S->pid_vals);
    kvs_free(S->sess);
    free_input(S);
    dg_free(S);
    free(S);
}

void kv_engine_counts(const kv_engine *S, long *out) {
    for (long i = 0; i < S->nrep; i++) {
        const kv_rep *e = &S->reps[i];
        long *o = out + KV_COUNTS * i;
        o[0] = e->num_arrived; o[1] = e->num_done; o[2] = e->num_holds;
        o[3] = e->prefix_query_tokens; o[4] = e->prefix_hit_tokens;
    }
}

int kv_engine_feed(kv_engine *S, long n, const double *at, const long *ids, const long *prompt,
                   const long *output, const long *max_tokens, const double *think,
                   const long *prefix_id, const long *prefix_tokens, int last) {
    free_input(S);
    S->in_n = S->in_pos = 0;  /* nothing to read until the copy below is whole */
    if (n < 0) n = 0;
    size_t k = (size_t)(n ? n : 1);
    S->in_at = malloc(sizeof(double) * k); S->in_think = malloc(sizeof(double) * k);
    S->in_id = malloc(sizeof(long) * k); S->in_prompt = malloc(sizeof(long) * k);
    S->in_output = malloc(sizeof(long) * k); S->in_max = malloc(sizeof(long) * k);
    S->in_pid = malloc(sizeof(long) * k); S->in_npt = malloc(sizeof(long) * k);
    if (!S->in_at || !S->in_think || !S->in_id || !S->in_prompt || !S->in_output || !S->in_max || !S->in_pid
        || !S->in_npt) return KV_NOMEM;
    if (n) {  /* the last, empty feed passes NULL arrays: memcpy from NULL is undefined even for 0 bytes */
        if (at) memcpy(S->in_at, at, sizeof(double) * n); else memset(S->in_at, 0, sizeof(double) * n);
        if (think) memcpy(S->in_think, think, sizeof(double) * n); else memset(S->in_think, 0, sizeof(double) * n);
        memcpy(S->in_id, ids, sizeof(long) * n);
        memcpy(S->in_prompt, prompt, sizeof(long) * n); memcpy(S->in_output, output, sizeof(long) * n);
        memcpy(S->in_max, max_tokens, sizeof(long) * n);
        for (long i = 0; i < n; i++) {
            S->in_pid[i] = prefix_id ? prefix_id[i] : -1;
            S->in_npt[i] = prefix_tokens && prefix_id && prefix_id[i] >= 0 ? prefix_tokens[i] : 0;
        }
    }
    S->in_n = n; S->in_pos = 0; S->in_last = last;
    return 0;
}

/* -- queues ------------------------------------------------------------------------------- */
static int wq_reserve(kv_rep *e) {
    if (e->wq_len < e->wq_cap) return 1;
    long nc = e->wq_cap ? 2 * e->wq_cap : 256;
    long *q = malloc(sizeof(long) * nc);
    if (!q) return 0;
    for (long i = 0; i < e->wq_len; i++) q[i] = e->wq[(e->wq_head + i) % e->wq_cap];
    free(e->wq); e->wq = q; e->wq_cap = nc; e->wq_head = 0;
    return 1;
}
static long wq_at(const kv_rep *e, long i) { return e->wq[(e->wq_head + i) % e->wq_cap]; }
static void wq_push_back(kv_rep *e, long s) { e->wq[(e->wq_head + e->wq_len++) % e->wq_cap] = s; }
static void wq_push_front(kv_rep *e, long s) {
    e->wq_head = (e->wq_head + e->wq_cap - 1) % e->wq_cap; e->wq[e->wq_head] = s; e->wq_len++;
}
static long wq_pop_front(kv_rep *e) {
    long s = e->wq[e->wq_head]; e->wq_head = (e->wq_head + 1) % e->wq_cap; e->wq_len--; return s;
}

static int sq_push_back(kv_rep *e, long s) {
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
static long sq_at(const kv_rep *e, long i) { return e->sq[(e->sq_head + i) % e->sq_cap]; }

static long new_slot(kv_rep *e) {
    if (!e->num_free_slots) {
        long old = e->cap_reqs, nc = old ? 2 * old : 256;
        kv_req *r = realloc(e->reqs, sizeof(kv_req) * nc);
        long *f = realloc(e->free_slots, sizeof(long) * nc);
        if (!r || !f) { if (r) e->reqs = r; if (f) e->free_slots = f; return -1; }
        memset(r + old, 0, sizeof(kv_req) * (nc - old));  /* rep_free frees every slot's `pt` */
        e->reqs = r; e->free_slots = f; e->cap_reqs = nc;
        for (long s = nc - 1; s >= old; s--) e->free_slots[e->num_free_slots++] = s;
    }
    return e->free_slots[--e->num_free_slots];
}

/* -- prefix caching (simcore/block_pool.py BlockPool, PagedAllocator) ----------------------- */
/* block i's content key in r's group: i in a shared prefix's group, its hash id for a turn (SESSIONS) */
#define KEY(r, i) ((r)->hk ? (r)->hk[i] : (i))
static long h_new(kv_rep *e) {
    long h;
    if (e->hfree_n) h = e->hfree[--e->hfree_n];
    else {
        if (e->blk_n == e->blk_cap) {
            long nc = e->blk_cap ? 2 * e->blk_cap : 256;
            kv_blk *b = realloc(e->blk, sizeof(kv_blk) * nc);
            if (!b) return -1;
            e->blk = b; e->blk_cap = nc;
        }
        h = e->blk_n++;
    }
    e->blk[h].g = -1; e->blk[h].i = -1; e->blk[h].ref = 1; e->blk[h].prev = e->blk[h].next = -1;
    return h;
}

static int h_drop(kv_rep *e, long h) {
    if (e->hfree_n == e->hfree_cap) {
        long nc = e->hfree_cap ? 2 * e->hfree_cap : 256;
        long *f = realloc(e->hfree, sizeof(long) * nc);
        if (!f) return 0;
        e->hfree = f; e->hfree_cap = nc;
    }
    e->hfree[e->hfree_n++] = h;
    return 1;
}

static void lru_push(kv_rep *e, long h) {  /* freed last: evicted last */
    e->blk[h].prev = e->lru_tail; e->blk[h].next = -1;
    if (e->lru_tail >= 0) e->blk[e->lru_tail].next = h; else e->lru_head = h;
    e->lru_tail = h;
}

static void lru_remove(kv_rep *e, long h) {
    long p = e->blk[h].prev, n = e->blk[h].next;
    if (p >= 0) e->blk[p].next = n; else e->lru_head = n;
    if (n >= 0) e->blk[n].prev = p; else e->lru_tail = p;
}

static long g_get(const kv_rep *e, long g, long i) {
    return g < e->ngroups && i < e->groups[g].n ? e->groups[g].h[i] : -1;
}

static int g_set(kv_rep *e, long g, long i, long h) {
    if (g >= e->ngroups) {
        long nc = g + 1 > 2 * e->ngroups ? g + 1 : 2 * e->ngroups;
        kv_group *gr = realloc(e->groups, sizeof(kv_group) * nc);
        if (!gr) return 0;
        for (long k = e->ngroups; k < nc; k++) { gr[k].h = NULL; gr[k].n = 0; }
        e->groups = gr; e->ngroups = nc;
    }
    kv_group *gr = &e->groups[g];
    if (i >= gr->n) {
        long nc = i + 1 > 2 * gr->n ? i + 1 : 2 * gr->n;
        long *a = realloc(gr->h, sizeof(long) * nc);
        if (!a) return 0;
        for (long k = gr->n; k < nc; k++) a[k] = -1;
        gr->h = a; gr->n = nc;
    }
    gr->h[i] = h;
    return 1;
}

/* BlockPool.take_many: `n` blocks for positions pos0.. of r's table: uncached free ones first,
   then the least recently freed cached ones, evicted (their content forgotten) */
static int pc_take(kv_rep *e, kv_req *r, long pos0, long n) {
    e->free_blocks -= n;
    for (long k = 0; k < n; k++) {
        long pos = pos0 + k, h = -1;
        if (e->uncached_free) e->uncached_free--;
        else {
            h = e->lru_head;
            if (h < 0) return KV_STALL;  /* the free count said a block was left: never */
            lru_remove(e, h);
            e->groups[e->blk[h].g].h[e->blk[h].i] = -1;
            e->blk[h].g = -1; e->blk[h].ref = 1; e->num_cached--;
        }
        if (pos < r->npb) {
            if (h < 0 && (h = h_new(e)) < 0) return KV_NOMEM;
            r->pt[pos] = h;
        } else if (h >= 0 && !h_drop(e, h)) return KV_NOMEM;
    }
    return 0;
}

/* BlockPool.decref of the block at position `pos` of r's table */
static int pc_decref(kv_rep *e, kv_req *r, long pos) {
    if (pos >= r->npb) { e->uncached_free++; e->free_blocks++; return 0; }
    long h = r->pt[pos];
    if (--e->blk[h].ref) return 0;  /* still held by another table */
    e->free_blocks++;
    if (e->blk[h].g >= 0) { lru_push(e, h); return 0; }
    e->uncached_free++;
    return h_drop(e, h) ? 0 : KV_NOMEM;
}

/* PagedAllocator.free: the table's blocks back, last first */
static int pc_release(kv_rep *e, kv_req *r) {
    for (long pos = r->nblk - 1; pos >= 0; pos--) {
        int rc = pc_decref(e, r, pos);
        if (rc) return rc;
    }
    e->gpu_tokens -= r->ntok; r->nblk = 0; r->ntok = 0;
    return 0;
}

/* the cached leading blocks of r's prefix it may adopt (at least one token is still computed) */
static long pc_hits(const kv_rep *e, const kv_req *r) {
    long hits = 0;
    while (hits < r->npb && g_get(e, r->g, KEY(r, hits)) >= 0) hits++;
    long most = (r->prompt + r->generated - 1) / e->c.block_size;
    return hits < most ? hits : most;
}

/* PagedAllocator.num_blocks_to_allocate: the free blocks an admission with `hit` cached blocks
   and `num_new` tokens after them takes (the evictable hits it revives included) */
static long pc_need(const kv_rep *e, const kv_req *r, long hit, long num_new) {
    long revived = 0;
    for (long i = 0; i < hit; i++) revived += e->blk[g_get(e, r->g, KEY(r, i))].ref == 0;
    return revived + blocks_for(e, hit * e->c.block_size + num_new) - hit;
}

/* PagedAllocator.allocate_slots: adopt the `hit` cached blocks (touched: revived if evictable),
   then new blocks for `num_new` tokens after them; the caller checked that they fit */
static int pc_admit(kv_rep *e, kv_req *r, long hit, long num_new) {
    for (long i = 0; i < hit; i++) {
        long h = g_get(e, r->g, KEY(r, i));
        if (!e->blk[h].ref) { lru_remove(e, h); e->free_blocks--; }
        e->blk[h].ref++;
        r->pt[i] = h;
    }
    long total = blocks_for(e, hit * e->c.block_size + num_new);
    int rc = pc_take(e, r, hit, total - hit);
    r->nblk = total; r->ntok = hit * e->c.block_size + num_new; e->gpu_tokens += r->ntok;
    return rc;
}

/* PagedAllocator.cache_full_blocks: r's full prefix blocks registered under their content
   (the first block with a content wins) */
static int pc_cache_full(kv_rep *e, kv_req *r) {
    long full = r->ntok / e->c.block_size;
    if (full > r->npb) full = r->npb;
    if (full > r->nblk) full = r->nblk;
    for (long i = 0; i < full; i++) {
        long h = r->pt[i];
        long key = KEY(r, i);
        if (e->blk[h].g >= 0 || g_get(e, r->g, key) >= 0) continue;
        if (!g_set(e, r->g, key, h)) return KV_NOMEM;
        e->blk[h].g = r->g; e->blk[h].i = key; e->num_cached++;
    }
    return 0;
}

/* ContinuousPagedPolicy._cache_blocks: r's full blocks registered, and (SESSIONS) a turn's
   written through to the CPU tier */
static int cache_blocks(kv_rep *e, kv_req *r) {
    int rc = pc_cache_full(e, r);
    if (!rc && e->tier && r->tok) kvt_store(e->tier, r->hk, r->ntok / e->c.block_size);
    return rc;
}

/* dense group of a prefix id (S-wide: every replica keys its cache the same) */
/* the slot of prefix id `pid` in the open-addressed table (its own, or the empty one it would take) */
static long pid_slot(const kv_engine *S, long pid) {
    long key = pid + 1;  /* ids are >= 0 */
    unsigned long x = (unsigned long)key * 0x9E3779B97F4A7C15UL;
    long p = (long)(x % (unsigned long)S->pid_cap);
    while (S->pid_keys[p] && S->pid_keys[p] != key) p = (p + 1) % S->pid_cap;
    return p;
}

/* pid_group's lookup alone: the group of a prefix id already seen, else -1 (nothing cached) */
static long pid_find(const kv_engine *S, long pid) {
    if (!S->pid_cap) return -1;
    long p = pid_slot(S, pid);
    return S->pid_keys[p] ? S->pid_vals[p] : -1;
}

static long pid_group(kv_engine *S, long pid) {
    if (2 * (S->pid_n + 1) > S->pid_cap) {
        long nc = S->pid_cap ? 2 * S->pid_cap : 64;
        long *k = calloc((size_t)nc, sizeof(long)), *v = calloc((size_t)nc, sizeof(long));
        if (!k || !v) { free(k); free(v); return -1; }
        for (long j = 0; j < S->pid_cap; j++) {
            if (!S->pid_keys[j]) continue;
            unsigned long x = (unsigned long)S->pid_keys[j] * 0x9E3779B97F4A7C15UL;
            long p = (long)(x % (unsigned long)nc);
            while (k[p]) p = (p + 1) % nc;
            k[p] = S->pid_keys[j]; v[p] = S->pid_vals[j];
        }
        free(S->pid_keys); free(S->pid_vals); S->pid_keys = k; S->pid_vals = v; S->pid_cap = nc;
    }
    long p = pid_slot(S, pid);
    if (!S->pid_keys[p]) { S->pid_keys[p] = pid + 1; S->pid_vals[p] = S->pid_n++; }
    return S->pid_vals[p];
}

static void fail(kv_rep *e, int rc) {
    if (rc && !e->S->err) e->S->err = rc;
}

/* -- inter-token gaps (simcore.records.Samples) -------------------------------------------- */
double kv_pairwise_sum(const double *a, long n) {  /* numpy's pairwise_sum for float64 */
    if (n < 8) {
        double res = 0.;
        for (long i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8], res;
        long i;
        for (int j = 0; j < 8; j++) r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    long n2 = n / 2;
    n2 -= n2 % 8;
    return kv_pairwise_sum(a, n2) + kv_pairwise_sum(a + n2, n - n2);
}

static int hist_add(kv_rep *e, long key) {
    if (!e->hist_n || key < e->hist_key0 || key >= e->hist_key0 + e->hist_n) {
        long lo = e->hist_n && e->hist_key0 < key ? e->hist_key0 : key - 4096;
        long hi = e->hist_n && e->hist_key0 + e->hist_n > key + 1 ? e->hist_key0 + e->hist_n : key + 4096;
        long *h = calloc((size_t)(hi - lo), sizeof(long));
        if (!h) return KV_NOMEM;
        if (e->hist_n) memcpy(h + (e->hist_key0 - lo), e->hist, sizeof(long) * (size_t)e->hist_n);
        free(e->hist); e->hist = h; e->hist_key0 = lo; e->hist_n = hi - lo;
    }
    e->hist[key - e->hist_key0]++;
    return 0;
}

/* Gaps binned a batch at a time (itl_put buffers them in emission order, itl_flush bins them;
   itl_put_run bins n copies of one gap, a decode span's step): kept while the replica's count
   is at most the cap (then they are dropped: the store will be the bins), binned always (min,
   max, zeros, key counts), summed a block at a time (Samples._bin_values: the same float sum).
   One at a time this was a third of the C loop. */
static int itl_keep(kv_rep *e, long m) {  /* room for m more values kept; 0: past the cap */
    long count = e->itl_count;
    if (count + m <= e->c.itl_cap) {
        if (count + m > e->itl_vals_cap) {
            long nc = e->itl_vals_cap ? 2 * e->itl_vals_cap : 4096;
            while (nc < count + m) nc *= 2;
            if (nc > e->c.itl_cap) nc = e->c.itl_cap;
            double *v2 = realloc(e->itl_vals, sizeof(double) * (size_t)nc);
            if (!v2) { fail(e, KV_NOMEM); return 0; }
            e->itl_vals = v2; e->itl_vals_cap = nc;
        }
        return 1;
    }
    if (e->itl_vals) { free(e->itl_vals); e->itl_vals = NULL; e->itl_vals_cap = 0; }  /* past the cap: dropped */
    return 0;
}

/* `reps` copies of x binned, the first being the replica's gap number `index` (0-based): a gap
   equal to the one before goes to its bin */
static void itl_bin(kv_rep *e, double x, long index, long reps) {
    if (!(x == e->itl_last && index > 0)) {
        if (x < e->itl_min) e->itl_min = x;
        if (x > e->itl_max) e->itl_max = x;
        e->itl_last = x; e->itl_last_key = -1;
        if (x != 0.0) {
            long bits;
            memcpy(&bits, &x, sizeof bits);
            e->itl_last_key = bits >> KV_HIST_SHIFT;
            int rc = hist_add(e, e->itl_last_key);  /* counts one */
            if (rc) { fail(e, rc); return; }
            reps--;
        }
    }
    if (e->itl_last_key < 0) e->itl_zeros += reps;
    else e->hist[e->itl_last_key - e->hist_key0] += reps;
}

/* the block sums: n gaps (v, or n copies of `fill` when v is NULL) appended */
static void itl_sum(kv_rep *e, const double *v, double fill, long n) {
    for (long i = 0; i < n;) {
        long take = e->c.itl_block - e->itl_blk_n;
        if (take > n - i) take = n - i;
        double *dst = e->itl_blk + e->itl_blk_n;
        if (v) memcpy(dst, v + i, sizeof(double) * (size_t)take);
        else for (long k = 0; k < take; k++) dst[k] = fill;
        e->itl_blk_n += take; i += take;
        if (e->itl_blk_n == e->c.itl_block) {
            e->itl_total += kv_pairwise_sum(e->itl_blk, e->itl_blk_n);
            e->itl_blk_n = 0;
        }
    }
}

static void itl_put_many(kv_rep *e, const double *v, long m) {
    if (m <= 0) return;
    long count = e->itl_count;
    if (itl_keep(e, m)) memcpy(e->itl_vals + count, v, sizeof(double) * (size_t)m);
    for (long i = 0; i < m;) {  /* by runs of equal gaps */
        double x = v[i];
        long j = i + 1;
        while (j < m && v[j] == x) j++;
        itl_bin(e, x, count + i, j - i);
        i = j;
    }
    e->itl_count = count + m;
    itl_sum(e, v, 0.0, m);
}

static void itl_flush(kv_rep *e) {
    itl_put_many(e, e->gap, e->gap_n);
    e->gap_n = 0;
}

static void itl_put_run(kv_rep *e, double v, long n) {
    if (n <= 0) return;
    if (e->gap_n) itl_flush(e);
    long count = e->itl_count;
    if (itl_keep(e, n)) {
        double *dst = e->itl_vals + count;
        for (long k = 0; k < n; k++) dst[k] = v;
    }
    itl_bin(e, v, count, n);
    e->itl_count = count + n;
    itl_sum(e, NULL, v, n);
}

/* One gap, in emission order (binned when the buffer fills, or at the end of the run) */
static inline void itl_put(kv_rep *e, double v) {
    e->gap[e->gap_n++] = v;
    if (e->gap_n == KV_GAP_BUF) itl_flush(e);
}

long kv_engine_itl(const kv_engine *S, long replica, double *stats, long *key0, long *hist, double *values) {
    const kv_rep *e = &S->reps[replica];
    stats[0] = (double)e->itl_count; stats[1] = e->itl_total; stats[2] = e->itl_min; stats[3] = e->itl_max;
    stats[4] = (double)e->itl_zeros;
    long lo = 0, hi = e->hist_n;  /* trimmed to the keys in use */
    while (lo < hi && !e->hist[lo]) lo++;
    while (hi > lo && !e->hist[hi - 1]) hi--;
    *key0 = e->hist_key0 + lo;
    if (hist && hi > lo) memcpy(hist, e->hist + lo, sizeof(long) * (size_t)(hi - lo));
    if (values && e->itl_count && e->itl_count <= e->c.itl_cap)
        memcpy(values, e->itl_vals, sizeof(double) * (size_t)e->itl_count);
    return hi - lo;
}

/* -- outputs ------------------------------------------------------------------------------ */
/* A request leaves (Lifecycle._leave): its row, and the done event its closed-loop client waits on */
static int put_req(kv_rep *e, const kv_req *r, int rejected, long kind, long output) {
    kv_engine *S = e->S;
    kv_outputs *o = S->out;
    double *row = o->req + KV_REQ_ROW * o->req_n++;
    row[0] = (double)r->id; row[1] = (double)e->index; row[2] = rejected ? 1 : 0; row[3] = rejected ? 0 : -1;
    row[4] = r->arrival; row[5] = r->first_sched; row[6] = r->first_token;
    row[7] = rejected ? -1.0 : e->pp ? r->last_token : S->now;  /* pp: at its last token (Lifecycle.finish) */
    row[8] = (double)r->prompt; row[9] = (double)r->generated;
    row[10] = (double)r->max_tokens; row[11] = r->k > 1 ? (double)r->k : 1; row[12] = 1;  /* sg: n */ row[13] = (double)r->preemptions;
    row[14] = (double)kind; row[15] = (double)output; row[16] = (double)o->num_arrived;
    o->num_done++;
    e->num_done++;
    if (S->dg && !rejected) return dg_left(e, (kv_req *)r);  /* the proxy's next hop (disagg.c) */
    if (r->client >= 0) {
        if (S->sess) kvs_left(S->sess, r->client, rejected);  /* SESSIONS: client = the session */
        return ev_push(S, S->now, EV_DONE, r->client);
    }
    return 0;
}

/* -- arrival (Router._pick, Engine._accept) ------------------------------------------------ */
static kv_rep *least_loaded(kv_engine *S);

/* SESSIONS: Router._best_prefix (llm-d's precise prefix-cache scorer, weights 2 : 1 : 1): the
   share of the prompt's full blocks a replica holds as a prefix (GPU cache, then its CPU tier),
   its free KV share, its queue min-max scaled; the highest score (ties: the lowest index) */
static long pid_find(const kv_engine *S, long pid);

static kv_rep *best_prefix(kv_engine *S, const long *hk, long prompt, long pid, long npt) {
    long g = !hk && pid >= 0 ? pid_find(S, pid) : -1;  /* a declared shared prefix: its group, if seen */
    long low = S->reps[0].wq_len, high = low;
    for (long i = 1; i < S->nrep; i++) {
        long q = S->reps[i].wq_len;
        if (q < low) low = q;
        if (q > high) high = q;
    }
    kv_rep *best = S->reps; double best_score = -1.0;
    for (long i = 0; i < S->nrep; i++) {
        kv_rep *e = &S->reps[i];
        double kv_free = (double)e->free_blocks / (double)e->c.num_gpu_blocks, prefix = 0.0;
        long nb = prompt / e->c.block_size;
        if (nb && e->pc && hk) {  /* (no turn cached yet: no hash group yet) */
            long hits = 0;
            while (S->hash_group >= 0 && hits < nb && g_get(e, S->hash_group, hk[hits]) >= 0) hits++;
            if (e->tier) hits += kvt_hits(e->tier, hk, hits, nb);
            prefix = (double)hits / (double)nb;
        } else if (nb && e->pc && g >= 0) {  /* block i of prefix p cached as (p, i): router.prefix_share */
            long hits = 0, npb = npt / e->c.block_size;
            while (hits < npb && g_get(e, g, hits) >= 0) hits++;
            prefix = (double)hits / (double)nb;
        }
        double queue = high > low ? (double)(high - e->wq_len) / (double)(high - low) : 1.0;
        double score = 2.0 * prefix + 1.0 * kv_free + 1.0 * queue;
        if (score > best_score) { best = e; best_score = score; }
    }
    return best;
}

static kv_rep *pick(kv_engine *S, long sess, const long *hk, long prompt, long pid, long npt) {
    if (S->fleet) return &S->reps[kv_fleet_pick(S)];  /* autoscaling: the active replicas only */
    if (S->nrep == 1) return S->reps;
    if (S->c.router == KV_ROUTER_ROUND_ROBIN) {
        kv_rep *e = &S->reps[S->rr_next];
        S->rr_next = (S->rr_next + 1) % S->nrep;
        return e;
    }
    if (S->c.router == KV_ROUTER_PREFIX_SCORE && (sess >= 0 || pid >= 0))  /* a turn or a declared prefix */
        return best_prefix(S, hk, prompt, sess >= 0 ? -1 : pid, npt);
    if (S->c.router == KV_ROUTER_SESSION_AFFINITY && sess >= 0) {  /* a conversation stays where it began */
        long a = kvs_affinity(S->sess, sess);
        if (a < 0) { a = least_loaded(S)->index; kvs_set_affinity(S->sess, sess, a); }
        return &S->reps[a];
    }
    return least_loaded(S);
}

static kv_rep *least_loaded(kv_engine *S) {
    kv_rep *best = S->reps;  /* the fewest waiting, running or swapped; ties: the lowest index */
    long least = best->wq_len + best->run_len + best->sq_len;
    for (long i = 1; i < S->nrep; i++) {
        kv_rep *e = &S->reps[i];
        long load = e->wq_len + e->run_len + e->sq_len;
        if (load < least) { least = load; best = e; }
    }
    return best;
}

/* Engine._accept of one request: `client` waits for it (-1: nobody; SESSIONS: with sessions, the
   session, `hk` its block keys, NULL without prefix caching) */
static int send_req(kv_engine *S, long id, long prompt, long out, long max_tokens, long pid, long npt,
                    double stamp, long client, const long *hk, long nkeys) {
    kv_rep *e = pick(S, S->sess ? client : -1, hk, prompt, pid, npt);
    kv_req r;
    memset(&r, 0, sizeof r);
    r.id = id; r.prompt = prompt; r.max_tokens = max_tokens; r.client = client; r.g = -1;
    r.k = S->sg_next > 1 ? S->sg_next : 1; S->sg_next = 0;  /* sg: its width */
    long room = e->c.max_model_len - r.prompt;
    r.target = out < room ? out : room;
    if (r.target < 1) r.target = 1;
    r.arrival = stamp; r.first_sched = r.first_token = r.last_token = -1.0;
    S->out->arr[S->out->arr_n++] = stamp;
    S->out->num_arrived++;
    e->num_arrived++;
    long final_len = r.prompt + r.target - 1, need = blocks_for(e, final_len), kind = KV_REJECT_NONE;
    if (r.prompt > e->c.max_model_len) kind = KV_REJECT_MODEL_LEN;
    else if (e->bt) kind = bt_check(e, &r);  /* bt: the reservation policy's own checks */
    else if (!e->c.chunked_prefill && r.prompt > e->c.max_num_batched_tokens) kind = KV_REJECT_BUDGET;
    else if (r.k > 1) kind = sg_check(e, &r);  /* sg: a group's own checks (no watermark) */
    else if (need > e->c.num_gpu_blocks) kind = KV_REJECT_CACHE;
    else if (!e->c.chunked_prefill && need > e->c.num_gpu_blocks - e->c.watermark_blocks) kind = KV_REJECT_WATERMARK;
    if (kind) return put_req(e, &r, 1, kind, out);
    if (e->pc && pid >= 0) {  /* ContinuousPagedPolicy._prefix_hashes: (g, 0..npb-1) */
        r.g = pid_group(S, pid);
        r.npt = npt; r.npb = r.npt / e->c.block_size;
        if (r.g < 0) return KV_NOMEM;
        if (r.npb && !(r.pt = malloc(sizeof(long) * r.npb))) return KV_NOMEM;
    } else if (e->pc && hk) {  /* SESSIONS: a turn's every full block, keyed by hash id */
        if (S->hash_group < 0 && (S->hash_group = pid_group(S, (long)(~0UL >> 2))) < 0) return KV_NOMEM;
        r.g = S->hash_group; r.hk = hk; r.tok = 1;
        r.npb = (r.prompt + r.target) / e->c.block_size;
        if (r.npb > nkeys) r.npb = nkeys;
        if (r.npb && !(r.pt = malloc(sizeof(long) * r.npb))) return KV_NOMEM;
    }
    long s = new_slot(e);
    if (s < 0 || !wq_reserve(e)) return KV_NOMEM;
    e->reqs[s] = r;
    wq_push_back(e, s);
    if (e->eng == ENG_IDLE) {  /* its wakeup succeeds */
        e->eng = ENG_WAKE;
        return ev_push(S, S->now, EV_ENGINE, e->index);
    }
    if (e->bt) return bt_wake(e);  /* bt: static batching's engine may wait on its timer too */
    if (e->eng == ENG_IDLE_T) {  /* SESSIONS: it waits on the first of its wakeup and a timer */
        e->eng = ENG_HOPPING;
        return ev_push(S, S->now, EV_HOP, e->index);
    }
    return 0;
}

static int send(kv_engine *S, long i, double stamp, long client) {
    if (S->dg) return dg_accept(S, i, stamp, client);  /* to the disaggregated proxy (disagg.c) */
    S->sg_next = S->in_w ? S->in_w[i] : 1;  /* sg */
    return send_req(S, S->in_id[i], S->in_prompt[i], S->in_output[i], S->in_max[i], S->in_pid[i], S->in_npt[i],
                    stamp, client, NULL, 0);
}

/* SESSIONS: what sessions.c calls */
double kvi_now(const kv_engine *S) { return S->now; }
int kvi_push(kv_engine *S, double t, int kind, long arg) { return ev_push(S, t, kind, arg); }
int kvi_send_turn(kv_engine *S, long id, long prompt, long output, long sess, const long *keys, long nkeys) {
    return send_req(S, id, prompt, output, output, -1, 0, S->now, sess, keys, nkeys);
}
int kvi_attach_sessions(kv_engine *S, kv_sessions *q) {
    kvs_free(S->sess);
    S->sess = q;
    return 0;
}
kv_sessions *kvi_sessions(const kv_engine *S) { return S->sess; }

int kv_engine_offload(kv_engine *S, long num_blocks, double load_block_s, long nkeys) {
    S->tier_blocks = num_blocks; S->load_block_s = load_block_s; S->nkeys = nkeys;
    for (long i = 0; i < S->nrep; i++) {
        kv_rep *e = &S->reps[i];
        if (!(e->tier = malloc(sizeof(kv_tier))) || !kvt_init(e->tier, num_blocks, nkeys)) return KV_NOMEM;
    }
    return 0;
}

void kv_engine_tier_wait(const kv_engine *S, double *out) {
    for (long i = 0; i < S->nrep; i++) out[i] = S->reps[i].off_wait_s;
}

void kv_engine_tier_counts(const kv_engine *S, long *out) {
    for (long i = 0; i < S->nrep; i++) {
        const kv_rep *e = &S->reps[i];
        long *o = out + KV_TIER_COUNTS * i;
        o[0] = e->off_hit_tokens; o[1] = e->off_loaded_blocks;
        o[2] = e->tier ? e->tier->stored : 0; o[3] = e->tier ? e->tier->evicted : 0;
    }
}

/* The open-loop arrival process, from where it stands: send the requests planned at the same
   time, then wait (one timeout) for the next planned time; while the queue is past the hold
   threshold, wait for it to drain, then send what was held with its planned time. Returns 0 (it
   waits), KV_NEED_INPUT or KV_FULL (resumed where it stopped), or an error. */
static int arrivals_continue(kv_engine *S) {
    kv_outputs *o = S->out;
    for (;;) {
        if (S->arr_stage == ARR_LOOK) {
            if (S->in_pos >= S->in_n) {
                if (S->in_last) { S->arr_resume = 0; return S->fleet ? kv_fleet_workload_end(S) : 0; }
                return KV_NEED_INPUT;
            }
            double at = 0.0 + S->in_at[S->in_pos];
            if (at > S->previous) {
                if (!(S->late && at <= S->now)) {
                    S->late = 0;
                    double delay = at - S->now;
                    if (delay < 0.0) delay = 0.0;
                    S->previous = at; S->arr_stage = ARR_SEND; S->arr_resume = 0;
                    return ev_push(S, S->now + delay, EV_ARRIVAL, 0);
                }
                S->previous = at;
            }
            S->arr_stage = ARR_SEND;
        }
        /* Engine.hold_arrivals: one replica only (a router has none) */
        if (S->arr_stage == ARR_SEND && S->nrep == 1 && S->reps[0].wq_len >= S->c.hold_at) {
            S->held = 1; S->reps[0].num_holds++; o->num_holds++;
            S->arr_stage = ARR_SEND_LATE; S->arr_resume = 0;
            return 0;
        }
        if (o->arr_n >= o->arr_cap || o->req_n >= o->req_cap) return KV_FULL;
        int rc = send(S, S->in_pos, S->late ? 0.0 + S->in_at[S->in_pos] : S->now, -1);
        if (rc) return rc;
        S->in_pos++;
        S->arr_stage = ARR_LOOK;
    }
}

/* A closed-loop client (workloads/arrivals.py closed_loop_process) takes the next request of the
   shared stream and submits it now; with none left it ends. Returns 0, KV_NEED_INPUT or KV_FULL
   (`taking` stays set: resumed there) or an error. */
static int client_take(kv_engine *S) {
    kv_outputs *o = S->out;
    long k = S->taking;
    if (S->in_pos >= S->in_n) {
        if (!S->in_last) return KV_NEED_INPUT;
        S->taking = -1;
        return S->fleet ? kv_fleet_client_end(S) : 0;
    }
    if (o->arr_n >= o->arr_cap || o->req_n >= o->req_cap) return KV_FULL;
    long i = S->in_pos++;
    S->client_think[k] = S->in_think[i];
    S->taking = -1;
    return send(S, i, S->now, k);
}

/* -- scheduling ----------------------------------------------------------------------------- */
static void plan_reset(kv_rep *e) {
    e->num_parts = e->num_chunks = e->num_preempted = e->num_admitted = e->num_filling = 0;
    e->num_swapped_in = e->num_swap_blocks = 0;
    e->num_tokens = e->num_decode_seqs = e->decode_ctx = e->num_sampled = 0;
    e->sg_nemit = 0;  /* sg */
    if (e->sp) kv_spec_reset(e->sp);
}

/* ContinuousPagedPolicy._add: a decode when one new token after generated ones, else a chunk */
static inline void plan_add(kv_rep *e, long s, long num_new, long computed) {
    const kv_req *r = &e->reqs[s];
    e->part_slot[e->num_parts] = s; e->part_new[e->num_parts++] = num_new;
    if (r->k > 1 && computed + num_new == r->prompt + r->generated) fail(e, sg_emitting(e, s));  /* sg */
    if (r->forked) sg_plan_decode(e, r);  /* sg: one token for each of its sequences */
    else if (num_new == 1 && r->generated) {
        e->num_tokens += 1; e->num_decode_seqs += 1; e->decode_ctx += r->computed + 1; e->num_sampled += 1;
        /* spec: it drafts next only if it samples: a recomputing request's 1-token chunk is priced
           as a decode here (as ContinuousPagedPolicy._add does) but samples nothing */
        if (e->sp && computed + 1 == r->prompt + r->generated) kv_spec_drafting(e->sp, computed + 1);
    } else if (e->sp && r->generated && computed + 1 == r->prompt + r->generated) {
        /* spec: a verify (its last token and num_new - 1 drafts), one decode in the plan's counts */
        e->num_tokens += 1; e->num_decode_seqs += 1; e->decode_ctx += computed + 1; e->num_sampled += 1;
        kv_spec_verify(e->sp, e->num_parts - 1, num_new - 1, computed);
    } else {
        e->num_tokens += num_new;
        e->chunk_tokens[e->num_chunks] = num_new; e->chunk_ctx[e->num_chunks++] = computed;
        if (computed + num_new == r->prompt + r->generated) {
            e->num_sampled += 1;
            if (e->sp) kv_spec_drafting(e->sp, computed + num_new);  /* spec */
        }
        if (e->pc && (computed < r->npt || r->tok) && r->npb) e->filling[e->num_filling++] = s;
    }
}

static void release(kv_rep *e, kv_req *r) {
    if (r->forked) { sg_release(e, r); return; }  /* sg */
    if (e->pc) { fail(e, pc_release(e, r)); return; }
    e->free_blocks += r->nblk; e->gpu_tokens -= r->ntok; r->nblk = 0; r->ntok = 0;
}

/* append_slots: all or nothing (no copy-on-write: a request's last block is never shared, a
   shared block being a full cached one) */
static inline int grow_seq(kv_rep *e, kv_req *r, long num_new) {
    if (r->ntok + num_new <= r->nblk * e->c.block_size) {  /* room in its last block (a decode, mostly) */
        r->ntok += num_new; e->gpu_tokens += num_new;
        return 1;
    }
    long need = blocks_for(e, r->ntok + num_new) - r->nblk;
    if (need > e->free_blocks) return 0;
    if (e->pc) fail(e, pc_take(e, r, r->nblk, need));
    else e->free_blocks -= need;
    r->nblk += need; r->ntok += num_new; e->gpu_tokens += num_new;
    return 1;
}

/* The common case of _schedule_running, fast: running[i..n) while each is a decode (one token
   after generated ones) with room in its last block; what grow_seq and plan_add do for it, with
   the plan's counters in locals (stores through `r` could alias `e`'s fields). Returns where it
   stopped: the generic loop takes that request. */
static long decode_run(kv_rep *e, long i, long n, long *budget_io) {
    long np = e->num_parts, nt = e->num_tokens, nd = e->num_decode_seqs, dctx = e->decode_ctx;
    long ns = e->num_sampled, gt = e->gpu_tokens, budget = *budget_io;
    long *ps = e->part_slot, *pn = e->part_new; const long *run = e->run;
    kv_req *reqs = e->reqs; const long bs = e->c.block_size;
    for (; i < n && budget > 0; i++) {
        long s = run[i];
        kv_req *r = &reqs[s];
        if (!r->generated || r->computed + 1 != r->prompt + r->generated || r->ntok + 1 > r->nblk * bs
            || r->k > 1) break;  /* (sg: a group, forked or not, takes the generic path) */
        r->ntok += 1; gt += 1;
        ps[np] = s; pn[np++] = 1;
        nt += 1; nd += 1; dctx += r->computed + 1; ns += 1;
        budget -= 1;
    }
    e->num_parts = np; e->num_tokens = nt; e->num_decode_seqs = nd; e->decode_ctx = dctx;
    e->num_sampled = ns; e->gpu_tokens = gt; *budget_io = budget;
    return i;
}

/* ContinuousPagedPolicy._preempt of running request v (the tail): swap while the CPU pool has room */
static inline void preempt(kv_rep *e, long v) {
    kv_req *vr = &e->reqs[v];
    int swap = vr->forked ? sg_swap_out(e, vr) : e->c.swap && vr->nblk <= e->cpu_free;
    if (vr->forked) {  /* sg: swapped out above, or released */
        if (!swap) release(e, vr);
    } else if (swap && e->pc) {  /* PagedAllocator._move: block by block, the GPU's let go in order */
        e->cpu_free -= vr->nblk; e->gpu_tokens -= vr->ntok; e->num_swap_blocks += vr->nblk;
        for (long pos = 0; pos < vr->nblk; pos++) fail(e, pc_decref(e, vr, pos));
    } else if (swap) {
        e->free_blocks += vr->nblk; e->cpu_free -= vr->nblk; e->gpu_tokens -= vr->ntok;
        e->num_swap_blocks += vr->nblk;
    } else {
        if (vr->tok) fail(e, cache_blocks(e, vr));  /* SESSIONS: its blocks stay cached (vLLM) */
        release(e, vr);
    }
    e->by_swap[e->num_preempted] = (char)swap;
    e->preempted[e->num_preempted++] = v;
}

/* _schedule_running over a copy of `running` (its length `*n` shrinks as the tail is preempted) */
static long schedule_running(kv_rep *e, long *n, long budget) {
    long i = 0;
    while (i < *n && budget > 0) {
        if (!e->sp) i = decode_run(e, i, *n, &budget);  /* the plain decodes from i on, in a tight loop */
        if (i >= *n || budget <= 0) break;
        long s = e->run[i];
        kv_req *r = &e->reqs[s];
        long left = r->prompt + r->generated - r->computed;
        long num_new = left < budget ? left : budget;
        if (e->sp && r->generated && left == 1)  /* spec: a decoding request verifies its drafts */
            num_new = 1 + kv_spec_drafts(e->sp, r->target - r->generated - 1, budget - 1);
        if (r->forked) {  /* sg: a forked group decodes, a token per sequence */
            num_new = 1;
            if (r->k > budget) break;
        }
        int ok = r->forked ? sg_grow(e, r) : grow_seq(e, r, num_new);
        while (!ok) {
            long v = e->run[--*n];
            preempt(e, v);
            if (v == s) break;
            ok = r->forked ? sg_grow(e, r) : grow_seq(e, r, num_new);
        }
        if (!ok) break;
        plan_add(e, s, num_new, r->computed);
        budget -= r->forked ? num_new * r->k : num_new;  /* (sg: a forked group's k sequences) */
        i++;
    }
    return budget;
}

/* allocate_slots + _take_admitted: `hit` cached prefix blocks adopted, `num_new` tokens after them */
static long admit_one(kv_rep *e, long s, long num_new, long hit) {
    kv_req *r = &e->reqs[s];
    long cached = hit * e->c.block_size;
    if (e->pc) {
        fail(e, pc_admit(e, r, hit, num_new));
        /* _take_admitted's shares_prefix: it has hashes (V1: or it is a turn; SESSIONS) */
        if (r->tok ? e->c.chunked_prefill || (r->prompt + r->generated) / e->c.block_size : r->npb)
            e->prefix_query_tokens += r->prompt + r->generated;
        e->prefix_hit_tokens += cached;
    } else {
        long need = blocks_for(e, num_new);
        e->free_blocks -= need; r->nblk = need; r->ntok = num_new; e->gpu_tokens += num_new;
    }
    r->adm_cached = cached;
    e->admitted[e->num_admitted++] = s;
    plan_add(e, s, num_new, cached);
    return num_new;
}

/* -- ms: multi-step scheduling (VllmV0PagedPolicy, continuous_v0.py's docstring) ------------- */
/* the slots a sequence asks for when `n` are its next tokens: a round's lookahead too, to max_model_len */
static inline long ms_target(const kv_rep *e, long n) {
    long t = n + e->ms_ahead;
    return t < e->c.max_model_len ? t : e->c.max_model_len;
}

/* _start_round: _schedule_running with the round's lookahead; every running request decodes */
static long ms_start_round(kv_rep *e, long *n, long budget) {
    long i = 0;
    while (i < *n && budget > 0) {
        long s = e->run[i];
        kv_req *r = &e->reqs[s];
        long held = r->nblk, need = blocks_for(e, ms_target(e, r->ntok + 1)) - held;
        int ok = 1;
        while (need > e->free_blocks - e->ms_reserved) {
            long v = e->run[--*n];
            preempt(e, v);
            if (v == s) { ok = 0; break; }
        }
        if (!ok) break;
        grow_seq(e, r, 1);  /* checked: its lookahead fits */
        e->ms_reserved += need - (r->nblk - held);
        plan_add(e, s, 1, r->computed);
        budget -= 1;
        i++;
    }
    return budget;
}

/* _continue_round: a step of the round under way (its running requests decode, its finished ones
   are computed too); 0: nothing running, waiting or swapped, the engine idles and the round waits */
static int ms_continue(kv_rep *e) {
    if (!e->run_len && !e->wq_len && !e->sq_len) return 0;
    e->ms_left--;
    long n = e->run_len;
    schedule_running(e, &n, e->c.max_num_batched_tokens);
    if (e->num_preempted) return KV_STALL;  /* never: its blocks were held back at its start */
    long g = e->ms_ghosts;
    if (g) {
        e->num_tokens += g; e->num_decode_seqs += g; e->num_sampled += g;
        e->decode_ctx += e->ms_ghost_ctx;
        e->ms_ghost_ctx += g;
    }
    return 1;
}

/* ContinuousPagedPolicy._swap_in: the head of the swapped queue back while it fits (its blocks
   and the step's new tokens), appended to the running set (length *n) */
static long swap_in(kv_rep *e, long *n, long budget) {
    long j = 0;
    while (j < e->sq_len && budget > 0 && *n + e->sg_extra < e->c.max_num_seqs) {
        long s = sq_at(e, j);
        kv_req *r = &e->reqs[s];
        if (r->forked) {  /* sg: a forked group's blocks and a token per sequence */
            long got = sg_swap_in(e, r, *n, budget);
            if (got < 0) break;
            e->swapped_in[e->num_swapped_in++] = s;
            e->run[(*n)++] = s;
            j++;
            plan_add(e, s, 1, r->computed);
            budget -= got;
            continue;
        }
        long left = r->prompt + r->generated - r->computed;
        long num_new = left < budget ? left : budget;
        long need = blocks_for(e, e->ms_ahead ? ms_target(e, r->computed + num_new) : r->computed + num_new);
        if (e->free_blocks - e->ms_reserved < need || 1 > budget) break;  /* (ms: and a round's lookahead) */
        e->cpu_free += r->nblk; e->gpu_tokens += r->ntok;
        if (e->pc) fail(e, pc_take(e, r, 0, r->nblk));  /* new GPU blocks, one by one (may evict) */
        else e->free_blocks -= r->nblk;
        e->num_swap_blocks += r->nblk;
        e->swapped_in[e->num_swapped_in++] = s;
        e->run[(*n)++] = s;
        j++;
        grow_seq(e, r, num_new);  /* checked: it fits */
        if (e->ms_ahead) e->ms_reserved += need - r->nblk;  /* ms: the rest held back for the round */
        plan_add(e, s, num_new, r->computed);
        budget -= num_new;
    }
    return budget;
}

/* SESSIONS: ContinuousPagedPolicy._start_load: if r's prefix continues in the CPU tier past its
   `hit` GPU blocks, take GPU blocks for both and queue the load on the host link; 1 if it did */
static int start_load(kv_rep *e, long s, long hit) {
    kv_req *r = &e->reqs[s];
    long bs = e->c.block_size, nt = r->prompt + r->generated, nb = nt / bs;
    kvt_touch(e->tier, r->hk, nb);  /* get_num_new_matched_tokens touches the request's blocks */
    long loaded = kvt_hits(e->tier, r->hk, hit, nb), most = (nt - 1) / bs - hit;
    if (loaded > most) loaded = most;
    if (loaded <= 0) return 0;
    long need = pc_need(e, r, hit, nt - hit * bs);
    if (need + e->load_reserved > e->free_blocks) return 0;  /* the whole prompt must fit now, beside the queued loads' */
    if (pc_need(e, r, hit, loaded * bs) > e->free_blocks) return 0;
    fail(e, pc_admit(e, r, hit, loaded * bs));
    double now = e->S->now, ready = (now > e->link_free ? now : e->link_free) + (double)loaded * e->S->load_block_s;
    e->link_free = ready;
    r->loading = 1; r->ready = ready; r->load_start = now; r->off_cached = (hit + loaded) * bs; r->off_loaded = loaded * bs;
    e->off_loaded_blocks += loaded;
    r->off_rest = blocks_for(e, nt) - r->nblk;
    e->load_reserved += r->off_rest;
    if (e->nload == e->load_cap) {
        long nc = e->load_cap ? 2 * e->load_cap : 64;
        long *l = realloc(e->loads, sizeof(long) * nc);
        if (!l) { fail(e, KV_NOMEM); return 1; }
        e->loads = l; e->load_cap = nc;
    }
    e->loads[e->nload++] = s;
    return 1;
}

/* returns 1 when a step is planned */
static int schedule(kv_rep *e) {
    if (e->bt) return bt_schedule(e);  /* bt: (negative: an error) */
    plan_reset(e);
    long n = e->run_len, budget = e->c.max_num_batched_tokens;
    if (!e->c.chunked_prefill) {  /* VllmV0PagedPolicy.schedule */
        if (e->ms_left) return ms_continue(e);  /* ms: the decode round under way */
        if (!e->sq_len && e->wq_len) {
            long num_seqs = n + e->sg_extra;  /* (sg: a forked group's sequences count) */
            for (long j = 0; j < e->wq_len; j++) {
                long s = wq_at(e, j);
                const kv_req *r = &e->reqs[s];
                long num_tokens = r->prompt + r->generated;
                if (num_tokens > budget || num_seqs + r->k > e->c.max_num_seqs) break;
                long hit = e->pc && r->npb ? pc_hits(e, r) : 0;
                long need = hit ? pc_need(e, r, hit, num_tokens - hit * e->c.block_size) : blocks_for(e, num_tokens);
                if (e->free_blocks - need < e->c.watermark_blocks) break;
                admit_one(e, s, num_tokens - hit * e->c.block_size, hit);
                num_seqs += r->k;
                budget -= num_tokens;
            }
            if (e->num_parts) return 1;
        }
        if (e->c.num_scheduler_steps > 1) {  /* ms: a decode round starts, with its lookahead */
            e->ms_ahead = e->c.num_scheduler_steps - 1;
            budget = ms_start_round(e, &n, budget);
        } else budget = schedule_running(e, &n, budget);
        if (e->sq_len && !e->num_preempted) swap_in(e, &n, budget);
        e->run_len = n;  /* the preempted were its tail; the swapped in follow */
        if (e->ms_ahead) {
            e->ms_ahead = e->ms_reserved = 0;
            if (e->num_parts) { e->ms_left = e->c.num_scheduler_steps - 1; e->ms_ghosts = e->ms_ghost_ctx = 0; }
        }
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
    long num_seqs = n + e->sg_extra;  /* (sg: a forked group's sequences count) */
    int stopped = 0;
    /* SESSIONS: requests loading from the CPU tier first, in the order their loads started (vLLM
       puts the requests it skipped back at the front of its queue); each passed over until done */
    for (long k = 0; k < e->nload; k++) {
        long s = e->loads[k];
        kv_req *r = &e->reqs[s];
        if (budget <= 0 || num_seqs + 1 > e->c.max_num_seqs) { stopped = 1; break; }
        if (r->ready > e->S->now) continue;
        long num_new = r->prompt + r->generated - r->off_cached;
        if (num_new > budget) num_new = budget;
        if (!grow_seq(e, r, num_new)) { stopped = 1; break; }
        r->loading = 2;
        if (r->first_sched < 0) e->off_wait_s += r->ready - r->load_start;  /* (TTFT split) */
        e->load_reserved -= r->off_rest;
        e->prefix_query_tokens += r->prompt + r->generated;
        e->prefix_hit_tokens += r->off_cached - r->off_loaded;
        e->off_hit_tokens += r->off_loaded;
        r->adm_cached = r->off_cached;
        e->admitted[e->num_admitted++] = s;
        plan_add(e, s, num_new, r->off_cached);
        num_seqs += 1;
        budget -= num_new;
    }
    if (e->num_admitted) {  /* the loads still in flight, in order */
        long w = 0;
        for (long k = 0; k < e->nload; k++)
            if (e->reqs[e->loads[k]].loading == 1) e->loads[w++] = e->loads[k];
        e->nload = w;
    }
    for (long j = 0; !stopped && j < e->wq_len; j++) {
        long s = wq_at(e, j);
        kv_req *r = &e->reqs[s];
        if (r->loading) continue;  /* looked at above */
        if (budget <= 0 || num_seqs + r->k > e->c.max_num_seqs) break;
        if (r->dg_state) {  /* its prompt's KV is on a prefill instance (disagg.c) */
            if (dg_admit(e, s, &num_seqs, &budget)) break;
            continue;
        }
        long hit = e->pc && r->npb ? pc_hits(e, r) : 0;
        if (e->tier && r->tok && (r->prompt + r->generated) / e->c.block_size && start_load(e, s, hit)) continue;
        long num_new = r->prompt + r->generated - hit * e->c.block_size;
        if (num_new > budget) num_new = budget;
        if ((hit ? pc_need(e, r, hit, num_new) : blocks_for(e, num_new)) > e->free_blocks) break;
        admit_one(e, s, num_new, hit);
        num_seqs += r->k;
        budget -= num_new;
    }
    return e->num_parts > 0;
}

/* Lifecycle.begin_step: preemptions (to the front of waiting, newest first), then admissions */
static int begin_step(kv_rep *e) {
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
        long s = e->admitted[k];
        if (wq_at(e, 0) == s) wq_pop_front(e);
        else wq_remove(e, s);  /* disaggregated: requests loading remote KV stay queued ahead */
        e->reqs[s].loading = 0;  /* SESSIONS */
        kv_req *r = &e->reqs[s];
        r->computed = r->adm_cached;
        if (r->first_sched < 0) r->first_sched = e->S->now;
        e->run[e->run_len++] = s;
    }
    return 0;
}

static int start_step_priced(kv_rep *e) {
    if (e->pp) return pp_start_step(e);  /* pp: a round of micro-batches through the stages */
    kv_engine *S = e->S;
    long prefill_out = 0;
    double spec_ms = 0.0;
    int mask = e->sp  /* spec: acceptance drawn, verify + drafter priced */
        ? kv_spec_price(e->sp, e->num_tokens, e->num_chunks, e->chunk_tokens, e->chunk_ctx, e->num_decode_seqs,
                        e->decode_ctx, e->num_sampled, e->parts_ms, &prefill_out, &spec_ms)
        : kv_step_parts(e->pricing, e->num_tokens, e->num_chunks, e->chunk_tokens, e->chunk_ctx,
                        e->num_decode_seqs, e->decode_ctx, e->num_sampled, e->parts_ms, &prefill_out);
    long *x = S->dg ? dg_extrap(e) : S->out->extrap;  /* (a disaggregated run counts per pool) */
    if (mask & KV_OUT_LINEAR) x[1]++;
    x[2] += prefill_out;
    if (mask & KV_OUT_DECODE) x[3]++;
    if (mask || prefill_out) x[0]++;
    double *p = e->parts_ms;
    e->step_start = S->now;
    e->step_dt = (e->sp ? spec_ms : p[3] + p[0] + p[1] + p[2]) / 1000.0 + (double)e->num_swap_blocks * e->c.swap_block_s;
    e->eng = ENG_STEP;
    return ev_push(S, S->now + e->step_dt, EV_ENGINE, e->index);
}

/* ASYNC: a step after the replica idled is priced cold (Engine.run: its CPU work had no GPU step to
   hide behind); the pricing is shared by the replicas, so the flag is set around this one step */
static int start_step(kv_rep *e) {
    if (!e->cold) return start_step_priced(e);
    e->cold = 0;
    kv_pricing_set_cold((kv_pricing *)e->pricing, 1);
    int rc = start_step_priced(e);
    kv_pricing_set_cold((kv_pricing *)e->pricing, 0);
    return rc;
}

/* -- step rows folded (simcore.metrics.StepRecorder: _fold, _seal, _coalesce_pairs) ---------- */
enum { C_START = 0, C_DT = 1, C_STEPS = 2, C_SEQS = 3, C_RUNNING = 6, C_WAITING = 7, C_SWAPPED = 8,
       C_PREEMPTED = 9, C_KV = 11, C_EXTERNAL = 16, C_COSTS = 18 };  /* metrics._COLUMNS */
enum { K_ALLOCATED = 0, K_LIVE = 1, K_INTERNAL = 3, K_UNSHARED = 6 };  /* metrics.KV_KINDS */

/* _coalesce_pairs on n rows in place: rows 2i and 2i+1 become row i (an odd last row stays) */
static long coalesce(double *rows, long n) {
    long even = n - n % 2, w = 0;
    for (long i = 0; i < even; i += 2, w++) {
        const double *a = rows + KV_STEP_COLUMNS * i, *b = a + KV_STEP_COLUMNS;
        double o[KV_STEP_COLUMNS];
        double steps = a[C_STEPS] + b[C_STEPS], dt = a[C_DT] + b[C_DT];
        o[C_START] = a[C_START]; o[C_DT] = dt; o[C_STEPS] = steps;
        for (int c = C_SEQS; c < C_KV; c++)  /* _PER_STEP: weighted by num_steps */
            o[c] = (a[c] * a[C_STEPS] + b[c] * b[C_STEPS]) / steps;
        for (int c = C_KV; c < C_KV + KV_STEP_KINDS; c++)  /* KV: weighted by duration */
            o[c] = dt > 0 ? (a[c] * a[C_DT] + b[c] * b[C_DT]) / dt : 0.5 * (a[c] + b[c]);
        for (int c = C_COSTS; c < KV_STEP_COLUMNS; c++) o[c] = a[c] + b[c];
        memcpy(rows + KV_STEP_COLUMNS * w, o, sizeof o);
    }
    if (n % 2) memmove(rows + KV_STEP_COLUMNS * w++, rows + KV_STEP_COLUMNS * (n - 1), sizeof(double) * KV_STEP_COLUMNS);
    return w;
}

/* _seal: the pending rows at the kept table's grain, appended; past the cap, the table halved
   until it holds at most half the cap */
static int seal(kv_rep *e) {
    long n = e->chunk_n;
    e->chunk_n = 0;
    if (!n) return 0;
    for (long h = 0; h < e->halvings; h++) n = coalesce(e->chunk, n);
    if (e->kept_n + n > e->kept_cap) {
        long nc = e->kept_cap ? 2 * e->kept_cap : e->c.step_chunk;
        while (nc < e->kept_n + n) nc *= 2;
        double *k = realloc(e->kept, sizeof(double) * KV_STEP_COLUMNS * (size_t)nc);
        if (!k) return KV_NOMEM;
        e->kept = k; e->kept_cap = nc;
    }
    memcpy(e->kept + KV_STEP_COLUMNS * e->kept_n, e->chunk, sizeof(double) * KV_STEP_COLUMNS * (size_t)n);
    e->kept_n += n;
    if (e->kept_n <= e->c.step_cap) return 0;
    e->streaming = 1;
    while (e->kept_n > e->c.step_cap / 2 && e->kept_n > 1) {
        e->kept_n = coalesce(e->kept, e->kept_n);
        e->halvings++;
    }
    e->coalesced = 1;
    return 0;
}

/* One row (KV_STEP_ROW doubles) into the totals (_fold: its addends, added in row order) and
   the pending rows */
static void fold_row(kv_rep *e, const double *row) {
    double dt = row[C_DT], steps = row[C_STEPS];
    e->t_steps += (long)steps;
    e->t_seq_steps += (long)row[C_SEQS] * (long)steps;
    if ((long)row[C_RUNNING] > e->t_max_running) e->t_max_running = (long)row[C_RUNNING];
    if ((long)row[C_KV] > e->t_kv_max) e->t_kv_max = (long)row[C_KV];
    e->t_preempted += (long)row[C_PREEMPTED];
    double add[3 + KV_STEP_KINDS];
    add[0] = dt;
    add[1] = row[C_RUNNING] * dt;
    add[2] = 0.0;
    if (e->c.kv_capacity && (row[C_WAITING] > 0 || row[C_SWAPPED] > 0)
        && (row[C_PREEMPTED] > 0 || (double)e->c.kv_capacity - row[C_KV] - row[C_EXTERNAL] < (double)e->c.kv_unit))
        add[2] = dt;
    for (int k = 0; k < KV_STEP_KINDS; k++) add[3 + k] = row[C_KV + k] * dt;
    if (row[24] != 0) {  /* a span row: its own steps' sums */
        add[2] = row[23];
        add[3 + K_ALLOCATED] = row[21];
        add[3 + K_LIVE] = row[21] - row[22];
        add[3 + K_INTERNAL] = row[22];
        add[3 + K_UNSHARED] = row[21];
    }
    for (int k = 0; k < 3 + KV_STEP_KINDS; k++) e->t_sums[k] += add[k];
    memcpy(e->chunk + KV_STEP_COLUMNS * e->chunk_n++, row, sizeof(double) * KV_STEP_COLUMNS);
    if (e->chunk_n == e->c.step_chunk) fail(e, seal(e));
}

long kv_engine_steps(const kv_engine *S, long replica, long *ints, double *sums, double *rows) {
    const kv_rep *e = &S->reps[replica];
    ints[0] = e->t_steps; ints[1] = e->t_seq_steps; ints[2] = e->t_max_running; ints[3] = e->t_kv_max;
    ints[4] = e->t_preempted; ints[5] = e->halvings; ints[6] = e->coalesced; ints[7] = e->streaming;
    memcpy(sums, e->t_sums, sizeof e->t_sums);
    if (rows && e->kept_n) memcpy(rows, e->kept, sizeof(double) * KV_STEP_COLUMNS * (size_t)e->kept_n);
    return e->kept_n;
}

/* a finished row: folded here, or handed out */
static void put_row(kv_rep *e, const double *row) {
    if (e->c.fold_steps) { fold_row(e, row); return; }
    kv_outputs *o = e->S->out;
    memcpy(o->step + KV_STEP_ROW * o->step_n++, row, sizeof(double) * KV_STEP_ROW);
}

static void flush_span(kv_rep *e) {
    if (!e->span_open) return;
    put_row(e, e->span_row);
    e->span_open = 0;
}

static void record_step(kv_rep *e, long allocated, long internal, int decode_only);
/* spec: SpeculativePagedPolicy.end_step's truncate: a verify's blocks past its computed tokens
   go back, the last first */
static int spec_truncate(kv_rep *e) {
    for (long k = 0; k < e->num_parts; k++) {
        if (kv_spec_accepted(e->sp, k) < 0) continue;
        kv_req *r = &e->reqs[e->part_slot[k]];
        long keep = blocks_for(e, r->computed);
        if (e->pc)
            for (long pos = r->nblk - 1; pos >= keep; pos--) {
                int rc = pc_decref(e, r, pos);
                if (rc) return rc;
            }
        else e->free_blocks += r->nblk - keep;
        e->gpu_tokens -= r->ntok - r->computed;
        r->ntok = r->computed; r->nblk = keep;
    }
    return 0;
}

/* Lifecycle.emit + policy.end_step + Lifecycle.finish + StepRecorder.record (a run of
   decode steps that changes nothing but the contexts goes into one row when aggregating) */
static int end_step(kv_rep *e) {
    double t = e->S->now;
    long nf = 0;
    for (long k = 0; k < e->num_parts; k++) {
        kv_req *r = &e->reqs[e->part_slot[k]];
        long accepted = e->sp ? kv_spec_accepted(e->sp, k) : -1, emitted;
        if (accepted >= 0) {  /* spec: a verify keeps its accepted drafts and emits them + 1 at once */
            r->computed += 1 + accepted;
            emitted = 1 + accepted;
        } else {
            r->computed += e->part_new[k];
            emitted = r->computed == r->prompt + r->generated;  /* == num_tokens: a token out */
        }
        if (emitted) {
            double at = e->pp ? pp_emit_time(e, k) : t;  /* pp: when its micro-batch leaves the last stage */
            if (e->tt) fail(e, kv_tok_put(e->tt, e->part_slot[k], at, emitted));  /* tokens: */
            if (r->generated) itl_put(e, at - r->last_token);
            else r->first_token = at;
            r->last_token = at;
            r->generated += emitted;
            if (r->target - r->generated <= 0) e->finished[nf++] = e->part_slot[k];
        }
    }
    if (e->ms_left && nf) {  /* ms: finished mid-round, still computed until the round ends */
        e->ms_ghosts += nf;
        for (long k = 0; k < nf; k++) e->ms_ghost_ctx += e->reqs[e->finished[k]].computed + 1;
    }
    if (e->sp) {  /* spec: each verify's rejected tail freed (PagedAllocator.truncate) */
        int rc = spec_truncate(e);
        if (rc) return rc;
    }
    if (e->bt) {  /* bt: the ledger's snapshot, the finished's reservations let go */
        int rc = bt_end(e, nf);
        if (rc) return rc;
    }
    for (long k = 0; k < e->num_filling; k++) {  /* policy.end_step: register the prefix blocks written */
        int rc = cache_blocks(e, &e->reqs[e->filling[k]]);
        if (rc) return rc;
    }
    for (long k = 0; k < nf; k++) {  /* SESSIONS: a turn's answer blocks, for the next turn */
        kv_req *r = &e->reqs[e->finished[k]];
        int rc = r->tok ? cache_blocks(e, r) : 0;
        if (rc) return rc;
    }
    /* end_step's snapshot, before the finished let go: with nothing cached nothing is shared, so
       the unfilled slots are the allocated ones less the written ones; else the running
       requests' last blocks' (a shared block is a full cached one) */
    long allocated = (e->c.num_gpu_blocks - e->free_blocks) * e->c.block_size;
    long internal = allocated - e->gpu_tokens;
    if (e->num_cached) {
        long bs = e->c.block_size;
        internal = 0;
        for (long k = 0; k < e->run_len; k++) internal += (bs - e->reqs[e->run[k]].computed % bs) % bs;
    }
    sg_end(e, &internal);  /* sg: groups fork; with any forked, their unfilled and shared slots */
    int held = e->S->dg && dg_holds(e);  /* a prefill instance keeps the KV until it is read (disagg.c) */
    for (long k = 0; k < nf; k++) {
        kv_req *r = &e->reqs[e->finished[k]];
        if (!held) { release(e, r); free(r->pt); r->pt = NULL; }
        if (e->tt) fail(e, kv_tok_leave(e->tt, e->finished[k], r->id));  /* tokens: */
        int rc = put_req(e, r, 0, KV_REJECT_NONE, 0);
        if (rc) return rc;
        if (!held) e->free_slots[e->num_free_slots++] = e->finished[k];
        r->id = -1;  /* finished: dropped from running below */
    }
    if (nf) {
        long w = 0;
        for (long k = 0; k < e->run_len; k++)
            if (e->reqs[e->run[k]].id >= 0) e->run[w++] = e->run[k];
        e->run_len = w;
    }
    int decode_only = !e->num_chunks && !e->num_preempted && !e->num_admitted && !nf && !e->num_swapped_in
                      && !e->sg_saved;  /* sg: a span row's slot-seconds have no shared slots (fold_row) */
    record_step(e, allocated, internal, decode_only);
    return 0;
}

/* StepRecorder.record of the step that ended (end_step's snapshot: KV allocated and unfilled
   slots), into the open span row when it is one more decode step of the same batch */
static void record_step(kv_rep *e, long allocated, long internal, int decode_only) {
    kv_outputs *o = e->S->out;
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
        (double)allocated, (double)(allocated - internal), 0, (double)internal, 0, 0, (double)(allocated + e->sg_saved),
        kernels, coll, host, (double)allocated * dt, (double)internal * dt, blocked ? dt : 0.0, 0,
        (double)e->index,
    };
    e->sg_saved = 0;  /* sg: this step's (a span's steps set none) */
    if (e->bt) bt_row(e, row);  /* bt: the reservation ledger's KV breakdown */
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
    put_row(e, row);
}

static int has_room(const kv_engine *S) {
    const kv_outputs *o = S->out;
    long m = S->c.max_num_seqs + 1;
    return o->req_cap - o->req_n >= m && o->step_cap - o->step_n >= 2
           && o->arr_cap - o->arr_n >= 1;
}

/* -- decode spans: runs of decode steps ended without visiting each request ----------------- *
 * Once a replica has started a step that only decodes (every running request, one token each),
 * the steps that follow repeat it until
 * one of them finishes a request, needs more free blocks than there are (preemption), or another
 * event (an arrival, another replica, a client) comes first: nobody is admitted (the head of the
 * queue did not fit and the free blocks only shrink), swapped or preempted. simcore/span.py
 * says why, for the Python engine. Such steps end here in closed form, the event loop's own
 * order kept (each step's end is popped off the heap, as it is the next event): from its second
 * step every request emits one token at the same gap, so the per-request state is brought up to date once, when
 * the span stops; a step costs its pricing and its gaps, not a pass over the batch. The
 * timestamps, gaps, KV counts and rows are those of step-by-step simulation
 * (tests/test_fastcore_equivalence.py, test_core_spans.py). With prefix caching only while no
 * block is cached and no running request has prefix blocks (then its allocation is that of no
 * caching); not with speculative decoding (several tokens a step) or disaggregation (its proxy). */

/* the steps a span may end: the one just started (step 1) is a pure decode of the whole batch
   and nobody finishes at it; returns the steps after
   which one finishes (0: no span), and sets phase_count: requests by the step index (mod the
   block size) at which their next decode needs a new block */
static long span_setup(kv_rep *e) {
    kv_engine *S = e->S;
    long R = e->run_len, bs = e->c.block_size;
    /* prefix caching: only while nothing is cached and no running request has prefix blocks
       (npb 0: none of its blocks is ever registered), so pc_take takes uncached free blocks,
       exactly as without it (span_run keeps uncached_free in step) */
    if ((e->pc && (e->num_cached || e->tier)) || e->sp || S->dg || e->sg_forked || e->sg_nemit || !e->c.aggregate || !R || e->num_parts != R || e->num_chunks || e->num_admitted
        || e->num_preempted || e->num_swapped_in || e->num_swap_blocks || e->num_decode_seqs != R)
        return 0;
    if (!S->heap_n || S->heap[0].seq != S->seq - 1) return 0;  /* another event comes first */
    if (!e->phase_count) {
        e->phase_count = calloc((size_t)bs, sizeof(long));
        if (!e->phase_count) return 0;
    }
    long rem_min = -1;
    for (long k = 0; k < R; k++) {
        const kv_req *r = &e->reqs[e->run[k]];
        long left = r->target - r->generated, room = r->nblk * bs - r->ntok;
        if (e->pc && r->npb) return 0;
        if (room < 0 || room >= bs) { rem_min = 0; break; }
        if (rem_min < 0 || left < rem_min) rem_min = left;
    }
    if (e->c.num_scheduler_steps > 1 && !e->c.chunked_prefill && rem_min > e->ms_left + 1)
        rem_min = e->ms_left + 1;  /* ms: no further than the round's last step */
    if (rem_min < 2) return 0;
    for (long k = 0; k < R; k++) {
        const kv_req *r = &e->reqs[e->run[k]];
        e->phase_count[r->nblk * bs - r->ntok]++;
    }
    return rem_min;
}

/* The span's requests brought up to date: `ended` steps ended (a token each, the last at
   `last`), `planned` more decodes planned (their slots taken) */
static void span_apply(kv_rep *e, long ended, long planned, double last) {
    long bs = e->c.block_size;
    for (long k = 0; k < e->run_len; k++) {
        kv_req *r = &e->reqs[e->run[k]];
        if (e->tt && ended) fail(e, kv_tok_span_apply(e->tt, e->run[k]));  /* tokens: a token at each step's end */
        e->phase_count[r->nblk * bs - r->ntok] = 0;
        r->computed += ended; r->generated += ended;
        if (ended) r->last_token = last;
        r->ntok += planned;
        long nb = blocks_for(e, r->ntok);
        if (nb > r->nblk) r->nblk = nb;
    }
    if (e->tt) kv_tok_span_end(e->tt);
}

/* After start_step of a step that may open a span: its end and those of the steps after it, in
   closed form, while each is the next event. Returns 0 (a step is in flight, as start_step
   leaves it), 1 (steps ended, and the next plan needs the scheduler: preemption is possible),
   or an error. */
static int span_run(kv_rep *e) {
    kv_engine *S = e->S;
    long rem_min = span_setup(e);
    if (!rem_min) return 0;
    long R = e->run_len, bs = e->c.block_size, ended = 0, planned = 0;
    double last = S->now;
    int rc = 0;
    for (;;) {
        /* step ended + 1 is in flight: end it here if it is the next event and finishes nobody */
        if (ended + 1 >= rem_min || S->err || !S->heap_n || S->heap[0].seq != S->seq - 1) break;
        if (!e->c.fold_steps && S->out->step_cap - S->out->step_n < 2) break;
        kv_event ev = ev_pop(S);
        S->now = ev.t;
        ended++;
        if (ended == 1)  /* step 1: each its own gap (the last tokens may differ: a prefill before) */
            for (long k = 0; k < R; k++) itl_put(e, S->now - e->reqs[e->run[k]].last_token);
        else itl_put_run(e, S->now - last, R);  /* then one gap for all: they all emitted at `last` */
        last = S->now;
        if (e->tt) fail(e, kv_tok_span_step(e->tt, S->now));  /* tokens: */
        long allocated = (e->c.num_gpu_blocks - e->free_blocks) * bs;
        record_step(e, allocated, allocated - e->gpu_tokens, 1);
        /* the next plan: the same decodes, each one slot on; new blocks for those whose last
           block is full */
        long need = e->phase_count[(ended - 1) % bs];
        if (need > e->free_blocks) { rc = 1; break; }
        e->free_blocks -= need; e->gpu_tokens += R; e->decode_ctx += R;
        if (e->pc) e->uncached_free -= need;  /* pc_take of blocks past npb: uncached ones (nothing cached) */
        planned++;
        if (e->ms_left) e->ms_left--;  /* ms: a step of the round planned */
        rc = start_step(e);
        if (rc) break;
    }
    span_apply(e, ended, planned, last);
    return rc;
}

/* A replica's event: its wakeup or the end of its step; then it plans the next step, or idles */
static int engine_event(kv_rep *e) {
    kv_engine *S = e->S;
    if (e->eng == ENG_STEP) {
        int rc = end_step(e);
        if (rc) return rc;
    }
    for (;;) {
        int planned = schedule(e);
        if (planned < 0) return planned;
        if (!planned) {
            if (!(e->num_preempted && e->tier)) break;
            int rc = begin_step(e);  /* SESSIONS: preemptions alone, with the CPU tier: applied, look again (Engine.run) */
            if (rc) return rc;
            continue;
        }
        int rc = begin_step(e);
        if (rc) return rc;
        if (S->held && e->wq_len <= e->c.hold_at / 2) {  /* the held workload may go on */
            S->held = 0;
            rc = ev_push(S, S->now, EV_DRAIN, 0);
            if (rc) return rc;
        }
        rc = start_step(e);
        if (rc) return rc;
        rc = span_run(e);  /* hook: decode spans (1: steps ended there; plan the next one here) */
        if (rc != 1) return rc;
    }
    if (e->num_preempted && !S->dg && !e->tier) return KV_STALL;  /* a plan of preemptions alone: never in V0/V1 here */
    if (e->num_preempted) {  /* disaggregated (disagg.c), or loads from the CPU tier (SESSIONS): blocks of
                                requests that do not run fill the cache */
        int rc = begin_step(e);  /* the preemptions apply; nothing runs; it idles until woken, as Engine.run */
        if (rc) return rc;
    }
    if (e->bt && bt_idle(e)) return 0;  /* bt: static batching waits for its wakeup or its batch timer */
    e->eng = ENG_IDLE;
    e->cold = 1;  /* ASYNC: its next step's CPU work has no GPU step to hide behind */
    if (e->tier && e->wq_len) {  /* SESSIONS: policy.idle_timeout: it also wakes when the next load is done */
        double next = 0.0; int any = 0;
        for (long j = 0; j < e->wq_len; j++) {
            const kv_req *r = &e->reqs[wq_at(e, j)];
            if (r->loading == 1 && r->ready > S->now && (!any || r->ready < next)) { next = r->ready; any = 1; }
        }
        if (any) {
            e->eng = ENG_IDLE_T;
            e->idle_gen++;
            return ev_push(S, S->now + (next - S->now), EV_IDLE_TIMER, e->idle_gen * S->nrep + e->index);
        }
    }
    return 0;
}

int kv_engine_run(kv_engine *S, kv_outputs *out) {
    S->out = out;
    if (!S->started) {  /* time 0: the engines find nothing to do; the workload starts */
        S->started = 1; S->now = 0.0; S->previous = 0.0;
        S->arr_stage = ARR_LOOK;
        if (S->c.clients) { S->arr_resume = 0; S->clients_to_start = S->c.clients; S->next_client = 0; }
        else S->arr_resume = 1;
        if (S->fleet && S->c.clients) {  /* the autoscaler's process starts before the clients' */
            int rc = kv_fleet_begin(S);
            if (rc) return rc;
        }
        if (S->sess) {  /* SESSIONS: the session workload's process instead */
            S->arr_resume = 0; S->clients_to_start = 0;
            int rc = kvs_start(S->sess);
            if (rc) return rc;
        }
    }
    for (;;) {
        if (!has_room(S))
            return out->req_n || out->step_n || out->arr_n ? KV_FULL : KV_NOROOM;
        if (S->arr_resume) {
            int rc = arrivals_continue(S);
            if (rc) return rc;
            continue;
        }
        if (S->taking >= 0) {
            int rc = client_take(S);
            if (rc) return rc;
            continue;
        }
        if (S->sess && kvs_pending(S->sess)) {  /* SESSIONS: a session goes on now */
            int rc = kvs_go(S->sess);
            if (rc) return rc;
            continue;
        }
        if (S->clients_to_start) {  /* each client's process starts (URGENT, before any event at 0) */
            S->clients_to_start--;
            S->taking = S->next_client++;
            continue;
        }
        if (S->fleet && !kv_fleet_begun(S)) {  /* ... and after the open loop's first run */
            int rc = kv_fleet_begin(S);
            if (rc) return rc;
            continue;
        }
        if (!S->heap_n) {
            for (long i = 0; i < S->nrep; i++) {
                kv_rep *e = &S->reps[i];
                if (e->run_len || e->wq_len || e->sq_len) return KV_STALL;
            }
            if (S->held) return KV_STALL;
            if (out->step_cap - out->step_n < S->nrep) return out->step_n ? KV_FULL : KV_NOROOM;
            for (long i = 0; i < S->nrep; i++) {
                kv_rep *e = &S->reps[i];
                flush_span(e);
                if (!e->itl_done) itl_flush(e);
                if (e->c.fold_steps && !e->itl_done) fail(e, seal(e));
                if (!e->itl_done && e->itl_blk_n) e->itl_total += kv_pairwise_sum(e->itl_blk, e->itl_blk_n);
                e->itl_done = 1;
            }
            return S->err ? S->err : KV_DONE;
        }
        kv_event ev = ev_pop(S);
        S->now = ev.t;
        int rc = 0;
        if (S->err) return S->err;
        switch (ev.kind) {
        case EV_ENGINE: rc = engine_event(&S->reps[ev.arg]); break;
        case EV_ARRIVAL: S->arr_resume = 1; break;
        case EV_DRAIN: S->late = 1; S->arr_resume = 1; break;
        case EV_DONE:  /* the client's request left: it thinks, or takes the next one now */
            if (S->sess) { rc = kvs_done(S->sess, ev.arg); break; }  /* SESSIONS: its session goes on */
            if (S->client_think[ev.arg] > 0) rc = ev_push(S, S->now + S->client_think[ev.arg], EV_THINK, ev.arg);
            else S->taking = ev.arg;
            break;
        case EV_THINK: S->taking = ev.arg; break;
        case EV_FLEET: rc = kv_fleet_event(S, ev.arg); break;
        case EV_BT_TIMER: case EV_BT_WAKE: rc = bt_event(S, &ev); break;  /* bt: static batching's idle */
        case EV_HOP: {  /* SESSIONS: an idle engine's wakeup, processed: its first_of succeeds */
            kv_rep *e = &S->reps[ev.arg];
            if (e->eng == ENG_HOPPING) { e->eng = ENG_WAKE; rc = ev_push(S, S->now, EV_ENGINE, e->index); }
            break;
        }
        case EV_IDLE_TIMER: {  /* SESSIONS: the idle timer, unless stale or beaten by the wakeup */
            kv_rep *e = &S->reps[ev.arg % S->nrep];
            if (ev.arg / S->nrep == e->idle_gen && (e->eng == ENG_IDLE_T || e->eng == ENG_HOPPING)) {
                e->eng = ENG_WAKE;
                rc = ev_push(S, S->now, EV_ENGINE, e->index);
            }
            break;
        }
        default:
            if (S->dg) rc = dg_event(S, &ev);  /* the proxy's and the KV links' (disagg.c) */
            else rc = kvs_event(S->sess, ev.kind, ev.arg);  /* SESSIONS: starts, think times */
            break;
        }
        if (rc) return rc;
        if (S->err) return S->err;
    }
}

/* -- hooks for fleet.c (fleet.h): a heterogeneous fleet's replicas, the autoscaler's view ------- */
int kv_engine_set_replica(kv_engine *S, long i, const kv_engine_config *cfg, const kv_pricing *pricing) {
    if (i < 0 || i >= S->nrep || S->started) return KV_STALL;
    kv_rep *e = &S->reps[i];
    rep_free(e);
    memset(e, 0, sizeof *e);
    kv_engine_config run = S->c;  /* rep_init reads the engine's configuration: the replica's */
    const kv_pricing *run_pricing = S->pricing;
    S->c = *cfg; S->pricing = pricing;
    int ok = rep_init(e, S, i);
    S->c = run; S->pricing = run_pricing;
    if (!ok) return KV_NOMEM;
    if (cfg->max_num_seqs > S->c.max_num_seqs) S->c.max_num_seqs = cfg->max_num_seqs;  /* has_room's */
    return 0;
}
long kv__num_replicas(const kv_engine *S) { return S->nrep; }
long kv__load(const kv_engine *S, long i) { const kv_rep *e = &S->reps[i]; return e->wq_len + e->run_len + e->sq_len; }
double kv__kv_share(const kv_engine *S, long i) {
    const kv_rep *e = &S->reps[i];
    return (double)(e->c.num_gpu_blocks - e->free_blocks) / (double)e->c.num_gpu_blocks;
}
double kv__now(const kv_engine *S) { return S->now; }
long kv__clients(const kv_engine *S) { return S->c.clients; }
int kv__push(kv_engine *S, double t, long arg) { return ev_push(S, t, EV_FLEET, arg); }
void kv__set_fleet(kv_engine *S, kv_fleet *F) { S->fleet = F; }
kv_fleet *kv__fleet(const kv_engine *S) { return S->fleet; }

/* -- spec: speculative decoding's setup and totals (csrc/spec.c) --------------------------- */
int kv_engine_spec(kv_engine *S, const kv_spec_config *c, const double *rates, const unsigned long *rng,
                   const kv_pricing *draft) {
    for (long i = 0; i < S->nrep; i++) {
        kv_rep *e = &S->reps[i];
        kv_spec_free(e->sp);
        e->sp = kv_spec_new(c, rates, rng + 4 * i, e->pricing, draft, e->c.max_num_seqs + 2);
        if (!e->sp) return KV_NOMEM;
    }
    return 0;
}

void kv_engine_spec_stats(const kv_engine *S, long replica, long *ints, double *sums) {
    kv_spec_stats(S->reps[replica].sp, ints, sums);
}

/* -- tokens: per-request token times (csrc/tokens.c), kept from the first run on ---------------- */
int kv_engine_tokens_on(kv_engine *S) {
    for (long i = 0; i < S->nrep; i++) {
        kv_rep *e = &S->reps[i];
        if (!e->tt && !(e->tt = kv_tok_new())) return KV_NOMEM;
    }
    return 0;
}

long kv_engine_tokens(const kv_engine *S, long replica, long *ntimes, long *ids, long *counts, double *times) {
    return kv_tok_table(S->reps[replica].tt, ntimes, ids, counts, times);
}

#include "pipeline.c"  /* pipeline parallelism: uses the static helpers above */
#include "batching.c"  /* static / dynamic batching, Orca: uses the static helpers above */
#include "disagg.c"  /* disaggregated prefill/decode: uses the static helpers above */
#include "seqgroup.c"  /* parallel sampling: uses the static helpers above */
