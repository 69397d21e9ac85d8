"""Reliability, round 4, by name: an adversarial pass over the surface of the last two sessions
(--slo, sonnet, --speculative-config, disaggregation, --fleet, --autoscale, sessions, new --out
pages, --save-result, Parquet --resume). Each test is named after the case it found; each case
ends in one line on stderr and a non-zero exit before any work, with nothing written (or, where
the input is valid but was mishandled, in the right run). Same style as test_reliability_round3."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers import assert_one_line_error, invoke_cli

TINY = ["--num-requests", "5", "--rate", "5", "--input-len", "64", "--output-len", "8", "--no-error-bars"]
PLAN = ["plan", "--rate", "1", "--gpu", "H100-SXM-80GB", "--tp", "1"]
EAGLE = '{"method": "eagle", "num_speculative_tokens": 3}'
DEEP = "[" * 100_000  # json.loads raises RecursionError, not a decode error
HUGE = "9" * 5000  # past Python's 4,300-digit int() limit: a ValueError naming an interpreter setting
SESSION_HEADER = "arrival_s,num_prompt_tokens,num_output_tokens,session_id"


invoke = invoke_cli


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a simulation, a sweep's points or a plan's search starts."""
    import importlib

    def refuse(*args, **kwargs):
        raise AssertionError("work started for a bad input")

    # modules that bind `prepare` at their import must get the real one, not this test's stand-in
    importlib.import_module("kvsim.simcore.disagg")

    for module, name in (("kvsim.simcore.simulate", "prepare"), ("kvsim.reports.sweep_runner", "run_points"),
                         ("kvsim.reports.plan", "plan")):
        monkeypatch.setattr(importlib.import_module(module), name, refuse)


