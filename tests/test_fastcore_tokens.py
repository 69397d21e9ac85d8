"""Per-request token times (`kvsim run --save-result`) in the compiled core (simcore/csrc/tokens.c)
against the Python engine's reference mode: on random small runs (V0 / V1, tiny caches that
preempt by recompute and swap, prefix caching, one replica or two behind either router,
speculative decoding with its bursts), every request's token times are the same floats in the
same order as Lifecycle.token_times holds them, besides the request tables
(tests/test_fastcore_equivalence.py's comparison); and the CLI's result file is the same
document whichever core ran."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.simcore import ccore
from kvsim.simcore.simulate import prepare
from kvsim.simcore.speculative import parse_speculative_config
from tests import test_fastcore_equivalence as plain
from tests import test_fastcore_speculative as spec
from tests.helpers import assert_same_requests

pytestmark = pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")


def _run(config, workload, seed, core, model=plain.TINY, **extra):
    """(result, token times merged over the replicas) of one run that keeps every token's time."""
    from kvsim.cli.bench_result import token_times

    exact = core == "python"
    sim = prepare(model, plain.H100, config, workload, plain._profile(), seed=seed, exact_steps=exact,
                  engine_core=core, **extra)
    for engine in sim.replicas:
        engine.lifecycle.token_times = {}
    result = sim.run()
    assert result.record["engine_core"] == core
    return result, token_times(sim)


def _same_tokens(config, workload, seed, context, **extra):
    core, times = _run(config, workload, seed, "c", **extra)
    ref, ref_times = _run(config, workload, seed, "python", **extra)
    assert_same_requests(core.requests, ref.requests, context)
    assert times.keys() == ref_times.keys(), context
    for rid, stamps in ref_times.items():
        assert type(times[rid]) is type(stamps) and times[rid] == stamps, (context, rid)  # bit for bit
    done = core.requests["finish_s"].notna() & (core.requests["num_positions"] > 0)
    assert len(times) == int(done.sum()), context  # every finished request, nobody else
    return core, times


def test_token_times_match_the_python_reference():
    """36 random runs of the plain core's cases, one in three on two replicas."""
    preempted = spans = replicas = 0
    for case in range(36):
        config, workload = plain._random_case(np.random.default_rng(500 + case))
        if case % 3 == 2:
            config = dataclasses.replace(config, data_parallel_size=2,
                                         router="least-loaded" if case % 2 else "round-robin")
        core, _ = _same_tokens(config, workload, case, f"case {500 + case}: {config}")
        preempted += core.totals.num_preempted
        spans += int((core.steps["num_steps"] > 1).sum())
        replicas += config.data_parallel_size > 1
    assert preempted and spans and replicas, "the cases should preempt, run decode spans and route"


def test_speculative_bursts_share_a_time():
    """Speculative runs: a verify's accepted drafts and its own token share one time, as
    Lifecycle.emit_spec stamps them."""
    bursts = 0
    for case in range(12):
        method = spec.METHODS[case % 4]  # heads and n-gram (a draft model: test_fastcore_speculative)
        config, workload, text = spec._random_case(np.random.default_rng(900 + case), method)
        _, times = _same_tokens(config, workload, 900 + case, f"case {900 + case}: {text}",
                                model=spec.model_for(method))
        bursts += sum(int((np.diff(np.asarray(t)) == 0).sum()) for t in times.values())
    assert bursts, "some verify should accept a draft"


def test_reservation_policies_and_pipeline_stages():
    """Static / dynamic batching and Orca (csrc/batching.c), and two pipeline stages whose
    micro-batches leave at different times (csrc/pipeline.c): the same token times."""
    from tests import test_fastcore_batching as batching

    for case, policy in enumerate(("static", "dynamic", "orca") * 3):
        rng = np.random.default_rng(700 + case)
        config, workload = batching._random_case(rng, policy)
        if case % 2:
            config = dataclasses.replace(config, pipeline_parallel_size=2)
        _same_tokens(config, workload, 700 + case, f"case {700 + case}: {config}")
    config, workload = plain._random_case(np.random.default_rng(799))
    _same_tokens(dataclasses.replace(config, pipeline_parallel_size=2, data_parallel_size=2), workload, 799, "pp")


def test_a_longer_run_with_decode_spans():
    """400 requests on the 8B model's tables, where most steps are decode spans in the core."""
    from kvsim.profiles import default_profile
    from kvsim.simcore.catalog import MODELS
    from kvsim.simcore.specs import EngineConfig
    from kvsim.workloads import load_workload

    model = MODELS["llama3-8b"]
    config = EngineConfig(max_num_seqs=64, num_gpu_blocks_override=900)
    workload = load_workload("sharegpt", {"num_requests": 400, "rate": 30.0},
                             max_model_len=config.resolved_max_model_len(model))
    results = []
    for core in ("c", "python"):
        sim = prepare(model, plain.H100, config, workload, default_profile(plain.H100, model, 1), seed=2,
                      exact_steps=core == "python", engine_core="c" if core == "c" else "auto")
        sim.replicas[0].lifecycle.token_times = {}
        results.append((sim.run(), sim.replicas[0].lifecycle.token_times))
    (core, times), (ref, ref_times) = results
    assert (core.steps["num_steps"] > 1).any() and core.totals.num_preempted
    assert times == ref_times and len(times) == 400


def test_save_result_file_is_the_same_from_either_core(tmp_path):
    """`kvsim run --save-result` in the compiled core (no longer refused to it): the same vLLM
    document, per-request arrays and peak output tok/s included, as the Python engine writes."""
    docs = {}
    for core in ("c", "python"):
        result = CliRunner().invoke(app, [
            "run", "--num-requests", "60", "--rate", "30", "--input-len", "64", "--output-len", "40",
            "--max-num-seqs", "16", "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}',
            "--engine-core", core, "--save-result", "--result-dir", str(tmp_path), "--result-filename", f"{core}.json"])
        assert result.exit_code == 0, result.output
        docs[core] = json.loads((tmp_path / f"{core}.json").read_text())
    c, py = docs["c"], docs["python"]
    assert c["record"]["engine_core"] == "c" and py["record"]["engine_core"] == "python"
    for key in ("ttfts", "itls", "latencies", "start_times", "output_lens", "max_output_tokens_per_s",
                "mean_itl_ms", "p99_itl_ms", "max_concurrent_requests"):
        assert c[key] == py[key], key
    assert c["max_output_tokens_per_s"] > 0 and sum(map(len, c["itls"])) > 0


def test_refusals_stay_precise():
    """What the core still cannot keep token times for says so."""
    config, workload = plain._random_case(np.random.default_rng(3))
    sim = prepare(plain.TINY, plain.H100, dataclasses.replace(config, data_parallel_size=2), workload,
                  plain._profile())
    sim.replicas[0].lifecycle.token_times = {}
    assert "some replicas only" in sim.choose_core()[1]
    spec_config = dataclasses.replace(config, speculative_config=parse_speculative_config(
        '{"method": "eagle", "num_speculative_tokens": 2}'))
    sim = prepare(plain.TINY, plain.H100, spec_config, workload, plain._profile())
    sim.replicas[0].lifecycle.token_times = {}
    assert sim.choose_core() == ("c", "")
