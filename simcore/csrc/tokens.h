/* Per-request token times in the compiled core, kept only when asked (`kvsim run --save-result`:
 * vllm bench serve's per-request ttfts / itls and its peak output tokens per second). What
 * simcore/lifecycle.py's `token_times` holds: every token's time, in emission order, a
 * speculative step's burst sharing one time (Lifecycle.emit_spec), a decode span's steps each
 * their own (Lifecycle.emit_span). One kv_tokens per replica; engine.c calls these hooks where it
 * emits tokens (see "tokens:" there). Memory: the times of requests that left, 8 bytes a token
 * (the CLI caps --save-result runs at 100,000 requests, as for the Python engine), plus those in
 * flight. Plain C99, no knowledge of the engine's structures. */
#ifndef KVSIM_TOKENS_H
#define KVSIM_TOKENS_H

typedef struct kv_tokens kv_tokens;

kv_tokens *kv_tok_new(void);
void kv_tok_free(kv_tokens *t);
/* `count` tokens of the request in slot `slot` at time `at`; 0 or KV_NOMEM */
int kv_tok_put(kv_tokens *t, long slot, double at, long count);
/* a decode span: a step ended at `at` (kept until kv_tok_span_end) ... */
int kv_tok_span_step(kv_tokens *t, double at);
/* ... one token at each of those times for the request in `slot` ... */
int kv_tok_span_apply(kv_tokens *t, long slot);
/* ... and the span's steps forgotten */
void kv_tok_span_end(kv_tokens *t);
/* the request in `slot` (id `id`) left: its times move to the replica's table, the slot is free */
int kv_tok_leave(kv_tokens *t, long slot, long id);
/* the table: requests that left with a token (their number returned), in the order they left;
   *ntimes: their tokens in all; ids, counts (tokens each) and times (request after request) to
   the arrays that are not NULL */
long kv_tok_table(const kv_tokens *t, long *ntimes, long *ids, long *counts, double *times);

/* engine.c's: every replica keeps its token times (call after kv_engine_new and any
   kv_engine_set_replica, before the first run); 0 or KV_NOMEM */
struct kv_engine;
int kv_engine_tokens_on(struct kv_engine *S);
/* a replica's kv_tok_table, once the run is done */
long kv_engine_tokens(const struct kv_engine *S, long replica, long *ntimes, long *ids, long *counts, double *times);

#endif
