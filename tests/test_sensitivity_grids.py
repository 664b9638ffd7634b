"""Gradients are finite for every finalist of the default space, for every bundled workload."""

from __future__ import annotations

import numpy as np
import pytest

from jaxplan.funnel.sweep import run_sweep
from jaxplan.elasticity import METRICS, for_rows
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list

SLOW = pytest.mark.slow  # a default-space sweep each (~10-40 s on 2 cores); coding runs by default


@pytest.mark.parametrize(
    ("model", "workload"),
    [
        ("llama-3.1-70b", "coding"),
        pytest.param("llama-3.1-70b", "chat", marks=SLOW),
        pytest.param("llama-3.1-70b", "reasoning", marks=SLOW),
        pytest.param("qwen3.5-27b", "rl-rollout", marks=SLOW),
    ],
)
def test_gradients_finite_for_the_best_of_every_layout_on_the_default_space(model, workload):
    # top_k = 200: the best candidate of each of the 200 best (GPU, TP, PP, DP) layouts, i.e. well
    # beyond the finalists, across TP/PP/DP shapes and both GPU types.
    result = run_sweep(load_model(model), parse_gpu_list("h100_sxm,h200_sxm"), load_workload(workload), load_space("default"), top_k=200)
    assert len(result.shortlist) >= 20
    sens = for_rows(result, result.shortlist)
    assert np.all(np.isfinite(sens.values))
    assert np.all(np.isfinite(sens.derivative)) and np.all(np.isfinite(sens.elasticity))
    # What the physics fixes for every row: cost per token is hourly price / throughput, so its
    # elasticity is exactly minus throughput's; a stable Poisson deployment serves what arrives
    # (throughput = rate x OSL), so throughput's elasticity to the rate and to OSL is exactly +1.
    thr, cost = METRICS.index("output_tokens_per_s"), METRICS.index("cost_per_million_usd")
    np.testing.assert_allclose(sens.elasticity[:, cost, :], -sens.elasticity[:, thr, :], atol=1e-3)
    if workload != "rl-rollout":
        for p in ("request_rate_per_s", "osl_tokens"):
            np.testing.assert_allclose(sens.elasticity[:, thr, sens.parameters.index(p)], 1.0, atol=1e-3)
