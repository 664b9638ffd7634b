"""Forward-mode elasticities of stage 4 against central finite differences of the *replay*.

The replay (stage 7) is an independent, step-by-step model of the same engine: if stage 4's
derivative w.r.t. ISL or OSL had the wrong sign or size, the replay's response to the same change
would disagree. Three finalists (Llama-3.1-8B on H100 at TP 1, 2, 4) run a closed loop of 64
requests in flight; the request set is the same seeded sample with every length scaled by
(1 +- 20%) (uniform lengths: the same uniform draws, rescaled, so the difference is the scaling and
not resampling noise).

Tolerance: 0.05 absolute on the elasticity (d log metric / d log parameter). Why: a wide +-20% step
(the replay's metrics are step-quantised and finish in discrete waves, so a small step would measure
noise), whose curvature error on these near-linear responses is O(h^2) ~ 0.01; the two models differ
by the discrete effects stage 4 averages away (last-chunk rounding, block rounding, wave tails),
measured at up to ~0.015 here. The ISL elasticities are ~0.35-0.5 and the OSL ones ~0.05, so a
sign error or a factor-of-two error fails.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan.funnel.replay_stage import physics_params, physics_step, replay_config
from jaxplan.physics import (
    efficiency_for,
    hardware_table,
    make_layout,
    model_shape,
    take,
    workload_params,
)
from jaxplan.physics.memory import kv_blocks_per_replica
from jaxplan.replay import sample_requests, simulate
from jaxplan.elasticity import METRICS, PARAMETERS, sensitivities
from jaxplan.specs import load_gpu, load_model
from jaxplan.specs.workload import Arrival, LengthDistribution, Workload

STEP = 0.2  # relative step of the central difference
TOLERANCE = 0.05  # absolute, on the elasticity
REQUESTS = 640


@pytest.mark.slow
@pytest.mark.parametrize("parameter", ["isl_tokens", "osl_tokens"])
def test_elasticities_match_central_differences_of_the_replay(parameter):
    model = model_shape(load_model("llama-3.1-8b"))
    hw = take(hardware_table((load_gpu("h100_sxm"),), efficiency_for(["h100_sxm"])), jnp.zeros(3, jnp.int32))
    layout = make_layout(tp=jnp.array([1.0, 2.0, 4.0]), dp=jnp.ones(3), weight_bytes=2, kv_bytes=2, max_num_seqs=64, max_num_batched_tokens=8192)
    configs = replay_config(layout, np.asarray(kv_blocks_per_replica(model, hw, layout, 0.9, 16.0)), 16)
    base = Workload(
        "fd", isl_mean_tokens=2000, osl_mean_tokens=1000, arrival=Arrival.CLOSED, concurrency=64, num_requests=REQUESTS,
        isl_distribution=LengthDistribution.UNIFORM, isl_spread=0.2, osl_distribution=LengthDistribution.UNIFORM, osl_spread=0.2,
    )
    field = {"isl_tokens": "isl_mean_tokens", "osl_tokens": "osl_mean_tokens"}[parameter]

    def replayed(scale):
        w = dataclasses.replace(base, **{field: getattr(base, field) * scale})
        m = jax.device_get(simulate(configs, sample_requests(w, REQUESTS, seed=0), w, physics_step, physics_params(model, hw, layout)))
        assert np.all(m.unfinished == 0)
        return np.log(np.stack([m.output_tokens_per_s, m.tpot.mean_s], axis=-1))

    fd = (replayed(1 + STEP) - replayed(1 - STEP)) / (np.log(1 + STEP) - np.log(1 - STEP))
    sens = sensitivities(model, hw, layout, workload_params(base), 0.9, PARAMETERS)
    k = sens.parameters.index(parameter)
    ad = sens.elasticity[:, [METRICS.index("output_tokens_per_s"), METRICS.index("tpot_mean_s")], k]
    np.testing.assert_allclose(ad, fd, atol=TOLERANCE, rtol=0)
    # Signs the physics fixes: longer prompts cost more prefill per output token (throughput down,
    # TPOT up: prefill chunks ride along decode steps); the replay agrees.
    if parameter == "isl_tokens":
        assert np.all(ad[:, 0] < -0.2) and np.all(fd[:, 0] < -0.2) and np.all(ad[:, 1] > 0.2) and np.all(fd[:, 1] > 0.2)
