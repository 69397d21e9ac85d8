/* The reservation policies in the compiled core (batching.c): static and dynamic batching, Orca. */
#ifndef KVSIM_BATCHING_H
#define KVSIM_BATCHING_H

enum { KV_BT_STATIC = 1, KV_BT_DYNAMIC = 2, KV_BT_ORCA = 3 };
enum { KV_RES_MAX = 0, KV_RES_POW2 = 1, KV_RES_ORACLE = 2 };  /* Orca's reservation sizes */
/* engine.c's engine states and events of static batching's timed idle (see batching.c) */
enum { ENG_TIMED = 3 /* idle, waiting for its wakeup or the batch timer */,
       ENG_TIMED_W = 4 /* ... its wakeup succeeded (processed next) */ };
enum { EV_BT_TIMER = 40, EV_BT_WAKE = 41 };
#define KV_BT_EPS_S 1e-9  /* policies/static.py _EPS_S: a timer at the deadline counts as reaching it */

typedef struct {
    long kind;                 /* KV_BT_* */
    long capacity;             /* the contiguous allocator's tokens */
    long num_slots, slot_tokens;          /* static: a full batch, a slot's tokens (max_model_len) */
    long max_prefill_tokens, max_waiting_tokens;  /* dynamic (TGI) */
    long reservation;          /* Orca: KV_RES_* */
    double batch_timeout_s;    /* static */
    double waiting_served_ratio;  /* dynamic */
} kv_batch_config;

/* engine.c's: every replica runs this policy (its engine config's max_num_seqs, token budget,
   chunked prefill as the policy's); call after kv_engine_new, before the first run. 0 or KV_NOMEM */
struct kv_engine;
int kv_engine_batching(struct kv_engine *S, const kv_batch_config *c);

#endif
