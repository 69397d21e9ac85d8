r"""Time vLLM V1's own engine-core scheduler loop on this CPU, per step, against the running batch.

Why: kvsim's `vllm-v1` host terms (profiles/host.py) are Vidur's profile of a V0-style engine; no
public measurement of V1's per-step CPU phases against batch size was found. This runs vLLM's real
V1 `Scheduler` (no GPU, no weights, no tokenizer) the way vLLM's tests build it
(tests/v1/core/utils.py `create_scheduler`, vllm-project/vllm at the release's tag) and times, for N
decoding requests, the three engine-core phases of `EngineCore.step` (vllm/v1/engine/core.py) that
do not need the model: `scheduler.schedule()`, `scheduler.update_from_output()` with a fake
`ModelRunnerOutput` carrying one sampled token per request, and the output thread's msgpack encode
of the resulting `EngineCoreOutputs` (`process_output_sockets`, `MsgpackEncoder`); their sum is
the engine core's per-step CPU work at TP 1 outside the model runner. With TP > 1 the
multiprocessing executor also pickles the SchedulerOutput into its shared-memory broadcast queue
(`MessageQueue.enqueue`, distributed/device_communicators/shm_broadcast.py), timed apart. It does NOT
time the sampler, the GPU launch path, nor the frontend process's output processor
(detokenisation). `--model-runner` also times the model runner's `_update_states`,
`_prepare_inputs` and the sampler's CPU bookkeeping `_bookkeeping_sync` (the GPU runner's code,
run by vLLM's CPU runner: see `measure_runner`), not the sampler's kernels.

Not part of kvsim and not run by its tests: it needs vLLM, which kvsim does not depend on.
Run it in a separate venv (measured with vllm 0.11.0, torch 2.13.0+cpu, Python 3.11):

    python3 -m venv /tmp/venv-vllm && . /tmp/venv-vllm/bin/activate
    pip install torch==2.13.0            # a CPU build
    pip install vllm==0.11.0 --no-deps
    pip install numpy msgspec pydantic cloudpickle transformers pyzmq psutil cachetools regex \
        cbor2 setproctitle aiohttp requests blake3 pillow prometheus_client fastapi openai \
        openai_harmony pybase64 diskcache py-cpuinfo
    pip install numba                    # only for --model-runner
    python benchmarks/measure_v1_scheduler.py [--model-runner] [--steps 200] [--batches 8,16,...] \
        [--json out.json]

Settings are vLLM 0.11's serving defaults where they matter to the scheduler: prefix caching on
with the sha256 block hasher (EngineCore's), chunked prefill, log_stats on, block size 16. Each
request has a 128-token prompt and cannot finish within the run (max_tokens fills max_model_len).
Prints medians in ms per step and a least-squares line (per step + per sequence) for each phase.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
import time

# Llama-3-8B's shape: only the config is read (no weights, no tokenizer).
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 32, "vocab_size": 128256, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
    "bos_token_id": 128000, "eos_token_id": 128001, "tie_word_embeddings": False,
}
PROMPT_TOKENS = 128
MAX_MODEL_LEN = 8192
BLOCK_SIZE = 16
EOS = 128001


def build_scheduler(max_num_seqs: int, model_dir: str):
    """A V1 Scheduler as tests/v1/core/utils.py builds one, with EngineCore's block hasher."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.utils import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=8192, max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=True)
    model_config = ModelConfig(model=model_dir, dtype="bfloat16", seed=0,
                               skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN)
    cache_config = CacheConfig(block_size=BLOCK_SIZE, gpu_memory_utilization=0.9, swap_space=0,
                               cache_dtype="auto", enable_prefix_caching=True)
    # No accelerator platform is detected here; the scheduler does not use the device.
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, device_config=DeviceConfig("cpu"))
    num_blocks = max_num_seqs * (MAX_MODEL_LEN // BLOCK_SIZE) // 4 + 1024
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            BLOCK_SIZE, 8, 128, torch.bfloat16, False))])
    cache_config.num_gpu_blocks = num_blocks
    scheduler = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                          log_stats=True,
                          structured_output_manager=StructuredOutputManager(vllm_config))
    hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return scheduler, get_request_block_hasher(BLOCK_SIZE, hash_fn)


def add_requests(scheduler, block_hasher, n: int) -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=MAX_MODEL_LEN - PROMPT_TOKENS, ignore_eos=False)
    for i in range(n):
        prompt = [(i * 7919 + j) % 100000 + 1000 for j in range(PROMPT_TOKENS)]  # no shared prefix
        scheduler.add_request(Request(request_id=f"req-{i}", prompt_token_ids=prompt,
                                      sampling_params=params, pooling_params=None,
                                      eos_token_id=EOS, block_hasher=block_hasher))


