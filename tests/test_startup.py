"""Start-up and per-run setup (issue 10): what `kvsim run` imports, option values converted
without pydantic, and the pandas-free trace reader.

The peer target counts the whole process, so `kvsim run` must not import what it does not use
(pandas, matplotlib, ray, torch, pydantic); plain option values are converted as typer's pydantic
adapters convert them, and a plain trace CSV is read without pandas, giving exactly the Trace the
pandas reader gives (anything unusual still goes through typer / pandas, which word the errors).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.simcore.errors import WorkloadError
from kvsim.workloads import traces
from kvsim.workloads.catalog import DATA_DIR

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("pandas", "matplotlib", "pyarrow", "ray", "torch", "scipy", "pydantic")  # pydantic: cli/coercion.py
SIMULATION = ("numpy", "simpy", "yaml", "numpy.ma")  # what a run needs (numpy.ma: never), help does not


def _modules_after(args: list[str]) -> dict:
    """Run `kvsim ARGS` (the console script's main) in a fresh interpreter: its exit code, the
    heavy modules and the command modules it imported."""
    code = (
        "import json, sys\n"
        "from cli.main import main\n"
        f"sys.argv = ['kvsim', *{args!r}]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        f"simulation = sorted(m for m in {SIMULATION!r} if m in sys.modules)\n"
        "commands = sorted(m for m in sys.modules if m.startswith('kvsim.cli.') and m.endswith('_cmd'))\n"
        "print(json.dumps({'code': code, 'heavy': heavy, 'commands': commands, 'simulation': simulation}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [
    ["run", "--num-requests", "5", "--json"],
    ["run", "--model", "llama2-70b", "--tp", "4", "--workload", "benchmarks/peer-azure-conv.yaml", "--rate", "4",
     "--max-num-seqs", "128", "--max-num-batched-tokens", "4096", "--no-enable-chunked-prefill",
     "--no-enable-prefix-caching", "--num-requests", "5", "--json"],
    ["run", "--help"],
])
def test_run_imports_neither_heavy_libraries_nor_other_commands(args):
    seen = _modules_after(args)
    assert {k: seen[k] for k in ("code", "heavy", "commands")} == {"code": 0, "heavy": [], "commands": ["kvsim.cli.run_cmd"]}
    # help needs no simulation library; a run numpy and PyYAML (its workload is a YAML file), and
    # SimPy only when the Python engine runs it (these two run in the compiled core where it
    # builds); never numpy.ma (simcore.quantiles computes np.median's and np.percentile's values without it)
    from kvsim.simcore import ccore

    run_lib = ["numpy", "yaml"] if ccore.library() is not None else ["numpy", "simpy", "yaml"]
    assert seen["simulation"] == ([] if "--help" in args else run_lib)


def test_a_trace_file_run_imports_no_yaml():
    """PyYAML is imported to read a YAML workload (workloads.yaml_loader), not for a trace file."""
    seen = _modules_after(["run", "--workload", "workloads/data/AzureLLMInferenceTrace_code.csv",
                           "--num-requests", "5", "--json"])
    assert seen["code"] == 0 and seen["heavy"] == [] and "yaml" not in seen["simulation"]


def test_run_writes_its_tables_without_pandas(tmp_path):
    """`--out` writes requests.csv and steps.csv by reports.files.write_csv (pandas' bytes; its
    import would cost more than the rest of a small run), streamed or at the end."""
    seen = _modules_after(["run", "--num-requests", "5", "--dp", "2", "--out", str(tmp_path / "run")])
    assert seen["code"] == 0 and seen["heavy"] == []
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["requests.csv", "steps.csv", "summary.json"]


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["list", "gpus"], ["sweep", "--help"]])
def test_help_and_listing_import_no_simulation_library(args):
    """Help and the catalog listing need typer and the option tables alone: no numpy (whose
    import costs more than the rest of `kvsim --help`), SimPy or PyYAML."""
    seen = _modules_after(args)
    assert seen["code"] == 0 and seen["simulation"] == [] and seen["heavy"] == []


@pytest.mark.parametrize("args", [["--help"], ["--help", "run"], []])
def test_root_help_lists_every_command(args):
    seen = _modules_after(args)
    assert seen["code"] == 0 and len(seen["commands"]) == 8
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "kvsim.cli.main", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    listed = proc.stdout.split("Commands:")[1].split()
    from kvsim.cli.main import COMMANDS

    assert all(name in listed for name in COMMANDS)


def test_unknown_command_suggests_from_every_command():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "kvsim.cli.main", "pln"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == "kvsim: error: python -m kvsim.cli.main: No such command 'pln'. Did you mean 'plan'?\n"


# --- option values without pydantic ------------------------------------------------------------

VALUES = [
    "0", "7", "+3", "-2", "007", "-0", "1.5", "-0.0", "2.50", "0.1", "123456789012345.123456789012345",
    "1e3", "inf", "nan", " 4", "4 ", "", "x", "a/b", "-", ".", "static", "STATIC", "Continuous", "fp8", "paged",
    "round-robin", "0x10", "1_000", "\u0663", "9" * 18, "9" * 19, "1.", ".5", "True", "models", "ttft:500",
]


def _every_option():
    import typer.main
    from typer import _click as click

    from kvsim.cli.main import app

    def walk(command, parent):
        ctx = click.Context(command, parent=parent, **command.context_settings)
        for param in command.get_params(ctx):
            yield ctx, param
        for sub in getattr(command, "commands", {}).values():
            yield from walk(sub, ctx)

    yield from walk(typer.main.get_command(app), None)


def test_plain_option_values_convert_as_typer_converts_them():
    """Each value the plain path converts, typer's pydantic adapter converts to the same value
    (same type, same float bits); values it declines go to typer unchanged."""
    from typer._coercion import build_runtime_param

    from kvsim.cli.coercion import _NOT_PLAIN, PlainCoercion

    converted = declined = 0
    for ctx, param in _every_option():
        assert isinstance(param._runtime_param, PlainCoercion), param.name  # --help included
        multiple = param.multiple or param.nargs == -1
        values = [param.default, *VALUES] if not multiple else [tuple(VALUES[:3]), ("a", 1), []]
        for value in values:
            if value is None:
                continue
            plain = PlainCoercion(param.type_descriptor)._plain(value, multiple, param, ctx)
            if plain is _NOT_PLAIN:
                declined += 1
                continue
            converted += 1
            expected = build_runtime_param(param.type_descriptor).coerce(value, param=param, ctx=ctx)
            assert type(plain) is type(expected) and repr(plain) == repr(expected), (param.name, value)
    assert converted > 500 and declined > 500  # both paths are exercised


def test_typer_still_words_refused_values(tmp_path):
    from typer.testing import CliRunner

    from kvsim.cli.main import app

    runner = CliRunner()
    result = runner.invoke(app, ["run", "--tp", "4x"])
    assert result.exit_code == 2
    assert "Invalid value for '--tp' / '--tensor-parallel-size': Input should be a valid integer" in result.stderr
    result = runner.invoke(app, ["run", "--policy", "fifo"])
    assert "'fifo' is not one of 'static', 'dynamic', 'continuous'" in result.stderr


# --- the pandas-free trace reader --------------------------------------------------------------


def _pandas_trace(path: Path) -> traces.Trace:
    frame, lines = traces._read_csv(str(path))
    return traces._validate(str(path), frame, lines)


def _same(fast: traces.Trace, slow: traces.Trace) -> None:
    assert (fast.source, fast.format, sorted(fast.extras)) == (slow.source, slow.format, sorted(slow.extras))
    for name in ("arrival_s", "num_prompt_tokens", "num_output_tokens"):
        a, b = getattr(fast, name), getattr(slow, name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
        assert not a.flags.writeable


@pytest.mark.parametrize("kind", ["code", "conv"])
def test_shipped_azure_traces_are_read_without_pandas_exactly(kind):
    path = DATA_DIR / f"AzureLLMInferenceTrace_{kind}.csv"
    fast = traces._read_plain_csv(str(path))
    assert fast is not None
    _same(fast, _pandas_trace(path))


@pytest.mark.parametrize("text", [
    'TIMESTAMP,ContextTokens,GeneratedTokens\n"2023-11-16 18:15:46.1",3,4\n',  # quoted
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,3,4\n\n2023-11-16 18:15:47,3,4\n",  # blank line
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1, 3,4\n",  # a space (pandas skips it)
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,3.0,4\n",  # not digits
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,0,4\n",  # below the minimum
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,,4\n",  # empty cell
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,3\n",  # short row
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,3,4,5\n",  # long row
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:47,3,4\n2023-11-16 18:15:46,3,4\n",  # unsorted
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-16 18:15:46,3,4\n",  # month 13
    *(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\n{stamp},3,4\n" for stamp in (
        "2023-00-16 18:15:46", "2023-11-00 18:15:46", "2023-02-29 00:00:00", "2100-02-29 00:00:00",
        "2023-04-31 00:00:00", "2023-11-16 24:00:00", "2023-11-16 18:60:00", "2023-11-16 18:15:60.5",
    )),  # no such date or time (numpy's datetime64 refuses each; 2000-02-29 is below, accepted)
    "TIMESTAMP,ContextTokens,GeneratedTokens\nnow,3,4\n",  # numpy reads it, ISO 8601 does not
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46+01:00,3,4\n",  # time zone
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2300-01-01 00:00:00,3,4\n",  # past datetime64[ns]
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,99999999999999999\n",  # past 2**53
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\r2023-11-16 18:15:47,3,4\r",  # CR only
    "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\n",  # byte order mark
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\n2023-11-16 18:15:47,3,\u0664\n",  # not ASCII
    "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n",  # a missing column
    "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n2023-11-16 18:15:46,3,4,5\n",  # duplicate
    "TIMESTAMP,ContextTokens,GeneratedTokens\n",  # header only
    "arrival_s,num_prompt_tokens,num_output_tokens\n0.5,3,4\n",  # fractional seconds
    "arrival_s,num_prompt_tokens,num_output_tokens,prefix_id\n0,3,4,\n",  # optional column (blanks)
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.,3,4\n",  # a "." without digits
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1234567890,3,4\n",  # ten fraction digits
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\n2023-11-16_18:15:47,3,4\n",  # not " " / "T"
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023/11/16 18:15:46,3,4\n",  # not "-"
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.12a,3,4\n",  # a letter in the fraction
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\n2023-11-16 18:15:4,3,4\n",  # mixed, short
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,00000000000000003,4\n",  # 17 digits
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4/\n",  # "/" is just below "0"
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4:\n",  # ":" is just above "9"
    "arrival_s,num_prompt_tokens,num_output_tokens\n0,3,4\n0,3\n",  # short row, cell count still divides
])
def test_unusual_files_are_left_to_pandas(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8", newline="")
    assert traces._read_plain_csv(str(path)) is None


@pytest.mark.parametrize("text", [
    "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,374,44\r\n2023-11-16 18:15:50,7,09\r\n",
    "GeneratedTokens,x,TIMESTAMP,ContextTokens\n5,a b,2023-11-16T00:00:00.000000001,3\n5,,2023-11-17 00:00:00,1\n",
    " TIMESTAMP , ContextTokens,GeneratedTokens\n2023-01-01 00:00:00,1,1\n2023-01-01 00:00:00,2,9007199254740992",
    "arrival_s,num_prompt_tokens,num_output_tokens\n0,3,4\n0,5,6\n17,1,1\n",
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16T18:15:46,3,4\n2023-11-16 18:15:47,0012,4503599627370496\n",
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.123456789,3,4\n2023-11-16 18:15:46.2,5,6\n",
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2000-02-28 23:59:59,1,1\n2000-02-29 23:59:59.999999999,1,1\n"
    "2000-03-01 12:00:00.5,1,1\n2000-04-30 00:00:00,1,1\n",  # a leap day (2000: divisible by 400)
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-02-29 00:00:01,1,1\n2024-03-01 00:00:00,1,1\n",
    "TIMESTAMP,ContextTokens,GeneratedTokens\n1678-01-01 00:00:00,1,1\n",  # the ends of the range
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2261-12-31 23:59:59.999999999,1,1\n",
])
def test_plain_files_read_as_pandas_reads_them(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8", newline="")
    fast = traces._read_plain_csv(str(path))
    assert fast is not None
    _same(fast, _pandas_trace(path))


_STAMP = st.one_of(  # mostly close together (whole traces), sometimes centuries apart
    st.datetimes(datetime(2023, 11, 16), datetime(2023, 11, 17)), st.datetimes(),
).map(lambda d: d.isoformat(sep=" "))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(st.tuples(_STAMP, st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=6),
    sort=st.booleans(), crlf=st.booleans(), zeros=st.integers(0, 2),
)
def test_fast_reader_agrees_with_pandas(tmp_path, rows, sort, crlf, zeros):
    """Whenever the fast reader answers, pandas gives the same Trace; whenever pandas refuses, the
    fast reader has left the file to it."""
    if sort:
        rows = sorted(rows)
    end = "\r\n" if crlf else "\n"
    body = "".join(f"{t},{'0' * zeros}{p},{o}{end}" for t, p, o in rows)
    path = tmp_path / "t.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens{end}{body}", encoding="ascii", newline="")
    fast = traces._read_plain_csv(str(path))
    try:
        slow = _pandas_trace(path)
    except WorkloadError:
        assert fast is None
        return
    if fast is not None:  # None (left to pandas) is always allowed
        _same(fast, slow)


def test_read_trace_uses_the_fast_reader_and_still_words_errors(tmp_path):
    good = tmp_path / "good.csv"
    good.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n0,3,4\n2,5,6\n")
    trace = traces.read_trace(good)
    assert trace.format == "kvsim" and list(trace.arrival_s) == [0.0, 2.0]
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n2,3,4\n0,5,6\n")
    with pytest.raises(WorkloadError, match="line 3: arrival_s '0' is earlier than the previous row's '2'"):
        traces.read_trace(bad)
    assert np.array_equal(trace.num_prompt_tokens, [3, 5])


# --- the committed profile found without a Path per file ------------------------------------------


def test_profile_lookup_finds_what_a_glob_finds(tmp_path):
    from kvsim.profiles.lookup import PROFILE_DIR, find_profile_path

    def by_glob(gpu, model, tp, directory):
        wanted = f"{gpu}-{model}-tp{tp}.json".lower()
        return next((p for p in sorted(directory.glob("*.json")) if p.name.lower() == wanted), None)

    for name in ("b-M-tp2.json", "B-m-tp2.json", "b-m-tp2.JSON", "b-m-tp4.json.bak", "a-m-tp1.json"):
        (tmp_path / name).write_text("{}")
    cases = [("b", "m", 2), ("B", "M", 2), ("a", "m", 1), ("b", "m", 4), ("c", "m", 1)]
    for gpu, model, tp in cases:
        assert find_profile_path(gpu, model, tp, directory=tmp_path) == by_glob(gpu, model, tp, tmp_path)
    assert find_profile_path("b", "m", 2, directory=tmp_path).name == "B-m-tp2.json"
    assert find_profile_path("b", "m", 2, directory=tmp_path / "missing") is None
    for path in PROFILE_DIR.glob("*GB-*-tp*.json"):  # every committed GPU profile, its GPU name in capitals
        gpu, _, rest = path.stem.partition("GB-")
        gpu += "GB"
        model, _, tp = rest.rpartition("-tp")
        found = find_profile_path(gpu.upper(), model, int(tp), directory=PROFILE_DIR)
        assert found == path, path


# --- the latency model built once per run ------------------------------------------------------


def test_profile_hands_its_validation_model_to_the_first_run_only():
    """parse_profile builds a StepLatencyModel to validate the profile; it becomes the template of
    that policy (no second build) and every simulation gets its own fresh copy of it; other policies
    build their own template, and a pickled profile (sweep workers) carries none."""
    import pickle

    from kvsim.profiles import default_profile
    from kvsim.simcore.catalog import get_gpu, get_model

    profile = default_profile(get_gpu("H100-SXM-80GB"), get_model("llama2-70b"), 4)
    spare = profile._unused_model
    assert spare is not None and spare.policy == "continuous"
    assert pickle.loads(pickle.dumps(profile))._unused_model is None
    first, second = profile.latency_model(policy="continuous"), profile.latency_model(policy="continuous")
    assert first is not spare and second is not spare and first is not second
    assert profile._unused_model is None and list(profile._templates.values()) == [spare]
    assert second.host == first.host and second.decode_block_size == first.decode_block_size
    other = default_profile(get_gpu("H100-SXM-80GB"), get_model("llama2-70b"), 4)
    static = other.latency_model(policy="static")
    assert static.policy == "static" and other._unused_model is None
