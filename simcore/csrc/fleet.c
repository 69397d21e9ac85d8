/* The autoscaler of simcore/autoscale.py (AutoscalingRouter) in the compiled core; see fleet.h.
 *
 * Its SimPy processes, and the events they make, in the order SimPy makes them:
 *   process()   the autoscaler's loop: starts after the workload's process (a closed loop's
 *               clients after it), then one timeout of interval_s per decision; a decision may
 *               start replicas (one _start process each, then _drain ones), records the
 *               timeline, and ends the loop once the workload's process is over and no replica
 *               holds a request; otherwise its next timeout, created before those processes run
 *   _start      one timeout of the cold start; then the replica is active if still starting
 *   _drain      while the replica drains and holds requests, a timeout of 1 s; then it is off
 * A process's start is an URGENT event of its instant: it runs right after the decision that
 * made it, before any other event of that instant. `arrivals.processed` (the workload's process
 * is over) becomes true when the event of its return is processed: one event after the open
 * loop's last send, three after a closed loop's last client ends (the client's process, the
 * all_of condition, the workload's process). Floating point as the Python's: the same
 * operations in the same order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fleet.h"

enum { F_TICK = 0, F_START = 1, F_DRAIN = 2, F_HOP = 3, F_SHIFT = 3 };  /* arg = replica (or hops) << 3 | kind */

struct kv_fleet {
    kv_autoscale_config c;
    long n;
    int *state;
    double *cold, *paid_since, *paid_s;  /* paid_since < 0: not paid now */
    long decisions, clients_ended;
    int begun, arrivals_done;
    double *rows; long rows_n, rows_cap;  /* (t, active, starting, draining) */
    /* the HPA's memory (AutoscalingRouter._recommendations / _events), oldest first from *_head */
    double *rec_t; long *rec_v; long rec_head, rec_n, rec_cap;  /* (time, raw recommendation) */
    double *ev_t; long *ev_v; long ev_head, ev_n, ev_cap;       /* (time, replicas added or removed (< 0)) */
};

/* append (t, v) to a queue of pairs, dropping its first `head` (read no more) when it must grow */
static int push_pair(double **ts, long **vs, long *head, long *n, long *cap, double t, long v) {
    if (*n == *cap) {
        if (*head) {  /* slide the live pairs to the front */
            memmove(*ts, *ts + *head, sizeof(double) * (size_t)(*n - *head));
            memmove(*vs, *vs + *head, sizeof(long) * (size_t)(*n - *head));
            *n -= *head; *head = 0;
        }
        if (*n == *cap) {
            long nc = *cap ? 2 * *cap : 32;
            double *a = realloc(*ts, sizeof(double) * (size_t)nc);
            if (!a) return KV_NOMEM;
            *ts = a;
            long *b = realloc(*vs, sizeof(long) * (size_t)nc);
            if (!b) return KV_NOMEM;
            *vs = b; *cap = nc;
        }
    }
    (*ts)[*n] = t; (*vs)[*n] = v; (*n)++;
    return 0;
}

static long count(const kv_fleet *F, int state) {
    long k = 0;
    for (long i = 0; i < F->n; i++) k += F->state[i] == state;
    return k;
}

/* Timeline._record: a row when the counts changed */
static int record(kv_fleet *F, double now) {
    double a = (double)count(F, KV_REP_ACTIVE), s = (double)count(F, KV_REP_STARTING), d = (double)count(F, KV_REP_DRAINING);
    if (F->rows_n) {
        const double *last = F->rows + 4 * (F->rows_n - 1);
        if (last[1] == a && last[2] == s && last[3] == d) return 0;
    }
    if (F->rows_n == F->rows_cap) {
        long nc = F->rows_cap ? 2 * F->rows_cap : 64;
        double *r = realloc(F->rows, sizeof(double) * 4 * (size_t)nc);
        if (!r) return KV_NOMEM;
        F->rows = r; F->rows_cap = nc;
    }
    double *row = F->rows + 4 * F->rows_n++;
    row[0] = now; row[1] = a; row[2] = s; row[3] = d;
    return 0;
}

int kv_engine_autoscale(kv_engine *S, const kv_autoscale_config *cfg, const double *cold_start_s) {
    long n = kv__num_replicas(S);
    if (kv__fleet(S) || cfg->min_replicas < 1 || cfg->min_replicas > n) return KV_STALL;
    kv_fleet *F = calloc(1, sizeof *F);
    if (!F) return KV_NOMEM;
    F->c = *cfg; F->n = n;
    F->state = calloc((size_t)n, sizeof(int));
    F->cold = malloc(sizeof(double) * (size_t)n);
    F->paid_since = malloc(sizeof(double) * (size_t)n);
    F->paid_s = calloc((size_t)n, sizeof(double));
    kv__set_fleet(S, F);  /* freed with the engine from here on */
    if (!F->state || !F->cold || !F->paid_since || !F->paid_s) return KV_NOMEM;
    memcpy(F->cold, cold_start_s, sizeof(double) * (size_t)n);
    for (long i = 0; i < n; i++) {
        F->paid_since[i] = -1.0;
        if (i < cfg->min_replicas) { F->state[i] = KV_REP_ACTIVE; F->paid_since[i] = 0.0; }
    }
    return record(F, 0.0);
}

