"""Issue 23 (reliability, round 3), by name: every case of the adversarial pass ends in one line on
stderr and a non-zero exit, writes nothing, loses nothing and leaves no process behind. Each test
is named after its case and drives the real CLI: the typer app in process (as
tests/test_bad_inputs.py does) or, where a signal or a second process is the case, `python -m
kvsim.cli.main` in a subprocess (as tests/test_sweep_parallel.py does), always bounded in time."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--num-requests", "5", "--rate", "5", "--input-len", "64", "--output-len", "8"]
HF_SHAPE = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 688, "vocab_size": 1024, "max_position_embeddings": 2048}
GOOD_YAML = "num_requests: 10\narrival: {process: poisson, rate: 2}\nprompt_len: 10\noutput_len: 10\n"
HUGE = "9" * 400  # a 400-digit integer
MEASURED_HEADER = "tp,batch_size,input_len,output_len,latency_ms\n"


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


def assert_one_line_error(result, *needles: str, code: int = 2) -> None:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr
    assert err.startswith("kvsim: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a simulation, a sweep's points, a plan's search or a calibration's pricing
    starts: each case here must be refused before any work."""
    import importlib

    def refuse(*args, **kwargs):
        raise AssertionError("work started for a bad input")

    for module, name in (("kvsim.simcore.simulate", "prepare"), ("kvsim.reports.sweep_runner", "run_points"),
                         ("kvsim.reports.plan", "plan"), ("kvsim.profiles.calibrate", "price_all")):
        monkeypatch.setattr(importlib.import_module(module), name, refuse)


