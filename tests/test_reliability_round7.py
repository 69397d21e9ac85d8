"""Reliability, round 7: an adversarial pass over the whole CLI after the session's features
(vllm-v1-async, per-engine prefill attention, error bars, custom all-reduce fields, calibration
from the real example CSVs, report sweep, sessions / KV tiers, disaggregation, speculation,
autoscaling). Each test is named after the case it found; a bad input ends in one line on stderr
and a non-zero exit before any work, with nothing written. Same style as test_reliability_round5."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import assert_one_line_error, invoke_cli

REPO = Path(__file__).resolve().parents[1]
TINY = ["--num-requests", "5", "--rate", "5", "--input-len", "64", "--output-len", "8", "--no-error-bars"]

invoke = invoke_cli


def _edited_profile(tmp_path, edit, name="H100-SXM-80GB-llama3-8b-tp2.json"):
    """A shipped profile, hand-edited by `edit(doc)`, written under tmp_path (400-digit integers
    and infinities are written as JSON numbers, as an editor would)."""
    doc = json.loads((REPO / "profiles" / name).read_text())
    edit(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


# --- hand-edited profile headers and model shapes --------------------------------------------


@pytest.mark.parametrize("path, value, needle", [
    (("model_shape", "hidden_size"), "abc", "model_shape.hidden_size: expected an integer"),
    (("model_shape", "dtype_bytes"), None, "model_shape.dtype_bytes: expected an integer"),
    (("model_shape", "dtype_bytes"), float("inf"), "model_shape.dtype_bytes: expected an integer"),
    (("model_shape", "vocab_size"), [1], "model_shape.vocab_size: expected an integer"),
    (("model_shape", "intermediate_size"), 10**400, "model_shape.intermediate_size: expected an integer"),
    (("model_shape", "num_layers"), 10**400, "model_shape.num_layers: expected an integer"),
    (("model",), None, ".model: expected a name"),
    (("model",), 1.5, ".model: expected a name"),
    (("expert_parallel_size",), "abc", "expert_parallel_size: expected a positive integer"),
    (("expert_parallel_size",), float("nan"), "expert_parallel_size: expected a positive integer"),
    (("tensor_parallel_size",), 10**400, "tensor_parallel_size: expected a positive integer"),
    (("prefill_vs_decode_factor",), 10**400, "prefill_vs_decode_factor: expected a positive number"),
    (("collectives", "all_reduce_calls_per_layer"), 10**400, "all_reduce_calls_per_layer: 1000"),
    (("host_overhead_by_engine", "vllm-v1-async", "hidden_per_step_ms"), 10**400, "is not a finite number"),
    (("prefill_attention", "launch_floor_ms"), 10**400, "launch_floor_ms: 1000"),
], ids=lambda v: repr(v)[:24])
def test_a_hand_edited_profile_header_or_shape_is_one_line(tmp_path, path, value, needle):
    """model_shape.hidden_size "abc" / null, a dtype_bytes of Infinity, a model name that is not
    a string, an expert_parallel_size "abc", any size or term as a 400-digit integer: the run
    ended in a traceback (ValueError / TypeError / OverflowError from float(), int() or the label's
    join), or, for dtype_bytes Infinity, printed its header and then numpy warnings and a
    zero-throughput error. Each is now one line naming the field, before anything is printed."""
    def edit(doc):
        where = doc
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value

    profile = _edited_profile(tmp_path, edit)
    for version in ("vllm-v1", "vllm-v1-async"):
        result = invoke("run", "--profile", str(profile), "--tp", "2", "--engine-version", version, *TINY)
        assert_one_line_error(result, needle)
        assert len(result.stderr) < 400, result.stderr  # a 400-digit number is cut short in the message


# --- report sweep: a TPOT column with no values, tables edited by hand -------------------------


def _one_token_sweep(tmp_path, *extra):
    """A sweep whose every request gives one token (a trace): no TPOT anywhere, so the table's
    TPOT columns are empty."""
    trace = tmp_path / "one-token.csv"
    trace.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n0,10,1\n0.5,20,1\n1,30,1\n")
    table = tmp_path / "s.csv"
    result = invoke("sweep", "--rate", "5,10", "--workload", str(trace), "--jobs", "1", "--out", str(table), *extra)
    assert result.exit_code == 0, result.stderr
    return table


@pytest.mark.parametrize("extra", [(), ("--seeds", "0,1")])
def test_report_sweep_draws_a_table_whose_tpot_has_no_value(tmp_path, extra):
    """Every request one token long (a prefill-only trace): the sweep wrote empty TPOT cells and
    `kvsim report sweep` died in matplotlib ("x, y, and format string must not be None": the best
    point's star at a missing TPOT), then in the answer's float(None). It draws the page now,
    with TPOT p95 n/a."""
    table = _one_token_sweep(tmp_path, *extra)
    out = tmp_path / "r"
    result = invoke("report", "sweep", str(table), "--out", str(out))
    assert result.exit_code == 0, result.stderr
    page = (out / "sweep-report.html").read_text()
    assert "TPOT p95 n/a" in page and (out / "throughput-latency.png").stat().st_size > 0


def _edited_table(src: Path, dst: Path, edit) -> Path:
    import csv

    rows = list(csv.reader(src.open()))
    edit(rows)
    with dst.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    return dst


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("small")
    table = folder / "s.csv"
    result = invoke("sweep", "--rate", "5,10", "--num-requests", "20", "--input-len", "64", "--output-len", "8",
                    "--jobs", "1", "--error-bars", "--out", str(table))
    assert result.exit_code == 0, result.stderr
    return table


def _set_column(name, value):
    def edit(rows):
        i = rows[0].index(name)
        for row in rows[1:]:
            row[i] = value
    return edit


def _drop_column(name):
    def edit(rows):
        i = rows[0].index(name)
        rows[:] = [r[:i] + r[i + 1:] for r in rows]
    return edit


@pytest.mark.parametrize("edit, needle", [
    (_set_column("p95_ttft_ms", "inf"), "p95_ttft_ms is 'inf', expected a number from 0 to 1e+15"),
    (_set_column("p95_tpot_ms", "1e308"), "p95_tpot_ms is '1e308'"),
    (_set_column("output_throughput", "1" + "0" * 400), "output_throughput is '1000"),
    (_set_column("p95_ttft_ms", "-1"), "p95_ttft_ms is '-1'"),
    (_set_column("gpus", "inf"), "gpus is 'inf'"),
    (_set_column("p95_ttft_ms_band_high", "inf"), "p95_ttft_ms_band_high is 'inf'"),
    (_drop_column("tensor_parallel_size"), "no 'tensor_parallel_size' column"),
    (_drop_column("gpu"), "no 'gpu' column"),
    (_drop_column("p95_tpot_ms"), "no 'p95_tpot_ms' column"),
    (_drop_column("kv_waste_rate"), "no 'kv_waste_rate' column"),
    (_drop_column("p95_ttft_ms_band_high"), "no 'p95_ttft_ms_band_high' column"),
], ids=lambda v: v[:40] if isinstance(v, str) else "edit")
def test_report_sweep_refuses_a_hand_edited_table_in_one_line(small_sweep, tmp_path, edit, needle):
    """A sweep table edited by hand: an infinite, negative, 1e308 or 400-digit metric ended in
    matplotlib's "Axis limits cannot be NaN or Inf" / "arange: cannot compute length" / pandas'
    OverflowError, a dropped column in AttributeError or KeyError, all after the table was read.
    Now one line naming the line and column (or the column), and no report folder."""
    table = _edited_table(small_sweep, tmp_path / "t.csv", edit)
    out = tmp_path / "r"
    assert_one_line_error(invoke("report", "sweep", str(table), "--out", str(out)), needle)
    assert not out.exists()


def test_report_sweep_judges_a_tpot_slo_no_request_could_miss(tmp_path):
    """`sweep --slo tpot:p99:50` over one-token requests, then `report sweep`: "rerun `kvsim sweep`
    with --slo tpot:p99:50", which is what had been run. With no TPOT anywhere, nothing misses
    the target (reports.capacity._none_to_miss): the page names a best point."""
    table = _one_token_sweep(tmp_path, "--slo", "tpot:p99:50")
    out = tmp_path / "r"
    result = invoke("report", "sweep", str(table), "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "No point meets the SLO" not in (out / "sweep-report.html").read_text()


# --- a draft_model's draft priced in every run, not only the first ------------------------------

DRAFT = json.dumps({"method": "draft_model", "model": "llama3-8b", "num_speculative_tokens": 3, "acceptance_rate": 0.7})


def test_sweep_error_bars_price_a_draft_model_draft_in_the_band_runs(tmp_path):
    """`sweep --error-bars --speculative-config '{"method": "draft_model", ...}'`: the point ran,
    then its band runs called simulate without the draft's profile and the sweep ended in
    "method draft_model needs a profile of llama3-8b". The band runs price the draft scaled as
    the target is now (as `run --error-bars` does)."""
    table = tmp_path / "s.csv"
    result = invoke("sweep", "--model", "llama3-70b", "--tp", "4", "--rate", "2", "--num-requests", "8",
                    "--input-len", "64", "--output-len", "8", "--speculative-config", DRAFT, "--error-bars",
                    "--jobs", "1", "--out", str(table))
    assert result.exit_code == 0, result.stderr
    import csv

    row = next(csv.DictReader(table.open()))
    low, mid, high = (float(row[k]) for k in ("p95_tpot_ms_band_low", "p95_tpot_ms", "p95_tpot_ms_band_high"))
    assert low < mid < high


def test_run_autoscale_with_a_draft_model_prices_its_static_fleets(tmp_path):
    """`run --autoscale --speculative-config '{"method": "draft_model", ...}'`: the autoscaled day
    ran and printed its header, then the static fleets it is compared with were simulated without
    the draft's profile: "method draft_model needs a profile" after the output had begun."""
    result = invoke("run", "--model", "llama3-70b", "--tp", "4", "--autoscale", "--workload", "diurnal",
                    "--num-requests", "30", "--rate", "1", "--speculative-config", DRAFT, "--no-error-bars")
    assert result.exit_code == 0, result.stderr
    assert "Static fleet, the peak" in result.stdout and "Static fleet, the mean" in result.stdout


# --- plan --autoscale: what it would ignore is refused -----------------------------------------


@pytest.mark.parametrize("flag", [
    ["--input-len", "3000"], ["--burstiness", "0.1"], ["--block-size", "32"], ["--max-num-seqs", "8"],
    ["--kv-cache-dtype", "fp8"], ["--quantization", "fp8"], ["--router", "round-robin"], ["--goodput", "ttft:10"],
    ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'], ["--disagg", "on"],
    ["--search-requests", "100"], ["--jobs", "2"],
], ids=lambda f: f[0])
def test_plan_autoscale_refuses_every_option_it_would_ignore(flag):
    """`plan --autoscale --input-len 3000` (or --block-size, --speculative-config, --disagg on,
    --goodput, ...): the answer was byte for byte the one without the option; it planned the
    workload's own day at vLLM V1's defaults and said nothing. Refused now, as --engine-version was."""
    result = invoke("plan", "--autoscale", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--tp", "1", *flag)
    assert_one_line_error(result, f"{flag[0]} does not apply to plan --autoscale")


# --- a run that served nothing leaves earlier results alone --------------------------------------


def test_a_run_that_serves_nothing_does_not_replace_an_earlier_out_folder_or_result(tmp_path):
    """`run --out o` after a good `run --out o`, with a trace whose every prompt is past
    max_model_len: it printed its n/a table, replaced o/requests.csv, steps.csv and summary.json
    with the empty run's, then exited 1 ("no request was served"). The earlier files stay now,
    and no --save-result file is written either."""
    out = tmp_path / "o"
    result = invoke("run", *TINY, "--out", str(out))
    assert result.exit_code == 0, result.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    trace = tmp_path / "big.csv"
    trace.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n0,9000,10\n0.5,9000,10\n")
    result = invoke("run", "--workload", str(trace), "--no-error-bars", "--out", str(out), "--save-result",
                    "--result-dir", str(tmp_path / "res"))
    assert result.exit_code == 1 and "no request was served" in result.stderr.splitlines()[-1]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not (tmp_path / "res").exists() and "Wrote" not in result.stdout


# --- workload files -------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("arrival", "{process: [poisson], rate: 2}"), ("prompt_len", "{dist: {a: 1}, mean: 10}"),
    ("output_len", "{dist: [fixed], value: 10}"),
])
def test_a_workload_kind_that_is_a_list_or_mapping_is_one_line(tmp_path, field, value):
    """`arrival: {process: [poisson]}` or `prompt_len: {dist: {a: 1}}`: the kind was looked up in
    a dict and raised TypeError (unhashable type: 'list'), a traceback from run and sweep alike."""
    lines = {"arrival": "{process: poisson, rate: 2}", "prompt_len": "{dist: fixed, value: 10}",
             "output_len": "{dist: fixed, value: 10}", field: value}
    path = tmp_path / "w.yaml"
    path.write_text("name: w\nnum_requests: 5\n" + "".join(f"{k}: {v}\n" for k, v in lines.items()))
    kind = "process" if field == "arrival" else "dist"
    for args in (("run", "--no-error-bars"), ("sweep", "--rate", "1,2", "--jobs", "1")):
        assert_one_line_error(invoke(*args, "--workload", str(path)), f"field '{field}.{kind}' must be one of")


