"""The compiled core's loader (simcore/ccore.py) and its step pricing (simcore/csrc/pricing.c).

Pricing in C must give the same bits as StepLatencyModel (compared with ==, never approx): the
C engine's timestamps are sums of these step times. Without a C compiler the pricing tests skip,
saying why; the fallback itself (library() None with a reason) is tested everywhere.
"""

from __future__ import annotations

import copy
import ctypes
import json
import os
import random
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from profiles import default_profile
from simcore import ccore
from simcore.catalog import get_gpu, get_model
from simcore.latency import StepLatencyModel, load_profile, parse_profile

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def lib():
    cc, why = ccore.find_compiler()
    if cc is None:
        pytest.skip(f"no C compiler: {why}")
    lib = ccore.library()
    assert lib is not None, ccore.unavailable_reason()  # a compiler is there: building must work
    return lib


# --- the profiles priced -------------------------------------------------------------------

ROOFLINES = [("H100-SXM-80GB", "llama2-70b", 4), ("H100-SXM-80GB", "llama3-8b", 1), ("A100-80GB", "mixtral-8x7b", 8),
             ("H200-141GB", "qwen3-30b-a3b", 2), ("A100-40GB", "opt-13b", 2), ("H100-SXM-80GB", "tiny", 1)]


def _one_point(doc: dict) -> dict:
    """`doc` with every table cut to one point (and decode tables of one row, one column)."""
    doc = copy.deepcopy(doc)
    for key in ("linear", "lm_head"):
        t = doc[key]
        x = "num_tokens" if key == "linear" else "num_seqs"
        t[x], t["time_ms"] = t[x][3:4], t["time_ms"][3:4]
    ar = doc["collectives"]["all_reduce"]
    ar["bytes"], ar["time_ms"] = ar["bytes"][5:6], ar["time_ms"][5:6]
    pre = doc["prefill_attention"]
    pre["chunk_tokens"], pre["context_tokens"], pre["time_ms"] = [512], [0], [[pre["time_ms"][2][0]]]
    dec = doc["decode_attention"]["16"]
    doc["decode_attention"] = {
        "16": {"batch_size": dec["batch_size"][2:3], "context_tokens": dec["context_tokens"],
               "time_ms": dec["time_ms"][2:3]},
        "32": {"batch_size": dec["batch_size"], "context_tokens": dec["context_tokens"][4:5],
               "time_ms": [row[4:5] for row in dec["time_ms"]]},
    }
    return doc


def _models() -> dict[str, StepLatencyModel]:
    """Every kind of document the pricing reads differently: v2 rooflines (committed, with prefill
    occupancy and all-reduce tables, and built in memory), the committed measured CPU profile (v1,
    no collectives), v1 with the per-layer `collective` table, one-point tables, each policy's host,
    every host term non-zero."""
    models = {}
    for gpu, model, tp in ROOFLINES:
        models[f"{gpu}-{model}-tp{tp}"] = default_profile(get_gpu(gpu), get_model(model), tp).latency_model()
    cpu = load_profile(ROOT / "profiles" / "cpu-tiny-tp1.json")
    models["cpu-measured-v1"] = cpu.latency_model()
    v1 = copy.deepcopy(cpu.data)
    v1["collective"] = {"num_tokens": [1, 64, 4096], "time_ms": [0.02, 0.05, 0.2]}
    models["v1-collective"] = parse_profile(v1).latency_model()
    doc = json.loads((ROOT / "profiles" / "H100-SXM-80GB-llama2-70b-tp4.json").read_text())
    models["one-point"] = parse_profile(_one_point(doc)).latency_model()
    terms = copy.deepcopy(doc)  # every host term at work (the committed profiles leave prefill's at 0)
    terms["host_overhead"] = {"per_step_ms": 1.37, "per_seq_ms": 0.0491, "per_prefill_step_ms": 0.731,
                              "per_prefill_token_ms": 0.00117}
    del terms["host_overhead_by_policy"]
    models["host-terms"] = parse_profile(terms).latency_model()
    for policy in ("static", "dynamic"):
        models[f"policy-{policy}"] = StepLatencyModel(doc, policy=policy)
    return models


MODELS = _models()


def _value(rng: random.Random, lo: float, hi: float, low: int = 1) -> int:
    """A count inside [lo, hi] (log-uniform), at a grid edge, below or above it."""
    r = rng.random()
    if r < 0.6:
        return int(round(np.exp(rng.uniform(np.log(max(lo, 1)), np.log(max(hi, 1))))))
    if r < 0.75:
        return max(low, int(rng.choice([lo, hi, lo + 1, hi - 1, hi + 1])))
    if r < 0.85:
        return rng.randint(low, max(int(lo), low))
    return int(hi * rng.uniform(1.0, 4.0))


