"""The policy registry: every policy described once, read by validation and the CLI; a new
policy (tests/spf_policy.py) is one module plus one registration line."""

from __future__ import annotations

import pytest

import tests.spf_policy  # noqa: F401  (registers "spf")
from kvsim.simcore.catalog import GPUS, MODELS
from kvsim.simcore.errors import ConfigError
from kvsim.simcore.policies import policy_names, variants
from kvsim.simcore.simulate import simulate
from kvsim.simcore.specs import EngineConfig
from tests.helpers import ListWorkload, flat_profile, req

TINY, H100 = MODELS["tiny"], GPUS["H100-SXM-80GB"]


def test_every_policy_variant_is_registered_once():
    assert policy_names()[:3] == ["static", "dynamic", "continuous"]
    keys = [(v.name, v.allocator) for v in variants()]
    assert len(keys) == len(set(keys))
    assert ("continuous", "contiguous") in keys and ("spf", "paged") in keys


def test_toy_shortest_prompt_first_policy_runs_end_to_end():
    # max_num_seqs 1. r0 (prompt 8, 3 out) runs [0, 6). r1 (20 tokens) and r2 (4) arrive at 1 ms;
    # shortest first admits r2 [6, 8) before r1 [8, 10); FIFO would do the opposite.
    requests = [req(0, 0.0, 8, 3), req(1, 0.001, 20, 1), req(2, 0.001, 4, 1)]
    config = dict(block_size=4, max_model_len=32, max_num_seqs=1)
    spf = simulate(TINY, H100, EngineConfig(policy="spf", **config), ListWorkload(requests), flat_profile())
    fifo = simulate(TINY, H100, EngineConfig(**config), ListWorkload(requests), flat_profile())
    assert [round(v * 1000, 6) for v in spf.requests["finish_s"]] == [6.0, 10.0, 8.0]
    assert [round(v * 1000, 6) for v in fifo.requests["finish_s"]] == [6.0, 8.0, 10.0]
    assert spf.record["policy"]["name"] == "spf" and spf.record["config"]["allocator"] == "paged"


def test_the_registry_decides_which_options_a_policy_takes():
    with pytest.raises(ConfigError, match="--max-batch-size applies only to --policy static, not --policy spf"):
        simulate(TINY, H100, EngineConfig(policy="spf", max_batch_size=8), ListWorkload([]), flat_profile())
    with pytest.raises(ConfigError, match="--policy must be one of static, dynamic, continuous"):
        simulate(TINY, H100, EngineConfig(policy="fifo"), ListWorkload([]), flat_profile())
    with pytest.raises(ConfigError, match="--preemption-mode applies only to --policy continuous --allocator "
                       "paged, not --policy continuous --allocator contiguous"):
        simulate(TINY, H100, EngineConfig(allocator="contiguous", preemption_mode="swap"),
                 ListWorkload([]), flat_profile())
