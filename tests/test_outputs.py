"""What a command leaves on disk: files as readable as any the user writes (not tempfile's
owner-only modes), written whole or not at all, and carrying their provenance."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.reports.files import write_csv, write_file, write_files


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture()
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_new_output_folder_and_file_get_the_umask_modes(tmp_path: Path, umask_022):
    out = tmp_path / "run"
    write_files(out, {"a.csv": lambda p: p.write_text("x\n")})
    assert _mode(out) == 0o755 and _mode(out / "a.csv") == 0o644
    single = write_file(tmp_path / "profile.json", lambda p: p.write_text("{}\n"))
    assert _mode(single) == 0o644


def test_replacing_keeps_the_modes_the_user_chose(tmp_path: Path, umask_022):
    out = tmp_path / "run"
    out.mkdir()
    out.chmod(0o750)
    write_files(out, {"a.csv": lambda p: p.write_text("x\n")})
    assert _mode(out) == 0o750
    kept = tmp_path / "profile.json"
    kept.write_text("old\n")
    kept.chmod(0o640)
    write_file(kept, lambda p: p.write_text("new\n"))
    assert _mode(kept) == 0o640 and kept.read_text() == "new\n"


def test_a_failed_write_leaves_no_half_written_file(tmp_path: Path):
    target = tmp_path / "plot.png"
    target.write_bytes(b"old")

    def half(path: Path) -> None:
        path.write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    with pytest.raises(Exception, match="No space left"):
        write_file(target, half)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


def test_workloads_plot_is_written_through_a_temporary_file_and_names_its_seed(tmp_path: Path, monkeypatch):
    from PIL import Image

    png = tmp_path / "seed.png"
    png.write_bytes(b"previous plot")
    import matplotlib.figure

    def broken(self, *args, **kwargs):  # a failure halfway through drawing the PNG
        Path(args[0]).write_bytes(b"\x89PNG\r\n\x1a\n cut short")
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(matplotlib.figure.Figure, "savefig", broken)
        failed = CliRunner().invoke(app, ["workloads", "show", "sharegpt", "--num-requests", "50", "--plot", str(png)])
    assert failed.exit_code == 2 and "nothing was written" in failed.stderr
    assert png.read_bytes() == b"previous plot" and sorted(p.name for p in tmp_path.iterdir()) == ["seed.png"]
    shown = CliRunner().invoke(app, ["workloads", "show", "sharegpt", "--num-requests", "50", "--seed", "7",
                                     "--plot", str(png)])
    assert shown.exit_code == 0, shown.stderr
    about = Image.open(png).text["Description"]
    assert "seed 7" in about and "kvsim " in about and "sharegpt" in about


PLAN = ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM-80GB,A100-40GB", "--tp", "1,2", "--rate", "20",
        "--input-len", "256", "--output-len", "64", "--search-requests", "100", "--confirm-requests", "150",
        "--tolerance", "0.15", "--slo-ttft-p95-ms", "150", "--slo-tpot-p95-ms", "12"]


def test_plan_files_record_provenance_and_repeat_byte_for_byte(tmp_path: Path):
    import json

    from kvsim.profiles import default_profile
    from kvsim.simcore.catalog import get_gpu, get_model
    from kvsim.simcore.simulate import KVSIM_VERSION

    for name in ("a", "b"):
        done = CliRunner().invoke(app, [*PLAN, "--out", str(tmp_path / name)])
        assert done.exit_code == 0, done.stderr
    for name in ("plan.csv", "plan.json", "capacity.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    doc = json.loads((tmp_path / "a" / "plan.json").read_text())
    assert doc["kvsim_version"] == KVSIM_VERSION and doc["seed"] == 0
    assert doc["engine"]["block_size"] == 16 and doc["engine"]["gpu_memory_utilization"] == 0.9
    by_tp = {(c["gpu"], c["tp"]): c for c in doc["candidates"]}
    h100 = by_tp[("H100-SXM-80GB", 1)]
    expected = default_profile(get_gpu("H100-SXM-80GB"), get_model("llama3-8b"), 1)
    assert h100["profile_sha256"] == expected.sha256 and h100["profile_source"] == "roofline"
    assert by_tp[("A100-40GB", 1)]["profile_sha256"] is None  # no price: pruned before pricing


def test_a_long_plan_status_is_cut_visibly():
    from kvsim.cli.plan_cmd import _clip

    assert _clip("memory: does not fit", 110) == "memory: does not fit"
    cut = _clip("memory: " + "word " * 40, 40)
    assert len(cut) <= 40 and cut.endswith("...")


def test_the_fit_data_ships_with_the_profiles():
    """A clone can rerun the fits: the data is in profiles/data/, with its licence, and is the file
    the committed efficiency factors were fitted on."""
    import hashlib
    import json

    from kvsim.profiles import fit

    data = Path(fit.__file__).with_name("data")
    assert fit.DATA.parent == data and (data / "LICENSE-vidur-MIT.txt").exists()
    stored = json.loads(Path(fit.__file__).with_name("efficiency_h100.json").read_text())
    assert hashlib.sha256(fit.DATA.read_bytes()).hexdigest() == stored["fit"]["data_sha256"]


@pytest.mark.parametrize("exact", [False, True])
def test_run_record_says_what_the_open_options_resolved_to(tmp_path: Path, exact: bool):
    """`--max-num-batched-tokens` left open is recorded as the budget the run used, not null, and
    the stepping mode is recorded, so a summary.json alone says how to repeat the run."""
    import json

    args = ["run", "--num-requests", "20", "--out", str(tmp_path / "r")] + (["--exact-steps"] if exact else [])
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    record = json.loads((tmp_path / "r" / "summary.json").read_text())["record"]
    # the default engine filled it (vLLM V1's server default on an H100), and the record says so
    assert record["config"]["max_num_batched_tokens"] == 8192
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["engine_assumptions"]["batch_defaults_filled"] == ["max_num_batched_tokens", "max_num_seqs"]
    resolved = record["resolved"]
    assert resolved["exact_steps"] is exact
    assert resolved["max_num_batched_tokens"] >= 1 and resolved["max_model_len"] >= 1


_FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, -0.0, 1e16, 1e-5, 1e-4, 0.1, 2.5e-300, 5e-324, 1.7976931348623157e308, 123456789.0,
     float("nan"), float("inf"), -float("inf")])
_TEXT = st.text(alphabet=st.sampled_from('ab ,"\n\r\t;\'\\é'), max_size=6)


@st.composite
def _columns(draw):
    n = draw(st.integers(0, 12))
    kinds = draw(st.lists(st.sampled_from(["f8", "f4", "i8", "i4", "u1", "b", "O"]), min_size=1, max_size=6))
    columns = {}
    for i, kind in enumerate(kinds):
        if kind in ("f8", "f4"):
            values = np.array(draw(st.lists(_FLOATS, min_size=n, max_size=n)), dtype=np.float64)
            with np.errstate(over="ignore"):
                values = values.astype(kind)
        elif kind == "b":
            values = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
        elif kind == "O":
            values = np.empty(n, dtype=object)  # strings, None among them (a blank cell)
            values[:] = draw(st.lists(_TEXT | st.none(), min_size=n, max_size=n))
        else:
            info = np.iinfo(kind)
            values = np.array(draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n, max_size=n)),
                              dtype=kind)
        columns[f"c{i}{kind}{draw(_TEXT)}"] = values  # a name to quote, at times
    return columns


@settings(max_examples=200, deadline=None)
@given(_columns(), st.booleans())
def test_csv_writer_writes_pandas_bytes(tmp_path_factory, columns, append):
    """kvsim.reports.files.write_csv (no pandas on `kvsim run --out`) writes exactly what
    `DataFrame.to_csv(index=False)` writes: shortest float reprs, NaN blank, inf, -0.0, float32,
    quoting of commas, quotes and line breaks (cells and names), empty strings, booleans, unsigned,
    empty tables, one-column tables."""
    import pandas as pd

    folder = tmp_path_factory.mktemp("csv")
    ours, theirs = folder / "ours.csv", folder / "theirs.csv"
    write_csv(ours, columns)
    pd.DataFrame(columns).to_csv(theirs, index=False)
    if append:  # a streamed table: the next chunk without its header
        write_csv(ours, columns, append=True)
        pd.DataFrame(columns).to_csv(theirs, index=False, mode="a", header=False)
    assert ours.read_bytes() == theirs.read_bytes()


def test_csv_writer_refuses_what_it_cannot_match(tmp_path: Path):
    with pytest.raises(ValueError, match="no CSV cells"):
        write_csv(tmp_path / "t.csv", {"t": np.array(["2024-01-01"], dtype="datetime64[ns]")})


def test_python_float_repr_is_numpys_astype_str():
    """write_csv formats float64 cells with repr (faster), pandas with numpy's astype(str): the
    same shortest round-trip text, checked on random bit patterns (subnormals, huge, every
    exponent) and every power of ten."""
    rng = np.random.default_rng(0)
    values = rng.integers(0, 2**64, size=100_000, dtype=np.uint64).view(np.float64)
    values = np.concatenate([values[~np.isnan(values)], 10.0 ** np.arange(-323, 309), rng.random(20_000)])
    assert list(map(repr, values.tolist())) == values.astype(str).tolist()
