/* Disaggregated prefill/decode (see disagg.h). Included at the end of engine.c, whose replicas
 * and event heap it reuses; engine.c calls in through a few hooks (dg_*). The Python it mirrors:
 *   simcore/disagg.py DisaggProxy._accept / _prefilled / _start_transfer / _transferred, _pick
 *                     KvLink (processor sharing: _advance, _join, _reschedule, _fire)
 *   simcore/policies/continuous.py  _admit_waiting's remote branch, _admit_loaded, release_held,
 *                                   end_step's hold_kv (a prefill instance keeps finished KV)
 * Events follow SimPy's order as engine.c's do: a request's prefill done (the proxy's callback),
 * a link's latency timeout and its completion timeout (stale ones are pushed and skipped, as
 * SimPy processes an outdated timeout and the generation check drops it), a decode request's
 * done (a closed-loop client's event then succeeds in its callback: one more event). */
#include "disagg.h"

enum { DG_WAIT = 1, DG_LOADING = 2, DG_LOADED = 3 };  /* kv_req.dg_state on a decode instance */
enum { EV_DG_PREFILLED = 16, EV_DG_JOIN = 17, EV_DG_FIRE = 18, EV_DG_DDONE = 19 };

typedef struct {  /* a request between the proxy's accept and the end of its transfer */
    long id, prompt, output, max_tokens, client, pid, npt;
    double arrival, nbytes;
    long p, pslot, d, dslot, row;  /* instances (global replica indexes), slots, log row */
} dg_entry;

typedef struct { long entry; double left; } dg_flow;
typedef struct { dg_flow *f; long n, cap, gen, max_flowing; double last; } dg_link;

typedef struct kv_disagg kv_disagg;
struct kv_disagg {
    kv_disagg_config c;
    long np, nd;
    long cursor[2];
    dg_entry *ent; long ent_n, ent_cap; long *ent_free; long ent_free_n;
    dg_link *links;
    double *log; long log_n, log_cap;
    double *stamps; long stamps_n, stamps_cap;
    long prefill_arrived;
    long extrap[4];
};

static void dg_free(kv_engine *S) {
    kv_disagg *D = S->dg;
    if (!D) return;
    if (D->links)
        for (long i = 0; i < D->nd; i++) free(D->links[i].f);
    free(D->links); free(D->ent); free(D->ent_free); free(D->log); free(D->stamps);
    free(D);
    S->dg = NULL;
}

kv_engine *kv_disagg_new(const kv_engine_config *prefill, const kv_pricing *prefill_pricing,
                         const kv_engine_config *decode, const kv_pricing *decode_pricing,
                         const kv_disagg_config *dc) {
    if (dc->num_prefill < 1 || dc->num_decode < 1 || decode->clients < 0 || !(dc->link_bytes_per_s > 0))
        return NULL;
    kv_engine *S = calloc(1, sizeof *S);
    if (!S) return NULL;
    kv_disagg *D = S->dg = calloc(1, sizeof *D);
    if (!D) { free(S); return NULL; }
    D->c = *dc; D->np = dc->num_prefill; D->nd = dc->num_decode;
    D->links = calloc((size_t)D->nd, sizeof(dg_link));
    S->nrep = D->np + D->nd;
    S->reps = calloc((size_t)S->nrep, sizeof(kv_rep));
    if (decode->clients) S->client_think = calloc((size_t)decode->clients, sizeof(double));
    if (!D->links || !S->reps || (decode->clients && !S->client_think)) { kv_engine_free(S); return NULL; }
    for (long i = 0; i < S->nrep; i++) {  /* rep_init reads the engine's configuration: each pool's */
        int pre = i < D->np;
        S->c = pre ? *prefill : *decode;
        S->pricing = pre ? prefill_pricing : decode_pricing;
        if (!rep_init(&S->reps[i], S, i)) { kv_engine_free(S); return NULL; }
    }
    S->c = *decode;  /* the run's: clients; output room for the larger batch */
    if (prefill->max_num_seqs > S->c.max_num_seqs) S->c.max_num_seqs = prefill->max_num_seqs;
    S->c.num_replicas = S->nrep;
    S->c.hold_at = 1L << 62;  /* the proxy never holds the workload back */
    S->arr_resume = 1;
    S->taking = -1;
    return S;
}