# --- one-token outputs: no TPOT to print or to miss -----------------------------------------------


def _one_token_trace(tmp_path, num=120):
    trace = tmp_path / "prefill-only.csv"
    trace.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n"
                     + "".join(f"{i * 0.05:.2f},{50 + i % 30},1\n" for i in range(num)))
    return trace


PLAN_SMALL = ("--gpu", "H100-SXM-80GB", "--tp", "1", "--search-requests", "80", "--confirm-requests", "100")


@pytest.mark.parametrize("slo", [(), ("--goodput", "tpot:30"), ("--slo-tpot-p95-ms", "30")], ids=str)
def test_plan_answers_a_workload_whose_every_output_is_one_token(tmp_path, slo):
    """A prefill-only trace (every output one token): `plan --rate 5` with no SLO or --goodput
    died formatting the confirmation's TPOT p95 (None: TypeError, a traceback after the table);
    with --slo-tpot-p95-ms 30 it said "nothing meets the SLO: TPOT p95 n/a ms > 30 ms" at any
    rate, though no request has a TPOT to miss (vLLM's goodput counts it as 0). It answers now."""
    result = invoke("plan", "--rate", "5", "--workload", str(_one_token_trace(tmp_path)), *PLAN_SMALL, *slo)
    assert result.exit_code == 0, result.stderr
    answer = next(line for line in result.stdout.splitlines() if line.startswith("Answer:"))
    assert "1 x TP1 H100-SXM-80GB" in answer and "TPOT p95 n/a ms" in answer, answer