def _steps(rng: random.Random, model: StepLatencyModel, n: int):
    """Random steps: decode-only, prefill-only, mixed, several chunks; values in and out of tables."""
    pre, dec, lin = model.prefill, model.decode, model.linear
    for _ in range(n):
        kind = rng.choice(["decode", "prefill", "mixed", "chunks"])
        num_chunks = {"decode": 0, "prefill": 1, "mixed": 1, "chunks": rng.randint(2, 6)}[kind]
        chunks = [(_value(rng, *pre.a_range), _value(rng, *pre.b_range, low=0)) for _ in range(num_chunks)]
        nds = 0 if kind == "prefill" else _value(rng, *dec.a_range)
        ctx = nds * _value(rng, *dec.b_range, low=0) + rng.randint(0, max(nds - 1, 0))
        tokens = sum(c for c, _ in chunks) + nds
        if rng.random() < 0.1:  # the GEMMs' table on its own, in and out
            tokens = _value(rng, lin.lo, lin.hi)
        sampled = rng.choice([nds + num_chunks, nds, 0, 1])
        yield tokens, chunks, nds, ctx, sampled


@pytest.mark.parametrize("name", sorted(MODELS))
def test_c_pricing_equals_the_model_bit_for_bit(lib, name):
    """Every decode block size's table, thousands of steps: the same four floats (==) and the
    same extrapolation counts as StepLatencyModel.step_parts_ms."""
    model = MODELS[name]
    rng = random.Random(name)
    for bs in sorted(model.decode_by_block_size):
        model.set_block_size(bs)
        c = ccore.CPricing(model)
        for step in _steps(rng, model, 2400 if bs == 16 else 300):
            expected = model.step_parts_ms(*step)
            got = c.step_parts_ms(*step)
            assert got == expected, (bs, step, got, expected)
        assert c.extrapolated == model.extrapolated, bs
        model.extrapolated.tables.clear()
        model.extrapolated.steps = 0


def test_c_memos_change_no_result(lib):
    """pricing.c keeps a batch size's row blend and a step shape's fixed parts in direct-mapped slots
    (1,024 and 2,048 of them): thousands of shapes differing in one field each must share slots and
    evict one another, and still price as the model does (forwards, then backwards over kept slots)."""
    doc = json.loads((ROOT / "profiles" / "H100-SXM-80GB-llama2-70b-tp4.json").read_text())
    model, fresh = StepLatencyModel(doc), StepLatencyModel(doc)
    c = ccore.CPricing(model)
    n = 4096
    sweeps = [
        [(300, [(200, 10)], 100, 100 * 700, s) for s in range(n)],  # num_sampled alone
        [(t, [(200, 10)], 100, 100 * 700, 101) for t in range(1, n + 1)],  # num_tokens alone
        [(5000, [(200, 10)], d, d * 700, 101) for d in range(1, n + 1)],  # decode batch (and its row blend)
        [(5000, [(a, 10)], 100, 100 * 700, 101) for a in range(1, n + 1)],  # prefill chunk (its row blend)
        [(300, [(200, 10)] * k, 100, 100 * 700, s) for k in range(8) for s in range(n // 8)],  # chunk count
    ]
    for steps in sweeps:
        for step in steps + steps[::-1]:
            assert c.step_parts_ms(*step) == model.step_parts_ms(*step), step
    for step in sweeps[2][::97]:
        assert c.step_parts_ms(*step) == fresh.step_parts_ms(*step), step  # Python's memos too: fresh bits


def test_c_pricing_notes_each_table_as_the_model_does(lib):
    model = StepLatencyModel(json.loads((ROOT / "profiles" / "H100-SXM-80GB-llama2-70b-tp4.json").read_text()))
    c = ccore.CPricing(model)
    lin, pre, dec = model.linear, model.prefill, model.decode
    inside = (int(pre.a_hi) // 2, 0)
    # linear only (far more tokens than its grid), two prefill chunks outside, decode outside
    cases = [((int(lin.hi) * 2, [], 1, 10, 1), ccore.KV_OUT_LINEAR, 0),
             ((100, [inside, (int(pre.a_hi) + 1, 0), (1, int(pre.b_hi) * 2)], 0, 0, 3), ccore.KV_OUT_PREFILL, 2),
             ((int(dec.a_hi) + 1, [], int(dec.a_hi) + 1, 100, 1), ccore.KV_OUT_DECODE, 0),
             ((65, [inside], 64, 64 * 100, 65), 0, 0)]
    for step, mask, prefill_out in cases:
        parts, got_mask, got_prefill = c.parts(*step)
        assert (got_mask, got_prefill) == (mask, prefill_out), step
        assert parts == model.step_parts_ms(*step)


def test_malformed_blobs_are_refused(lib):
    blob = ccore.pricing_blob(MODELS["cpu-measured-v1"])

    def new(values: np.ndarray):
        values = np.ascontiguousarray(values, dtype=np.float64)
        ptr = lib.kv_pricing_new(values.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), len(values))
        if ptr:
            lib.kv_pricing_free(ptr)
        return bool(ptr)

    assert new(blob)
    wrong_magic, wrong_abi, bad_count = blob.copy(), blob.copy(), blob.copy()
    wrong_magic[0] += 1
    wrong_abi[1] += 1
    bad_count[16] = 2.5  # the linear table's length
    for bad in (blob[:-1], np.append(blob, 0.0), blob[:10], wrong_magic, wrong_abi, bad_count):
        assert not new(bad)


# --- building, caching, falling back --------------------------------------------------------

def _run(code: str, env: dict[str, str]) -> dict:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


LOAD = ("import json; from simcore import ccore; lib = ccore.library(); "
        "print(json.dumps({'path': lib and lib._name, 'reason': ccore.unavailable_reason()}))")


def test_no_compiler_means_no_library_and_a_reason(tmp_path):
    seen = _run(LOAD, {"CC": str(tmp_path / "no-such-cc"), "KVSIM_CACHE_DIR": str(tmp_path)})
    assert seen["path"] is None and "no such compiler" in seen["reason"] and "no-such-cc" in seen["reason"]
    assert list(tmp_path.iterdir()) == []


def test_a_compile_error_means_no_library_and_the_compilers_words(lib, tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "broken.c").write_text("int kv_broken(void) { return missing_name; }\n")
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "cache"))
    got, reason = ccore._load(src)
    assert got is None and "failed" in reason and "missing_name" in reason
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # no temp file left behind