long kv_disagg_stamps(kv_engine *S, double *out) {
    kv_disagg *D = S->dg;
    long n = D->stamps_n;
    if (out) { if (n) memcpy(out, D->stamps, sizeof(double) * (size_t)n); D->stamps_n = 0; }
    return n;
}

long kv_disagg_log(const kv_engine *S, double *rows) {
    const kv_disagg *D = S->dg;
    if (rows && D->log_n) memcpy(rows, D->log, sizeof(double) * KV_DG_LOG_ROW * (size_t)D->log_n);
    return D->log_n;
}

void kv_disagg_counts(const kv_engine *S, long *out) {
    const kv_disagg *D = S->dg;
    for (int k = 0; k < 4; k++) out[k] = D->extrap[k];
    long most = 0;
    for (long i = 0; i < D->nd; i++) if (D->links[i].max_flowing > most) most = D->links[i].max_flowing;
    out[4] = most;
}

static long *dg_extrap(kv_rep *e) { return e->index < e->S->dg->np ? e->S->dg->extrap : e->S->out->extrap; }

static int dg_holds(const kv_rep *e) { return e->index < e->S->dg->np; }

static long dg_entry_new(kv_disagg *D) {
    if (D->ent_free_n) return D->ent_free[--D->ent_free_n];
    if (D->ent_n == D->ent_cap) {
        long nc = D->ent_cap ? 2 * D->ent_cap : 256;
        dg_entry *x = realloc(D->ent, sizeof(dg_entry) * (size_t)nc);
        long *f = realloc(D->ent_free, sizeof(long) * (size_t)nc);
        if (x) D->ent = x;
        if (f) D->ent_free = f;
        if (!x || !f) return -1;
        D->ent_cap = nc;
    }
    return D->ent_n++;
}

static int dg_push(double **a, long *n, long *cap, long width, const double *row) {
    if (*n == *cap) {
        long nc = *cap ? 2 * *cap : 1024;
        double *b = realloc(*a, sizeof(double) * (size_t)(nc * width));
        if (!b) return KV_NOMEM;
        *a = b; *cap = nc;
    }
    memcpy(*a + width * (*n)++, row, sizeof(double) * (size_t)width);
    return 0;
}

/* ReqState's output target: what is asked, within max_model_len, at least one */
static long dg_target(const kv_rep *e, long prompt, long output) {
    long room = e->c.max_model_len - prompt, t = output < room ? output : room;
    return t < 1 ? 1 : t;
}

/* Engine.reject_reason on an instance of continuous batching (V1: chunked prefill) */
static long dg_reject_kind(const kv_rep *e, long prompt, long target) {
    if (prompt > e->c.max_model_len) return KV_REJECT_MODEL_LEN;
    if (!e->c.chunked_prefill && prompt > e->c.max_num_batched_tokens) return KV_REJECT_BUDGET;
    if (blocks_for(e, prompt + target - 1) > e->c.num_gpu_blocks) return KV_REJECT_CACHE;
    return KV_REJECT_NONE;
}

/* disagg._pick over replicas first .. first + n - 1: round-robin, or the least loaded (first) */
static long dg_pick(kv_engine *S, long first, long n, long policy, long *cursor) {
    if (policy == KV_ROUTER_ROUND_ROBIN) {
        long i = *cursor;
        *cursor = (i + 1) % n;
        return first + i;
    }
    long best = first, least = -1;
    for (long i = first; i < first + n; i++) {
        const kv_rep *e = &S->reps[i];
        long load = e->wq_len + e->run_len + e->sq_len;
        if (least < 0 || load < least) { least = load; best = i; }
    }
    return best;
}

/* disagg._pick_by_prefix (prefix-aware, a request with a shared prefix `pid` of `npt` tokens):
   llm-d's scores as simcore/router.py weighs them, on the prefill instances' prefix caches */