void kv_fleet_free(kv_fleet *F) {
    if (!F) return;
    free(F->state); free(F->cold); free(F->paid_since); free(F->paid_s); free(F->rows);
    free(F->rec_t); free(F->rec_v); free(F->ev_t); free(F->ev_v);
    free(F);
}

long kv_engine_fleet(const kv_engine *S, double *rows, long *decisions, long *state, double *paid) {
    const kv_fleet *F = kv__fleet(S);
    if (!F) return 0;
    if (rows && F->rows_n) memcpy(rows, F->rows, sizeof(double) * 4 * (size_t)F->rows_n);
    if (decisions) *decisions = F->decisions;
    for (long i = 0; i < F->n; i++) {
        if (state) state[i] = F->state[i];
        if (paid) { paid[2 * i] = F->paid_s[i]; paid[2 * i + 1] = F->paid_since[i]; }
    }
    return F->rows_n;
}

/* AutoscalingRouter._pick: the fewest in flight among the active; ties: the lowest index */
long kv_fleet_pick(const kv_engine *S) {
    const kv_fleet *F = kv__fleet(S);
    long best = -1, least = 0;
    for (long i = 0; i < F->n; i++) {
        if (F->state[i] != KV_REP_ACTIVE) continue;
        long load = kv__load(S, i);
        if (best < 0 || load < least) { best = i; least = load; }
    }
    return best;  /* never -1: a decision never leaves fewer than min_replicas >= 1 active */
}

/* AutoscalingRouter.metric and desired (the HPA rule) */
static long desired(const kv_engine *S, const kv_fleet *F) {
    long active = count(F, KV_REP_ACTIVE);
    double metric;
    if (F->c.metric == KV_METRIC_INFLIGHT) {
        long sum = 0;
        for (long i = 0; i < F->n; i++)
            if (F->state[i] == KV_REP_ACTIVE) sum += kv__load(S, i);
        metric = (double)sum / (double)active;
    } else {
        double sum = 0.0;
        for (long i = 0; i < F->n; i++)
            if (F->state[i] == KV_REP_ACTIVE) sum += kv__kv_share(S, i);
        metric = 100.0 * sum / (double)active;
    }
    double ratio = metric / F->c.target;
    long want = fabs(ratio - 1.0) <= F->c.tolerance ? active : (long)ceil((double)active * ratio);
    if (want > F->n) want = F->n;
    if (want < F->c.min_replicas) want = F->c.min_replicas;
    return want;
}

/* replicas added less those removed by the changes strictly after `cutoff` (_changed) */
static long changed(const kv_fleet *F, double cutoff) {
    long sum = 0;
    for (long k = F->ev_head; k < F->ev_n; k++)
        if (F->ev_t[k] > cutoff) sum += F->ev_v[k];
    return sum;
}

/* AutoscalingRouter.normalized: the HPA's stabilization windows, then its rate policies */
static int normalized(kv_fleet *F, double now, long raw, long current, long *out) {
    const kv_autoscale_config *c = &F->c;
    double up_cut = now - c->scale_up_cooldown_s, down_cut = now - c->scale_down_cooldown_s;
    long up = raw, down = raw;
    for (long k = F->rec_head; k < F->rec_n; k++) {
        if (F->rec_t[k] > up_cut && F->rec_v[k] < up) up = F->rec_v[k];
        if (F->rec_t[k] > down_cut && F->rec_v[k] > down) down = F->rec_v[k];
    }
    long want = current;
    if (want < up) want = up;
    if (want > down) want = down;
    double old = up_cut < down_cut ? up_cut : down_cut;
    while (F->rec_head < F->rec_n && F->rec_t[F->rec_head] <= old) F->rec_head++;
    int rc = push_pair(&F->rec_t, &F->rec_v, &F->rec_head, &F->rec_n, &F->rec_cap, now, raw);
    if (rc) return rc;
    if (want > current) {
        long start = current - changed(F, now - c->scale_up_period_s);
        long pct = (long)ceil((double)start * (1.0 + c->scale_up_percent / 100.0));
        long pods = start + (long)c->scale_up_pods;
        long limit = pct > pods ? pct : pods;
        if (limit < current) limit = current;
        if (want > limit) want = limit;
        if (want > F->n) want = F->n;
    } else if (want < current) {
        long start = current - changed(F, now - c->scale_down_period_s);
        long limit = (long)((double)start * (1.0 - c->scale_down_percent / 100.0));
        if (limit > current) limit = current;
        if (want < limit) want = limit;
        if (want < c->min_replicas) want = c->min_replicas;
    }
    *out = want;
    return 0;
}

