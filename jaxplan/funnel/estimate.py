"""Stage 4, estimate: roofline throughput, TTFT, TPOT; SLO and throughput-target filters; cost."""

from __future__ import annotations

import jax.numpy as jnp

from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.structure import first_failure
from jaxplan.physics.shapes import Hardware, Layout, ModelShape
from jaxplan.physics.steady_state import Estimate, estimate
from jaxplan.physics.traffic import WorkloadParams

HOUR_S = 3600.0
TIE_BREAK = 0.01  # weight of the secondary objective in the log score
# A configuration that produces (next to) nothing costs hourly / this per token: finite, and 0 rather
# than NaN at a zero price, where millions of stage-4 candidates include some with no throughput.
MIN_OUTPUT_TOKENS_PER_HOUR = 1e-9


def cost_per_million_tokens_usd(hourly_usd, output_tokens_per_s):
    """USD per million output tokens (broadcast shape; traceable) from the hourly cost (USD/h) and
    the output throughput (tokens/s), with throughput floored at MIN_OUTPUT_TOKENS_PER_HOUR."""
    return hourly_usd / jnp.maximum(output_tokens_per_s * HOUR_S, MIN_OUTPUT_TOKENS_PER_HOUR) * 1e6


def estimate_stage(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, gpu_memory_utilization, capacity, prepared=None):
    """(reason [C], Estimate, cost per million output tokens [C] USD, hourly cost [C] USD, score [C]).

    `capacity` = (slots b_max [C], bound code [C]) from stage 3; `prepared` its demand-independent
    part (steady_state.prepare) when already computed."""
    est: Estimate = estimate(model, hw, layout, w, gpu_memory_utilization, capacity, prepared)
    hourly_usd = layout.num_gpus * hw.price_usd_per_hour
    per_million = cost_per_million_tokens_usd(hourly_usd, est.output_tokens_per_s)
    reason = first_failure(
        [
            ((w.arrival_code == 0) & (est.utilization >= 1.0), Reason.OVERLOADED),
            (est.ttft_p99_s > w.ttft_slo_s, Reason.TTFT_SLO),
            (est.tpot_p99_s > w.tpot_slo_s, Reason.TPOT_SLO),
            (est.output_tokens_per_s < w.target_output_tokens_per_s, Reason.BELOW_TARGET),
        ]
    )
    return reason, est, per_million, hourly_usd, score(est, hourly_usd, w)


def score(est: Estimate, hourly_usd, w: WorkloadParams):
    """The funnel's objective for stage-4 estimates (see `objective`)."""
    return objective(est.output_tokens_per_s, est.tpot_p99_s, hourly_usd, w.target_output_tokens_per_s)


def objective(output_tokens_per_s, tpot_p99_s, hourly_usd, target_output_tokens_per_s):
    """Higher is better. With a throughput target: the cheapest deployment that meets it (ties: more
    throughput, then lower p99 TPOT). Without: output tokens per dollar (ties: lower p99 TPOT). For
    Poisson traffic every stable candidate delivers the same throughput, so this is again the
    cheapest deployment, and among equally priced ones the lower p99 TPOT.
    Stage 4 and the replay (stage 7) both rank by it."""
    throughput = jnp.maximum(output_tokens_per_s, 1e-9)
    log_tpot = jnp.log(jnp.maximum(tpot_p99_s, 1e-9))
    # Under Poisson traffic with a target, equally priced candidates that keep up tie on throughput
    # exactly; the TPOT term, a hundred times weaker, orders them rather than grid order.
    with_target = -jnp.log(hourly_usd) + TIE_BREAK * jnp.log(throughput) - TIE_BREAK**2 * log_tpot
    per_dollar = jnp.log(throughput / hourly_usd) - TIE_BREAK * log_tpot
    return jnp.where(target_output_tokens_per_s > 0, with_target, per_dollar)
