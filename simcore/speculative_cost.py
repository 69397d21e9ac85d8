"""What a speculative-decoding step costs: the target's verify pass, then the drafter's k passes
(vLLM V1 runs them in one engine step: target forward, rejection sampling, then the proposer
for the next step; `vllm/v1/worker/gpu_model_runner.py`, `execute_model`).

Target (the verify, as a mixed step): every verifying request is a chunk of 1 + d query tokens
over its computed context, priced with the prefill-attention table in the same varlen launch as
the step's prompt chunks (what vLLM V1's attention backends run for it); plain decodes use the
decode table. GEMMs run over all T query tokens, the LM head over every verified position, and
the host terms are the step's as without speculation.

    target = host + L * (linear(T) + attention + all_reduce(T)) + lm_head(sampled)

Drafter, for the S sequences that sampled a token this step (vLLM's proposers run over the whole
batch), k sequential passes:

    eagle / eagle3 / mtp   a head of h target layers (one decoder layer + its fc,
                           `SpeculativeConfig.head_layers`): pass 1 over the step's T tokens
                           (the head reads every new hidden state), passes 2..k over S tokens
                           (`vllm/v1/spec_decode/eagle.py`, `propose`); each adds the LM head
                           over S and one layer's all-reduce, scaled by h
    draft_model            the draft model's own profile: pass 1 as a mixed step over the same
                           chunks, passes 2..k as decode steps of S sequences (kernels and
                           collectives; its host work is inside the target step's)
    ngram                  host time only, NGRAM_HOST_MS_PER_SEQ per sequence

Not modelled: the EAGLE-3 head's smaller LM head (priced as the target's), CUDA-graph padding of
the draft batch, n-gram steps that find no match (they would draft nothing).
"""

from __future__ import annotations

from kvsim.simcore.latency import StepLatencyModel
from kvsim.simcore.specs import ModelSpec
from kvsim.simcore.speculative import NGRAM_HOST_MS_PER_SEQ, SpeculativeConfig
from kvsim.simcore.step import StepPlan