def entries(folder: Path) -> list[str]:
    """Every entry below `folder`, hidden ones included (what a command must not leave behind)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _default_sigint() -> None:
    """In the child: SIGINT as a terminal gives it. A shell without job control starts background
    commands with SIGINT ignored, and Python then installs no handler (nor would kvsim be asked
    to handle one)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kvsim_process(*args: str, cwd: Path = ROOT, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "kvsim.cli.main", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint, **kwargs)


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def signal_run_out_new(tmp_path: Path, sig: int) -> tuple[int, str]:
    """(exit code, stderr) of `run --out NEW` sent `sig` once it is simulating (its staging exists)."""
    proc = kvsim_process("run", "--num-requests", "2000000", "--rate", "500", "--out", str(tmp_path / "NEW"),
                         cwd=tmp_path)
    wait_for(lambda: any(p.name.startswith(".NEW.kvsim-") for p in tmp_path.iterdir()), 60, "the staging folder")
    time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def children_of(pid: int) -> list[int]:
    """Live processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# --- Tracebacks and memory --------------------------------------------------------------------


def test_out_under_a_symlink_loop(tmp_path, monkeypatch, no_work):
    """`--out loop1/sub`, loop1 a symlink to itself: Path.resolve raises RuntimeError on 3.11."""
    monkeypatch.chdir(tmp_path)
    os.symlink("loop1", tmp_path / "loop1")
    for argv in (["run", *TINY, "--out", "loop1/sub"], ["sweep", *TINY, "--block-size", "16,32", "--out", "loop1/x.csv"],
                 ["plan", "--rate", "1", "--gpu", "H100-SXM-80GB", "--tp", "1", "--out", "loop1/sub"]):
        assert_one_line_error(invoke(*argv), "--out loop1/", "symlink loop")
    assert entries(tmp_path) == ["loop1"]


@pytest.mark.parametrize("flag", ["--num-requests", "--max-num-batched-tokens", "--max-num-seqs", "--seed",
                                  "--input-len", "--concurrency"])
def test_num_requests_of_400_digits(flag, no_work):
    """An integer flag of 400 digits: OverflowError in float() before; now a bound named with the flag."""
    args = ["run", "--num-requests", "5", flag, HUGE]
    if flag == "--num-requests":
        args = ["run", flag, HUGE]
    result = invoke(*args)
    assert_one_line_error(result, flag, "at most")
    assert len(result.stderr) < 300  # the value is cut, not printed whole


def test_profile_dev_zero_and_links_to_it_are_refused_unread(tmp_path, no_work):
    """`--profile /dev/zero`, or a model config / profile symlinked to it, read 4.4 GB and growing:
    a file kvsim reads must be a regular file."""
    os.symlink("/dev/zero", tmp_path / "zero.json")
    for argv, needle in (
        (["run", *TINY, "--profile", "/dev/zero"], "/dev/zero"),
        (["run", *TINY, "--profile", str(tmp_path / "zero.json")], "zero.json"),
        (["run", *TINY, "--model", str(tmp_path / "zero.json")], "zero.json"),
        (["sweep", *TINY, "--block-size", "16,32", "--profile", "/dev/zero"], "/dev/zero"),
    ):
        started = time.monotonic()
        assert_one_line_error(invoke(*argv), needle, "not a regular file")
        assert time.monotonic() - started < 5


def test_every_file_kvsim_reads_is_bounded(tmp_path, no_work):
    """FIFOs and devices everywhere a file is read (profiles, model configs, workload YAML, traces,
    calibrate measurements, sweep tables, price files), and a sparse file past its kind's cap."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for name in ("t.csv", "w.yaml", "m.csv", "table.csv", "prices.yaml", "p.json", "config.json"):
        os.symlink(fifo, tmp_path / name)
    d = str(tmp_path)
    cases = [
        ["run", *TINY, "--profile", f"{d}/p.json"], ["run", *TINY, "--model", f"{d}/config.json"],
        ["run", *TINY[:2], "--workload", f"{d}/w.yaml"], ["run", *TINY[:2], "--workload", f"{d}/t.csv"],
        ["calibrate", f"{d}/m.csv", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--out", f"{d}/cal"],
        ["report", "sweep", f"{d}/table.csv", "--out", f"{d}/rep"],
        ["plan", "--rate", "1", "--gpu", "H100-SXM-80GB", "--tp", "1", "--price", f"{d}/prices.yaml"],
        ["profile", "check", f"{d}/m.csv", "--profile", f"{d}/p.json"],
    ]
    before = entries(tmp_path)
    for argv in cases:
        started = time.monotonic()
        result = invoke(*argv)
        assert result.exit_code == 2 and "Traceback" not in result.stderr, (argv, result.stderr)
        assert result.stderr.startswith("kvsim: error: ") and result.stderr.count("\n") == 1, (argv, result.stderr)
        assert "regular file" in result.stderr, (argv, result.stderr)
        assert time.monotonic() - started < 5, argv  # opened without waiting for a writer
    assert entries(tmp_path) == before
    big = tmp_path / "big" / "config.json"
    big.parent.mkdir()
    with open(big, "wb") as f:  # sparse: 5 MiB on paper, nothing on disk
        f.truncate(5 << 20)
    assert_one_line_error(invoke("run", *TINY, "--model", str(big)), "config.json", "larger than the 4 MiB")


def test_read_bytes_caps_and_kinds(tmp_path):
    from kvsim.simcore.userfiles import CAPS, RefusedFile, read_bytes

    small = tmp_path / "a.json"
    small.write_text("{}")
    assert read_bytes(small, "profile") == b"{}"
    with pytest.raises(IsADirectoryError):
        read_bytes(tmp_path, "profile")
    with pytest.raises(RefusedFile, match="character device"):
        read_bytes("/dev/zero", "trace")
    sparse = tmp_path / "big.yaml"
    with open(sparse, "wb") as f:
        f.truncate(CAPS["workload file"] + 1)
    with pytest.raises(RefusedFile, match="larger than"):
        read_bytes(sparse, "workload file")


def test_ctrl_c_during_imports_says_interrupted():
    """A Ctrl-C while `kvsim` imports typer and the command (the first ~0.3 s) was a
    KeyboardInterrupt traceback: the import is made to raise it, deterministically."""
    code = (
        "import builtins, sys\n"
        "real = builtins.__import__\n"
        "def imp(name, *a, **k):\n"
        "    if name == 'typer':\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = imp\n"
        "from kvsim.cli.main import main\n"
        "sys.argv = ['kvsim', 'run']\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 130 and done.stderr == "kvsim: interrupted\n", (done.returncode, done.stderr)


def test_ctrl_c_at_any_moment_of_start_up(tmp_path):
    """Real SIGINTs at several moments once the console script's wrapper has imported `main`
    (`from kvsim.cli.main import main`: that module imports only `sys`), while typer and the
    command import and while the run sets up: exactly one line and 130 each time. (Earlier, in
    the interpreter's own start-up, a SIGINT is Python's, before any kvsim code runs.)"""
    code = ("import sys\nfrom kvsim.cli.main import main\nprint('ready', flush=True)\n"
            f"sys.argv = ['kvsim', 'run', '--num-requests', '200000', '--rate', '50', '--out', {str(tmp_path / 'o')!r}]\n"
            "main()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for delay in (0.0, 0.05, 0.15, 0.3):
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
        assert proc.stdout.readline() == "ready\n"
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and err.endswith("kvsim: interrupted\n"), (delay, proc.returncode, err)
        assert "Traceback" not in err and err.count("kvsim: interrupted") == 1, err
    assert entries(tmp_path) == []


def test_ctrl_c_of_run_out_new_leaves_nothing(tmp_path):
    """Ctrl-C of `run --out NEW` once the run is simulating: one line, exit 130, no NEW, no staging."""
    returncode, err = signal_run_out_new(tmp_path, signal.SIGINT)
    assert returncode == 130, (returncode, err)
    assert err.endswith("kvsim: interrupted\n") and "Traceback" not in err, err
    assert entries(tmp_path) == []


# --- Wrong acceptances and late refusals ------------------------------------------------------


@pytest.mark.parametrize(("flag", "value"), [("--burstiness", "1e-320"), ("--burstiness", "1e-300"),
                                             ("--burstiness", "1e-5"), ("--rate", "1e-320")])
def test_burstiness_and_rate_1e_320_are_bounded_up_front(flag, value, no_work):
    assert_one_line_error(invoke("run", "--num-requests", "5", flag, value), flag, "must be from")


def test_burstiness_in_workload_yaml_is_bounded(tmp_path, no_work):
    path = tmp_path / "w.yaml"
    path.write_text(GOOD_YAML.replace("{process: poisson, rate: 2}", "{process: gamma, rate: 2, burstiness: 1e-320}"))
    assert_one_line_error(invoke("run", "--workload", str(path)), "w.yaml", "arrival.burstiness")


@pytest.mark.parametrize(("flag", "value"), [("--beam-width", "1000000"), ("--n", "2000")])
def test_beam_width_or_n_wider_than_max_num_seqs(flag, value, no_work):
    """Every request would be rejected after the whole run: refused before it, for run and sweep
    (the default engine's limit on an H100 is vLLM V1's 1024 sequences)."""
    assert_one_line_error(invoke("run", *TINY, flag, value), f"{flag} {value}", "--max-num-seqs 1024")
    assert_one_line_error(invoke("sweep", *TINY, "--block-size", "16,32", flag, value), flag, "--max-num-seqs 1024")
    assert_one_line_error(invoke("run", *TINY, flag, "32", "--max-num-seqs", "16"), f"{flag} 32", "--max-num-seqs 16")


def test_beam_width_within_a_step_still_runs():
    result = invoke("run", *TINY, "--beam-width", "4", "--max-num-seqs", "4")
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("rows", ["1,1,128,16,250\n", "1,4,128,16,300\n" * 6])
def test_calibrate_one_row_or_six_identical_rows(tmp_path, rows, no_work):
    """8 terms fitted to one run, and a "leave-one-out 0.0%" that checked the fit against itself."""
    path = tmp_path / "m.csv"
    path.write_text(MEASURED_HEADER + rows)
    result = invoke("calibrate", str(path), "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--out", str(tmp_path / "o"))
    assert_one_line_error(result, "m.csv", "distinct", "cannot fit")
    assert entries(tmp_path) == ["m.csv"]


def test_mixtral_config_with_zero_experts(tmp_path, no_work):
    """`num_local_experts: 0, num_experts_per_tok: 2` ran as a dense model."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF_SHAPE, "num_local_experts": 0, "num_experts_per_tok": 2}))
    assert_one_line_error(invoke("run", *TINY, "--model", str(path)), "config.json", "'num_local_experts'")
    path.write_text(json.dumps({**HF_SHAPE, "num_local_experts": 2, "num_experts_per_tok": 4}))
    assert_one_line_error(invoke("run", *TINY, "--model", str(path)), "num_experts_per_tok (4)")


@pytest.mark.parametrize("header", ["arrival_s,num_prompt_tokens,num_output_tokens,num_prompt_tokens",
                                    "TIMESTAMP,ContextTokens,GeneratedTokens,GeneratedTokens"])
def test_trace_csv_with_a_duplicated_column(tmp_path, header, no_work):
    """pandas renames the second `x` to `x.1`, so it was silently ignored."""
    path = tmp_path / "t.csv"
    row = "0,10,10,99" if header.startswith("arrival") else "2023-11-16 18:15:46,10,10,99"
    path.write_text(f"{header}\n{row}\n")
    assert_one_line_error(invoke("run", "--workload", str(path)), "t.csv", "line 1", "given twice")


def test_plan_on_a_trace_with_prompts_longer_than_max_model_len(tmp_path, no_work):
    """`kvsim plan` said "TTFT >= 1.49e9 ms" and exit 0; `run` says every request is rejected, and why."""
    trace = tmp_path / "long.csv"
    trace.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n0,100000,10\n1,100000,10\n2,90000,10\n")
    result = invoke("plan", "--workload", str(trace), "--rate", "1", "--gpu", "H100-SXM-80GB", "--tp", "1",
                    "--slo-ttft-p95-ms", "1000", "--out", str(tmp_path / "P"))
    assert_one_line_error(result, "long.csv", "longer than max_model_len 8192", "rejects them")
    assert entries(tmp_path) == ["long.csv"]


def test_plan_sizes_for_the_served_requests_of_a_partly_too_long_trace(tmp_path):
    """Some prompts too long: a warning, and the TTFT bound counts only the requests served."""
    lines = ["arrival_s,num_prompt_tokens,num_output_tokens"]
    lines += [f"{i * 0.5},{100000 if i % 10 == 0 else 200},{50}" for i in range(200)]
    trace = tmp_path / "mix.csv"
    trace.write_text("\n".join(lines) + "\n")
    result = invoke("plan", "--workload", str(trace), "--rate", "1", "--gpu", "H100-SXM-80GB", "--tp", "1",
                    "--slo-ttft-p95-ms", "1000", "--search-requests", "100", "--confirm-requests", "100", "--json")
    assert result.exit_code == 0, result.stderr
    assert "WARNING 20 of 200 trace rows have prompts longer than max_model_len 8192" in result.stderr
    doc = json.loads(result.stdout)
    assert all("prefill" not in str(c.get("status")) for c in doc["candidates"]), doc["candidates"]


def test_calibrate_batch_size_100000000_names_no_flag_calibrate_lacks(tmp_path, no_work):
    path = tmp_path / "m.csv"
    path.write_text(MEASURED_HEADER + "1,100000000,128,16,250\n1,4,128,16,300\n")
    result = invoke("calibrate", str(path), "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--out", str(tmp_path / "o"))
    assert_one_line_error(result, "m.csv:2", "batch_size 100,000,000")
    assert "--max-num" not in result.stderr  # calibrate has no such flags
    assert entries(tmp_path) == ["m.csv"]


# --- Writes -------------------------------------------------------------------------------------

SWEEP = ["sweep", "--block-size", "8,16", "--rate", "5", "--num-requests", "20", "--input-len", "64",
         "--output-len", "8", "--jobs", "1"]


def _table_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_a_second_sweep_on_a_locked_table_is_refused(tmp_path):
    """The table is locked for the whole sweep: a second sweep started meanwhile is refused at once."""
    from kvsim.reports.sweep_table import SweepTable

    out = tmp_path / "x.csv"
    holder = SweepTable(out)
    holder.open("other-sweep", resume=False)  # a sweep in progress
    try:
        result = invoke(*SWEEP, "--out", str(out))
        assert_one_line_error(result, f"--out {out}", "another kvsim sweep is writing this table")
        assert out.read_text() == ""  # the holder's table, untouched
    finally:
        holder.close()
    assert entries(tmp_path) == []  # the holder wrote no row: its empty table and lock file are gone


def test_two_sweeps_started_at_once_on_one_out(tmp_path):
    """Both exited 0 and the table mixed both sweeps or lost one's rows: now exactly one writes it."""
    out = tmp_path / "x.csv"
    first = kvsim_process(*SWEEP, "--out", str(out))
    second = kvsim_process(*SWEEP[:-4], "--output-len", "16", "--jobs", "1", "--out", str(out))  # another sweep
    results = [(p.wait(timeout=120), p.communicate()[1]) for p in (first, second)]
    codes = sorted(code for code, _ in results)
    assert codes[0] == 0 and codes[1] == 2, results
    refused = next(err for code, err in results if code == 2)
    assert refused.startswith("kvsim: error: --out") and refused.count("\n") == 1, refused
    assert "another kvsim sweep" in refused or "exists" in refused, refused
    rows = _table_rows(out)
    assert len(rows) == 2 and len({r["sweep_id"] for r in rows}) == 1 and len({r["point_id"] for r in rows}) == 2
    assert entries(tmp_path) == ["x.csv"]  # no lock file or temporary left


def test_resume_on_a_table_with_a_duplicated_row(tmp_path):
    out = tmp_path / "x.csv"
    assert invoke(*SWEEP, "--out", str(out)).exit_code == 0
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines + [lines[2]]))  # row 2 given twice
    result = invoke(*SWEEP, "--out", str(out), "--resume")
    assert result.exit_code == 0, result.stderr
    rows = _table_rows(out)
    assert len(rows) == 2 and len({r["point_id"] for r in rows}) == 2


def test_refused_commands_leave_no_empty_out_folder(tmp_path, no_work):
    """`plan --workload BAD --out D` and `calibrate` refusing a row left an empty D behind."""
    d = str(tmp_path)
    (tmp_path / "m.csv").write_text(MEASURED_HEADER + "1,1,128,16,250\n1,4,128,16,abc\n")
    for argv in (
        ["plan", "--rate", "1", "--gpu", "H100-SXM-80GB", "--tp", "1", "--workload", "BAD", "--out", f"{d}/D"],
        ["calibrate", f"{d}/m.csv", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB", "--out", f"{d}/C/sub"],
        ["run", *TINY, "--workload", "BAD", "--out", f"{d}/R/a/b"],
    ):
        result = invoke(*argv)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, (argv, result.stderr)
    assert entries(tmp_path) == ["m.csv"]


def test_sigkill_of_run_out_leaves_staging_that_the_next_run_removes(tmp_path):
    """SIGKILL runs no clean-up: the staging folder stays (12.7 MB after 14 s in the issue); the
    next write beside it removes it, since its pid is dead."""
    proc = kvsim_process("run", "--num-requests", "2000000", "--rate", "500", "--out", str(tmp_path / "D"))
    wait_for(lambda: any(p.name.startswith(".D.kvsim-") for p in tmp_path.iterdir()), 60, "the staging folder")
    proc.kill()
    proc.communicate(timeout=30)
    stale = [p.name for p in tmp_path.iterdir()]
    assert len(stale) == 1 and stale[0].startswith(f".D.kvsim-{proc.pid}-"), stale
    result = invoke("run", *TINY, "--out", str(tmp_path / "D"))
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["D"]
    assert sorted(p.name for p in (tmp_path / "D").iterdir()) == ["requests.csv", "steps.csv", "summary.json"]


def test_stale_staging_of_live_processes_and_other_names_is_kept(tmp_path):
    from kvsim.reports.files import remove_stale

    dead = dead_pid()
    for name in (f".D.kvsim-{dead}-abc", f".D.kvsim-{os.getppid()}-abc", f".E.kvsim-{dead}-abc", ".D.kvsim-xyz",
                 f".D.csv.kvsim-{dead}-tmp"):
        (tmp_path / name).mkdir()
    remove_stale(tmp_path, "D")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f".D.kvsim-{os.getppid()}-abc", f".E.kvsim-{dead}-abc", ".D.kvsim-xyz", f".D.csv.kvsim-{dead}-tmp"])