def fake_output(sched_out, step: int):
    """What the worker returns for a decode step: one sampled token per scheduled request."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(sched_out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[1000 + (step + i) % 50000] for i in range(len(req_ids))],
        logprobs=None, prompt_logprobs_dict={}, pooler_output=[])


def measure(n: int, steps: int, warmup: int, model_dir: str) -> dict:
    from vllm.v1.serial_utils import MsgpackEncoder

    gc.unfreeze()
    gc.collect()
    scheduler, hasher = build_scheduler(n, model_dir)
    # EngineCoreProc.__init__ (vllm/v1/engine/core.py) ends with gc.collect(); gc.freeze(), so
    # the block pool's KVCacheBlocks are not rescanned by the oldest-generation collections.
    gc.collect()
    gc.freeze()
    add_requests(scheduler, hasher, n)
    encoder = MsgpackEncoder()
    step = 0
    # Prefill every prompt (chunked, 8192 tokens a step), then settle into pure decode.
    while (len(scheduler.running) < n
           or any(r.num_computed_tokens < PROMPT_TOKENS for r in scheduler.running)):
        out = scheduler.schedule()
        scheduler.update_from_output(out, fake_output(out, step))
        step += 1
    t_sched, t_update, t_encode, t_pickle = [], [], [], []
    for k in range(warmup + steps):
        t0 = time.perf_counter()
        out = scheduler.schedule()
        t1 = time.perf_counter()
        mro = fake_output(out, step)
        t2 = time.perf_counter()
        outputs = scheduler.update_from_output(out, mro)
        t3 = time.perf_counter()
        for eco in outputs.values():
            encoder.encode(eco)
        t4 = time.perf_counter()
        pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        t5 = time.perf_counter()
        step += 1
        assert len(out.num_scheduled_tokens) == n and out.total_num_scheduled_tokens == n
        if k >= warmup:
            t_sched.append((t1 - t0) * 1e3)
            t_update.append((t3 - t2) * 1e3)
            t_encode.append((t4 - t3) * 1e3)
            t_pickle.append((t5 - t4) * 1e3)
    med = statistics.median
    sums = [a + b + c for a, b, c in zip(t_sched, t_update, t_encode, strict=True)]
    return {"batch": n, "schedule_ms": med(t_sched), "update_from_output_ms": med(t_update),
            "encode_ms": med(t_encode), "sum_ms": med(sums),
            "sum_p10_ms": statistics.quantiles(sums, n=10)[0],
            "broadcast_pickle_ms": med(t_pickle)}


# The model runner is built on a 2-layer, 256-wide Llama (constructing it allocates the weights):
# its input preparation depends on the batch, the block table's width and the KV-cache groups,
# not on the layers' sizes.
TINY_CONFIG = dict(LLAMA_CONFIG, num_hidden_layers=2, hidden_size=256, intermediate_size=512,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=32000,
                   bos_token_id=1, eos_token_id=2)


def measure_runner(n: int, steps: int, warmup: int, model_dir: str) -> dict:
    """Time the model runner's _update_states, _prepare_inputs, _bookkeeping_sync (CPU runner).

    Runs in its own process (`--runner-one`): the platform must be vLLM's CpuPlatform before
    anything resolves it, and the runner needs a one-rank gloo process group. `CPUModelRunner`
    (vllm/v1/worker/cpu_model_runner.py) is `GPUModelRunner` with CUDA streams stubbed, so both
    methods are the GPU runner's own code; what differs on a GPU host is the attention metadata
    builder (TorchSDPA's here, FlashAttention's there) and the host-to-device copies (memcpy here).
    """
    import torch
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()  # noqa: SLF001 - no GPU: run as vLLM's CPU build
    CpuPlatform.is_pin_memory_available = classmethod(lambda cls: False)  # nothing to pin to here
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    scheduler, hasher = build_scheduler(n, model_dir)
    vllm_config = scheduler.vllm_config
    vllm_config.load_config.load_format = "dummy"
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(1, 0, "tcp://127.0.0.1:29533", 0, "gloo")
        ensure_model_parallel_initialized(1, 1)
        runner = CPUModelRunner(vllm_config, torch.device("cpu"))
        runner.load_model()
        spec = runner.get_kv_cache_spec()
        names, nb = list(spec), 256  # block ids past nb only index slot mappings, never memory
        runner.initialize_kv_cache(KVCacheConfig(
            num_blocks=nb,
            kv_cache_tensors=[KVCacheTensor(size=spec[k].page_size_bytes * nb, shared_by=[k])
                              for k in names],
            kv_cache_groups=[KVCacheGroupSpec(names, spec[names[0]])]))
        gc.collect()
        gc.freeze()
        add_requests(scheduler, hasher, n)
        t_upd, t_prep, t_book = [], [], []
        hidden = torch.zeros(n, TINY_CONFIG["hidden_size"])
        for step in range(100000):
            out = scheduler.schedule()
            t0 = time.perf_counter()
            runner._update_states(out)  # noqa: SLF001 - the phase under test
            t1 = time.perf_counter()
            runner._prepare_inputs(out)  # noqa: SLF001
            t2 = time.perf_counter()
            # The sampler's kernels are the GPU's; what follows them on the CPU is the
            # bookkeeping of one sampled token per request (greedy, no logprobs).
            sampled = SamplerOutput(
                sampled_token_ids=torch.randint(1000, 30000, (runner.input_batch.num_reqs, 1)),
                logprobs_tensors=None)
            t3 = time.perf_counter()
            runner._bookkeeping_sync(out, sampled, None, hidden,  # noqa: SLF001
                                     out.total_num_scheduled_tokens)
            t4 = time.perf_counter()
            scheduler.update_from_output(out, fake_output(out, step))
            decoding = (len(out.num_scheduled_tokens) == n and out.total_num_scheduled_tokens == n
                        and all(r.num_computed_tokens > PROMPT_TOKENS for r in scheduler.running))
            if decoding:
                t_upd.append((t1 - t0) * 1e3)
                t_prep.append((t2 - t1) * 1e3)
                t_book.append((t4 - t3) * 1e3)
                if len(t_upd) == warmup + steps:
                    break
    med = statistics.median
    return {"batch": n, "update_states_ms": med(t_upd[warmup:]),
            "prepare_inputs_ms": med(t_prep[warmup:]), "bookkeeping_ms": med(t_book[warmup:])}


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares on relative error, (intercept, slope): every batch weighs the same."""
    w = [1.0 / (y * y) for y in ys]
    sw = sum(w)
    swx = sum(wi * x for wi, x in zip(w, xs, strict=True))
    swy = sum(wi * y for wi, y in zip(w, ys, strict=True))
    swxx = sum(wi * x * x for wi, x in zip(w, xs, strict=True))
    swxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys, strict=True))
    slope = (sw * swxy - swx * swy) / (sw * swxx - swx * swx)
    return (swy - slope * swx) / sw, slope


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="8,16,32,64,128,256,512,1024")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--model-runner", action="store_true",
                    help="also time the model runner's _update_states / _prepare_inputs")
    ap.add_argument("--runner-one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    try:
        import vllm
    except ImportError:
        print("measure_v1_scheduler: vllm is not importable (see the module docstring)",
              file=sys.stderr)
        return 2
    if args.runner_one is not None:
        with tempfile.TemporaryDirectory() as model_dir:
            with open(os.path.join(model_dir, "config.json"), "w") as f:
                json.dump(TINY_CONFIG, f)
            print("RUNNER " + json.dumps(measure_runner(args.runner_one, args.steps,
                                                        args.warmup, model_dir)))
        return 0
    batches = [int(b) for b in args.batches.split(",")]
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    print(f"vllm {vllm.__version__}, python {platform.python_version()}, cpu: {cpu}")
    with tempfile.TemporaryDirectory() as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(LLAMA_CONFIG, f)
        rows = []
        for n in batches:
            gc.collect()
            rows.append(measure(n, args.steps, args.warmup, model_dir))
            r = rows[-1]
            print(f"batch {n:5d}: schedule {r['schedule_ms']:.3f}  update_from_output "
                  f"{r['update_from_output_ms']:.3f}  encode {r['encode_ms']:.3f}  "
                  f"sum {r['sum_ms']:.3f} (p10 {r['sum_p10_ms']:.3f})  [TP>1 broadcast pickle "
                  f"{r['broadcast_pickle_ms']:.3f}] ms, median of {args.steps}", flush=True)
    ranges = [(min(batches), max(batches))] + ([(8, 64)] if max(batches) > 64 else [])
    for lo, hi in ranges:
        sel = [r for r in rows if lo <= r["batch"] <= hi]
        if len(sel) < 2:
            continue
        xs = [float(r["batch"]) for r in sel]
        print(f"line over batches {xs[0]:.0f}..{xs[-1]:.0f} (least relative squares), ms: "
              "per step + per seq")
        for key in ("schedule_ms", "update_from_output_ms", "encode_ms", "sum_ms",
                    "sum_p10_ms", "broadcast_pickle_ms"):
            a, b = fit(xs, [r[key] for r in sel])
            print(f"  {key[:-3]:20s} {a:.4f} + {b:.5f} * seqs")
    runner_rows = []
    for n in batches if args.model_runner else ():
        proc = subprocess.run([sys.executable, __file__, "--runner-one", str(n), "--steps",
                               str(args.steps), "--warmup", str(args.warmup)],
                              capture_output=True, text=True, check=False)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RUNNER ")), None)
        if line is None:
            print(f"model runner at batch {n} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            return 1
        runner_rows.append(json.loads(line[len("RUNNER "):]))
        r = runner_rows[-1]
        print(f"batch {n:5d}: model runner _update_states {r['update_states_ms']:.3f}  "
              f"_prepare_inputs {r['prepare_inputs_ms']:.3f}  _bookkeeping_sync "
              f"{r['bookkeeping_ms']:.3f} ms (CPU runner), median of "
              f"{args.steps}", flush=True)
    if len(runner_rows) >= 2:
        xs = [float(r["batch"]) for r in runner_rows]
        print("model runner lines (least relative squares), ms: per step + per seq")
        for key in ("update_states_ms", "prepare_inputs_ms", "bookkeeping_ms"):
            a, b = fit(xs, [r[key] for r in runner_rows])
            print(f"  {key[:-3]:20s} {a:.4f} + {b:.5f} * seqs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"vllm": vllm.__version__, "cpu": cpu, "steps": args.steps,
                       "rows": rows, "runner_rows": runner_rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