class SpeculativeStepCost:
    """Prices a speculative engine's steps (every plan with `spec`) and keeps their breakdown:
    the step recorder asks `step_breakdown_ms` right after the step was priced."""

    def __init__(self, latency: StepLatencyModel, spec: SpeculativeConfig, target: ModelSpec,
                 draft: StepLatencyModel | None = None):
        if spec.method == "draft_model" and draft is None:
            raise ValueError("a draft_model config needs the draft model's latency model")
        self.latency = latency
        self.spec = spec
        self._target = target
        self.draft = draft
        self.head_layers = spec.head_layers(target) if spec.is_head else 0.0
        self.verify_ms = 0.0  # target passes (and host), summed over the steps priced
        self.draft_ms = 0.0  # drafter passes, summed
        self._last = (0.0, 0.0, 0.0)  # (kernels, collectives, host) ms of the step just priced

    def load_sums(self, verify_ms: float, draft_ms: float) -> None:
        """The sums of a run another core priced (simcore/fastcore.py), set by their owner."""
        self.verify_ms, self.draft_ms = verify_ms, draft_ms

    def fresh(self) -> SpeculativeStepCost:
        """The same pricer with its own sums and last breakdown (another replica's)."""
        return SpeculativeStepCost(self.latency, self.spec, self._target, self.draft)

    @property
    def extrapolated(self):
        return self.latency.extrapolated

    def step_breakdown_ms(self, *_shape) -> tuple[float, float, float]:
        """(kernels, collectives, host) ms of the step just priced (the recorder's question)."""
        return self._last

    def step_time_s(self, plan: StepPlan) -> float:
        lat, spec = self.latency, plan.spec
        layers = lat.num_layers
        num_verify = len(spec.verify)
        num_tokens = plan.num_tokens + spec.num_draft_tokens
        num_sampled = plan.num_sampled + spec.num_draft_tokens
        chunks = plan.prefill_chunks + spec.verify_chunks
        num_plain = plan.num_decode_seqs - num_verify
        plain_context = plan.decode_context_tokens - spec.verify_context_tokens
        out = False
        if lat.linear.outside(num_tokens):
            lat.extrapolated.note("linear")
            out = True
        attention, att_out = self._attention_ms(lat, chunks, num_plain, plain_context)
        out = out or att_out
        if out:
            lat.extrapolated.steps += 1
        kernels = layers * lat.linear(num_tokens) + lat.lm_head(num_sampled) + layers * attention
        coll = lat.collectives_ms(num_tokens, num_sampled)
        host = lat.host.ms(len(plan.prefill_chunks) + plan.num_decode_seqs, plan.num_tokens - plan.num_decode_seqs)
        r = getattr(lat, "prefill_ratio", 1.0)  # the verify pass's prompt tokens, as StepLatencyModel._parts_ms (1: unscaled)
        if r != 1.0 and plan.num_tokens > plan.num_decode_seqs:
            m = 1.0 + (r - 1.0) * ((plan.num_tokens - plan.num_decode_seqs) / num_tokens)
            kernels, coll, host = kernels * m, coll * m, host * m
        d_kernels, d_coll, d_host = self._draft_ms(spec, num_tokens, chunks, num_plain, plain_context, attention)
        if getattr(lat, "hidden", None) is not None:  # ASYNC: the hidden CPU work's excess over the GPU step
            host = host + lat.excess_ms(len(plan.prefill_chunks) + plan.num_decode_seqs,
                                        kernels + coll + d_kernels + d_coll)  # verify + draft
        self.verify_ms += kernels + coll + host
        self.draft_ms += d_kernels + d_coll + d_host
        self._last = (kernels + d_kernels, coll + d_coll, host + d_host)
        return (kernels + coll + host + d_kernels + d_coll + d_host) / 1000.0

    @staticmethod
    def _attention_ms(lat: StepLatencyModel, chunks: list[tuple[int, int]], num_plain: int,
                      plain_context: int) -> tuple[float, bool]:
        """One layer's attention: the chunks (prompts and verifies) in one varlen launch, plain
        decodes in the paged decode kernel; and whether a table was extrapolated (noted)."""
        ms, out = 0.0, False
        if chunks:
            prefill = lat.prefill
            for chunk, ctx in chunks:
                ms += prefill(chunk, ctx)
                if prefill.outside(chunk, ctx):
                    lat.extrapolated.note("prefill_attention")
                    out = True
            if lat.occupancy is not None:
                ms = lat.occupancy.floor_ms + ms / lat.occupancy.share(chunks)
        if num_plain:
            mean = plain_context / num_plain
            ms += lat.decode(num_plain, mean)
            if lat.decode.outside(num_plain, mean):
                lat.extrapolated.note("decode_attention")
                out = True
        return ms, out

    def _draft_ms(self, spec, num_tokens: int, chunks: list[tuple[int, int]], num_plain: int,
                  plain_context: int, layer_attention_ms: float) -> tuple[float, float, float]:
        """(kernels, collectives, host) ms of the drafter's k passes for this step."""
        num_seqs, k = spec.num_drafting, self.spec.num_speculative_tokens
        if not num_seqs:
            return 0.0, 0.0, 0.0
        method = self.spec.method
        if method == "ngram":
            return 0.0, 0.0, NGRAM_HOST_MS_PER_SEQ * num_seqs
        mean = spec.drafting_context_tokens / num_seqs
        if method == "draft_model":
            d = self.draft
            g, a, c, _ = d.step_parts_ms(num_tokens, chunks, num_plain, plain_context, num_seqs)
            kernels, coll = g + a, c
            for j in range(1, k):
                g, a, c, _ = d.step_parts_ms(num_seqs, [], num_seqs, spec.drafting_context_tokens + j * num_seqs, num_seqs)
                kernels += g + a
                coll += c
            return kernels, coll, 0.0
        lat, h = self.latency, self.head_layers
        kernels = h * lat.linear(num_tokens) + layer_attention_ms + lat.lm_head(num_seqs)
        coll = self._head_collectives_ms(num_tokens, num_seqs)
        for j in range(1, k):
            kernels += h * lat.linear(num_seqs) + lat.decode(num_seqs, mean + j) + lat.lm_head(num_seqs)
            coll += self._head_collectives_ms(num_seqs, num_seqs)
        return kernels, coll, 0.0

    def _head_collectives_ms(self, num_tokens: int, num_sampled: int) -> float:
        """A head pass's TP collectives: h layers' share of the per-layer all-reduces, plus
        the logits gather."""
        lat = self.latency
        layers_only = lat.collectives_ms(num_tokens, 0)
        return layers_only / lat.num_layers * self.head_layers + lat.collectives_ms(num_tokens, num_sampled) - layers_only