def test_find_max_rate_with_a_tpot_slo_on_one_token_outputs_finds_a_rate(tmp_path):
    """`run --find-max-rate --slo tpot:p95:30` on a prefill-only trace: every rate failed on "TPOT
    p95 n/a ms > 30 ms" (rows printed "TPOT p95 None ms"), so the answer was "No rate meets the
    SLO"; the rate is now bounded by overload, as with no TPOT target."""
    result = invoke("run", "--workload", str(_one_token_trace(tmp_path)), "--find-max-rate", "--rate", "5",
                    "--slo", "tpot:p95:30", "--no-error-bars")
    assert result.exit_code == 0, result.stderr
    assert "Max sustainable rate:" in result.stdout and "No rate meets" not in result.stdout
    assert "None ms" not in result.stdout


@pytest.mark.parametrize("args, needle", [
    (("run", "--engine-version", "vllm-v0", *TINY), "--engine-version vllm-v0 turns it off: give --enable-chunked-prefill"),
    (("plan", "--engine-version", "vllm-0.6", "--rate", "1", "--gpu", "H100-SXM-80GB", "--tp", "1"),
     "--engine-version vllm-0.6 turns it off"),
    (("run", "--no-enable-chunked-prefill", *TINY), "drop --no-enable-chunked-prefill"),
])
def test_speculation_without_chunked_prefill_names_what_turned_it_off(args, needle):
    """`--engine-version vllm-v0 --speculative-config ...` said "drop --no-enable-chunked-prefill",
    a flag the user never gave (the version's preset turns chunked prefill off)."""
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 2})
    assert_one_line_error(invoke(*args, "--speculative-config", spec), needle)


