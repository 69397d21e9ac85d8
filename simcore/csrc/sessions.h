/* Multi-turn sessions, a host-memory (CPU) KV tier and the block-hash keys they use, for the
 * engine core (engine.c), in C as the Python engine runs them:
 *   workloads/sessions.py  SessionWorkload.process   a session's turns: each sent when the answer
 *                                                    to the one before is back plus a think time;
 *                                                    sessions started open-loop or by N clients
 *   simcore/kv_tier.py     HostKVTier                an LRU set of block hashes in host memory
 * Block hashes (simcore/prefix_hash.py, chained as vLLM's) are computed in Python, once per
 * session up to the longest turn it can send, and handed over as dense ids ("keys": equal ids,
 * equal hashes), so the core's prefix cache and tier key blocks by id.
 * engine.c calls the kvs_* hooks; sessions.c calls back through the kvi_* functions. */
#ifndef KVSIM_SESSIONS_H
#define KVSIM_SESSIONS_H

typedef struct kv_engine kv_engine;

/* -- the CPU KV tier: an LRU over keys 0..nkeys-1 (HostKVTier) ----------------------------- */
typedef struct {
    long cap, n, head, tail, nkeys;  /* head: least recently used */
    long *prev, *next; char *in;
    long stored, evicted;            /* blocks copied in (write-through), blocks dropped */
} kv_tier;

int kvt_init(kv_tier *t, long cap, long nkeys);
void kvt_free(kv_tier *t);
void kvt_store(kv_tier *t, const long *keys, long n);       /* HostKVTier.store */
void kvt_touch(kv_tier *t, const long *keys, long n);       /* HostKVTier.touch */
long kvt_hits(const kv_tier *t, const long *keys, long start, long n);  /* HostKVTier.num_hits */

/* -- sessions: events of their own (engine.c's heap) -------------------------------------- */
enum { EV_SESS_START = 48,   /* the open loop's next session start time */
       EV_SESS_THINK = 49,   /* a session's think time over (arg: the session) */
       EV_SESS_CLIENT = 50,  /* a closed-loop client's pause between sessions over (arg: client) */
       EV_HOP = 51,          /* an idle engine's wakeup, while it also waits on a timer (arg: replica) */
       EV_IDLE_TIMER = 52 }; /* that timer (arg: generation * replicas + replica) */

typedef struct kv_sessions kv_sessions;

void kvs_free(kv_sessions *s);
int kvs_start(kv_sessions *s);               /* time 0: the workload process starts */
int kvs_pending(const kv_sessions *s);       /* a session goes on now (before the next event) */
int kvs_go(kv_sessions *s);                  /* one of those: at most one request sent */
int kvs_event(kv_sessions *s, int kind, long arg);
void kvs_left(kv_sessions *s, long sess, int rejected);  /* a turn left (its done event follows) */
int kvs_done(kv_sessions *s, long sess);     /* that done event, processed */
long kvs_affinity(const kv_sessions *s, long sess);
void kvs_set_affinity(kv_sessions *s, long sess, long replica);

/* engine.c, for sessions.c */
double kvi_now(const kv_engine *S);
int kvi_push(kv_engine *S, double t, int kind, long arg);
int kvi_send_turn(kv_engine *S, long id, long prompt, long output, long sess, const long *keys, long nkeys);

/* Python (fastcore) hands the sessions over before the first run: n sessions, in start order;
   `start` their start times (NULL: a closed loop of `clients`), `system_len` the system prompt
   each starts with (its first context); session i's turns are
   turn_off[i] .. turn_off[i+1]-1 of new_tokens / out_tokens / think_s; its block keys
   key_off[i] .. key_off[i+1]-1 of `keys` (NULL: no prefix caching); `mml`: the workload's
   max_model_len (-1: none); `between`: the closed loop's pauses between sessions, in the order
   they are drawn (NULL: none). Copied. */
int kv_engine_sessions(kv_engine *S, long n, const double *start, long clients, const long *system_len,
                       const long *turn_off, const long *new_tokens, const long *out_tokens, const double *think_s,
                       const long *key_off, const long *keys, long mml, const double *between);
/* The CPU tier behind every replica (--kv-offloading-size): `num_blocks` each, `load_block_s`
   seconds per block over the host link, keys below `nkeys`. */
int kv_engine_offload(kv_engine *S, long num_blocks, double load_block_s, long nkeys);
/* Once the run is done: sessions started, turns sent, rejected, ended at max_model_len (out[0..3]);
   the turn of each request id below n (turn_of, if not NULL) */
void kv_engine_session_stats(const kv_engine *S, long *out, long n, long *turn_of);
/* per replica, KV_TIER_COUNTS longs: prompt tokens loaded from the tier, blocks loaded, stored, evicted */
#define KV_TIER_COUNTS 4
void kv_engine_tier_counts(const kv_engine *S, long *out);
/* per replica: seconds requests waited for loads before they were first scheduled (TTFT split) */
void kv_engine_tier_wait(const kv_engine *S, double *out);

#endif
