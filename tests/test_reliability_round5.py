"""Reliability, round 5, by name: defects left by earlier sessions (n > 1 groups stalling both
engines, spans past float64's resolution, session labels, report sweep's intervals and
percentiles) and an adversarial pass over every subcommand. Each test is named after the case
it found; a bad input ends in one line on stderr and a non-zero exit before any work, with
nothing written. Same style as test_reliability_round4."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.main import app
from kvsim.simcore import ccore

TINY = ["--num-requests", "5", "--rate", "5", "--input-len", "64", "--output-len", "8", "--no-error-bars"]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def assert_one_line_error(result, *needles: str, code: int = 2) -> None:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr
    assert err.startswith("kvsim: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and not result.stdout.strip(), (err, result.stdout)
    for needle in needles:
        assert needle in err, (needle, err)


# --- n > 1: swapped-out groups --------------------------------------------------------------


@pytest.mark.skipif(ccore.library() is None, reason="no compiled core (no C compiler?)")
@pytest.mark.parametrize("case", [546, 1090])
def test_swapped_out_groups_no_longer_stall_both_engines(case):
    """Block 4, 48 GPU blocks, swap space 0.001 GiB, groups of 2-4 samples: two groups swapped out
    counted their extra sequences against max_num_seqs although they ran nothing, so neither
    could come back ("simulation stalled" in Python, KV_STALL in C). Every group here fits the
    cache alone (the ones that cannot are rejected at admission); both engines now finish, equal."""
    from tests.test_fastcore_equivalence import _compare
    from tests.test_fastcore_seqgroups import _random_case

    config, workload = _random_case(np.random.default_rng(case))
    config = dataclasses.replace(config, block_size=4, num_gpu_blocks_override=48, swap_space=0.001,
                                 data_parallel_size=1)
    core, _ = _compare(config, workload, seed=case, context=f"stall case {case}")
    assert core.summary["completed"] + core.summary["rejected"] == workload.num_requests
    assert int(core.steps["num_swap_blocks"].sum()) > 0, "the case must swap groups out"
    assert core.steps["num_seqs"].max() <= config.max_num_seqs, "a swapped-in group stays within max_num_seqs"