@pytest.mark.parametrize("content", [{"notes.txt": "mine"}, {"simcore/__init__.py": ""},
                                     {"summary.json": '{"not": "kvsim"}'}, {".bashrc": "x"}])
def test_out_that_is_a_non_empty_folder_kvsim_did_not_write(tmp_path, content, no_work):
    """A home-like folder, a source tree, a summary.json of someone else's: the whole folder would
    have been swapped for a new one. Refused, and left exactly as it was."""
    out = tmp_path / "home"
    for name, text in content.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    before = entries(tmp_path)
    for argv in (["run", *TINY], ["plan", "--rate", "1", "--gpu", "H100-SXM-80GB", "--tp", "1"]):
        assert_one_line_error(invoke(*argv, "--out", str(out)), f"--out {out}", "no kvsim result")
    assert entries(tmp_path) == before


def test_every_folder_output_name_is_known_as_a_kvsim_result():
    """A folder one kvsim command wrote may be reused by another: each command's file list is in
    reports.files.KVSIM_OUTPUT_NAMES."""
    from kvsim.cli.output import RUN_FILES
    from kvsim.cli.plan_cmd import PLAN_FILES
    from kvsim.reports import seed_table, sweep_report
    from kvsim.reports.files import KVSIM_OUTPUT_NAMES

    for names in (RUN_FILES, ("rates.csv", "max_rate.json"), PLAN_FILES, seed_table.FILES, sweep_report.FILES,
                  ("autoscale.png", "autoscale.html", "fleet.html")):
        assert set(names) <= KVSIM_OUTPUT_NAMES, set(names) - KVSIM_OUTPUT_NAMES


