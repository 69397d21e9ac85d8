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
sonnet   poem lines from a text file (--dataset-path; kvsim ships seven of Shakespeare's sonnets,
         public domain, workloads/data/sonnet.txt, used without one), as vLLM's SonnetDataset
         (vllm/benchmarks/datasets.py, `vllm bench serve --dataset-name sonnet`) builds its
         prompts: "Pick as many lines as you can from these poem lines:\n", then the file's first
         lines up to --sonnet-prefix-len tokens (the same in every request), then lines drawn at
         random (with replacement) up to --sonnet-input-len tokens; a draw longer than that is
         drawn again; every output --sonnet-output-len tokens (defaults 550 / 150 / 200, vLLM's).
         The common head is a real shared prefix (one prefix id), so prefix caching reuses it
         as vLLM's does. vLLM counts its chat template's tokens into the prompt; kvsim has no
         tokenizer or template, and counts the text alone.

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

DATASET_NAMES = ("random", "sharegpt", "sonnet")
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


# vllm bench serve's --sonnet-input-len / --sonnet-output-len / --sonnet-prefix-len defaults
# (SonnetDataset.DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, DEFAULT_PREFIX_LEN in vllm/benchmarks/datasets.py)
SONNET_INPUT_LEN, SONNET_OUTPUT_LEN, SONNET_PREFIX_LEN = 550, 150, 200
SONNET_BASE_PROMPT = "Pick as many lines as you can from these poem lines:\n"  # vLLM's, word for word
SONNET_FILE = Path(__file__).resolve().parent / "data" / "sonnet.txt"
MAX_SONNET_DRAWS = 100  # draws per prompt before giving up (each is kept with probability ~1/2)


def sonnet_dataset(path: str | Path | None, num_prompts: int, seed: int, input_len: int = SONNET_INPUT_LEN,
                   output_len: int = SONNET_OUTPUT_LEN, prefix_len: int = SONNET_PREFIX_LEN) -> WorkloadSpec:
    """vLLM's `sonnet` dataset (module docstring): prompts of poem lines behind a shared head."""
    for flag, value, least in (("--sonnet-input-len", input_len, 1), ("--sonnet-output-len", output_len, 1),
                               ("--sonnet-prefix-len", prefix_len, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise WorkloadError(f"{flag} must be an integer >= {least}, got {value}")
    if prefix_len > input_len:
        raise WorkloadError(f"--sonnet-prefix-len {prefix_len} must be at most --sonnet-input-len {input_len}")
    path = SONNET_FILE if path is None else Path(path).expanduser()
    lines = _read_lines(path)
    chars = np.array([len(line) for line in lines], dtype=np.int64)
    wide = np.array([len(_WIDE.findall(line)) for line in lines], dtype=np.int64)
    avg_len = float(np.mean([estimate_tokens(line) for line in lines]))
    base_offset = estimate_tokens(SONNET_BASE_PROMPT)
    if input_len <= base_offset:
        raise WorkloadError(f"--sonnet-input-len must be higher than the base prompt's length ({base_offset} tokens)")
    num_input_lines = round((input_len - base_offset) / avg_len)
    num_prefix_lines = max(round((prefix_len - base_offset) / avg_len), 0)
    head = slice(0, num_prefix_lines)  # the file's first lines, as vLLM's self.data[:num_prefix_lines]
    base_chars, base_wide = len(SONNET_BASE_PROMPT), len(_WIDE.findall(SONNET_BASE_PROMPT))
    head_chars, head_wide = base_chars + int(chars[head].sum()), base_wide + int(wide[head].sum())
    head_tokens = head_wide + math.ceil((head_chars - head_wide) / CHARS_PER_TOKEN)
    k = max(num_input_lines - min(num_prefix_lines, len(lines)), 0)
    rng = np.random.default_rng(seed)
    prompts: list[int] = []
    for _ in range(MAX_SONNET_DRAWS * num_prompts):
        picked = rng.integers(0, len(lines), size=k)
        c, w = head_chars + int(chars[picked].sum()), head_wide + int(wide[picked].sum())
        tokens = w + math.ceil((c - w) / CHARS_PER_TOKEN)  # estimate_tokens of the whole prompt's text
        if tokens <= input_len:
            prompts.append(tokens)
            if len(prompts) == num_prompts:
                break
    if len(prompts) < num_prompts:
        raise WorkloadError(f"--dataset-path {path}: no prompt of at most --sonnet-input-len {input_len} tokens "
                            f"came from {MAX_SONNET_DRAWS * num_prompts:,} draws (its lines average "
                            f"{avg_len:.1f} tokens; the shared head alone is {head_tokens})")
    n = len(prompts)
    prompt_arr = np.asarray(prompts, dtype=np.int64)
    trace = Trace(source=str(path), format="sonnet", arrival_s=np.zeros(n), num_prompt_tokens=prompt_arr,
                  num_output_tokens=np.full(n, output_len, dtype=np.int64),
                  extras={"prefix_id": np.zeros(n, dtype=np.int64),
                          "num_prefix_tokens": np.minimum(head_tokens, prompt_arr)})
    return WorkloadSpec(
        name="sonnet", num_requests=n, arrival=BatchArrivals(), trace=trace,
        description=f"vllm bench serve --dataset-name sonnet: {path.name}, input {input_len}, output {output_len}, "
                    f"prefix {prefix_len} ({head_tokens} tokens shared by every prompt), seed {seed}, lengths "
                    f"estimated at {CHARS_PER_TOKEN} characters per token",
        source=str(path),
    )


def _read_lines(path: Path) -> list[str]:
    """The file's lines (newlines kept, as Python's readlines), at least one with text."""
    from kvsim.simcore.userfiles import is_special, read_text

    if is_special(path):
        raise WorkloadError(f"--dataset-path {path}: not a regular file")
    if not path.is_file():
        raise WorkloadError(f"--dataset-path {path}: no such file")
    try:
        text = read_text(path, "dataset", encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise WorkloadError(f"--dataset-path {path}: not a readable text file ({str(exc).splitlines()[0][:200]})") from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as readlines reads them
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]  # the text after the last newline (none when the file ends with one)
    lines = lines if lines[-1] else lines[:-1]
    if not any(line.strip() for line in lines):
        raise WorkloadError(f"--dataset-path {path}: no lines of text")
    return lines


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
