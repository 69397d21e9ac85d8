/* Sessions and the CPU KV tier for the engine core (see sessions.h). The Python they mirror:
 *   workloads/sessions.py SessionWorkload.process: session() (turns, think, rejection, the
 *       max_model_len end), the open loop's starter (one timeout per later start time, sessions
 *       started as processes: URGENT, before anything else at that instant) and the closed loop's
 *       clients (a free client takes the next session; a pause between sessions)
 *   simcore/kv_tier.py HostKVTier: store / touch / num_hits over an OrderedDict (LRU first)
 * SimPy order: a session process resumed by its done event or its think timeout sends its next
 * turn at once; the core takes those "go"s one at a time, before the next event, in order. */
#include <stdlib.h>
#include <string.h>

#include "sessions.h"

/* -- the CPU tier ---------------------------------------------------------------------------- */
int kvt_init(kv_tier *t, long cap, long nkeys) {
    memset(t, 0, sizeof *t);
    t->cap = cap; t->head = t->tail = -1; t->nkeys = nkeys;
    size_t k = (size_t)(nkeys ? nkeys : 1);
    t->prev = malloc(sizeof(long) * k); t->next = malloc(sizeof(long) * k); t->in = calloc(k, 1);
    return t->prev && t->next && t->in;
}

void kvt_free(kv_tier *t) { free(t->prev); free(t->next); free(t->in); t->prev = t->next = NULL; t->in = NULL; }

static void kvt_unlink(kv_tier *t, long k) {
    long p = t->prev[k], n = t->next[k];
    if (p >= 0) t->next[p] = n; else t->head = n;
    if (n >= 0) t->prev[n] = p; else t->tail = p;
}

static void kvt_append(kv_tier *t, long k) {  /* most recently used */
    t->prev[k] = t->tail; t->next[k] = -1;
    if (t->tail >= 0) t->next[t->tail] = k; else t->head = k;
    t->tail = k;
}

void kvt_store(kv_tier *t, const long *keys, long n) {
    for (long i = 0; i < n; i++) {
        long k = keys[i];
        if (t->in[k]) { kvt_unlink(t, k); kvt_append(t, k); continue; }  /* move_to_end */
        if (t->n >= t->cap) {  /* popitem(last=False) */
            long old = t->head;
            kvt_unlink(t, old); t->in[old] = 0; t->n--; t->evicted++;
        }
        kvt_append(t, k); t->in[k] = 1; t->n++; t->stored++;
    }
}

void kvt_touch(kv_tier *t, const long *keys, long n) {
    for (long i = 0; i < n; i++) {
        long k = keys[i];
        if (t->in[k]) { kvt_unlink(t, k); kvt_append(t, k); }
    }
}

long kvt_hits(const kv_tier *t, const long *keys, long start, long n) {
    long hits = 0;
    for (long i = start; i < n && t->in[keys[i]]; i++) hits++;
    return hits;
}

/* -- sessions ---------------------------------------------------------------------------------- */
typedef struct {
    long turn;      /* turns sent so far (the next is turn + 1) */
    long context;   /* tokens of the conversation so far (system prompt, prompts, answers) */
    long prompt, out;  /* the turn in flight */
    long client;    /* closed loop: the client running it */
    long affinity;  /* session-affinity router: its replica, -1 none yet */
    int rejected;   /* its turn in flight was refused */
} kv_sess;

struct kv_sessions {
    kv_engine *S;
    long n; double *start; long clients;
    long *turn_off, *new_tokens, *out_tokens; double *think;
    long *key_off, *keys; long mml; double *between; long between_next;
    kv_sess *s;
    long next_start;  /* open loop: the next session to start */
    long next_plan;   /* closed loop: the next session a free client takes */
    long *go; long go_head, go_n, go_cap;  /* sessions that go on now, in order */
    long next_id;
    long *turn_of; long turn_of_cap;
    long num_sessions, num_turns, num_rejected, num_ended;
};

void kvs_free(kv_sessions *q) {
    if (!q) return;
    free(q->start); free(q->turn_off); free(q->new_tokens); free(q->out_tokens); free(q->think);
    free(q->key_off); free(q->keys); free(q->between); free(q->s); free(q->go); free(q->turn_of);
    free(q);
}

