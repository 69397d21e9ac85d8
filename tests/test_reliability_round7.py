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
])
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
