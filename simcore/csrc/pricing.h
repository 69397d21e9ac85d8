/* Step pricing of simcore/latency.py's StepLatencyModel, in C (issue 10's compiled engine core).

   Python marshals a model into a flat float64 blob (simcore/ccore.py: pricing_blob); C parses it
   once and prices steps with the same IEEE operations in the same order as
   StepLatencyModel._parts_ms (libm's log, log1p and exp, as Python's math module calls them), so
   a step costs the same bits either way (tests/test_ccore.py compares them with ==). Compile with
   -ffp-contract=off and without fast-math: a fused multiply-add would round differently. */
#ifndef KVSIM_PRICING_H
#define KVSIM_PRICING_H

#define KV_PRICING_ABI 3   /* bump with any change of the blob layout or of these signatures */
#define KV_BLOB_MAGIC 1802924141.0  /* "kvpm" as a number: the blob's first value */

/* kv_step_parts' bitmask of extrapolated tables (points outside a table's grid) */
#define KV_OUT_LINEAR 1
#define KV_OUT_PREFILL 2   /* at least one prefill chunk; *prefill_out says how many */
#define KV_OUT_DECODE 4

typedef struct kv_pricing kv_pricing;

long kv_pricing_abi(void);

/* A model from its blob (copied); NULL if the blob is malformed or memory is short. */
kv_pricing *kv_pricing_new(const double *blob, long len);
void kv_pricing_free(kv_pricing *p);

/* StepLatencyModel._parts_ms, bit for bit: out[0] gemm (L*linear(T) + lm_head(S)), out[1] attention
   (L * (prefill chunks [occupancy] + decode)), out[2] collectives, out[3] host, in ms. Returns a
   bitmask of the tables extrapolated; *prefill_out = prefill chunks outside their table (each is one
   counter.note("prefill_attention")). A step's time is (out[3] + out[0] + out[1] + out[2]) / 1000.0 s.
   Like the Python model it keeps what a step shape and a batch size determine (memos inside *p, the
   same values as computed afresh): price with one kv_pricing per thread. */
int kv_step_parts(const kv_pricing *p, long num_tokens, long num_chunks, const long *chunk_tokens,
                  const long *chunk_context, long num_decode_seqs, long decode_context_tokens,
                  long num_sampled, double out[4], long *prefill_out);

/* The tables and terms one by one, for csrc/spec.c (same arithmetic as kv_step_parts') */
double kv_p_layers(const kv_pricing *p);
double kv_p_linear(const kv_pricing *p, long n);
int kv_p_linear_outside(const kv_pricing *p, long n);
double kv_p_lm_head(const kv_pricing *p, long n);
double kv_p_decode(const kv_pricing *p, long num_seqs, double context);
int kv_p_decode_outside(const kv_pricing *p, long num_seqs, double context);
double kv_p_collectives(const kv_pricing *p, long num_tokens, long num_sampled);
double kv_p_host(const kv_pricing *p, long num_seqs, long num_prefill_tokens);
/* ASYNC: the steps priced next follow an idle engine (1: none of their hidden CPU work is hidden) or
   not (0); the engine sets it around one step's pricing (StepLatencyModel.cold) */
void kv_pricing_set_cold(kv_pricing *p, int cold);
/* ASYNC: the hidden CPU work's excess over a step's GPU ms (HostOverhead.excess_ms; 0 without hidden terms) */
double kv_p_hidden_excess(const kv_pricing *p, long num_seqs, double gpu_ms);
/* a step with p prompt tokens of T priced x 1 + (r - 1) * p / T (StepLatencyModel.prefill_ratio) */
double kv_p_prefill_factor(const kv_pricing *p, long num_prefill_tokens, long num_tokens);
int kv_p_attention(const kv_pricing *p, long num_chunks, const long *chunk_tokens, const long *chunk_context,
                   long num_decode_seqs, long decode_context_tokens, double *ms_out, long *prefill_out);

#endif