/* set by kv_engine_sessions (engine.c keeps the pointer) */
int kvi_attach_sessions(kv_engine *S, kv_sessions *q);
kv_sessions *kvi_sessions(const kv_engine *S);

static void *dup(const void *src, size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (p && src && bytes) memcpy(p, src, bytes);
    return p;
}

int kv_engine_sessions(kv_engine *S, long n, const double *start, long clients, const long *system_len,
                       const long *turn_off, const long *new_tokens, const long *out_tokens, const double *think_s,
                       const long *key_off, const long *keys, long mml, const double *between) {
    kv_sessions *q = calloc(1, sizeof *q);
    if (!q) return -3;
    long nt = turn_off[n], nk = key_off ? key_off[n] : 0;
    q->S = S; q->n = n; q->clients = clients; q->mml = mml;
    q->start = start ? dup(start, sizeof(double) * n) : NULL;
    q->turn_off = dup(turn_off, sizeof(long) * (n + 1));
    q->new_tokens = dup(new_tokens, sizeof(long) * nt); q->out_tokens = dup(out_tokens, sizeof(long) * nt);
    q->think = dup(think_s, sizeof(double) * nt);
    q->key_off = key_off ? dup(key_off, sizeof(long) * (n + 1)) : NULL;
    q->keys = key_off ? dup(keys, sizeof(long) * nk) : NULL;
    q->between = between ? dup(between, sizeof(double) * n) : NULL;
    q->s = calloc((size_t)(n ? n : 1), sizeof(kv_sess));
    if ((start && !q->start) || !q->turn_off || !q->new_tokens || !q->out_tokens || !q->think || !q->s
        || (key_off && (!q->key_off || !q->keys)) || (between && !q->between)) { kvs_free(q); return -3; }
    for (long i = 0; i < n; i++) { q->s[i].affinity = -1; q->s[i].client = -1; q->s[i].context = system_len[i]; }
    return kvi_attach_sessions(S, q);
}

void kv_engine_session_stats(const kv_engine *S, long *out, long n, long *turn_of) {
    const kv_sessions *q = kvi_sessions(S);
    out[0] = q->num_sessions; out[1] = q->num_turns; out[2] = q->num_rejected; out[3] = q->num_ended;
    if (turn_of)
        for (long i = 0; i < n; i++) turn_of[i] = i < q->next_id ? q->turn_of[i] : 0;
}

long kvs_affinity(const kv_sessions *q, long sess) { return q->s[sess].affinity; }
void kvs_set_affinity(kv_sessions *q, long sess, long replica) { q->s[sess].affinity = replica; }

static int go_push(kv_sessions *q, long sess) {
    if (q->go_n == q->go_cap) {
        long nc = q->go_cap ? 2 * q->go_cap : 64;
        long *g = malloc(sizeof(long) * nc);
        if (!g) return -3;
        for (long i = 0; i < q->go_n; i++) g[i] = q->go[(q->go_head + i) % q->go_cap];
        free(q->go); q->go = g; q->go_cap = nc; q->go_head = 0;
    }
    q->go[(q->go_head + q->go_n++) % q->go_cap] = sess;
    return 0;
}

int kvs_pending(const kv_sessions *q) { return q->go_n > 0; }

/* a closed-loop client is free: it takes the next session (now), or ends */
static int client_next(kv_sessions *q, long client) {
    if (q->next_plan >= q->n) return 0;
    long i = q->next_plan++;
    q->s[i].client = client;
    return go_push(q, i);
}

/* the session's process returned: a client pauses (its next pause drawn) or takes the next one */
static int session_end(kv_sessions *q, long sess) {
    long client = q->s[sess].client;
    if (client < 0) return 0;  /* open loop: nobody waits */
    if (q->between) {
        double pause = q->between[q->between_next++];
        return kvi_push(q->S, kvi_now(q->S) + pause, EV_SESS_CLIENT, client);
    }
    return client_next(q, client);
}