def test_racing_processes_all_load_one_whole_library(lib, tmp_path):
    """Sweep workers may compile at once: each renames its own complete file into place."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KVSIM_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", LOAD], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    seen = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 1 and files[0].startswith("kvsim_core-") and files[0].endswith(".so")
    assert all(s["reason"] is None and s["path"] == str(tmp_path / files[0]) for s in seen)


def test_threads_share_one_build(lib, tmp_path, monkeypatch):
    """library() builds once per process: threads asking at once wait for the first and get its CDLL."""
    import threading

    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ccore, "_STATE", None)
    got = []
    threads = [threading.Thread(target=lambda: got.append(ccore.library())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and got[0] is not None and all(g is got[0] for g in got)
    assert len(list(tmp_path.iterdir())) == 1


def test_the_cache_is_reused_and_a_broken_file_rebuilt(lib, tmp_path):
    env = {"KVSIM_CACHE_DIR": str(tmp_path)}
    first = Path(_run(LOAD, env)["path"])
    stamp = first.stat()
    assert _run(LOAD, env)["path"] == str(first)
    again = first.stat()
    assert (again.st_ino, again.st_mtime_ns) == (stamp.st_ino, stamp.st_mtime_ns)  # loaded, not rebuilt
    first.write_bytes(b"not a shared library")  # as a crash mid-write might leave it
    assert _run(LOAD, env) == {"path": str(first), "reason": None}
    assert first.stat().st_size > 1000


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "k"))
    assert ccore.cache_dir() == tmp_path / "k"
    monkeypatch.delenv("KVSIM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert ccore.cache_dir() == tmp_path / "x" / "kvsim"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # not absolute: ignored, as the XDG spec says
    assert ccore.cache_dir() == Path.home() / ".cache" / "kvsim"


def test_an_unwritable_cache_dir_falls_back_to_a_private_temp_dir(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    where = ccore._writable(blocker / "kvsim")  # cannot be created: under a file
    assert where is not None and where != blocker / "kvsim" and where.stat().st_mode & 0o077 == 0


def test_importing_the_loader_is_cheap():
    """simcore.ccore is imported on the way to every run: no numpy, ctypes or subprocess until used."""
    seen = _run("import json, sys, simcore.ccore; "
                "print(json.dumps([m for m in ('numpy', 'ctypes', 'subprocess') if m in sys.modules]))", {})
    assert seen == []


def test_the_c_sources_are_package_data():
    """`pip install .` ships simcore/csrc (the library is compiled on the user's machine)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = config["tool"]["setuptools"]["package-data"]["simcore"]
    assert "csrc/*.c" in data and "csrc/*.h" in data
    assert {p.name for p in (ROOT / "simcore" / "csrc").glob("*.[ch]")} >= {"pricing.c", "pricing.h"}
