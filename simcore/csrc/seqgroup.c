/* Parallel sampling (n > 1) in the compiled core: simcore/sampling.py's SequenceGroups and the
 * multi-sequence paths of policies/continuous.py (_grow, _swap_in, _preempt, end_step's fork and
 * snapshot), on the paged cache with no block ever cached (blocks are counts, not identities:
 * prefix caching may be on, as vLLM V1's default, where no request declares a shared prefix).
 * engine.c calls these hooks (marked "sg:" there); included at its end (it uses its static
 * helpers). Beam search stays in Python (its parents are drawn from numpy's Generator).
 *
 * A request of width k prefills one sequence; when the step that completes its prompt ends and
 * it is not finished, it forks into k sequences sharing every block (ref k). Each sequence then
 * appends one token a step, in lock step, so a forked group is two counts: `gsh` blocks shared
 * by all k sequences and `gown` blocks of each sequence's own (blocks_for(ntok) = gsh + gown):
 *
 *   fork            [ S shared (the last maybe partly filled) ]              gsh = P, gown = 0
 *   first decode    last block partly filled: the first k - 1 copy it on write, the last
 *                   sequence writes it in place (its ref count is 1 by then): gsh = P - 1,
 *                   gown = 1, k - 1 blocks taken; full: each takes a new one, k taken
 *   later           each sequence's own last block, a new one each when they are full
 *
 * PagedAllocator's counts follow: used blocks gsh + k * gown, written slots k * ntok (a shared
 * block counted per sequence), distinct blocks copied by a swap gsh + k * gown. */

/* the widths of the chunk just fed (kv_engine_feed): one per request, 1 for one sequence */
int kv_engine_feed_widths(kv_engine *S, long n, const long *widths) {
    free(S->in_w);
    S->in_w = NULL;
    if (n <= 0 || !widths) return 0;
    S->in_w = malloc(sizeof(long) * (size_t)n);
    if (!S->in_w) return KV_NOMEM;
    memcpy(S->in_w, widths, sizeof(long) * (size_t)n);
    return 0;
}

/* ContinuousPagedPolicy.check for k > 1: the group must fit a step and the cache at its longest
   (SequenceGroups.num_blocks_for); no V0 watermark for groups. 0: admissible */
static long sg_check(const kv_rep *e, const kv_req *r) {
    /* ms: vLLM 0.6's multi-step rounds run one sequence per request (VllmV0PagedPolicy.check
       refuses the group; the reason's text is the Python engine's, fastcore._reason) */
    if (e->c.num_scheduler_steps > 1) return KV_REJECT_BUDGET;
    long k = r->k, cap = e->c.max_num_seqs < e->c.max_num_batched_tokens ? e->c.max_num_seqs
                                                                          : e->c.max_num_batched_tokens;
    if (k > cap) return KV_REJECT_BUDGET;
    long p = blocks_for(e, r->prompt);
    if (p + k * (blocks_for(e, r->prompt + r->target - 1) - p + 1) > e->c.num_gpu_blocks) return KV_REJECT_CACHE;
    return KV_REJECT_NONE;
}

/* plan_add's part for a forked group: one token per sequence, each attending to computed + 1 */
static void sg_plan_decode(kv_rep *e, const kv_req *r) {
    e->num_tokens += r->k; e->num_decode_seqs += r->k;
    e->decode_ctx += r->k * (r->computed + 1); e->num_sampled += r->k;
}

/* a width > 1 request whose step emits a token (_emitting_groups) */
static int sg_emitting(kv_rep *e, long s) {
    if (e->sg_nemit == e->sg_emit_cap) {
        long nc = e->sg_emit_cap ? 2 * e->sg_emit_cap : 64;
        long *p = realloc(e->sg_emit, sizeof(long) * (size_t)nc);
        if (!p) return KV_NOMEM;
        e->sg_emit = p; e->sg_emit_cap = nc;
    }
    e->sg_emit[e->sg_nemit++] = s;
    return 0;
}

static long sg_distinct(const kv_req *r) { return r->gsh + r->k * r->gown; }

