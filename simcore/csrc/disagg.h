/* Disaggregated prefill/decode in the compiled core (disagg.c): a prefill pool and a decode pool
 * of replicas, each pool with its own configuration and step prices, behind the proxy and KV links
 * of simcore/disagg.py (DisaggProxy, KvLink), with the same decisions, timestamps and prices.
 * Driven by simcore/fastcore_disagg.py. */
#ifndef KVSIM_DISAGG_H
#define KVSIM_DISAGG_H

#include "engine.h"

typedef struct {
    long num_prefill, num_decode;          /* instances: replicas 0.. are prefill, then decode */
    long prefill_router, decode_router;    /* KV_ROUTER_*, or (prefill) KV_ROUTER_PREFIX_AWARE */
    long bytes_per_token;                  /* KV bytes one prompt token moves */
    double link_latency_s, link_bytes_per_s;  /* one decode instance's ingress (LinkSpec) */
} kv_disagg_config;

enum { KV_ROUTER_PREFIX_AWARE = 2 };  /* the prefill pool's: disagg._pick_by_prefix */

#define KV_DG_LOG_ROW 8  /* request_id, prefill_instance, decode_instance, num_tokens, nbytes,
                            prefilled_s, start_s, end_s (simcore.disagg.TransferLog), in log order */

/* `prefill` / `decode`: each pool's configuration (num_replicas ignored: the counts above) */
kv_engine *kv_disagg_new(const kv_engine_config *prefill, const kv_pricing *prefill_pricing,
                         const kv_engine_config *decode, const kv_pricing *decode_pricing,
                         const kv_disagg_config *dc);
/* The prefill pool's arrival stamps not taken yet (to `out` if not NULL, then forgotten);
   returns their number. A prefill row's arrivals-so-far (KV_REQ_ROW's last) counts these. */
long kv_disagg_stamps(kv_engine *S, double *out);
/* The transfer log's rows so far (to `rows` if not NULL); returns their number. */
long kv_disagg_log(const kv_engine *S, double *rows);
/* The prefill pool's extrapolation counts (kv_outputs.extrap's: the decode pool's there);
   out[4] = the most transfers one link carried at once */
void kv_disagg_counts(const kv_engine *S, long *out);

#endif
