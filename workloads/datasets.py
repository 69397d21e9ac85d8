"""`vllm bench serve`'s datasets as kvsim workloads: `--dataset-name random` and `--dataset-name
sharegpt --dataset-path FILE`, so a benchmark command line carries over with its own flags.

random   every prompt and output length drawn uniformly from the integers in
         [floor(L (1 - r)), ceil(L (1 + r))] (output at least 1), L = --random-input-len /
         --random-output-len (vLLM's defaults 1024 and 128), r = --random-range-ratio in [0, 1)
         (default 0: every request the same), as vllm/benchmarks/datasets.py `_get_sampling_params`
         draws them. vLLM also takes the tokenizer's special tokens off the prompt; kvsim has no
         tokenizer and keeps L.
sharegpt the real ShareGPT JSON (a list of {"conversations": [{"from": "human", "value": ...},
         {"from": "gpt", "value": ...}, ...]}), read as vLLM's ShareGPTDataset reads it: entries
         with at least two turns, shuffled by the seed, the first turn the prompt and the second
         the output; a pair is skipped when the prompt or output is under 4 tokens, the prompt
         over 1024 or both over 2048 (vLLM's `is_valid_sequence` defaults); --output-len gives
         every request that output length instead (vLLM's --sharegpt-output-len).

Token counts without a tokenizer (kvsim ships none, and a model's tokenizer is a large download):
`estimate_tokens` counts each CJK / kana / Hangul character as one token and the rest of the text
as one token per 4 characters, OpenAI's rule of thumb for English ("one token generally
corresponds to ~4 characters of text for common English text", help.openai.com, "What are tokens
and how to count them?"); vLLM's own tokenizer-free fallback uses the same 4 characters per token.
Expect +-20% per request against a Llama tokenizer; the mix of lengths is what matters here.

Arrivals follow `vllm bench serve`: every request at t = 0 (its default --request-rate inf)
unless --request-rate (Poisson, or Gamma with --burstiness) or --max-concurrency is given.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from kvsim.simcore.errors import WorkloadError
from kvsim.workloads.arrivals import BatchArrivals
from kvsim.workloads.lengths import Fixed, Uniform
from kvsim.workloads.spec import WorkloadSpec
from kvsim.workloads.traces import Trace

DATASET_NAMES = ("random", "sharegpt")
DEFAULT_NUM_PROMPTS = 1000  # vllm bench serve --num-prompts
RANDOM_INPUT_LEN, RANDOM_OUTPUT_LEN = 1024, 128  # its --random-input-len / --random-output-len defaults
# vLLM's is_valid_sequence defaults (vllm/benchmarks/datasets.py)
MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048
CHARS_PER_TOKEN = 4  # OpenAI's rule of thumb for English text (see the module docstring)
# CJK ideographs, kana, Hangul: roughly one token per character in Llama-family tokenizers
_WIDE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def estimate_tokens(text: str) -> int:
    """Tokens of `text` without a tokenizer: one per CJK/kana/Hangul character, one per 4 other
    characters (rounded up), at least 1."""
    wide = len(_WIDE.findall(text))
    return max(1, wide + math.ceil((len(text) - wide) / CHARS_PER_TOKEN))


def random_dataset(num_prompts: int, input_len: int, output_len: int, range_ratio: float) -> WorkloadSpec:
    """vLLM's `random` dataset: uniform integer lengths around the given ones (module docstring)."""
    for flag, value in (("--random-input-len", input_len), ("--random-output-len", output_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WorkloadError(f"{flag} must be an integer >= 1, got {value}")
    if not (isinstance(range_ratio, (int, float)) and 0.0 <= range_ratio < 1.0):
        raise WorkloadError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")

    def dist(length: int, low_at_least: int) -> Fixed | Uniform:
        low = max(low_at_least, math.floor(length * (1 - range_ratio)))
        high = math.ceil(length * (1 + range_ratio))
        return Fixed(length) if low == high == length else Uniform(low, high)

    return WorkloadSpec(
        name="random", num_requests=num_prompts, arrival=BatchArrivals(),
        prompt_len=dist(input_len, 1), output_len=dist(output_len, 1),
        description=f"vllm bench serve --dataset-name random: input {input_len}, output {output_len}, "
                    f"range ratio {range_ratio:g}", source="random",
    )


def sharegpt_dataset(path: str | Path, num_prompts: int, seed: int, output_len: int | None = None) -> WorkloadSpec:
    """vLLM's `sharegpt` dataset from a ShareGPT JSON file (module docstring)."""
    path = Path(path).expanduser()
    pairs = _read_pairs(path)
    order = np.random.default_rng(seed).permutation(len(pairs))
    prompts: list[int] = []
    outputs: list[int] = []
    for index in order.tolist():
        prompt, completion = pairs[index]
        p = estimate_tokens(prompt)
        o = output_len if output_len is not None else estimate_tokens(completion)
        if p < MIN_LEN or (output_len is None and o < MIN_LEN) or p > MAX_PROMPT_LEN or p + o > MAX_TOTAL_LEN:
            continue
        prompts.append(p)
        outputs.append(o)
        if len(prompts) == num_prompts:
            break
    if len(prompts) < num_prompts:
        raise WorkloadError(
            f"--dataset-path {path}: only {len(prompts)} of its {len(pairs)} conversations are usable "
            f"(prompt {MIN_LEN}-{MAX_PROMPT_LEN} tokens, output >= {MIN_LEN}, both <= {MAX_TOTAL_LEN}), "
            f"fewer than --num-prompts {num_prompts}"
        )
    n = len(prompts)
    trace = Trace(source=str(path), format="sharegpt", arrival_s=np.zeros(n),
                  num_prompt_tokens=np.asarray(prompts, dtype=np.int64),
                  num_output_tokens=np.asarray(outputs, dtype=np.int64))
    return WorkloadSpec(
        name="sharegpt", num_requests=n, arrival=BatchArrivals(), trace=trace,
        description=f"vllm bench serve --dataset-name sharegpt: {path.name}, shuffled with seed {seed}, "
                    f"lengths estimated at {CHARS_PER_TOKEN} characters per token",
        source=str(path),
    )


def _read_pairs(path: Path) -> list[tuple[str, str]]:
    """(first turn, second turn) of every entry with at least two turns; errors name the file."""
    from kvsim.simcore.userfiles import is_special, read_text

    if is_special(path):  # a FIFO or /dev/zero: it exists, and is no file to read
        raise WorkloadError(f"--dataset-path {path}: not a regular file")
    if not path.is_file():
        raise WorkloadError(f"--dataset-path {path}: no such file")
    try:
        data = json.loads(read_text(path, "dataset", encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WorkloadError(f"--dataset-path {path}: not a readable JSON file ({str(exc).splitlines()[0][:200]})") from None
    if not isinstance(data, list):
        raise WorkloadError(f"--dataset-path {path}: expected a JSON list of {{\"conversations\": [...]}} entries "
                            f"(the ShareGPT format), got a {type(data).__name__}")
    pairs = []
    for i, entry in enumerate(data):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            raise WorkloadError(f"--dataset-path {path}: entry {i} has no \"conversations\" list (the ShareGPT format)")
        if len(turns) < 2:
            continue
        values = []
        for j in (0, 1):
            turn = turns[j]
            value = turn.get("value") if isinstance(turn, dict) else None
            if not isinstance(value, str):
                raise WorkloadError(f"--dataset-path {path}: entry {i}, turn {j} has no text \"value\"")
            values.append(value)
        pairs.append((values[0], values[1]))
    if not pairs:
        raise WorkloadError(f"--dataset-path {path}: no entry has two turns (a prompt and a reply)")
    return pairs
