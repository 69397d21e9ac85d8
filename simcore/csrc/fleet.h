/* Heterogeneous fleets and autoscaling in the compiled core (issue 29): the same run as
 * simcore/fleet.py and simcore/autoscale.py's AutoscalingRouter in the Python engine's
 * --exact-steps mode.
 *
 * A fleet: each replica its own kv_engine_config (KV cache, batch limits, swap space) and its own
 * kv_pricing (its GPU's and TP's latency tables), set with kv_engine_set_replica before the first
 * kv_engine_run; the router (engine.c) sees them all.
 *
 * Autoscaling: kv_engine_autoscale before the first run; the replicas are the pool (max_replicas),
 * the first min_replicas active from t = 0; a Kubernetes-HPA decision every interval_s (fleet.c: the
 * recommendation, then the HPA's stabilization windows and rate policies),
 * cold starts (one delay per replica: provisioning + load + warm-up, computed in Python), draining
 * replicas that take no new requests and go off once empty (checked every simulated second), the
 * router (least-loaded) over the active ones only. Once the run is done kv_engine_fleet hands back
 * the timeline, the decisions and each replica's bill for simcore.autoscale to summarise. */
#ifndef KVSIM_FLEET_H
#define KVSIM_FLEET_H

#include "engine.h"

typedef struct {
    long min_replicas;      /* active at t = 0; the pool is the core's num_replicas */
    long metric;            /* KV_METRIC_* */
    double target, interval_s, tolerance;
    double scale_up_cooldown_s, scale_down_cooldown_s;  /* the HPA's stabilization windows (up, down) */
    double scale_up_percent, scale_up_pods, scale_up_period_s;  /* its rate policies (selectPolicy Max) */
    double scale_down_percent, scale_down_period_s;
} kv_autoscale_config;

enum { KV_METRIC_INFLIGHT = 0, KV_METRIC_KV = 1 };
enum { KV_REP_OFF = 0, KV_REP_STARTING = 1, KV_REP_ACTIVE = 2, KV_REP_DRAINING = 3 };

/* Replica `i` of a fleet: its own configuration and pricing (both kept by reference: the caller
   keeps `pricing` alive until kv_engine_free). Before the first kv_engine_run. Returns 0, or
   KV_NOMEM. (engine.c) */
int kv_engine_set_replica(kv_engine *e, long i, const kv_engine_config *cfg, const kv_pricing *pricing);

/* Autoscale the replicas (`cold_start_s`: one per replica, copied). Before the first run. */
int kv_engine_autoscale(kv_engine *e, const kv_autoscale_config *cfg, const double *cold_start_s);

/* Once the run is done: the timeline rows (t, active, starting, draining: 4 doubles each) to
   `rows` if not NULL; decisions made, and per replica its state (KV_REP_*), seconds paid and
   the start of its unpaid stretch (-1: none) to `state` / `paid` (2 doubles each) if not NULL.
   Returns the number of rows. */
long kv_engine_fleet(const kv_engine *e, double *rows, long *decisions, long *state, double *paid);

/* -- between engine.c and fleet.c (not for callers) ------------------------------------------ */
typedef struct kv_fleet kv_fleet;

/* engine.c gives fleet.c: */
long kv__num_replicas(const kv_engine *S);
long kv__load(const kv_engine *S, long i);          /* waiting + running + swapped (Engine.load) */
double kv__kv_share(const kv_engine *S, long i);    /* used / all GPU blocks (num_used_blocks / num_gpu_blocks) */
double kv__now(const kv_engine *S);
long kv__clients(const kv_engine *S);
int kv__push(kv_engine *S, double t, long arg);     /* an EV_FLEET event (SimPy order: time, then creation) */
void kv__set_fleet(kv_engine *S, kv_fleet *F);
kv_fleet *kv__fleet(const kv_engine *S);

/* fleet.c gives engine.c: */
long kv_fleet_pick(const kv_engine *S);              /* the least-loaded active replica */
int kv_fleet_begin(kv_engine *S);                    /* the autoscaler's process starts (once) */
int kv_fleet_begun(const kv_engine *S);
int kv_fleet_event(kv_engine *S, long arg);          /* an EV_FLEET event popped */
int kv_fleet_workload_end(kv_engine *S);             /* the open loop's process returned */
int kv_fleet_client_end(kv_engine *S);               /* a closed-loop client's process returned */
void kv_fleet_free(kv_fleet *F);

#endif
