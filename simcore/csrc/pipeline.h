/* Pipeline parallelism in the compiled core (pipeline.c): simcore/pipeline.py's rounds. */
#ifndef KVSIM_PIPELINE_H
#define KVSIM_PIPELINE_H

/* engine.c's: every replica runs `pp` stages of layers[s] layers each; hand-off s crosses nodes
   when crosses[s]; handoff_ms[0 or 1][t]: one hand-off of a micro-batch of t tokens inside a node
   or across nodes (t < max_tokens; PipelineLatency.handoff_ms's values, from Python). Call after
   kv_engine_new, before the first run. 0 or KV_NOMEM */
struct kv_engine;
int kv_engine_pipeline(struct kv_engine *S, long pp, const long *layers, const long *crosses, long max_tokens,
                       const double *intra_ms, const double *inter_ms);

#endif