/* open loop: start the sessions planned for now, then wait for the next start time */
/* `woken`: its timeout fired, so the session it waited for starts now, even when now + (at - now)
   rounded below `at` (the Python loop does not test `at > env.now` again after the yield) */
static int starter(kv_sessions *q, int woken) {
    double now = kvi_now(q->S);
    while (q->next_start < q->n) {
        double at = 0.0 + q->start[q->next_start];
        if (!woken && at > now) return kvi_push(q->S, now + (at - now), EV_SESS_START, 0);
        woken = 0;
        int rc = go_push(q, q->next_start++);
        if (rc) return rc;
    }
    return 0;
}

int kvs_start(kv_sessions *q) {
    if (!q->start) {  /* the clients start in order, each taking a session */
        long k = q->clients < q->n ? q->clients : q->n;
        for (long c = 0; c < k; c++) {
            int rc = client_next(q, c);
            if (rc) return rc;
        }
        return 0;
    }
    return starter(q, 0);
}

/* the session at the head of the go queue goes on: its next turn is sent, or it ends (then a
   client may take the next session at once; that one goes on in its place) */
int kvs_go(kv_sessions *q) {
    long sess = q->go[q->go_head];
    for (;;) {
        kv_sess *s = &q->s[sess];
        long first = q->turn_off[sess], nturns = q->turn_off[sess + 1] - first;
        if (s->turn == 0) q->num_sessions++;
        if (s->turn < nturns) {
            long k = first + s->turn;
            long prompt = s->context + q->new_tokens[k];
            if (q->mml >= 0 && prompt >= q->mml) {
                q->num_ended++;
            } else {
                long out = q->out_tokens[k];
                if (q->mml >= 0 && out > q->mml - prompt) out = q->mml - prompt;
                s->turn++; s->prompt = prompt; s->out = out; s->rejected = 0;
                long id = q->next_id++;
                if (id >= q->turn_of_cap) {
                    long nc = q->turn_of_cap ? 2 * q->turn_of_cap : 1024;
                    long *t = realloc(q->turn_of, sizeof(long) * nc);
                    if (!t) return -3;
                    q->turn_of = t; q->turn_of_cap = nc;
                }
                q->turn_of[id] = s->turn;
                q->num_turns++;
                q->go_head = (q->go_head + 1) % q->go_cap; q->go_n--;
                const long *keys = q->key_off ? q->keys + q->key_off[sess] : NULL;
                long nkeys = q->key_off ? q->key_off[sess + 1] - q->key_off[sess] : 0;
                return kvi_send_turn(q->S, id, prompt, out, sess, keys, nkeys);
            }
        }
        /* it ends here */
        long client = s->client;
        if (client >= 0 && !q->between && q->next_plan < q->n) {  /* the client takes the next now */
            sess = q->next_plan++;
            q->s[sess].client = client;
            q->go[q->go_head] = sess;
            continue;
        }
        q->go_head = (q->go_head + 1) % q->go_cap; q->go_n--;
        return session_end(q, sess);
    }
}

void kvs_left(kv_sessions *q, long sess, int rejected) { q->s[sess].rejected = rejected; }

/* the turn's done event: a refused turn ends the session; else the answer extends the
   conversation and the next turn goes after the think time (none after the last turn) */
int kvs_done(kv_sessions *q, long sess) {
    kv_sess *s = &q->s[sess];
    if (s->rejected) {
        q->num_rejected++;
        return session_end(q, sess);
    }
    s->context = s->prompt + s->out;
    long first = q->turn_off[sess], nturns = q->turn_off[sess + 1] - first;
    double think = q->think[first + s->turn - 1];
    if (s->turn < nturns && think > 0) return kvi_push(q->S, kvi_now(q->S) + think, EV_SESS_THINK, sess);
    return go_push(q, sess);
}

int kvs_event(kv_sessions *q, int kind, long arg) {
    switch (kind) {
    case EV_SESS_START: return starter(q, 1);
    case EV_SESS_THINK: return go_push(q, arg);
    case EV_SESS_CLIENT: return client_next(q, arg);
    }
    return -2;
}
