"""The compiled core's loader (simcore/ccore.py) and its step pricing (simcore/csrc/pricing.c).

Pricing in C must give the same bits as StepLatencyModel (compared with ==, never approx): the
C engine's timestamps are sums of these step times. Without a compiled core (an install on a machine
with no compiler) the pricing tests skip, saying why; the fallback itself (library() None with a
reason) is tested everywhere.
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

from kvsim.profiles import default_profile
from kvsim.simcore import ccore
from kvsim.simcore.catalog import get_gpu, get_model
from kvsim.simcore.latency import StepLatencyModel, load_profile, parse_profile

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def lib():
    lib = ccore.library()
    if lib is None:
        import shutil

        # a compiler is there, so `pip install .` must have built the core
        assert not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")), ccore.unavailable_reason()
        pytest.skip(f"no compiled core: {ccore.unavailable_reason()}")
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
    for entry in doc.get("prefill_attention_by_engine", {}).values():  # per-version scales on the same grid
        entry["time_scale"] = [[entry["time_scale"][2][0]]]
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
    del terms["host_overhead_by_policy"], terms["host_overhead_by_engine"]
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
    wrong_magic, wrong_abi, bad_count, bad_ratio = blob.copy(), blob.copy(), blob.copy(), blob.copy()
    wrong_magic[0] += 1
    wrong_abi[1] += 1
    bad_count[17] = 2.5  # the linear table's length
    bad_ratio[7] = 0.0  # prefill_ratio (a profile scaled per phase): positive and finite
    for bad in (blob[:-1], np.append(blob, 0.0), blob[:10], wrong_magic, wrong_abi, bad_count, bad_ratio):
        assert not new(bad)


# --- building, caching, falling back --------------------------------------------------------

def _run(code: str, env: dict[str, str], cwd: Path = ROOT) -> dict:
    full = {**os.environ, **env}
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


LOAD = ("import json; from kvsim.simcore import ccore; lib = ccore.library(); "
        "print(json.dumps({'path': lib and lib._name, 'reason': ccore.unavailable_reason()}))")


def test_the_core_is_loaded_from_the_installed_package_and_nothing_is_compiled(lib, tmp_path):
    """No compiler and an empty HOME at run time change nothing: the core was built at install time,
    lives in the package, and no cache folder is created or read."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"CC": str(tmp_path / "no-such-cc"), "HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "KVSIM_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/nonexistent"}
    seen = _run(LOAD, env, cwd=home)
    assert seen["reason"] is None
    assert Path(seen["path"]) == ccore.module_path() and Path(seen["path"]).parent == Path(ccore.__file__).parent
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"] and list(home.iterdir()) == []


def test_no_installed_core_means_no_library_and_the_recorded_reason(tmp_path, monkeypatch):
    """An install whose build failed: setup.py wrote why beside the package; library() says it."""
    reason = tmp_path / "_core_build.txt"
    reason.write_text("the compiled core was not built when kvsim was installed: error: no compiler\n")
    monkeypatch.setattr(ccore, "module_path", lambda: None)
    monkeypatch.setattr(ccore, "REASON_FILE", reason)
    monkeypatch.setattr(ccore, "_STATE", None)
    assert ccore.library() is None
    assert ccore.unavailable_reason() == reason.read_text().strip()
    reason.unlink()  # a source tree never installed: no file, still a reason
    monkeypatch.setattr(ccore, "_STATE", None)
    assert ccore.library() is None and "pip install ." in ccore.unavailable_reason()


def test_a_broken_library_file_is_refused_with_a_reason(tmp_path, monkeypatch):
    """A truncated or foreign file where the extension should be: no crash, a reason naming it."""
    broken = tmp_path / "_core.abi3.so"
    broken.write_bytes(b"\x7fELF not a shared library")
    monkeypatch.setattr(ccore, "module_path", lambda: broken)
    monkeypatch.setattr(ccore, "_STATE", None)
    assert ccore.library() is None and str(broken) in ccore.unavailable_reason()


def test_threads_share_one_load(lib, monkeypatch):
    """library() loads once per process: threads asking at once wait for the first and get its CDLL."""
    import threading

    monkeypatch.setattr(ccore, "_STATE", None)
    got = []
    threads = [threading.Thread(target=lambda: got.append(ccore.library())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and got[0] is not None and all(g is got[0] for g in got)


def test_importing_the_loader_is_cheap():
    """kvsim.simcore.ccore is imported on the way to every run: no numpy, ctypes or subprocess until used."""
    seen = _run("import json, sys, kvsim.simcore.ccore; "
                "print(json.dumps([m for m in ('numpy', 'ctypes', 'subprocess') if m in sys.modules]))", {})
    assert seen == []


def test_the_core_is_an_extension_built_by_setup_py():
    """`pip install .` compiles simcore/csrc into kvsim.simcore._core (setup.py); the sources ship too."""
    setup = (ROOT / "setup.py").read_text()
    assert '"kvsim.simcore._core"' in setup and "-ffp-contract=off" in setup
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = config["tool"]["setuptools"]["package-data"]["kvsim.simcore"]
    assert "csrc/*.c" in data and "csrc/*.h" in data
    assert {p.name for p in (ROOT / "simcore" / "csrc").glob("*.[ch]")} >= {"pricing.c", "pricing.h", "module.c"}