def entries(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --- --speculative-config and --autoscale-config JSON ------------------------------------------


@pytest.mark.parametrize("argv", [
    ["run", *TINY, "--speculative-config"],
    ["sweep", *TINY[:-1], "--rate", "1,2", "--speculative-config"],
    [*PLAN, "--speculative-config"],
])
def test_speculative_config_nested_too_deeply(argv, no_work):
    """'[[[[...' 100,000 deep: a RecursionError traceback in run and plan."""
    assert_one_line_error(invoke(*argv, DEEP), "--speculative-config", "nested too deeply")


def test_speculative_config_integer_of_thousands_of_digits(no_work):
    """num_speculative_tokens of 5,000 digits: ValueError traceback (Python's int() digit limit)."""
    text = '{"method": "eagle", "num_speculative_tokens": ' + HUGE + "}"
    result = invoke("run", *TINY, "--speculative-config", text)
    assert_one_line_error(result, "--speculative-config", "thousands of digits")
    assert "set_int_max_str_digits" not in result.stderr


def test_speculative_config_repeated_key(no_work):
    """{"method": "eagle", "method": "ngram"}: the last one silently won."""
    text = '{"method": "eagle", "method": "ngram", "num_speculative_tokens": 3}'
    assert_one_line_error(invoke("run", *TINY, "--speculative-config", text), "'method' is given twice")


AUTOSCALE = ["run", "--num-requests", "20", "--rate", "5", "--no-error-bars", "--autoscale"]


@pytest.mark.parametrize(("config", "needle"), [
    (DEEP, "nested too deeply"),
    ('{"target": ' + "9" * 400 + "}", "400 digits"),  # float() of it: OverflowError traceback
    ('{"target": ' + HUGE + "}", "thousands of digits"),
    ('{"target": 1, "target": 2}', "'target' is given twice"),  # the last one silently won
])
def test_autoscale_config_hostile_json(config, needle, no_work):
    assert_one_line_error(invoke(*AUTOSCALE, "--autoscale-config", config), "--autoscale-config", needle)


@pytest.mark.parametrize(("args", "needle"), [
    (["--autoscale-config", '{"metric": "bogus"}'], "--autoscale-config: metric"),  # was --autoscale-metric
    (["--autoscale-config", '{"target": 0}'], "--autoscale-config: target"),  # was --autoscale-target
    (["--autoscale-config", '{"scale_up_cooldown_s": -1}'], "--autoscale-config: scale_up_cooldown_s"),
    (["--autoscale-config", '{"model_load_gbps": 0}'], "--autoscale-config: model_load_gbps"),
    (["--provisioning-delay", "-1"], "--provisioning-delay"),  # was --provisioning-s
])
def test_autoscale_errors_name_flags_that_exist(args, needle, no_work):
    """The messages named --autoscale-metric, --autoscale-target, --provisioning-s...: no such flags."""
    result = invoke(*AUTOSCALE, *args)
    assert_one_line_error(result, needle)
    assert "--autoscale-metric" not in result.stderr and "--provisioning-s " not in result.stderr


def test_provisioning_delay_of_1e308(no_work):
    """Ran, and printed a cold start of a 309-digit number of seconds."""
    assert_one_line_error(invoke(*AUTOSCALE, "--provisioning-delay", "1e308"), "--provisioning-delay", "at most")


# --- requests every run would reject, refused before the run ----------------------------------


@pytest.mark.parametrize("flag", ["--n", "--beam-width"])
def test_parallel_samples_with_speculative_config(flag, no_work):
    """Ran, rejected all 5 requests, then 3 lines on stderr after a printed header."""
    result = invoke("run", *TINY, "--speculative-config", EAGLE, flag, "2")
    assert_one_line_error(result, f"{flag} 2", "speculative decoding")


@pytest.mark.parametrize("flag", ["--n", "--beam-width"])
def test_parallel_samples_with_disaggregation(flag, no_work):
    """Ran, rejected every request (one sequence per request in a disaggregated run)."""
    result = invoke("run", *TINY, "--prefill-replicas", "1", "--decode-replicas", "1", flag, "2")
    assert_one_line_error(result, f"{flag} 2", "disaggregated")


@pytest.mark.parametrize("flag", ["--prefill-tp", "--decode-tp"])
def test_pool_tp_of_zero(flag, no_work):
    """`--prefill-tp 0` ran as `--tp` (0 read as unset) while -2 was refused."""
    result = invoke("run", *TINY, "--prefill-replicas", "1", "--decode-replicas", "1", flag, "0")
    assert_one_line_error(result, "must be positive, got 0")


# --- plan --disagg ---------------------------------------------------------------------------


@pytest.mark.parametrize(("ratios", "needle"), [("", "got ''"), ("1:1,", "got ''"), ("1:2,1:2", "listed twice")])
def test_disagg_ratios_empty_or_repeated(ratios, needle, no_work):
    """'' planned the default ratios (--tp '' is refused); 1:2,1:2 searched the same unit twice."""
    assert_one_line_error(invoke(*PLAN, "--disagg", "on", "--disagg-ratios", ratios), "--disagg-ratios", needle)


def test_plan_disagg_on_with_speculative_config(no_work):
    """Exit 0: every disaggregated candidate ran without the speculation asked for (run refuses it)."""
    result = invoke(*PLAN, "--disagg", "on", "--speculative-config", EAGLE)
    assert_one_line_error(result, "--speculative-config", "disaggregated")


# --- sessions --------------------------------------------------------------------------------


@pytest.mark.parametrize("column", ["beam_width", "n", "max_tokens", "prefix_id"])
def test_session_trace_with_a_per_request_column(tmp_path, column, no_work):
    """A session trace's beam_width (n, max_tokens, prefix_id...) column was dropped without a word."""
    trace = tmp_path / "s.csv"
    trace.write_text(f"{SESSION_HEADER},{column}\n0,100,10,1,2\n0.5,50,10,1,2\n")
    before = entries(tmp_path)
    assert_one_line_error(invoke("run", "--workload", str(trace), "--no-error-bars"), "s.csv", repr(column),
                          "session trace")
    assert entries(tmp_path) == before


def _sessions_yaml(path: Path, num_sessions: str = "3", turns: str = "3", prompt_len: str = "50") -> Path:
    path.write_text(f"sessions:\n  num_sessions: {num_sessions}\n  turns: {turns}\n  think_time_s: 1\n"
                    f"arrival: {{process: poisson, rate: 0.5}}\nprompt_len: {prompt_len}\noutput_len: 20\n")
    return path


@pytest.mark.parametrize("how", ["yaml", "flag"])
def test_a_trillion_sessions(tmp_path, how, no_work):
    """num_sessions 1e12: the header printed, then 'out of memory ... 7.28 TiB' (exit 1)."""
    if how == "yaml":
        argv = ["run", "--workload", str(_sessions_yaml(tmp_path / "w.yaml", num_sessions="1000000000000"))]
    else:
        argv = ["run", "--workload", "chat-sessions", "--num-requests", "1000000000000"]
    assert_one_line_error(invoke(*argv, "--no-error-bars"), "at most 10,000,000 sessions")


def test_session_first_prompt_never_fits(tmp_path, no_work):
    """prompt_len 100000 (max_model_len 8192): a WARNING, a header, then 'no request was served
    (0 of 0 rejected)'; a session trace whose every first turn is too long likewise."""
    wl = _sessions_yaml(tmp_path / "w.yaml", prompt_len="100000")
    assert_one_line_error(invoke("run", "--workload", str(wl), "--no-error-bars"), "first prompt", "max_model_len 8,192")
    trace = tmp_path / "s.csv"
    trace.write_text(f"{SESSION_HEADER}\n0,3000,10,1\n0.5,3000,10,2\n")
    result = invoke("run", "--workload", str(trace), "--max-model-len", "2000", "--no-error-bars")
    assert_one_line_error(result, "first prompt", "max_model_len 2,000")


def test_session_of_a_hundred_million_turns(tmp_path):
    """turns: 100000000 drew 1e8 turns per session up front (over a minute, gigabytes) although
    no turn past max_model_len / 2 can be sent; now it runs at once and says the sessions ended."""
    wl = _sessions_yaml(tmp_path / "w.yaml", turns="100000000")
    started = time.monotonic()
    result = invoke("run", "--workload", str(wl), "--no-error-bars", "--max-model-len", "2048")
    assert result.exit_code == 0, result.stderr
    assert time.monotonic() - started < 10
    assert "3 of 3 sessions ended early" in result.stderr


# --- --save-result and Parquet --resume ------------------------------------------------------


def test_save_result_over_a_file_kvsim_did_not_write(tmp_path, monkeypatch, no_work):
    """`--result-filename /etc/passwd` (as root) replaced the file whole after the run; any
    existing file that is not a kvsim result (or a symlink) is now refused before any work."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.json").write_text("precious\n")
    (tmp_path / "link.json").symlink_to("mine.json")
    for name in ("mine.json", "link.json", str(tmp_path / "mine.json")):
        assert_one_line_error(invoke("run", *TINY, "--save-result", "--result-filename", name),
                              "exists and is not a kvsim result file")
    assert (tmp_path / "mine.json").read_text() == "precious\n"
    assert entries(tmp_path) == ["link.json", "mine.json"]


def test_save_result_replaces_its_own_result(tmp_path, monkeypatch):
    """A rerun with the same --result-filename still replaces the previous kvsim result."""
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        result = invoke("run", *TINY, "--save-result", "--result-filename", "r.json")
        assert result.exit_code == 0, result.stderr
    assert entries(tmp_path) == ["r.json"]


def test_save_result_into_a_dangling_symlink(tmp_path, monkeypatch, no_work):
    """`--result-dir D`, D a symlink to nothing: the run printed everything, then 'cannot write it
    (File exists)'."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dang").symlink_to(tmp_path / "nothing" / "here")
    assert_one_line_error(invoke("run", *TINY, "--save-result", "--result-dir", "dang"), "symlink to nothing")
    assert entries(tmp_path) == ["dang"]


def test_resume_parquet_with_a_bad_cell(tmp_path, monkeypatch):
    """A finished Parquet table with a bad cell: the error named the hidden journal
    `.x.parquet.rows.csv`, which stayed behind; now it names the table and leaves nothing."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    monkeypatch.chdir(tmp_path)
    sweep = ["sweep", "--num-requests", "3", "--rate", "1,2", "--input-len", "32", "--output-len", "4", "--out", "x.parquet"]
    assert invoke(*sweep).exit_code == 0
    frame = pd.read_parquet("x.parquet")
    frame["seed"] = frame["seed"].astype(str) + "x"
    frame.to_parquet("x.parquet")
    before = (tmp_path / "x.parquet").read_bytes()
    result = invoke(*sweep, "--resume")
    assert_one_line_error(result, "x.parquet, row 1: seed", "expected a whole number")  # (round 8: its row named)
    assert ".x.parquet.rows.csv" not in result.stderr
    assert entries(tmp_path) == ["x.parquet"] and (tmp_path / "x.parquet").read_bytes() == before



# --- --dataset-name --------------------------------------------------------------------------


@pytest.mark.parametrize(("dataset", "count"), [("sonnet", "0"), ("sonnet", "-5"), ("random", "0")])
def test_dataset_with_zero_requests(dataset, count, no_work):
    """`--dataset-name sonnet --num-requests 0` ran vLLM's default 1,000 requests (0 read as unset);
    a plain run refuses 0."""
    assert_one_line_error(invoke("run", "--dataset-name", dataset, "--num-requests", count, "--no-error-bars"),
                          f"--num-requests must be an integer >= 1, got {count}")


@pytest.mark.parametrize("flag", ["--sonnet-output-len", "--output-len"])
def test_sonnet_output_longer_than_max_model_len(flag, no_work):
    """Ran with every output clipped to max_model_len (a WARNING after the run); --random-output-len
    of the same length is refused up front."""
    result = invoke("run", "--dataset-name", "sonnet", flag, "100000000", "--num-requests", "3", "--no-error-bars")
    assert_one_line_error(result, f"{flag} 100000000", "max_model_len 8192")


# --- plan ------------------------------------------------------------------------------------


@pytest.mark.parametrize("confidence", ["1e-300", "0.9995"])
def test_plan_confidence_in_the_far_tails(confidence, no_work):
    """`--confidence 1e-300` printed the plan's header, then refused the committed profile scaled
    x0.007 as 'over 10x faster than the datasheet': a late, confusing line."""
    assert_one_line_error(invoke(*PLAN, "--confidence", confidence), "--confidence must be from 0.001 to 0.999")


def test_plan_disagg_auto_on_a_session_workload_refused_before_the_header(no_work):
    """The refusal came after the 'Planning ...' header on stdout."""
    assert_one_line_error(invoke(*PLAN, "--workload", "chat-sessions", "--disagg", "auto"), "session workloads")


@pytest.mark.parametrize(("prices", "needle"), [
    (["H100-SXM-80GB=1e308"], "at most 1,000,000"),  # printed a 309-digit $/h
    (["H100-SXM-80GB=1", "H100-SXM-80GB=2"], "given twice"),  # the first silently replaced
])
def test_plan_price_absurd_or_repeated(prices, needle, no_work):
    argv = [*PLAN]
    for price in prices:
        argv += ["--price", price]
    assert_one_line_error(invoke(*argv), "--price", needle)


def test_autoscale_price_of_1e308(no_work):
    result = invoke(*AUTOSCALE, "--autoscale-config", '{"price_usd_per_gpu_hour": 1e308}')
    assert_one_line_error(result, "price_usd_per_gpu_hour", "at most")


@pytest.mark.parametrize("layout", [["--allocator", "contiguous"], ["--policy", "static"]])
def test_autoscale_on_kv_without_a_paged_cache(layout, no_work):
    """The refusal came once the replicas were built, after the run's header on stdout."""
    result = invoke(*AUTOSCALE, "--autoscale-config", '{"metric": "kv", "target": 80}', *layout)
    assert_one_line_error(result, "metric kv needs the paged KV cache")
