"""Cost per million output tokens: one helper for stage 4 and the sensitivities, hand-computed
cases, its floor, and its gradient above the floor."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan.funnel.estimate import MIN_OUTPUT_TOKENS_PER_HOUR, cost_per_million_tokens_usd


def test_hand_computed_costs():
    # $10/h at 1,000 tok/s: 3.6M tokens per hour, so 10 / 3.6 = 2.777... USD per million tokens;
    # 8 GPUs at $2.50/h at 2,000 tok/s: $20/h over 7.2M tokens, the same; $3.6/h at 1 tok/s: $1,000.
    cost = cost_per_million_tokens_usd(jnp.array([10.0, 8 * 2.5, 3.6]), jnp.array([1000.0, 2000.0, 1.0]))
    np.testing.assert_allclose(np.asarray(cost), [10 / 3.6, 10 / 3.6, 1000.0], rtol=1e-6)  # float32


def test_no_throughput_is_finite_and_a_free_one_costs_nothing():
    cost = np.asarray(cost_per_million_tokens_usd(jnp.array([4.0, 0.0]), jnp.array([0.0, 0.0])))
    assert cost[0] == np.float32(4.0 / MIN_OUTPUT_TOKENS_PER_HOUR * 1e6) and np.isfinite(cost[0])
    assert cost[1] == 0.0  # 0 / 0 would be NaN without the floor


def test_the_floor_leaves_the_gradient_of_a_real_throughput_alone():
    # d/dx [h / (3600 x) * 1e6] = -h 1e6 / (3600 x^2): at h = $7.2/h, x = 100 tok/s, -0.2 USD per tok/s.
    grad = jax.grad(lambda x: cost_per_million_tokens_usd(7.2, x))(100.0)
    np.testing.assert_allclose(float(grad), -7.2e6 / (3600 * 100.0**2), rtol=1e-6)


def test_the_sensitivities_price_with_the_same_helper():
    from jaxplan.elasticity import METRICS, metrics_of
    from jaxplan.physics import efficiency_for, hardware_table, make_layout, model_shape, take, workload_params
    from jaxplan.specs import load_gpu, load_model, load_workload

    hw = take(hardware_table((load_gpu("h100_sxm"),), efficiency_for(["h100_sxm"])), jnp.zeros(2, jnp.int32))
    layout = make_layout(tp=jnp.array([2.0, 8.0]), dp=jnp.array([4.0, 1.0]), weight_bytes=1, kv_bytes=1, max_num_seqs=256, max_num_batched_tokens=8192)
    values = np.asarray(metrics_of(model_shape(load_model("llama-3.1-70b")), hw, layout, workload_params(load_workload("chat")), 0.9))
    hourly = np.asarray(layout.num_gpus * hw.price_usd_per_hour)
    thr, cost = values[:, METRICS.index("output_tokens_per_s")], values[:, METRICS.index("cost_per_million_usd")]
    assert np.all(thr > 0)
    np.testing.assert_allclose(cost, hourly / (thr * 3600.0) * 1e6, rtol=1e-5)  # float32, independent arithmetic
