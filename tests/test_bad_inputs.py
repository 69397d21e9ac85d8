"""Issue 11, by name: every bad input refused cleanly before any work, nothing lost on a failed
write, loud results, and a CLI that says what it does. Each case drives the real typer app."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app

TINY = ["--num-requests", "5", "--rate", "5", "--input-len", "64", "--output-len", "8"]
SHAPE = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 688, "vocab_size": 1024, "max_position_embeddings": 2048}


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


@pytest.fixture
def no_simulation(monkeypatch):
    """Fail the test if any simulation is wired up: bad input must be refused before the work."""
    import importlib

    module = importlib.import_module("kvsim.simcore.simulate")  # the package re-exports a function of that name

    def refuse(*args, **kwargs):
        raise AssertionError("a simulation started for a bad input")

    monkeypatch.setattr(module, "prepare", refuse)


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("kvsim: error: ") and "\n" not in err, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


def hf_config(tmp_path: Path, **changes) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**SHAPE, **changes}))
    return str(path)


# --- Wrong acceptances: HF config values coerced ----------------------------------------------


@pytest.mark.parametrize(("name", "changes", "needles"), [
    ("bool-layers", {"num_hidden_layers": True}, ("'num_hidden_layers'", "whole number", "True")),
    ("fractional-layers", {"num_hidden_layers": 31.5}, ("'num_hidden_layers'", "31.5")),
    ("string-hidden-size", {"hidden_size": "256"}, ("'hidden_size'",)),
    ("zero-kv-heads", {"num_key_value_heads": 0}, ("'num_key_value_heads'",)),
    ("unknown-torch-dtype", {"torch_dtype": "int4"}, ("unknown torch_dtype 'int4'",)),
    ("fp8-torch-dtype", {"torch_dtype": "float8_e4m3fn"}, ("FP8",)),
    ("gptq-quantization-config", {"quantization_config": {"quant_method": "gptq"}},
     ("quantization_config", "'gptq'", "not supported")),  # fp8 is read as FP8 weights
    ("max-position-embeddings-1", {"max_position_embeddings": 1}, ("'max_position_embeddings'",)),
    ("bool-tie-embeddings", {"tie_word_embeddings": "yes"}, ("'tie_word_embeddings'",)),
])
def test_hf_config_values_are_not_coerced(tmp_path, no_simulation, name, changes, needles):
    path = hf_config(tmp_path, **changes)
    result = invoke("run", "--model", path, *TINY)
    assert_one_line_error(result, f"model config {path}", *needles)
    assert "ModelSpec" not in result.stderr  # no internal names


def test_a_strict_hf_config_still_runs(tmp_path):
    result = invoke("run", "--model", hf_config(tmp_path, num_hidden_layers=2.0, torch_dtype="bfloat16"), *TINY)
    assert result.exit_code == 0, result.stderr


# --- Messages that name the flag, never an internal name ---------------------------------------


@pytest.mark.parametrize(("command", "flag", "value"), [
    (command, flag, value)
    for command in ("run", "sweep")
    for flag, value in (
        ("--n", "0"), ("--beam-width", "0"), ("--num-requests", "0"), ("--input-len", "0"),
        ("--output-len", "0"), ("--max-tokens", "0"), ("--burstiness", "nan"), ("--burstiness", "0"),
    )
] + [("run", "--rate", "nan"), ("run", "--rate", "inf"), ("run", "--rate", "0"),
     ("run", "--concurrency", "0")])
def test_workload_flag_errors_name_the_flag(no_simulation, command, flag, value):
    assert_one_line_error(invoke(command, "--num-requests", "5", flag, value), f"{flag} must be")


def test_think_time_nan_names_the_flag(no_simulation):
    result = invoke("run", "--concurrency", "2", "--num-requests", "5", "--think-time-s", "nan")
    assert_one_line_error(result, "--think-time-s must be")


# --- Workload YAML: 1e3 as in the CSV reader; unknown fields flagged ---------------------------


def _yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return str(path)


def test_yaml_1e3_is_a_number_as_in_the_csv_reader(tmp_path):
    path = _yaml(tmp_path, "num_requests: 1e3\narrival: {process: poisson, rate: 2.5e1}\n"
                           "prompt_len: 1e2\noutput_len: {dist: fixed, value: 1E1}\n")
    result = invoke("workloads", "show", path)
    assert result.exit_code == 0, result.stderr
    assert "requests: 1,000" in result.stdout and "rate=25.0" in result.stdout


@pytest.mark.parametrize(("name", "text", "needle"), [
    ("arrival-kind-not-process", "num_requests: 10\narrival: {kind: poisson}\nprompt_len: 10\noutput_len: 10\n",
     "unknown field 'arrival.kind'"),
    ("misspelt-rate", "num_requests: 10\narrival: {process: poisson, rte: 2}\nprompt_len: 10\noutput_len: 10\n",
     "unknown field 'arrival.rte'"),
    ("fractional-1e-requests", "num_requests: 1.5e0\narrival: {process: poisson, rate: 2}\n"
                               "prompt_len: 10\noutput_len: 10\n", "'num_requests'"),
    ("infinite-rate", "num_requests: 10\narrival: {process: poisson, rate: .inf}\nprompt_len: 10\noutput_len: 10\n",
     "'arrival.rate'"),
])
def test_bad_workload_yaml_is_refused_on_every_command(tmp_path, no_simulation, name, text, needle):
    path = _yaml(tmp_path, text)
    for args in (("run", "--workload", path), ("sweep", "--workload", path), ("workloads", "show", path)):
        assert_one_line_error(invoke(*args), f"workload file {path}", needle)


# --- A trace row whose prompt exceeds max_model_len: rejected with its reason, not clipped ------


def test_trace_prompt_over_max_model_len_is_rejected_not_clipped(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n0,100,10\n0.5,3000,10\n1.0,200,10\n")
    out = tmp_path / "run"
    result = invoke("run", "--workload", str(trace), "--max-model-len", "2048", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "1 of 3 requests rejected" in result.stderr
    assert "prompt of 3000 tokens exceeds max_model_len 2048" in result.stderr
    requests = (out / "requests.csv").read_text()
    assert "rejected" in requests and ",3000," in requests  # the offered load is unchanged


# --- Partial output: all or nothing, and --out checked before the work -------------------------


def test_out_whose_steps_csv_is_a_folder_is_refused_before_the_work(tmp_path, no_simulation):
    out = tmp_path / "run"
    (out / "steps.csv").mkdir(parents=True)
    (out / "requests.csv").write_text("old requests\n")
    result = invoke("run", *TINY, "--out", str(out))
    assert_one_line_error(result, "--out", "steps.csv there is a folder")
    assert (out / "requests.csv").read_text() == "old requests\n"


def test_a_write_that_fails_halfway_leaves_the_old_run_untouched(tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert invoke("run", *TINY, "--out", str(out)).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (out / "notes.txt").write_text("mine\n")
    import kvsim.reports.files

    real = kvsim.reports.files.write_csv

    def write_csv(path, *args, **kwargs):  # requests.csv is written, steps.csv fails (disk full)
        if Path(path).name == "steps.csv":
            raise OSError(28, "No space left on device")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(kvsim.reports.files, "write_csv", write_csv)
    result = invoke("run", *TINY, "--seed", "3", "--out", str(out))
    assert_one_line_error(result, "No space left on device", "nothing was written")
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "notes.txt"}
    assert after == before and (out / "notes.txt").read_text() == "mine\n"
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no staging folder left behind


def test_a_rewrite_swaps_the_whole_folder_and_keeps_other_files(tmp_path):
    out = tmp_path / "run"
    assert invoke("run", *TINY, "--out", str(out)).exit_code == 0
    (out / "notes.txt").write_text("mine\n")
    (out / "plots").mkdir()
    (out / "plots" / "a.png").write_bytes(b"png")
    first = (out / "summary.json").read_text()
    assert invoke("run", *TINY, "--seed", "9", "--out", str(out)).exit_code == 0
    assert (out / "summary.json").read_text() != first
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "plots" / "a.png").read_bytes() == b"png"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize("command", [
    ["run", "--num-requests", "5000000", "--rate", "50"],
    ["run", "--num-requests", "5000000", "--rate", "50", "--find-max-rate"],
    ["sweep", "--num-requests", "5000000", "--block-size", "8,16,32"],
    ["report", "seed-table", "--num-requests", "100000"],
])
def test_unwritable_out_is_refused_in_under_a_second(tmp_path, no_simulation, command):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / ("x.csv" if command[0] == "sweep" else "out")
    started = time.process_time()
    result = invoke(*command, "--out", str(target))
    assert time.process_time() - started < 1.0
    assert_one_line_error(result, f"--out {target}", "cannot write there")


def test_out_that_is_the_current_folder_is_refused(tmp_path, monkeypatch, no_simulation):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(invoke("run", *TINY, "--out", "."), "--out .", "folder of its own")


def test_workloads_show_plot_target_checked_first(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("")
    assert_one_line_error(invoke("workloads", "show", "sharegpt", "--plot", str(blocker / "p.png")), "--plot")


# --- Unbounded memory: lazy generation, sampled `workloads show` --------------------------------


def test_workloads_show_of_a_billion_requests_samples(tmp_path):
    path = _yaml(tmp_path, "num_requests: 1e9\narrival: {process: poisson, rate: 50}\n"
                           "prompt_len: {dist: lognormal, mean: 200, cv: 1}\noutput_len: 100\n")
    started = time.process_time()
    result = invoke("workloads", "show", path)
    assert result.exit_code == 0, result.stderr
    assert time.process_time() - started < 30
    assert "requests: 1,000,000,000 (statistics below from the first 200,000)" in result.stdout


def test_generation_is_chunked_and_equals_one_shot():
    from kvsim.workloads import load_workload

    spec = load_workload("sharegpt-bursty", {"num_requests": 1000})
    chunks = list(spec.iter_arrays(0, chunk=300))
    assert [len(c.num_prompt_tokens) for c in chunks] == [300, 300, 300, 100]
    assert [c.first_id for c in chunks] == [0, 300, 600, 900]
    times = [t for c in chunks for t in c.arrival_s.tolist()]
    assert times == sorted(times) and times[0] == 0.0
    small = [r for c in chunks for r in c.to_requests()]
    assert [r.request_id for r in small] == list(range(1000))
    # the process submits what sample_requests returns, chunk boundaries included
    assert spec.sample_requests(0, limit=10) == spec.sample_requests(0)[:10]


# --- Silent failures: nothing served, zero throughput, near-idle runs --------------------------


def test_a_run_that_serves_nothing_exits_non_zero(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n0,3000,10\n1,4000,10\n")
    result = invoke("run", "--workload", str(trace), "--max-model-len", "2048")
    assert result.exit_code == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("kvsim: error: no request was served (2 of 2 rejected: prompt of 3000 tokens")


@pytest.mark.parametrize(("name", "args", "needle"), [
    ("rate-1e-8", ["--rate", "1e-8", "--num-requests", "5"], "engine was busy"),  # (spans past 1e9 s are
    ("trace-1e8-gap", None, "longest gap between two arrivals is 100,000,000 s"),  # refused: round 5)
])
def test_near_idle_runs_are_warned(tmp_path, name, args, needle):
    if args is None:
        trace = tmp_path / "gap.csv"
        trace.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n0,10,10\n1e8,10,10\n")
        args = ["--workload", str(trace)]
    result = invoke("run", *args)
    assert result.exit_code == 0, result.stderr
    assert needle in result.stderr
    assert "0.00  " not in result.stdout.split("Request throughput (req/s):")[1].splitlines()[0]


def test_rejected_requests_are_counted_with_their_reasons_on_stderr(tmp_path):
    # every prompt past max_model_len 8192: all rejected (static batching with --n 2 was the case
    # here; it is refused before the run since round 8, tests/test_reliability_round8.py)
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n" + "".join(f"{i / 5},9000,10\n" for i in range(5)))
    result = invoke("run", "--workload", str(trace))
    assert result.exit_code == 1
    assert "5 of 5 requests rejected (not served):" in result.stderr


# --- Says what it simulated; --version; help; profile without --model; long-context ------------


def test_every_run_says_what_it_simulated():
    result = invoke("run", "--dp", "2", "--tp", "2", *TINY)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        "Simulating: workload sharegpt, 5 requests, poisson arrivals at 5 req/s; llama3-8b on "
        "4 x H100-SXM-80GB (TP 2 x DP 2); policy continuous (paged KV, block 16)"
    )
    closed = invoke("run", "--concurrency", "3", "--num-requests", "5", "--policy", "static", "--json")
    assert "closed loop of 3 clients" in closed.stderr and "policy static (batch 64)" in closed.stderr


def test_the_simulating_line_counts_pipeline_stages_and_names_fp8():
    from kvsim.cli.output import describe_run
    from kvsim.simcore import EngineConfig, get_model

    workload = {"name": "w", "num_requests": 10, "arrival": {"process": "poisson", "rate": 1.0}}
    config = EngineConfig(tensor_parallel_size=8, pipeline_parallel_size=2, data_parallel_size=3,
                          quantization="fp8", kv_cache_dtype="fp8", preemption_mode="swap",
                          enable_chunked_prefill=False)
    model = config.resolve_model(get_model("llama3-70b"))
    line = describe_run(workload, config.to_dict(), model, "H100-SXM-80GB")
    assert "llama3-70b (FP8 weights, FP8 KV cache) on 48 x H100-SXM-80GB (TP 8 x PP 2 x DP 3)" in line
    assert line.endswith("policy continuous (paged KV, block 16, no chunked prefill, swap preemption)")


def test_an_fp8_checkpoint_is_named_by_its_file_and_said_to_be_fp8(tmp_path):
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
              "vocab_size": 128256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
              "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}
    path = tmp_path / "my-llama-fp8.json"
    path.write_text(json.dumps(config))
    result = invoke("run", "--model", str(path), *TINY)
    assert result.exit_code == 0, result.stderr
    assert "; my-llama-fp8 (FP8 weights) on 1 x H100-SXM-80GB" in result.stdout.splitlines()[0]


def test_version():
    from kvsim.simcore.simulate import KVSIM_VERSION

    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"kvsim {KVSIM_VERSION}"


@pytest.mark.parametrize("command", [["run"], ["sweep"], ["profile"], ["workloads", "show"], ["report", "seed-table"]])
def test_help_does_not_cut_flag_names_at_80_columns(command):
    result = invoke(*command, "--help", env={"COLUMNS": "80", "TERM": "dumb"})
    assert result.exit_code == 0
    assert "…" not in result.stdout
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    if command == ["run"]:
        for flag in ("--tensor-parallel-size", "--data-parallel-size", "--gpu-memory-utilization",
                     "--max-num-batched-tokens", "--no-enable-chunked-prefill"):
            assert flag in result.stdout


def test_profile_with_options_but_no_model_is_an_error():
    assert_one_line_error(invoke("profile", "--device", "cpu", "--quick"), "--model is required")
    bare = invoke("profile")
    assert bare.exit_code == 0 and "Usage:" in bare.stdout


def test_long_context_on_an_8k_model_is_refused(no_simulation):
    assert_one_line_error(invoke("run", "--workload", "long-context"),
                          "every prompt (at least 8192 tokens) is longer than max_model_len 8192")


def test_progress_without_a_terminal_prints_a_line_with_an_eta(capsys):
    from kvsim.cli.output import LiveProgress

    progress = LiveProgress("simulating", 1000, "requests finished", period_s=0.0)
    progress.started -= 10.0  # as if 10 s had passed
    progress.update(250)
    progress.stop()
    line = capsys.readouterr().err.strip()
    assert line.startswith("simulating: 250 of 1,000 requests finished (25%), 10 s elapsed, ETA 30 s")


def test_run_progress_reaches_stderr_when_not_a_terminal(monkeypatch):
    import kvsim.cli.output

    monkeypatch.setattr(kvsim.cli.output.LiveProgress, "__init__", _every_update(kvsim.cli.output.LiveProgress.__init__))
    result = invoke("run", "--num-requests", "600", "--rate", "50", "--input-len", "32", "--output-len", "4")
    assert result.exit_code == 0, result.stderr
    assert "simulating: 512 of 600 requests finished (85%)" in result.stderr


def _every_update(init):
    def patched(self, description, total, unit, period_s=10.0):
        init(self, description, total, unit, period_s=0.0)

    return patched


# --- Engine options (issue 9's resolved config) and profiles (issue 8), surfaced as one line ----

PROFILES = Path(__file__).resolve().parents[1] / "profiles"


@pytest.mark.parametrize(("command", "args", "needle"), [
    (command, args, needle)
    for command in ("run", "sweep")
    for args, needle in (
        (["--swap-space", "nan"], "--swap-space must be a finite number"),
        (["--swap-space", "inf"], "--swap-space must be a finite number"),
        (["--policy", "static", "--batch-timeout-s", "nan"], "--batch-timeout-s must be a finite number"),
        (["--profile", str(PROFILES / "A100-80GB-llama3-8b-tp1.json")], "profile is for GPU"),
    )
] + [  # vLLM's cross-field rules: a sweep checks them per point (max_num_seqs may be swept)
    ("run", ["--max-model-len", "1"], "--max-model-len"),
    ("run", ["--max-num-batched-tokens", "8", "--max-num-seqs", "16"], "--max-num-batched-tokens (8) must be >= --max-num-seqs"),
])
def test_engine_and_profile_mistakes_are_one_line(no_simulation, command, args, needle):
    assert_one_line_error(invoke(command, "--num-requests", "5", *args), needle)


def test_running_out_of_memory_is_one_line_and_leaves_no_output(tmp_path, monkeypatch):
    """A MemoryError (the C core's state, a huge run) is the machine's limit, not the input's: one
    line, exit 1, no traceback, and nothing half-written under --out."""
    import kvsim.simcore.simulate as simulate_module

    def out_of_memory(*args, **kwargs):
        raise MemoryError("kvsim: the C engine core could not allocate its state")

    monkeypatch.setattr(simulate_module.Simulation, "run", out_of_memory)  # whichever path kvsim run takes to it
    result = invoke("run", "--num-requests", "5", "--out", str(tmp_path / "run"))
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert result.stderr == ("kvsim: error: out of memory: the C engine core could not allocate its state "
                             "(fewer requests, or a machine with more memory)\n")
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
