"""Speculative decoding: the `--speculative-config` vLLM takes, what a draft costs in memory,
and how many draft tokens the target accepts.

    {"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3-Instruct-70B", "num_speculative_tokens": 3}

vLLM's keys (`vllm/config/speculative.py`): `method` (draft_model | ngram | eagle | eagle3 |
mtp), `model` (the draft checkpoint), `num_speculative_tokens` (k), `draft_tensor_parallel_size`.
kvsim adds what vLLM measures at run time and a simulator must be told: `acceptance_rate` (the
probability that draft token i is accepted given that tokens 1..i-1 were) or `acceptance_rates`
(one such conditional rate per draft position), and `dataset` (which published measurement the
default comes from). A step of k draft tokens then emits `a + 1` tokens, a accepted drafts plus
the target's own (corrected or bonus) token:

    P(a >= i) = r_1 * ... * r_i,   mean acceptance length  E[a] + 1 = 1 + sum_i P(a >= i)

(Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", ICML 2023, eq. 1,
for a constant rate; vLLM reports the same "mean acceptance length" = 1 + accepted / drafts,
`vllm/v1/spec_decode/metrics.py`).

Defaults: one published (acceptance length, k) per method, turned into the constant rate r that
gives that length at that k under the formula above (`rate_for_length`). Nothing is fitted to a
speed-up; the lengths are what vLLM (or the model's authors) measured:

  eagle   MT-Bench, Llama-3-8B-Instruct + lmsys/sglang-EAGLE-LLaMA3-Instruct-8B, k=4: length 2.08 (vLLM V1, bs 1;
          github.com/vllm-project/vllm/pull/16035, benchmark comment of 2025-04-09)
  eagle3  MT-Bench, Llama-3.1-8B-Instruct + EAGLE3 head, k=7, temperature 0: length 3.53
          (12,208 accepted / 4,816 drafts; github.com/vllm-project/vllm/issues/26191)
  ngram   code editing (vdaita/edit_5k_char), Llama-3.1-8B, k=5, prompt lookup 2..5: length 2.96
          per step, steps without a match included ("seq normalized"; github.com/vllm-project/
          vllm/pull/24344). Chat prompts repeat little: give your own rate for those.
  mtp     DeepSeek-V3's one MTP module, k=1: "the acceptance rate of the second token prediction
          ranges between 85% and 90%" (DeepSeek-V3 Technical Report, arXiv 2412.19437, sec.
          5.4.3); the lower end, 0.85.
  draft_model  none: acceptance depends on the pair of models; give acceptance_rate(s).

`mtp` drafts with the target checkpoint's own multi-token-prediction modules: vLLM loads the
target's checkpoint as the draft and maps only model types that carry MTP layers to an MTP
architecture (n_predict = `num_nextn_predict_layers`); any other model ends in "Unsupported
speculative method" (vllm/config/speculative.py at 002e77c1, SpeculativeConfig.__post_init__ and
hf_config_override). A model without them (ModelSpec.num_nextn_predict_layers == 0) is refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import kvsim.simcore.userjson as userjson
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.specs import ModelSpec

# Published configurations draft at most 7-10 tokens (EAGLE-3 k=7, MTP k=1-3); a position's chance to be
# reached is the product of the rates before it (0.9**64 ~ 0.1%), so beyond 64 drafts only add cost. The
# bound also keeps a step's sequential draft passes finite (k = 100,000 would run for hours).
MAX_SPECULATIVE_TOKENS = 64
METHODS = ("draft_model", "ngram", "eagle", "eagle3", "mtp")
HEAD_METHODS = ("eagle", "eagle3", "mtp")  # a small head on the target's hidden states
KEYS = ("method", "model", "num_speculative_tokens", "draft_tensor_parallel_size",
        "acceptance_rate", "acceptance_rates", "dataset")
# vLLM keys that change what is proposed or accepted, which kvsim takes from the acceptance rates
# instead: refused with that said, never silently ignored
UNMODELLED_VLLM_KEYS = ("prompt_lookup_max", "prompt_lookup_min", "disable_padded_drafter_batch", "max_model_len",
                        "quantization", "revision", "code_revision", "draft_sample_method",
                        "rejection_sample_method", "speculative_token_tree", "disable_by_batch_size",
                        "parallel_drafting", "enforce_eager")

# method -> dataset -> (published mean acceptance length, the k it was measured at, source)
PUBLISHED_LENGTHS: dict[str, dict[str, tuple[float, int, str]]] = {
    "eagle": {"mt-bench": (2.08, 4, "vLLM PR 16035: Llama-3-8B-Instruct + EAGLE, MT-Bench, k=4")},
    "eagle3": {"mt-bench": (3.53, 7, "vLLM issue 26191: Llama-3.1-8B-Instruct + EAGLE3, MT-Bench, k=7, T=0")},
    "ngram": {"code-edit": (2.96, 5, "vLLM PR 24344: Llama-3.1-8B, edit_5k_char, k=5, lookup 2..5")},
    "mtp": {"deepseek-v3": (1.85, 1, "DeepSeek-V3 report sec. 5.4.3: 2nd-token acceptance 85-90% (k=1)")},
}

# EAGLE's head: one decoder layer plus an fc layer that maps [token embedding; hidden state]
# (2h) to h (Li et al., "EAGLE", ICML 2024, sec. 4.1); EAGLE-3 fuses three hidden states (3h -> h)
# and has its own LM head over a 32,000-token draft vocabulary (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B
# config.json, draft_vocab_size); DeepSeek-V3's MTP module is one transformer block plus a 2h -> h
# projection (DeepSeek-V3 report, sec. 2.2). All share the target's embedding (and, but for
# EAGLE-3, its LM head), as vLLM loads them (vllm/v1/spec_decode/eagle.py, load_model).
HEAD_FC_INPUTS = {"eagle": 2, "eagle3": 3, "mtp": 2}
EAGLE3_DRAFT_VOCAB = 32000

# n-gram lookup runs on the host: vLLM's Numba KMP matcher took 1.9 s in all for a 5,000-request
# ShareGPT run (github.com/vllm-project/vllm/pull/13365), ~1e6 generated tokens at ShareGPT's
# ~200 output tokens per request: ~2 us per sequence per step.
NGRAM_HOST_MS_PER_SEQ = 0.002


def rate_for_length(length: float, k: int) -> float:
    """The constant conditional rate r with 1 + r + ... + r^k == length (bisection)."""
    if not 1.0 <= length <= k + 1:
        raise ValueError(f"an acceptance length of {length} is impossible with k={k}")
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(k + 1)) < length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """vLLM's speculative config plus the acceptance behaviour kvsim samples from."""

    method: str
    num_speculative_tokens: int  # k draft tokens per step and sequence
    model: str | None = None  # the draft checkpoint (draft_model: a catalog name or config.json)
    draft_tensor_parallel_size: int | None = None  # None: the target's TP
    acceptance_rate: float | None = None  # constant conditional rate
    acceptance_rates: tuple[float, ...] | None = None  # conditional rate per draft position
    dataset: str | None = None  # which published default (None: the method's own)
    rates: tuple[float, ...] = field(default=(), compare=False)  # resolved: k conditional rates
    source: str = field(default="", compare=False)  # where the rates come from

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if self.method not in METHODS:
            raise ConfigError(f"--speculative-config: method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"--speculative-config: num_speculative_tokens must be an integer from 1 to "
                              f"{MAX_SPECULATIVE_TOKENS}, got {k!r}")
        if self.method == "draft_model" and not self.model:
            raise ConfigError("--speculative-config: method draft_model needs \"model\" (a catalog model or a config.json)")
        tp = self.draft_tensor_parallel_size
        if tp is not None and (not isinstance(tp, int) or isinstance(tp, bool) or tp < 1):
            raise ConfigError(f"--speculative-config: draft_tensor_parallel_size must be an integer >= 1, got {tp!r}")
        if self.acceptance_rate is not None and self.acceptance_rates is not None:
            raise ConfigError("--speculative-config: give acceptance_rate or acceptance_rates, not both")
        rates, source = self._resolve_rates()
        object.__setattr__(self, "rates", rates)
        object.__setattr__(self, "source", source)

    def _resolve_rates(self) -> tuple[tuple[float, ...], str]:
        k = self.num_speculative_tokens
        if self.acceptance_rate is not None:
            if self.dataset is not None:
                raise ConfigError("--speculative-config: \"dataset\" picks a published default; not with acceptance_rate")
            return (_rate(self.acceptance_rate, "acceptance_rate"),) * k, "acceptance_rate (given)"
        if self.acceptance_rates is not None:
            if self.dataset is not None:
                raise ConfigError("--speculative-config: \"dataset\" picks a published default; not with acceptance_rates")
            if len(self.acceptance_rates) != k:
                raise ConfigError(f"--speculative-config: acceptance_rates has {len(self.acceptance_rates)} "
                                  f"entries; num_speculative_tokens is {k}")
            return tuple(_rate(r, "acceptance_rates") for r in self.acceptance_rates), "acceptance_rates (given)"
        published = PUBLISHED_LENGTHS.get(self.method)
        if not published:
            raise ConfigError(f"--speculative-config: no published acceptance for method {self.method} "
                              "(it depends on the pair of models); give \"acceptance_rate\" or \"acceptance_rates\"")
        dataset = self.dataset if self.dataset is not None else next(iter(published))
        if dataset not in published:
            raise ConfigError(f"--speculative-config: no published acceptance for {self.method} on {dataset!r}; "
                              f"known: {', '.join(published)} (or give acceptance_rate)")
        length, at_k, where = published[dataset]
        rate = rate_for_length(length, at_k)
        return (rate,) * k, f"{where}: length {length:g} at k={at_k} -> rate {rate:.4f}"

    @property
    def label(self) -> str:
        """Short text for tables: method, k and the acceptance it runs with."""
        rates = self.rates
        acc = f"r={rates[0]:.2f}" if len(set(rates)) == 1 else "r=" + "/".join(f"{r:.2f}" for r in rates)
        model = f" {self.model}" if self.method == "draft_model" else ""
        return f"{self.method}{model} k={self.num_speculative_tokens} {acc}"

    def __str__(self) -> str:
        return self.label

    @property
    def is_head(self) -> bool:
        return self.method in HEAD_METHODS

    def mean_acceptance_length(self, k: int | None = None) -> float:
        """Expected tokens per verify step with `k` drafts (default: all of them)."""
        k = self.num_speculative_tokens if k is None else k
        total, alive = 1.0, 1.0
        for r in self.rates[:k]:
            alive *= r
            total += alive
        return total

    def sample_accepted(self, rng: np.random.Generator, num_drafts: np.ndarray) -> np.ndarray:
        """Accepted drafts per sequence: the leading run of accepted positions among each
        sequence's `num_drafts` (one uniform draw per position, so the stream is the same
        whatever the drafts turn out to be)."""
        k = self.num_speculative_tokens
        draws = rng.random((len(num_drafts), k))
        run = np.cumprod(draws < np.asarray(self.rates), axis=1).sum(axis=1)
        return np.minimum(run, num_drafts)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        for name in ("model", "draft_tensor_parallel_size", "acceptance_rate", "dataset"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        if self.acceptance_rates is not None:
            d["acceptance_rates"] = list(self.acceptance_rates)
        d["resolved_rates"] = list(self.rates)
        d["acceptance_source"] = self.source
        d["mean_acceptance_length"] = self.mean_acceptance_length()
        return d

    # -- the draft's memory ------------------------------------------------------------
    def draft_model_spec(self) -> ModelSpec:
        """The draft model's shape (draft_model only)."""
        from kvsim.simcore.catalog import get_model

        assert self.method == "draft_model"
        return get_model(self.model)

    def head_layers(self, target: ModelSpec) -> float:
        """A head's cost in target decoder layers: one layer plus its fc (n*h x h) as a share
        of a layer's linear weights."""
        fc = HEAD_FC_INPUTS[self.method] * target.hidden_size * target.hidden_size
        return 1.0 + fc / target.linear_params_per_layer

    def draft_tp(self, target_tp: int) -> int:
        return self.draft_tensor_parallel_size or target_tp

    def weight_bytes_per_gpu(self, target: ModelSpec, tp: int) -> int:
        """Draft weights on each GPU of the target's TP group."""
        if self.method == "ngram":
            return 0
        if self.method == "draft_model":
            return self.draft_model_spec().weight_bytes // self.draft_tp(tp)
        h = target.hidden_size
        fc = HEAD_FC_INPUTS[self.method] * h * h * target.dtype_bytes
        head = target.layer_weight_bytes + fc
        if self.method == "eagle3":
            head += EAGLE3_DRAFT_VOCAB * h * target.dtype_bytes
        return head // tp

    def kv_bytes_per_token(self, target: ModelSpec, tp: int) -> int:
        """Draft KV per token on each GPU: vLLM V1 puts the draft's layers in the same KV cache
        as the target's (one block table), so every block also holds them."""
        if self.method == "ngram":
            return 0
        if self.method == "draft_model":
            return self.draft_model_spec().kv_bytes_per_token(self.draft_tp(tp))
        return target.kv_bytes_per_token(tp, num_layers=1)

    def check_model(self, target: ModelSpec) -> None:
        """The method must be one `target` can use: mtp needs the model's own MTP layers."""
        if self.method == "mtp" and not target.num_nextn_predict_layers:
            usable = ", ".join(m for m in METHODS if m != "mtp")
            raise ConfigError(f"--speculative-config: method mtp drafts with the model's own multi-token-prediction "
                              f"layers (DeepSeek-V3's num_nextn_predict_layers), and {target.name} has no "
                              f"multi-token-prediction layers; methods it can use: {usable} (eagle / eagle3 with a "
                              "head trained for it)")

    def check_with(self, target: ModelSpec, tp: int, pp: int) -> None:
        """Cross-checks with the model and the deployment (ConfigError naming what to change)."""
        self.check_model(target)
        if pp > 1:
            # "speculative decoding in vLLM is not compatible with pipeline parallelism" (vLLM docs,
            # features/spec_decode)
            raise ConfigError("--speculative-config does not work with --pp > 1 (vLLM: speculative decoding "
                              "is not compatible with pipeline parallelism)")
        dtp = self.draft_tensor_parallel_size
        if self.method == "draft_model":
            draft = self.draft_model_spec()
            if draft.vocab_size != target.vocab_size:
                raise ConfigError(f"--speculative-config: draft model {draft.name} has a vocabulary of "
                                  f"{draft.vocab_size:,} tokens, {target.name} {target.vocab_size:,}; they must share it")
            if dtp is not None and dtp not in (1, tp):
                raise ConfigError(f"--speculative-config: draft_tensor_parallel_size must be 1 or the target's TP ({tp})")
            if draft.num_attention_heads % self.draft_tp(tp):
                raise ConfigError(f"--speculative-config: draft TP {self.draft_tp(tp)} must divide {draft.name}'s "
                                  f"{draft.num_attention_heads} attention heads")
        elif dtp is not None and dtp != tp:
            raise ConfigError(f"--speculative-config: kvsim prices a {self.method} head at the target's TP ({tp}); "
                              "draft_tensor_parallel_size must be left out or equal it")


def _rate(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= 1:
        what = "numbers" if name == "acceptance_rates" else "a number"
        raise ConfigError(f"--speculative-config: {name} must be {what} in [0, 1], got {value!r}")
    return float(value)


def _json(text: str, flag: str) -> Any:
    """The flag's JSON, strictly (simcore.userjson: a repeated key, nesting too deep for the parser
    or an integer of thousands of digits is a ConfigError, not a traceback)."""
    try:
        return userjson.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag} is not valid JSON ({exc.msg} at character {exc.pos})") from None
    except ValueError as exc:
        raise ConfigError(f"{flag} is not valid JSON ({exc})") from None


def parse_speculative_configs(text: str, flag: str = "--speculative-config") -> list[SpeculativeConfig | None]:
    """A sweep or plan dimension: one JSON object, or a JSON list of objects where null (or
    "off") is a run without speculation, e.g. '[null, {"method": "eagle", "num_speculative_tokens": 3}]'."""
    stripped = text.strip()
    if not stripped.startswith("["):
        return [parse_speculative_config(text)]
    items = _json(stripped, flag)
    if not items:
        raise ConfigError(f"{flag}: the list is empty; give configs, or null for no speculation")
    out: list[SpeculativeConfig | None] = []
    for item in items:
        config = None if item is None or (isinstance(item, str) and item.lower() in ("off", "none")) \
            else parse_speculative_config(item)
        if config in out:
            raise ConfigError(f"{flag}: {config.label if config else 'off'} is listed twice")
        out.append(config)
    return out


def parse_speculative_config(value: str | dict | None) -> SpeculativeConfig | None:
    """`--speculative-config` as JSON text (or an already parsed dict), as vLLM takes it."""
    if value is None:
        return None
    if isinstance(value, str):
        value = _json(value, "--speculative-config")
    if not isinstance(value, dict):
        raise ConfigError("--speculative-config must be a JSON object, e.g. "
                          "'{\"method\": \"eagle\", \"num_speculative_tokens\": 3}'")
    unknown = sorted(set(value) - set(KEYS))
    vllm_only = [key for key in unknown if key in UNMODELLED_VLLM_KEYS]
    if vllm_only:
        raise ConfigError(f"--speculative-config: {vllm_only[0]!r} is a vLLM key kvsim does not model (what is "
                          "proposed and accepted comes from acceptance_rate / acceptance_rates); leave it out")
    if unknown:
        raise ConfigError(f"--speculative-config: unknown key {unknown[0]!r}; kvsim reads {', '.join(KEYS)}")
    args = dict(value)
    method = args.get("method")
    if method is None:  # vLLM infers it: "ngram" as the model, else a draft model
        model = args.get("model")
        if model in ("ngram", "[ngram]"):
            args["method"], args["model"] = "ngram", None
        elif model:
            args["method"] = "draft_model"
        else:
            raise ConfigError("--speculative-config needs \"method\" (or a draft \"model\")")
    if "num_speculative_tokens" not in args:
        raise ConfigError("--speculative-config needs \"num_speculative_tokens\"")
    rates = args.get("acceptance_rates")
    if rates is not None:
        if not isinstance(rates, list):
            raise ConfigError("--speculative-config: acceptance_rates must be a list, one rate per draft position")
        args["acceptance_rates"] = tuple(rates)
    for name in ("model", "dataset", "method"):
        if args.get(name) is not None and not isinstance(args[name], str):
            raise ConfigError(f"--speculative-config: {name} must be a string, got {args[name]!r}")
    return SpeculativeConfig(**args)