def test_out_that_holds_a_previous_kvsim_result_is_reused(tmp_path):
    out = tmp_path / "exp"
    assert invoke("run", *TINY, "--out", str(out)).exit_code == 0
    (out / "notes.txt").write_text("mine")  # the user's own file beside the result: carried over
    result = invoke("run", *TINY, "--seed", "1", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "summary.json").read_text())["record"]["seed"] == 1


# --- Processes and names ------------------------------------------------------------------------


def test_sigkill_of_sweep_leaves_no_orphan_workers(tmp_path):
    """The pool's workers outlived a SIGKILLed `kvsim sweep` (still running 10 minutes later);
    they now exit with their parent (PR_SET_PDEATHSIG, and a parent watchdog)."""
    proc = kvsim_process("sweep", "--block-size", "8,16,32", "--rate", "50,60", "--num-requests", "300000",
                         "--jobs", "2", "--out", str(tmp_path / "x.csv"))
    workers: list[int] = []

    def two_workers() -> bool:
        workers[:] = children_of(proc.pid)
        return len(workers) >= 2

    wait_for(two_workers, 60, "two pool workers")
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [w for w in workers if alive(w)]
    for w in left:  # never leave them to the rest of the suite
        os.kill(w, signal.SIGKILL)
    assert not left, f"workers {left} outlived their parent"