static long dg_pick_prefix(kv_engine *S, long pid, long npt, long prompt) {
    kv_disagg *D = S->dg;
    long low = S->reps[0].wq_len, high = low, g = -1, best = 0;
    for (long i = 1; i < D->np; i++) {
        long q = S->reps[i].wq_len;
        if (q < low) low = q;
        if (q > high) high = q;
    }
    double best_score = -1.0;
    for (long i = 0; i < D->np; i++) {
        kv_rep *e = &S->reps[i];
        double kv_free = (double)e->free_blocks / (double)e->c.num_gpu_blocks, prefix = 0.0;
        long num_blocks = prompt / e->c.block_size;
        if (num_blocks && e->pc) {
            if (g < 0) g = pid_group(S, pid);
            long hits = 0, n = npt / e->c.block_size;
            while (g >= 0 && hits < n && g_get(e, g, hits) >= 0) hits++;
            prefix = (double)hits / (double)num_blocks;
        }
        long q = e->wq_len;
        double queue_score = high > low ? (double)(high - q) / (double)(high - low) : 1.0;
        double score = 2.0 * prefix + 1.0 * kv_free + 1.0 * queue_score;  /* PREFIX, KV, QUEUE_WEIGHT */
        if (score > best_score) { best = i; best_score = score; }
    }
    return best;
}

static int dg_wake(kv_rep *e) {  /* Engine.wake: an idle step loop looks again */
    if (e->eng != ENG_IDLE) return 0;
    e->eng = ENG_WAKE;
    return ev_push(e->S, e->S->now, EV_ENGINE, e->index);
}

/* Engine.send/submit on instance `e` (accepted: the proxy checked); its slot to `*slot` */
static int dg_enqueue(kv_rep *e, const dg_entry *x, long output, long max_tokens, long client, long state,
                      long tag, long *slot) {
    kv_engine *S = e->S;
    kv_req r;
    memset(&r, 0, sizeof r);
    r.id = x->id; r.prompt = x->prompt; r.max_tokens = max_tokens; r.client = client; r.g = -1;
    r.k = 1;  /* one sequence (seqgroup.c's width: n > 1 never reaches a disaggregated run) */
    r.target = dg_target(e, x->prompt, output);
    r.arrival = x->arrival; r.first_sched = r.first_token = r.last_token = -1.0;
    r.dg_state = state; r.dg_tag = tag;
    e->num_arrived++;
    if (e->pc && x->pid >= 0) {  /* as send(): the prefix's content keys */
        r.g = pid_group(S, x->pid);
        r.npt = x->npt; r.npb = r.npt / e->c.block_size;
        if (r.g < 0) return KV_NOMEM;
        if (r.npb && !(r.pt = malloc(sizeof(long) * r.npb))) return KV_NOMEM;
    }
    long s = new_slot(e);
    if (s < 0 || !wq_reserve(e)) { free(r.pt); return KV_NOMEM; }
    e->reqs[s] = r;
    wq_push_back(e, s);
    *slot = s;
    return dg_wake(e);
}

/* DisaggProxy._accept: a client's request arrives (stamped in the decode pool's records, the
   client's view); a prefill instance is picked, then the request refused (the decode instance's
   checks, then the prefill instance's) or sent there with max_tokens 1 */
static int dg_accept(kv_engine *S, long i, double stamp, long client) {
    kv_disagg *D = S->dg;
    kv_outputs *o = S->out;
    o->arr[o->arr_n++] = stamp;
    o->num_arrived++;
    long p = D->c.prefill_router != KV_ROUTER_PREFIX_AWARE ? dg_pick(S, 0, D->np, D->c.prefill_router, &D->cursor[0])
             : S->in_pid[i] >= 0 ? dg_pick_prefix(S, S->in_pid[i], S->in_npt[i], S->in_prompt[i])
             : dg_pick(S, 0, D->np, KV_ROUTER_LEAST_LOADED, &D->cursor[0]);
    kv_rep *d0 = &S->reps[D->np], *pe = &S->reps[p];
    long prompt = S->in_prompt[i], output = S->in_output[i];
    long kind = dg_reject_kind(d0, prompt, dg_target(d0, prompt, output));
    if (!kind) kind = dg_reject_kind(pe, prompt, dg_target(pe, prompt, 1));
    if (kind) {  /* decode instance 0's lifecycle refuses it (Python names the reason from the row) */
        kv_req r;
        memset(&r, 0, sizeof r);
        r.id = S->in_id[i]; r.prompt = prompt; r.max_tokens = S->in_max[i]; r.client = client; r.g = -1;
        r.k = 1;  /* one sequence */
        r.arrival = stamp; r.first_sched = r.first_token = r.last_token = -1.0;
        d0->num_arrived++;
        return put_req(d0, &r, 1, kind, output);
    }
    long en = dg_entry_new(D);
    if (en < 0) return KV_NOMEM;
    dg_entry *x = &D->ent[en];
    x->id = S->in_id[i]; x->prompt = prompt; x->output = output; x->max_tokens = S->in_max[i];
    x->client = client; x->pid = S->in_pid[i]; x->npt = S->in_npt[i]; x->arrival = stamp;
    x->nbytes = (double)(prompt * D->c.bytes_per_token);
    x->p = p; x->d = -1; x->row = -1;
    D->prefill_arrived++;
    int rc = dg_push(&D->stamps, &D->stamps_n, &D->stamps_cap, 1, &stamp);
    if (rc) return rc;
    return dg_enqueue(pe, x, 1, 1, -1, 0, en, &x->pslot);
}

