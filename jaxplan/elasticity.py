"""Sensitivity of the stage-4 answer to the workload: derivatives and elasticities by forward-mode AD.

For finalists (layouts [F]) and the workload's continuous parameters θ
(mean ISL, mean OSL, arrival rate, prefix-cache hit rate, concurrency), computes
d metric / d θ and the elasticity d log metric / d log θ for output throughput,
mean TTFT, mean TPOT and cost per million output tokens.

Where the physics has kinks the gradient is the one-sided gradient of the
binding term (min/max select a branch; the prefill chunk count uses a
straight-through ceil: exact value, gradient of the unrounded count; the KV
footprint is not rounded to blocks; the Poisson concurrency is differentiated as
the root of Little's law, not through the solver's steps) -- see
physics/steady_state.py.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan.buckets import pad_rows
from jaxplan.errors import bad_value
from jaxplan.funnel.estimate import cost_per_million_tokens_usd
from jaxplan.physics.shapes import Hardware, Layout, ModelShape, traced
from jaxplan.physics.steady_state import estimate
from jaxplan.physics.traffic import WorkloadParams
from jaxplan.xla_options import LEAN_ONE_SHOT_COMPILE, jit_with_options

PARAMETERS = ("isl_tokens", "osl_tokens", "request_rate_per_s", "prefix_hit_rate", "concurrency")
METRICS = ("output_tokens_per_s", "ttft_mean_s", "tpot_mean_s", "cost_per_million_usd")
HIT_STEP = 0.1  # the hit rate's "elasticity" is per +10 percentage points
# Finalists per Jacobian call (the last block padded): one program for 1 or 200 finalists, where a
# bucket per power of two compiled a new program for each (16 s apiece, bench/README.md).
BLOCK_ROWS = 32


class Sensitivity(NamedTuple):
    """values [F, M]; derivative [F, M, P] (metric units per parameter unit); elasticity [F, M, P]
    (d log metric / d log parameter; for the prefix hit rate: relative change per +0.1)."""

    values: np.ndarray
    derivative: np.ndarray
    elasticity: np.ndarray
    parameters: tuple[str, ...]
    metrics: tuple[str, ...] = METRICS


def metrics_of(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, gpu_memory_utilization) -> jnp.ndarray:
    """[F, M] stage-4 metrics (SI units; cost in USD per million output tokens)."""
    est = estimate(model, hw, layout, w, gpu_memory_utilization)
    hourly = layout.num_gpus * hw.price_usd_per_hour
    cost = cost_per_million_tokens_usd(hourly, est.output_tokens_per_s)
    return jnp.stack([est.output_tokens_per_s, est.ttft_mean_s, est.tpot_mean_s, cost], axis=-1)


# It runs once for milliseconds: compiled at -O0 with XLA:CPU's older emitters (LEAN_ONE_SHOT_COMPILE),
# in about half the time the default emitters take at -O0; its elasticities agree with the default's
# at -O2 to 2.2e-5 (bench/README.md, "Sensitivity"; tests/test_xla_options.py with --run-slow, and
# central differences of an independent program in every run, tests/test_sensitivity.py).
@jit_with_options(LEAN_ONE_SHOT_COMPILE)
def _jacobian(model, hw, layout, w, gpu_memory_utilization):
    """(metrics [F, M], d metrics / d θ [F, M, P], θ [P]) for every parameter of PARAMETERS. Traced
    in the model shape too, and `sensitivities` calls it on blocks of BLOCK_ROWS finalists: one
    compilation serves every model, traffic pattern and number of finalists."""
    theta = jnp.stack([getattr(w, p) for p in PARAMETERS])

    def f(theta):
        return metrics_of(model, hw, layout, w._replace(**dict(zip(PARAMETERS, theta))), gpu_memory_utilization)

    return f(theta), jax.jacfwd(f)(theta), theta


def sensitivities(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, gpu_memory_utilization, parameters=None) -> Sensitivity:
    """Derivatives and elasticities of METRICS for finalists [F] w.r.t. the workload parameters that
    apply (the arrival rate only for Poisson traffic, concurrency only for closed loops and bursts);
    `parameters`, a subset of PARAMETERS, chooses others."""
    if parameters is None:
        poisson = float(w.arrival_code) == 0.0
        parameters = tuple(p for p in PARAMETERS if p != ("concurrency" if poisson else "request_rate_per_s"))
    unknown = [p for p in parameters if p not in PARAMETERS]
    if unknown:
        raise bad_value("parameters", unknown, f"use a subset of {', '.join(PARAMETERS)}")
    num = int(np.shape(layout.tensor_parallel_size)[0])
    padded = -(-num // BLOCK_ROWS) * BLOCK_ROWS
    f32 = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)  # noqa: E731 - strong types: a Python 0.9 and an array share the program
    per_row = f32(pad_rows((hw, layout), num, padded))
    shared = traced(model), f32(w), f32(gpu_memory_utilization)
    rows = lambda start: jax.tree.map(lambda x: x[start : start + BLOCK_ROWS] if np.ndim(x) and np.shape(x)[0] == padded else x, per_row)  # noqa: E731
    blocks = [_jacobian(shared[0], *rows(start), *shared[1:]) for start in range(0, padded, BLOCK_ROWS)]
    values, jac, theta = jax.device_get((jnp.concatenate([b[0] for b in blocks]), jnp.concatenate([b[1] for b in blocks]), blocks[0][2]))
    columns = [PARAMETERS.index(p) for p in parameters]
    values, jac, theta = values[:num], jac[:num][:, :, columns], theta[columns]
    # Prefix hit rate is a fraction that is often 0: report its semi-elasticity per +10 points
    # (relative change of the metric when the hit rate rises by 0.1) instead of d log / d log.
    scale = np.array([HIT_STEP if p == "prefix_hit_rate" else t for p, t in zip(parameters, theta)])
    with np.errstate(divide="ignore", invalid="ignore"):
        elasticity = jac * scale[None, None, :] / values[:, :, None]
    elasticity = np.where(np.isfinite(elasticity), elasticity, 0.0)
    return Sensitivity(values, jac, elasticity, tuple(parameters))


def for_rows(result, rows: list[dict]) -> Sensitivity:
    """Sensitivities of sweep rows (e.g. the shortlist) under the sweep's workload."""
    from jaxplan.funnel.chunk import layout_of
    from jaxplan.grid import candidates_from_digits
    from jaxplan.physics.shapes import take

    ctx = result.context
    digits = jnp.asarray(np.array([r["digits"] for r in rows], np.int32))
    c = candidates_from_digits(ctx.axis_values, digits, jnp.ones(len(rows), bool))
    return sensitivities(ctx.model, take(ctx.hardware, c.gpu_index), layout_of(c), ctx.workload, ctx.gpu_memory_utilization)
