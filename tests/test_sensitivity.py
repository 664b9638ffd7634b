"""Sensitivities: forward-mode derivatives agree with finite differences; signs the physics fixes.

One compilation serves every call here: the Jacobian is always taken for all PARAMETERS (a call's
subset is a choice of columns), the model shape is traced and the finalists padded to a bucket."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan.physics import efficiency_for, hardware_table, make_layout, model_shape, take, workload_params
from jaxplan.elasticity import METRICS, PARAMETERS, metrics_of as _metrics_of, sensitivities

metrics_of = jax.jit(_metrics_of, static_argnames=("model",))
from jaxplan.specs import load_gpu, load_model, load_workload


def setup(model="llama-3.1-70b", tp=(2.0, 4.0, 8.0), dp=(4.0, 2.0, 1.0)):
    gpus = (load_gpu("h100_sxm"),)
    hw = take(hardware_table(gpus, efficiency_for(["h100_sxm"])), jnp.zeros(len(tp), jnp.int32))
    layout = make_layout(tp=jnp.array(tp), dp=jnp.array(dp), weight_bytes=1, kv_bytes=1, max_num_seqs=256, max_num_batched_tokens=8192)
    return model_shape(load_model(model)), hw, layout


@pytest.mark.parametrize("scale", [1.0, 0.999])
@pytest.mark.parametrize("workload", ["reasoning", "chat", "rl-rollout"])
def test_derivatives_match_central_differences(workload, scale):
    """At the workload's own point and 0.1% below it (ISL, OSL, rate, concurrency): there, with the
    suite's compiler flags, differentiating the Poisson solver's iterations gave TPOT's ISL slope
    45% high or 50% low depending on the program; the root's implicit derivative does not."""
    model, hw, layout = setup()
    w = workload_params(load_workload(workload))
    w = w._replace(**{name: getattr(w, name) * scale for name in ("isl_tokens", "osl_tokens", "request_rate_per_s", "concurrency")})
    sens = sensitivities(model, hw, layout, w, 0.9, PARAMETERS)
    assert np.all(np.isfinite(sens.derivative))
    for k, name in enumerate(sens.parameters):
        base = float(getattr(w, name))
        step = 1e-3 * max(abs(base), 1.0) if name != "prefix_hit_rate" else 1e-3
        up = np.asarray(metrics_of(model, hw, layout, w._replace(**{name: jnp.float32(base + step)}), 0.9))
        down = np.asarray(metrics_of(model, hw, layout, w._replace(**{name: jnp.float32(max(base - step, 0.0))}), 0.9))
        fd = (up - down) / (base + step - max(base - step, 0.0))
        # float32 metrics: central differences carry ~1e-4 relative noise; kinks (min/max/ceil)
        # make one-sided gradients, so allow 5% relative or a small absolute slack.
        scale = np.maximum(np.abs(sens.values), 1e-9)
        np.testing.assert_allclose(sens.derivative[:, :, k] / scale, fd / scale, rtol=0.05, atol=2e-3 / max(abs(base), 1e-3) * 10)


def test_tpot_rises_with_osl_when_kv_bound():
    # Reasoning traffic: each request's KV grows to ISL + OSL, so longer outputs read more KV per step.
    model, hw, layout = setup()
    sens = sensitivities(model, hw, layout, workload_params(load_workload("reasoning")), 0.9, PARAMETERS)
    tpot, osl = METRICS.index("tpot_mean_s"), sens.parameters.index("osl_tokens")
    assert np.all(sens.derivative[:, tpot, osl] > 0)


def test_throughput_rises_with_prefix_hits_when_prefill_bound():
    # Offline coding traffic (8,000-token prompts, 300-token answers): prefill dominates, and cached
    # prefix tokens need no compute, so a higher hit rate must raise throughput.
    model, hw, layout = setup()
    w = workload_params(load_workload("coding"), arrival_code=1.0, concurrency=2000.0, request_rate_per_s=0.0, ttft_slo_s=np.inf)
    sens = sensitivities(model, hw, layout, w, 0.9, PARAMETERS)
    thr, hit = METRICS.index("output_tokens_per_s"), sens.parameters.index("prefix_hit_rate")
    assert np.all(sens.derivative[:, thr, hit] > 0)


def test_gradients_finite_for_every_bundled_workload_and_model():
    # One model of each attention/FFN kind: hybrid linear attention, sliding window, MoE + MLA.
    for model_name in ("qwen3.5-27b", "gemma-3-27b", "deepseek-v3"):
        model, hw, layout = setup(model_name, tp=(8.0,), dp=(1.0,))
        for workload in ("coding", "chat", "reasoning", "rl-rollout"):
            sens = sensitivities(model, hw, layout, workload_params(load_workload(workload)), 0.9, PARAMETERS)
            finite_values = np.isfinite(sens.values)
            assert np.all(np.isfinite(sens.derivative[finite_values])), (model_name, workload)


def test_default_parameters_are_columns_of_the_full_jacobian():
    """Poisson traffic: the default parameters drop concurrency, bursts and closed loops the rate; each
    column equals that parameter's column of the all-PARAMETERS call. Unknown names are refused."""
    from jaxplan.errors import PlanError

    model, hw, layout = setup()
    for workload, dropped in (("chat", "concurrency"), ("rl-rollout", "request_rate_per_s")):
        w = workload_params(load_workload(workload))
        full, default = sensitivities(model, hw, layout, w, 0.9, PARAMETERS), sensitivities(model, hw, layout, w, 0.9)
        assert default.parameters == tuple(p for p in PARAMETERS if p != dropped)
        for k, name in enumerate(default.parameters):
            np.testing.assert_array_equal(default.derivative[:, :, k], full.derivative[:, :, PARAMETERS.index(name)])
        np.testing.assert_array_equal(default.values, full.values)
    with pytest.raises(PlanError, match="parameters"):
        sensitivities(model, hw, layout, w, 0.9, ("isl_tokens", "num_layers"))


def test_any_number_of_finalists_shares_one_program():
    """Finalists go through the Jacobian in blocks of BLOCK_ROWS: 3 and 42 finalists use one compiled
    program, and a finalist in the second block gets what the same configuration gets in the first."""
    from jaxplan import elasticity

    w = workload_params(load_workload("chat"))
    few = sensitivities(*setup(), w, 0.9, PARAMETERS)
    programs = elasticity._jacobian._cache_size()
    reps = -(-(elasticity.BLOCK_ROWS + 10) // 3)
    many = sensitivities(*setup(tp=(2.0, 4.0, 8.0) * reps, dp=(4.0, 2.0, 1.0) * reps), w, 0.9, PARAMETERS)
    assert elasticity._jacobian._cache_size() == programs, "another number of finalists compiled again"
    assert many.values.shape[0] == 3 * reps > elasticity.BLOCK_ROWS
    second_block = slice(3 * (elasticity.BLOCK_ROWS // 3 + 1), 3 * (elasticity.BLOCK_ROWS // 3 + 2))
    np.testing.assert_allclose(many.values[second_block], few.values, rtol=1e-6)
    np.testing.assert_allclose(many.derivative[second_block], few.derivative, rtol=1e-5, atol=1e-12)