/* A request left an instance (put_req, not refused): a prefill instance's done event (the
   proxy's _prefilled runs when it is processed), or a decode request's (a client waits on it) */
static int dg_left(kv_rep *e, kv_req *r) {
    kv_engine *S = e->S;
    kv_disagg *D = S->dg;
    if (e->index < D->np) {
        S->out->req[KV_REQ_ROW * (S->out->req_n - 1) + 16] = (double)D->prefill_arrived;  /* its pool's */
        return ev_push(S, S->now, EV_DG_PREFILLED, r->dg_tag);
    }
    return r->client >= 0 ? ev_push(S, S->now, EV_DG_DDONE, r->client) : 0;
}

/* DisaggProxy._prefilled: a decode instance is picked, the transfer logged, the request queued there */
static int dg_prefilled(kv_engine *S, long en) {
    kv_disagg *D = S->dg;
    dg_entry *x = &D->ent[en];
    x->d = dg_pick(S, D->np, D->nd, D->c.decode_router, &D->cursor[1]);
    x->row = D->log_n;
    double nan = 0.0 / 0.0;
    double row[KV_DG_LOG_ROW] = { (double)x->id, (double)x->p, (double)(x->d - D->np), (double)x->prompt,
                                  x->nbytes, S->now, nan, nan };
    int rc = dg_push(&D->log, &D->log_n, &D->log_cap, KV_DG_LOG_ROW, row);
    if (rc) return rc;
    return dg_enqueue(&S->reps[x->d], x, x->output, x->max_tokens, x->client, DG_WAIT, en, &x->dslot);
}

/* _admit_waiting's remote branch on decode instance `e` for the waiting request in slot `s`:
   still loading, skipped; loaded, admitted with every prompt token but the last computed
   (_admit_loaded); else blocks for its whole prompt if they fit (1 when not: the queue stops)
   and the transfer starts (_start_transfer: the link's latency first) */
static int dg_admit(kv_rep *e, long s, long *num_seqs, long *budget) {
    kv_engine *S = e->S;
    kv_req *r = &e->reqs[s];
    if (r->dg_state == DG_LOADING) return 0;
    if (r->dg_state == DG_LOADED) {
        r->dg_state = 0;
        r->adm_cached = r->prompt - 1;
        e->admitted[e->num_admitted++] = s;
        long filling = e->num_filling;
        plan_add(e, s, 1, r->prompt - 1);
        e->num_filling = filling;  /* (loaded blocks are not registered in the prefix cache) */
        *num_seqs += 1;
        *budget -= 1;
        return 0;
    }
    long remote = r->prompt;
    if (blocks_for(e, remote) > e->free_blocks) return 1;
    if (e->pc) fail(e, pc_admit(e, r, 0, remote));
    else {
        long need = blocks_for(e, remote);
        e->free_blocks -= need; r->nblk = need; r->ntok = remote; e->gpu_tokens += remote;
    }
    r->dg_state = DG_LOADING;
    kv_disagg *D = S->dg;
    D->log[KV_DG_LOG_ROW * D->ent[r->dg_tag].row + 6] = S->now;
    fail(e, ev_push(S, S->now + D->c.link_latency_s, EV_DG_JOIN, r->dg_tag));
    return 0;
}

