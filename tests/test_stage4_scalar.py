"""The jitted funnel against stages 1-4 evaluated one candidate at a time on float64 scalars.

`evaluate_blocks` (stages 1-4 of explicit candidates: the program behind a sweep's report rows)
decodes each candidate's digits inside jit and prices it in float32 with the vectorised solver;
`scalar_stage4` gives each candidate its stage 1-3 reason from the plain-Python reference funnel and
runs stage 4's source eagerly on Python or NumPy scalars. They must agree on every reason and on
stage 4's throughput and p99 latencies to 2e-3 (float32 against float64), across dense, MoE (every
layout kind; MXFP4 and INT4 experts), MLA, hybrid-attention and AMD candidates; Poisson, burst and closed-loop traffic. `bench/bench_baseline.py` times the same
scalar path.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scalar_stage4 import SHIMS, Problem, check_agreement, reason_1_to_3, run_baseline

from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.sweep import build_context, evaluate_blocks
from jaxplan.grid import AXES, Grid
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list
from jaxplan.specs.workload import Arrival

ROWS = 512  # the report rows' block (funnel.sweep.REPORT_ROWS): the program other tests compile
STAGE4_SHARE = 0.75  # of the rows, candidates the reference funnel admits to stage 4 (where there are that many)


def sample_indices(p: Problem, grid_size: int, seed: int) -> np.ndarray:
    """ROWS grid indices, drawn uniformly, keeping mostly those that reach stage 4 (a uniform draw of
    a large grid is mostly stage-1 rejections) and the rest from the rejected ones."""
    rng = np.random.default_rng(seed)
    drawn = np.unique(rng.integers(0, grid_size, 16 * ROWS))
    reasons = np.array([int(reason_1_to_3(p, int(i))) for i in drawn])
    admitted, rejected = drawn[reasons == Reason.ADMITTED], drawn[reasons != Reason.ADMITTED]
    take = min(admitted.size, int(STAGE4_SHARE * ROWS))
    return np.sort(np.concatenate([admitted[:take], rejected[: ROWS - take]]))


CASES = [
    # model, GPUs, workload, space, shim: two GPUs and the default space, so that one report-rows program (the README sweep's) serves all
    ("llama-3.1-70b", "a100_sxm,b200_sxm", "coding", "default", "python"),
    ("gpt-oss-120b", "h200_sxm,mi355x", "chat", "default", "numpy"),
    ("qwen3.5-27b", "h100_sxm,l40s", "reasoning", "default", "numpy"),
    ("kimi-k2.5", "b200_sxm,gb200", "rl-rollout", "default", "numpy"),
    ("minimax-m2.5", "mi300x,mi325x", "coding-closed-loop", "default", "numpy"),
]


def workload_named(name: str):
    """A bundled workload, or `coding-closed-loop`: coding's lengths from 256 clients in a closed loop."""
    if name == "coding-closed-loop":
        return dataclasses.replace(load_workload("coding"), name=name, arrival=Arrival.CLOSED, concurrency=256, num_requests=2560)
    return load_workload(name)


@pytest.mark.parametrize(("model_name", "gpus", "workload_name", "space_name", "shim"), CASES, ids=[c[0] for c in CASES])
def test_jitted_funnel_matches_scalar_evaluation(model_name, gpus, workload_name, space_name, shim):
    model, gpu_specs, workload = load_model(model_name), parse_gpu_list(gpus), workload_named(workload_name)
    space = load_space(space_name).for_model(model)  # as a sweep resolves it: every layout kind and checkpoint format of a MoE model
    grid = Grid(gpu_specs, space)
    ctx = build_context(grid, model, workload)
    problem = Problem(model, gpu_specs, workload, space, ctx, grid, shim)
    sample = sample_indices(problem, grid.size, seed=len(model_name))
    assert sample.size == ROWS

    digits = np.stack([grid.digits_of(int(i)) for i in sample]).astype(np.int32)
    jitted = evaluate_blocks(ctx, digits)  # the report rows' program, in its blocks (shared with other tests)
    _, scalar = run_baseline(problem, sample, SHIMS[shim])

    counts, reached_stage4 = check_agreement(scalar, jitted, rtol=2e-3)
    # the sample exercises what it is for: stage 4's verdicts, not only the early sieves, and for a
    # MoE model every layout kind (lock-step ranks change the replica count stage 4 prices)
    assert reached_stage4 >= ROWS // 4, counts
    assert counts["ADMITTED"] >= ROWS // 8, counts
    kinds = {grid.labels["layout_kind"][d[AXES.index("layout_kind")]].partition(":")[0] for d in digits}
    assert kinds == ({"tp", "ep", "dp", "dp_ep"} if model.is_moe else {"tp"})