/* `d` more free GPU blocks (fewer if negative); with prefix caching on (fastcore lets groups
   run only where no block is ever cached) every free block is an uncached one */
static void sg_free(kv_rep *e, long d) {
    e->free_blocks += d;
    if (e->pc) e->uncached_free += d;
}

/* ContinuousPagedPolicy._grow of a forked group: one slot for each sequence, all or nothing
   (the free-block check counts a copy for every sequence on a shared partly filled last block,
   as num_blocks_needed does before any of them copied) */
static int sg_grow(kv_rep *e, kv_req *r) {
    long bs = e->c.block_size, k = r->k, partial = r->ntok % bs != 0;
    long need = (r->gown == 0 || !partial) ? k : 0;
    if (need > e->free_blocks) return 0;
    if (r->gown == 0) {  /* the shared last block: copied on write, or a new block each */
        if (partial) { sg_free(e, -(k - 1)); r->gsh -= 1; }
        else sg_free(e, -k);
        r->gown = 1;
    } else if (!partial) {
        sg_free(e, -k); r->gown += 1;
    }
    r->ntok += 1; e->gpu_tokens += k;
    r->nblk = r->gsh + r->gown;
    return 1;
}

/* SequenceGroups.release (finish or recompute preemption) */
static void sg_release(kv_rep *e, kv_req *r) {
    sg_free(e, sg_distinct(r)); e->gpu_tokens -= r->k * r->ntok;
    e->sg_extra -= r->k - 1; e->sg_forked--;
    r->forked = 0; r->gsh = r->gown = 0; r->nblk = 0; r->ntok = 0;
}

/* swap out a forked group if the CPU pool holds its distinct blocks; 1 if it did */
static int sg_swap_out(kv_rep *e, kv_req *r) {
    long d = sg_distinct(r);
    if (!e->c.swap || d > e->cpu_free) return 0;
    sg_free(e, d); e->cpu_free -= d; e->gpu_tokens -= r->k * r->ntok;
    e->num_swap_blocks += d;
    e->sg_extra -= r->k - 1;  /* a swapped group runs no sequence (SequenceGroups.num_extra_seqs) */
    return 1;
}

/* _swap_in of a forked group at the head of the swapped queue: its blocks plus a new or copied
   block per sequence must be free (at most the cache when nothing runs); -1: it does not fit */
static long sg_swap_in(kv_rep *e, kv_req *r, long n, long budget) {
    long d = sg_distinct(r), need = d + 2 * r->k;
    if (!n && need > e->c.num_gpu_blocks) need = e->c.num_gpu_blocks;
    if (e->free_blocks < need || r->k > budget || n + e->sg_extra + r->k > e->c.max_num_seqs) return -1;
    e->cpu_free += d; sg_free(e, -d); e->gpu_tokens += r->k * r->ntok;
    e->num_swap_blocks += d; e->sg_extra += r->k - 1;
    sg_grow(e, r);  /* checked: it fits */
    return r->k;
}

/* end_step: the groups whose prompt completed fork unless finished; then the snapshot's unfilled
   slots and shared slots (SequenceGroups.internal_and_saved, plus the one-sequence running
   requests' last blocks) while any group is forked */
static void sg_end(kv_rep *e, long *internal) {
    for (long j = 0; j < e->sg_nemit; j++) {
        kv_req *r = &e->reqs[e->sg_emit[j]];
        if (r->generated >= r->target || r->forked) continue;
        r->forked = 1; r->gsh = r->nblk; r->gown = 0;
        e->gpu_tokens += (r->k - 1) * r->ntok;
        e->sg_extra += r->k - 1; e->sg_forked++;
    }
    e->sg_saved = 0;
    if (!e->sg_forked) return;
    long bs = e->c.block_size, in = 0, saved = 0;
    for (long j = 0; j < e->run_len; j++) {  /* the swapped hold no GPU blocks */
        const kv_req *r = &e->reqs[e->run[j]];
        long res = (bs - r->computed % bs) % bs;
        if (!r->forked) { in += res; continue; }
        in += (r->gown ? r->k : 1) * res;
        saved += (r->k - 1) * r->gsh * bs;
    }
    *internal = in;
    e->sg_saved = saved;
}