/* -- KvLink: processor sharing of one decode instance's ingress --------------------------- */
static void link_advance(kv_disagg *D, dg_link *L, double now) {
    if (L->n && now > L->last) {
        double share = (now - L->last) * D->c.link_bytes_per_s / (double)L->n;
        for (long k = 0; k < L->n; k++) L->f[k].left -= share;
    }
    L->last = now;
}

static int link_reschedule(kv_engine *S, long li) {
    kv_disagg *D = S->dg;
    dg_link *L = &D->links[li];
    L->gen++;
    if (!L->n) return 0;
    double left = L->f[0].left;
    for (long k = 1; k < L->n; k++) if (L->f[k].left < left) left = L->f[k].left;
    double delay = (left > 0.0 ? left : 0.0) * (double)L->n / D->c.link_bytes_per_s;
    return ev_push(S, S->now + delay, EV_DG_FIRE, L->gen * D->nd + li);
}

static int link_join(kv_engine *S, long en) {
    kv_disagg *D = S->dg;
    long li = D->ent[en].d - D->np;
    dg_link *L = &D->links[li];
    link_advance(D, L, S->now);
    if (L->n == L->cap) {
        long nc = L->cap ? 2 * L->cap : 16;
        dg_flow *f = realloc(L->f, sizeof(dg_flow) * (size_t)nc);
        if (!f) return KV_NOMEM;
        L->f = f; L->cap = nc;
    }
    L->f[L->n].entry = en; L->f[L->n++].left = D->ent[en].nbytes;
    if (L->n > L->max_flowing) L->max_flowing = L->n;
    return link_reschedule(S, li);
}

/* DisaggProxy._transferred: the prefill instance frees the blocks and looks again; the decode
   request is loaded (admitted at that instance's next step) */
static int dg_transferred(kv_engine *S, long en) {
    kv_disagg *D = S->dg;
    dg_entry *x = &D->ent[en];
    D->log[KV_DG_LOG_ROW * x->row + 7] = S->now;
    kv_rep *pe = &S->reps[x->p], *de = &S->reps[x->d];
    kv_req *held = &pe->reqs[x->pslot];
    release(pe, held);
    free(held->pt); held->pt = NULL;
    pe->free_slots[pe->num_free_slots++] = x->pslot;
    int rc = dg_wake(pe);
    if (rc) return rc;
    de->reqs[x->dslot].dg_state = DG_LOADED;
    D->ent_free[D->ent_free_n++] = en;
    return dg_wake(de);
}

/* KvLink._fire: unless outdated, the transfers that ran out (and any within a byte of it) end */
static int link_fire(kv_engine *S, long arg) {
    kv_disagg *D = S->dg;
    long li = arg % D->nd, gen = arg / D->nd;
    dg_link *L = &D->links[li];
    if (gen != L->gen) return 0;
    link_advance(D, L, S->now);
    long first = 0;
    for (long k = 1; k < L->n; k++) if (L->f[k].left < L->f[first].left) first = k;
    long ndone = 0, w = 0;
    long small[16], *done = L->n <= 16 ? small : malloc(sizeof(long) * (size_t)L->n);
    if (!done) return KV_NOMEM;
    for (long k = 0; k < L->n; k++) {
        if (k == first || L->f[k].left <= 1.0) done[ndone++] = L->f[k].entry;
        else L->f[w++] = L->f[k];
    }
    L->n = w;
    int rc = link_reschedule(S, li);
    for (long k = 0; k < ndone && !rc; k++) rc = dg_transferred(S, done[k]);
    if (done != small) free(done);
    return rc;
}

static int dg_event(kv_engine *S, const kv_event *ev) {
    switch (ev->kind) {
    case EV_DG_PREFILLED: return dg_prefilled(S, ev->arg);
    case EV_DG_JOIN: return link_join(S, ev->arg);
    case EV_DG_FIRE: return link_fire(S, ev->arg);
    case EV_DG_DDONE: return ev_push(S, S->now, EV_DONE, ev->arg);  /* the proxy's done, in the callback */
    }
    return KV_STALL;
}

/* Lifecycle.admit's waiting.remove: a request admitted from behind the head */
static void wq_remove(kv_rep *e, long s) {
    long k = 0;
    while (k < e->wq_len && wq_at(e, k) != s) k++;
    for (; k + 1 < e->wq_len; k++) e->wq[(e->wq_head + k) % e->wq_cap] = wq_at(e, k + 1);
    e->wq_len--;
}