# --- autoscaling routes every request itself ------------------------------------------------------


@pytest.mark.parametrize("layout", [("--fleet", "H100-SXM-80GB:1:1,H200-141GB:1:2"), ()], ids=["fleet", "one-gpu"])
@pytest.mark.parametrize("router", ["round-robin", "session-affinity", "prefix-aware"])
def test_autoscale_refuses_a_router_it_would_ignore(layout, router):
    """`run --fleet ... --autoscale --router round-robin`: the record said router round-robin and
    the figures were, to the bit, those of least-loaded (the autoscaler picks the least-loaded
    active replica itself); without --fleet the refusal said "--router applies only with
    --data-parallel-size > 1", which --autoscale forbids. Now one line naming --autoscale; its own
    router, least-loaded, is accepted."""
    args = ("run", *layout, "--autoscale", "--workload", "diurnal", "--num-requests", "40", "--no-error-bars")
    assert_one_line_error(invoke(*args, "--router", router), f"--router {router} does not apply with --autoscale")
    result = invoke(*args, "--router", "least-loaded")
    assert result.exit_code == 0, result.stderr


def test_sweep_refuses_a_router_when_every_point_has_one_replica():
    """`sweep --router round-robin,least-loaded` at --dp 1: two identical points under two router
    names (one replica has nothing to route), where `kvsim run --router` at --dp 1 is refused."""
    args = ("sweep", "--rate", "2", "--num-requests", "10", "--input-len", "64", "--output-len", "8", "--jobs", "1")
    assert_one_line_error(invoke(*args, "--router", "round-robin,least-loaded"), "--router applies only with")
    result = invoke(*args, "--router", "round-robin,least-loaded", "--dp", "1,2")
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("flag", [
    ["--autoscale"], ["--compare-no-spec", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'],
    ["--metric-percentiles", "50"], ["--percentile-metrics", "ttft"],
], ids=lambda f: f[0])
def test_find_max_rate_refuses_what_its_search_would_ignore(flag):
    """`run --find-max-rate --autoscale` searched the fixed one-replica deployment (the same 543
    req/s as without --autoscale); --compare-no-spec printed no speed-up; --metric-percentiles 50
    and --percentile-metrics ttft changed nothing printed. Each is one line now."""
    result = invoke("run", "--find-max-rate", "--rate", "4", "--num-requests", "30", "--input-len", "64",
                    "--output-len", "8", "--no-error-bars", *flag)
    assert_one_line_error(result, f"{flag[0]} does not apply to --find-max-rate's search")


@pytest.mark.parametrize("flag", [["--block-size", "32"], ["--max-num-seqs", "8"], ["--chunked-prefill", "off"],
                                  ["--router", "round-robin"], ["--kv-offloading-size", "4"], ["--pp", "2"],
                                  ["--gpu-memory-utilization", "0.8"]], ids=lambda f: f[0])
def test_plan_disagg_on_refuses_engine_knobs_its_pools_ignore(flag):
    """`plan --disagg on --max-num-seqs 8` (or --block-size, --chunked-prefill off, --router, ...):
    the disaggregated candidates ran their pools at the defaults and the JSON answer was identical
    to the one without the option. Refused now, as --speculative-config is with --disagg on."""
    result = invoke("plan", "--rate", "4", "--gpu", "H100-SXM-80GB", "--tp", "1", "--disagg", "on", *flag)
    assert_one_line_error(result, f"{flag[0]} does not apply to disaggregated candidates")


# --- both cores on the session's newest presets -------------------------------------------------


@pytest.mark.parametrize("case", range(6))
def test_cores_agree_on_real_profiles_with_the_newest_presets(case):
    """The equivalence tests run a tiny model's profile; here the committed H100 llama3-8b profiles
    (per-engine prefill attention, vllm-v1-async's hidden host terms), a per-phase error-bar
    scaling of them, each engine version, small caches that preempt and dp 1-2: the compiled
    core and the Python reference agree (340 such cases checked while writing this; 6 kept)."""
    import numpy as np

    from kvsim.profiles import default_profile
    from kvsim.profiles.uncertainty import PhaseFactors, scaled_profile
    from kvsim.simcore import ccore
    from kvsim.simcore.catalog import GPUS, MODELS
    from kvsim.simcore.simulate import simulate
    from kvsim.simcore.specs import EngineConfig
    from tests.helpers import assert_cores_agree, random_requests
    from tests.test_fastcore_equivalence import ArraysWorkload

    if ccore.library() is None:
        pytest.skip("no compiled core (no C compiler?)")
    rng = np.random.default_rng(700 + case)
    gpu, model = GPUS["H100-SXM-80GB"], MODELS["llama3-8b"]
    tp = 1 + case % 2
    profile = default_profile(gpu, model, tp)
    if case % 3:
        profile = scaled_profile(profile, PhaseFactors(float(rng.uniform(0.6, 1.9)), float(rng.uniform(0.6, 1.7))))
    version = ("vllm-v1-async", "vllm-v0", "vllm-v1-async", "vllm-0.6", "vllm-v1", "vllm-v1-async")[case]
    chunked = version not in ("vllm-v0", "vllm-0.6")
    mml = 1024
    config = EngineConfig(tensor_parallel_size=tp, max_model_len=mml, max_num_seqs=int(rng.integers(2, 48)),
                          max_num_batched_tokens=512 if chunked else mml, enable_chunked_prefill=chunked,
                          enable_prefix_caching=chunked, engine_version=version, data_parallel_size=1 + case % 2,
                          num_gpu_blocks_override=int(rng.integers(64, 160)))
    workload = ArraysWorkload(*random_requests(rng, mml, max_requests=50))
    core = simulate(model, gpu, config, workload, profile, seed=case, engine_core="c")
    exact = simulate(model, gpu, config, workload, profile, seed=case, exact_steps=True)
    assert_cores_agree(core, exact, f"case {case}: {version} tp{tp}")
