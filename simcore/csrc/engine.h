/* Engine replicas' step loops in C: continuous batching over a paged KV cache (vLLM V0's
 * prefill-first scheduler, or V1's token budget with chunked prefill), recompute or swap preemption,
 * one-sequence requests, prefix caching of shared prefixes (hashed blocks, LRU eviction as
 * simcore/block_pool.py); one replica or several behind a router (round-robin or least-loaded,
 * simcore/router.py); an open-loop workload or a closed loop of clients with think times. The
 * same decisions, timestamps and step prices as the Python engine in --exact-steps mode
 * (simcore/engine.py, policies/continuous*.py, lifecycle.py, workloads/arrivals.py), without
 * SimPy: one event heap replays SimPy's event order (time, then creation).
 *
 * Resumable: kv_engine_run returns when an output buffer may not hold the next event's output,
 * when it needs more arrivals (kv_engine_feed), or when the run is over; Python empties the
 * buffers into its bounded stores and calls again, so memory stays flat in request count.
 * Plain C99, no Python.h: loaded with ctypes by simcore/fastcore.py. */
#ifndef KVSIM_ENGINE_H
#define KVSIM_ENGINE_H

#include "pricing.h"

#define KV_REQ_ROW 17  /* request_id, replica, status, reason, arrival_s, first_scheduled_s,
                          first_token_s, finish_s, num_prompt_tokens, num_positions, max_tokens, n,
                          beam_width, num_preemptions (simcore.records._RAW order), then the reject
                          kind (KV_REJECT_*), the output tokens asked for, and the arrivals so far */
#define KV_STEP_ROW 26 /* simcore.metrics._COLUMNS (21), then a span row's KV-allocated and
                          internal slot-seconds and KV-blocked seconds, 1 for a span row, and
                          the replica */

enum { KV_REJECT_NONE = 0, KV_REJECT_MODEL_LEN = 1, KV_REJECT_BUDGET = 2, KV_REJECT_CACHE = 3,
       KV_REJECT_WATERMARK = 4 };
enum { KV_DONE = 0, KV_FULL = 1, KV_NEED_INPUT = 2, KV_STALL = -2, KV_NOMEM = -3,
       KV_NOROOM = -4 /* empty output buffers too small for one event: KV_FULL would repeat forever */ };

typedef struct {
    long max_num_seqs, max_num_batched_tokens, max_model_len;
    long num_gpu_blocks, block_size, watermark_blocks;
    long chunked_prefill;  /* 0: vLLM V0 (continuous_v0.py); 1: V1 (continuous.py) */
    long hold_at;          /* waiting requests at which the Python workload would hold arrivals */
    long kv_capacity, kv_unit;  /* StepRecorder's, for a span row's KV-blocked seconds */
    long aggregate;        /* 1: one row per run of unchanged decode steps */
    long swap;             /* 1: preemption by swap (to the CPU pool while it has room) */
    long num_cpu_blocks;   /* the swap pool */
    long num_replicas;     /* replicas behind the router, each with this configuration (0: one) */
    long router;           /* with several: KV_ROUTER_* */
    long clients;          /* 0: an open loop; else a closed loop of this many clients */
    long prefix_caching;   /* 1: full blocks of shared prefixes cached by content, LRU eviction */
    long itl_cap;          /* a replica's inter-token gaps kept at most (simcore.records.Samples'
                              cap); past it every one is binned here instead */
    long itl_block;        /* gaps summed per block, pairwise as numpy sums (Samples' _FLUSH) */
    long fold_steps;       /* 1: step rows folded here as simcore.metrics.StepRecorder folds them
                              (totals, the kept table coalesced past step_cap), none handed out */
    long step_cap, step_chunk;  /* StepRecorder's cap and _STEP_CHUNK */
    double swap_block_s;   /* seconds to copy one block over PCIe */
    long num_scheduler_steps;  /* V0: steps of a decode round (vLLM 0.6's multi-step scheduling,
                                  continuous_v0.py); 0 or 1: every step scheduled */
} kv_engine_config;

enum { KV_ROUTER_ROUND_ROBIN = 0, KV_ROUTER_LEAST_LOADED = 1,
       /* sessions.c's hooks in engine.c (disagg.h's KV_ROUTER_PREFIX_AWARE, 2, is the prefill pool's) */
       KV_ROUTER_SESSION_AFFINITY = 4, KV_ROUTER_PREFIX_SCORE = 5 };

typedef struct {
    double *req; long req_cap, req_n;          /* KV_REQ_ROW doubles per request that left */
    double *step; long step_cap, step_n;       /* KV_STEP_ROW doubles per row */
    double *arr; long arr_cap, arr_n;          /* arrival stamps, arrival order */
    long extrap[4];                            /* steps, linear, prefill_attention, decode_attention */
    long num_arrived, num_done, num_steps;
    long num_holds;                            /* times arrivals were held back (Engine.num_holds) */
} kv_outputs;

typedef struct kv_engine kv_engine;

kv_engine *kv_engine_new(const kv_engine_config *cfg, const kv_pricing *pricing);
void kv_engine_free(kv_engine *e);
/* Arrivals (planned seconds after the start, nondecreasing; ignored in a closed loop) and
   lengths, think times (closed loop; NULL: none), shared prefixes (id, -1: none, and tokens;
   NULL: none); `last`: no more follow. Copied; call only when kv_engine_run asked
   (KV_NEED_INPUT) or before the first run. */
int kv_engine_feed(kv_engine *e, long n, const double *at, const long *ids, const long *prompt,
                   const long *output, const long *max_tokens, const double *think,
                   const long *prefix_id, const long *prefix_tokens, int last);
/* sg: the widths (n: parallel samples) of the chunk just fed, one per request (seqgroup.c);
   call right after kv_engine_feed, or not at all for one sequence each */
int kv_engine_feed_widths(kv_engine *e, long n, const long *widths);
int kv_engine_run(kv_engine *e, kv_outputs *out);
/* per replica (KV_COUNTS longs each): requests arrived, requests that left, times arrivals were
   held, prompt tokens of admitted requests that share a prefix, of those adopted from the cache */
#define KV_COUNTS 5
void kv_engine_counts(const kv_engine *e, long *out);
/* A replica's inter-token gaps, once the run is done: stats = count, sum, min, max, zeros as
   simcore.records.Samples bins them (the last partial block summed too); the counts of keys
   key0 .. key0 + n - 1 (float64 bits >> KV_HIST_SHIFT) go to `hist`, and while count <= itl_cap
   the gaps in emission order to `values` (each if not NULL). Returns n. */
#define KV_HIST_SHIFT 38
long kv_engine_itl(const kv_engine *e, long replica, double *stats, long *key0, long *hist, double *values);
/* A replica's folded step rows, once the run is done (fold_steps): ints = num_steps, seq_steps,
   max_running, kv_allocated_max, num_preempted, halvings, coalesced, streaming; sums =
   duration, running, KV-blocked seconds, then slot-seconds of the KV_STEP_KINDS kinds; the
   kept rows (KV_STEP_COLUMNS doubles each) to `rows` if not NULL. Returns their number. */
#define KV_STEP_COLUMNS 21
#define KV_STEP_KINDS 7
long kv_engine_steps(const kv_engine *e, long replica, long *ints, double *sums, double *rows);
/* numpy's float64 add.reduce of a contiguous array (pairwise, 8 accumulators; for tests) */
double kv_pairwise_sum(const double *a, long n);

#endif