def test_catalog_model_name_wins_over_a_same_named_folder(tmp_path, monkeypatch):
    """`./llama3-8b/` in the current directory broke a plain `kvsim run` (the default model)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama3-8b").mkdir()
    (tmp_path / "llama3-8b" / "config.json").write_text("not json")
    result = invoke("run", *TINY, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["record"]["model"]["name"] == "llama3-8b"
    for explicit in ("./llama3-8b", "llama3-8b/config.json", f"{tmp_path}/llama3-8b"):
        assert_one_line_error(invoke("run", *TINY, "--model", explicit), "model config", "config.json")


def test_catalog_workload_name_wins_over_a_same_named_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sharegpt").write_text("not: [a workload")
    result = invoke("workloads", "show", "sharegpt", "--num-requests", "10")
    assert result.exit_code == 0, result.stderr
    assert_one_line_error(invoke("workloads", "show", "./sharegpt"), "workload file sharegpt", "invalid YAML")


def test_fifo_or_dev_zero_as_a_workload(tmp_path, no_work):
    """It exists; it is not a regular file (was: "does not exist")."""
    fifo = tmp_path / "w.yaml"
    os.mkfifo(fifo)
    os.symlink("/dev/zero", tmp_path / "z.csv")
    for path in (str(fifo), "/dev/zero", str(tmp_path / "z.csv")):
        result = invoke("run", "--num-requests", "5", "--workload", path)
        assert_one_line_error(result, path, "not a regular file")
        assert "does not exist" not in result.stderr


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "yes"])
def test_yaml_beam_width_0(tmp_path, value, no_work):
    """`beam_width: 0` said "must be a mapping, got 0"; it must be an integer >= 1."""
    path = tmp_path / "w.yaml"
    path.write_text(GOOD_YAML + f"beam_width: {value}\n")
    result = invoke("run", "--workload", str(path))
    assert_one_line_error(result, "w.yaml", "'beam_width' must be an integer from 1")
    assert "mapping" not in result.stderr
