/* Speculative decoding in the compiled core (simcore/policies/speculative.py and
 * simcore/speculative_cost.py, in C): a replica's draft tokens per verifying request, the
 * seeded acceptance draws (numpy's PCG64 stream, bit for bit), and a speculative step's price
 * (the target's verify as a mixed step, then the drafter's k passes). engine.c keeps the
 * scheduling and the KV; it calls these hooks (see "speculative decoding" there). */
#ifndef KVSIM_SPEC_H
#define KVSIM_SPEC_H

#include "pricing.h"

enum { KV_SPEC_HEAD = 0, KV_SPEC_NGRAM = 1, KV_SPEC_DRAFT_MODEL = 2 };

typedef struct {
    long k;                   /* num_speculative_tokens */
    long method;              /* KV_SPEC_*: eagle / eagle3 / mtp are heads */
    double head_layers;       /* SpeculativeConfig.head_layers (a head's cost in target layers) */
    double ngram_ms_per_seq;  /* speculative.NGRAM_HOST_MS_PER_SEQ */
} kv_spec_config;

typedef struct kv_spec kv_spec;

/* One replica's: `rates` k conditional acceptance rates; `rng` the policy's accept_rng
   (numpy PCG64: state high, low, increment high, low); `draft` the draft model's pricing
   (KV_SPEC_DRAFT_MODEL only, else NULL); `max_parts` the most requests a step schedules. */
kv_spec *kv_spec_new(const kv_spec_config *c, const double *rates, const unsigned long *rng,
                     const kv_pricing *target, const kv_pricing *draft, long max_parts);
void kv_spec_free(kv_spec *s);
void kv_spec_reset(kv_spec *s);  /* a new plan */
/* Draft tokens for a decoding request: min(k, `left` tokens it emits after the one it
   samples anyway, `budget` left after that one), at least 0 */
long kv_spec_drafts(const kv_spec *s, long left, long budget);
void kv_spec_verify(kv_spec *s, long part, long num_drafts, long computed);  /* part `part` verifies */
void kv_spec_drafting(kv_spec *s, long context);  /* a sequence that samples (not a verify) drafts next */
long kv_spec_accepted(const kv_spec *s, long part);  /* a verify's accepted drafts (-1: not a verify) */
/* The planned step (the plan's own counts: drafts not in them): draws every verify's acceptance,
   then prices it as SpeculativeStepCost.step_time_s. parts = kernels, 0, collectives, host (ms,
   the recorder's breakdown); *total_ms the step's time in its own sum order. Returns the
   extrapolation mask (KV_OUT_*) and *prefill_out as kv_step_parts does. */
int kv_spec_price(kv_spec *s, long num_tokens, long num_chunks, const long *chunk_tokens, const long *chunk_ctx,
                  long num_decode_seqs, long decode_ctx, long num_sampled, double parts[4], long *prefill_out,
                  double *total_ms);
/* ints: drafts (verify steps of a request), draft tokens, accepted tokens, then accepted_at[k],
   drafted_at[k]; sums: verify ms, draft ms */
#define KV_SPEC_INTS 3
void kv_spec_stats(const kv_spec *s, long *ints, double *sums);

/* engine.c's: every replica runs speculative decoding (`rng`: 4 words per replica, each its
   own policy's stream); call after kv_engine_new, before the first run. 0 or KV_NOMEM. */
struct kv_engine;
int kv_engine_spec(struct kv_engine *S, const kv_spec_config *c, const double *rates, const unsigned long *rng,
                   const kv_pricing *draft);
/* a replica's kv_spec_stats, once the run is done */
void kv_engine_spec_stats(const struct kv_engine *S, long replica, long *ints, double *sums);

#endif