/* AutoscalingRouter._scaled: remember a change for the rate policies */
static int scaled(kv_fleet *F, double now, long change) {
    double pu = F->c.scale_up_period_s, pd = F->c.scale_down_period_s;
    double old = now - (pu > pd ? pu : pd);
    while (F->ev_head < F->ev_n && F->ev_t[F->ev_head] <= old) F->ev_head++;
    return push_pair(&F->ev_t, &F->ev_v, &F->ev_head, &F->ev_n, &F->ev_cap, now, change);
}

int kv_fleet_begun(const kv_engine *S) { return kv__fleet(S)->begun; }

int kv_fleet_begin(kv_engine *S) {
    kv_fleet *F = kv__fleet(S);
    F->begun = 1;
    return kv__push(S, kv__now(S) + F->c.interval_s, F_TICK);
}

static int engines_empty(const kv_engine *S, const kv_fleet *F) {
    for (long i = 0; i < F->n; i++)
        if (kv__load(S, i)) return 0;
    return 1;
}

/* _drain's loop test, at its start and after each second: go on polling, or off */
static int drain_check(kv_engine *S, kv_fleet *F, long i) {
    double now = kv__now(S);
    if (F->state[i] == KV_REP_DRAINING && kv__load(S, i)) return kv__push(S, now + 1.0, (i << F_SHIFT) | F_DRAIN);
    if (F->state[i] != KV_REP_DRAINING) return 0;
    F->state[i] = KV_REP_OFF;
    F->paid_s[i] += now - F->paid_since[i];
    F->paid_since[i] = -1.0;
    return record(F, now);
}

/* One decision (AutoscalingRouter.process's loop body) */
static int tick(kv_engine *S, kv_fleet *F) {
    const kv_autoscale_config *c = &F->c;
    double now = kv__now(S);
    long serving = count(F, KV_REP_ACTIVE) + count(F, KV_REP_STARTING);
    long want;
    int rc = normalized(F, now, desired(S, F), serving, &want);
    if (rc) return rc;
    F->decisions++;
    long n_started = 0;  /* replicas whose _start / _drain processes this decision makes */
    int kind = -1;
    long *made = malloc(sizeof(long) * (size_t)F->n);
    if (!made) return KV_NOMEM;
    if (want > serving) {
        rc = scaled(F, now, want - serving);
        for (long i = 0; i < F->n; i++) {
            if (serving >= want) break;
            if (F->state[i] == KV_REP_DRAINING) {  /* taken back: it is warm */
                F->state[i] = KV_REP_ACTIVE;
                serving++;
            } else if (F->state[i] == KV_REP_OFF) {
                F->state[i] = KV_REP_STARTING; F->paid_since[i] = now;
                made[n_started++] = i;
                serving++;
            }
        }
        kind = F_START;
    } else if (want < serving && count(F, KV_REP_STARTING) == 0) {
        rc = scaled(F, now, want - serving);
        for (long i = F->n - 1; i >= 0; i--) {
            if (count(F, KV_REP_ACTIVE) <= want) break;
            if (F->state[i] == KV_REP_ACTIVE) {
                F->state[i] = KV_REP_DRAINING;
                made[n_started++] = i;
            }
        }
        kind = F_DRAIN;
    }
    if (!rc) rc = record(F, now);
    /* the loop ends (no next timeout) once the workload is over and nothing is in flight */
    if (!rc && !(F->arrivals_done && engines_empty(S, F))) rc = kv__push(S, now + c->interval_s, F_TICK);
    /* then the processes it made start (URGENT: before any other event of this instant) */
    for (long k = 0; k < n_started && !rc; k++) {
        long i = made[k];
        rc = kind == F_START ? kv__push(S, now + F->cold[i], (i << F_SHIFT) | F_START) : drain_check(S, F, i);
    }
    free(made);
    return rc;
}

int kv_fleet_event(kv_engine *S, long arg) {
    kv_fleet *F = kv__fleet(S);
    long i = arg >> F_SHIFT;
    switch (arg & ((1 << F_SHIFT) - 1)) {
    case F_TICK: return tick(S, F);
    case F_START:  /* _start: the cold start is over */
        if (F->state[i] != KV_REP_STARTING) return 0;
        F->state[i] = KV_REP_ACTIVE;
        return record(F, kv__now(S));
    case F_DRAIN: return drain_check(S, F, i);
    case F_HOP:  /* the workload's process ending, event by event */
        if (i > 1) return kv__push(S, kv__now(S), ((i - 1) << F_SHIFT) | F_HOP);
        F->arrivals_done = 1;
        return 0;
    }
    return KV_STALL;
}

int kv_fleet_workload_end(kv_engine *S) {
    return kv__push(S, kv__now(S), (1L << F_SHIFT) | F_HOP);
}

int kv_fleet_client_end(kv_engine *S) {
    kv_fleet *F = kv__fleet(S);
    if (++F->clients_ended < kv__clients(S)) return 0;
    return kv__push(S, kv__now(S), (3L << F_SHIFT) | F_HOP);
}
