"""Why a MoE model's winner beats the best layout of each other kind on the same GPUs.

For every layout kind (tp, ep, dp, dp_ep) other than the winner's, the best candidate of that kind
on the winner's GPU type and count (`plots.splits.best_per_split`: every split and batching knob,
scored by stage 4) is set against the winner on two things the physics prices:
- KV capacity: the deployment's KV-cache tokens (replicas x blocks x block size) and weight bytes per
  GPU, which the experts' split sets (lock-step and EP kinds spread them over D x TP GPUs);
- one decode step at the same load (the winner's concurrent requests, spread evenly over each
  layout's replicas), broken into `physics.step_time.StepCost`'s parts: communication (all-reduce,
  dispatch and combine), GEMMs and weight streaming, attention, overhead.
One line per other kind, computed, never canned. Where no layout of a kind passes on the winner's
GPU count, the line names the split of that kind that comes closest (furthest through the funnel;
at stage 4, the most throughput), the stage that stops it and why: the reason of another split, e.g.
one whose weights do not fit, would hide that the contender ran out of throughput. Where one passes
on more GPUs (one GPU leaves no room for expert parallelism or lock-step ranks), the line also names
the fewest GPUs of the winner's type on which one does (up to MAX_LARGER_COUNTS larger counts) and
what its best layout there costs per output token against the winner.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from jaxplan.layout_kind import kind_label, kind_name, row_kind

KIND_ORDER = ("tp", "ep", "dp", "dp_ep")
MAX_ROWS = 8  # rows of one evaluation (winner + up to 3 rivals), padded: one compilation
MAX_LARGER_COUNTS = 6  # larger GPU counts searched for a kind that does not pass on the winner's


def why_it_wins(result, winner: dict) -> list[str]:
    """Lines saying how `winner` (a sweep or replayed row) beats the best layout of each other kind
    of the space on the same GPUs (or, where none of a kind passes there, on the fewest more GPUs
    that run one); [] for a dense model or a space with one kind."""
    if not result.model.is_moe:
        return []
    in_space = set(result.grid.space.layout_kind)
    if len(in_space) < 2:
        return []
    from jaxplan.funnel.sweep import STAGE_NAMES
    from jaxplan.plots.splits import best_per_split

    rows = best_per_split(result, int(winner["num_gpus"]), (winner["gpu"],))
    mine = row_kind(winner)[0]
    best: dict[str, dict] = {}
    progress = lambda r: (r.get("why_stage", 0), r.get("why_tokens_per_s", float("-inf")))  # noqa: E731
    for r in rows:  # best first; of a kind none of whose splits passes, the one that came closest
        kind = row_kind(r)[0]
        if kind != mine and (kind not in best or not best[kind]["passes"] and progress(r) > progress(best[kind])):
            best[kind] = r
    others = [k for k in KIND_ORDER if k != mine and k in in_space]
    passing = [best[k] for k in others if k in best and best[k]["passes"]]
    costs = decode_costs(result, [winner, *passing], concurrency=float(winner["concurrency_per_replica"]) * int(winner["data_parallel_size"])) if passing else []
    lines, searched = [], {}
    for kind in others:
        r = best.get(kind)
        if r is not None and r["passes"]:
            lines.append(compare_line(winner, r, costs[0], costs[1 + passing.index(r)], result.grid.space.block_size_tokens))
            continue
        if r is not None:
            stage = r.get("why_stage")
            where = f"the one that comes closest, {kind_label(r)}, stops at stage {stage} ({STAGE_NAMES[stage]}): " if stage in STAGE_NAMES else ""
            reached = reached_clause(r.get("why_tokens_per_s", float("-inf")), result.workload.offered_output_tokens_per_s)
            line = f"{kind_name(winner)} over {kind}: no {kind} layout of {winner['num_gpus']} {winner['gpu']} passes ({where}{r['why']}{reached})"
        else:
            line = f"{kind_name(winner)} over {kind}: the space has no {kind} layout of {winner['num_gpus']} {winner['gpu']}"
        larger = best_on_more_gpus(result, winner, kind, searched)
        lines.append(line if larger is None else f"{line}; {more_gpus_clause(winner, larger)}")
    return lines


def reached_clause(tokens_per_s: float, offered: float | None) -> str:
    """"; its best estimate N output tok/s [of the M the traffic asks for]", N rounded down: a layout
    that cannot keep up with 5,000 tok/s of arrivals reaches 4,999.7 at most, which must not read
    as 5,000; "" where no estimate was made."""
    if not np.isfinite(tokens_per_s):
        return ""
    asked = f" of the {offered:,.0f} the traffic asks for" if offered else ""
    return f"; its best estimate {math.floor(tokens_per_s):,} output tok/s{asked}"


def larger_counts(result, winner: dict) -> list[int]:
    """GPU counts of the grid's layouts on the winner's GPU type larger than the winner's, ascending:
    TP x PP x DP x lock-step ranks over the space's axes."""
    from jaxplan.specs.space import parse_kind_label

    labels = result.grid.labels
    ranks = {parse_kind_label(k)[1] for k in labels["layout_kind"]}
    counts = {int(tp) * int(pp) * int(dp) * r for tp in labels["tensor_parallel_size"] for pp in labels["pipeline_parallel_size"] for dp in labels["data_parallel_size"] for r in ranks}
    return sorted(c for c in counts if c > int(winner["num_gpus"]))


def best_on_more_gpus(result, winner: dict, kind: str, searched: dict | None = None) -> dict | None:
    """The best passing layout of `kind` on the fewest GPUs of the winner's type above the winner's
    count (the first MAX_LARGER_COUNTS such counts searched), or None. `searched`: {count: rows of
    `best_per_split`}, filled as counts are evaluated, so that several kinds evaluate each count once."""
    from jaxplan.plots.splits import best_per_split

    searched = {} if searched is None else searched
    for count in larger_counts(result, winner)[:MAX_LARGER_COUNTS]:
        if count not in searched:
            searched[count] = best_per_split(result, count, (winner["gpu"],))
        rows = [r for r in searched[count] if r["passes"] and row_kind(r)[0] == kind]
        if rows:
            return rows[0]  # best first
    return None


def more_gpus_clause(winner: dict, rival: dict) -> str:
    """How the best layout of another kind on more GPUs compares: cost per output token first (what
    the sweep ranks by), then stage 4's throughput and p99 TPOT."""
    cost, theirs = winner["cost_per_million_output_tokens_usd"], rival["cost_per_million_output_tokens_usd"]
    return (
        f"on the fewest {winner['gpu']} that run one ({rival['num_gpus']}), the best, {kind_label(rival)} "
        f"{rival['weight_dtype']}/{rival['kv_cache_dtype']}, costs ${theirs:.2f} per million output tokens against the winner's ${cost:.2f} "
        f"({theirs / max(cost, 1e-12):.2f}x); stage 4 {rival['output_tokens_per_s']:,.0f} vs {winner['output_tokens_per_s']:,.0f} tok/s, "
        f"p99 TPOT {rival['tpot_p99_s'] * 1e3:.1f} vs {winner['tpot_p99_s'] * 1e3:.1f} ms"
    )


def compare_line(winner: dict, rival: dict, mine: dict, theirs: dict, block_size_tokens: int) -> str:
    """One line: KV capacity, weights per GPU, and the decode step's parts (ms) against `rival`."""
    ours, their_tokens = kv_tokens(winner, block_size_tokens), kv_tokens(rival, block_size_tokens)
    parts = []
    for name, key in (("communication", "communication_s"), ("GEMM/weights", "gemm_s"), ("attention", "attention_s"), ("overhead", "overhead_s")):
        delta_ms = (mine[key] - theirs[key]) * 1e3
        if abs(delta_ms) >= 0.05:
            parts.append(f"{name} {delta_ms:+.1f}")
    return (
        f"{kind_name(winner)} over {row_kind(rival)[0]} (best: {kind_label(rival)} {rival['weight_dtype']}/{rival['kv_cache_dtype']}): "
        f"{ours / max(their_tokens, 1.0):.2f}x the KV cache ({_tokens(ours)} vs {_tokens(their_tokens)} tokens; "
        f"weights {mine['weight_bytes_per_gpu'] / 1e9:.1f} vs {theirs['weight_bytes_per_gpu'] / 1e9:.1f} GB/GPU); "
        f"decode step at {mine['concurrency']:,.0f} requests {mine['total_s'] * 1e3:.1f} vs {theirs['total_s'] * 1e3:.1f} ms"
        + (f" ({', '.join(parts)} ms)" if parts else "")
        + f"; stage 4 {winner['output_tokens_per_s']:,.0f} vs {rival['output_tokens_per_s']:,.0f} tok/s, "
        f"p99 TPOT {winner['tpot_p99_s'] * 1e3:.1f} vs {rival['tpot_p99_s'] * 1e3:.1f} ms"
    )


def _tokens(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k" if n >= 1e4 else f"{n:,.0f}"


def kv_tokens(row: dict, block_size_tokens: int) -> float:
    """KV-cache tokens of the whole deployment: replicas x blocks per replica x the block size."""
    return float(row["kv_blocks_per_replica"]) * block_size_tokens * int(row["data_parallel_size"])


def decode_costs(result, rows: list[dict], concurrency: float) -> list[dict]:
    """Per row: one decode step of a replica carrying concurrency / replicas requests at the workload's
    mean context (StepCost's parts, seconds), its weight bytes per GPU, and the concurrency."""
    import jax
    import jax.numpy as jnp

    digits = np.zeros((MAX_ROWS, len(rows[0]["digits"])), np.int32)
    digits[: len(rows)] = [r["digits"] for r in rows]
    per_replica = np.ones(MAX_ROWS, np.float32)
    per_replica[: len(rows)] = [max(concurrency / int(r["data_parallel_size"]), 1.0) for r in rows]
    workload = result.context.workload
    context = float(workload.isl_tokens) + 0.5 * float(workload.osl_tokens)
    cost, weights = jax.device_get(_decode_cost(result.context, jnp.asarray(digits), jnp.asarray(per_replica), jnp.float32(context)))
    return [
        {**{k: float(getattr(cost, k)[i]) for k in cost._fields}, "weight_bytes_per_gpu": float(weights[i]), "concurrency": concurrency}
        for i in range(len(rows))
    ]


def _decode_cost(ctx, digits, per_replica, context_tokens):
    from jaxplan.funnel.chunk import rows_context

    return _jitted()(rows_context(ctx), digits, per_replica, context_tokens)


@functools.cache
def _jitted():
    import jax  # on first use: importing this module does not import JAX

    return jax.jit(_decode_cost_impl)


def _decode_cost_impl(ctx, digits, per_replica, context_tokens):
    from jaxplan.funnel.chunk import layout_of
    from jaxplan.grid import candidates_from_digits
    from jaxplan.physics.batch import StepBatch
    from jaxplan.physics.memory import weight_bytes_per_gpu
    from jaxplan.physics.shapes import take
    from jaxplan.physics.step_time import step_cost

    c = candidates_from_digits(ctx.axis_values, digits, digits[:, 0] >= 0)
    layout = layout_of(c)
    hw = take(ctx.hardware, c.gpu_index)
    cost = step_cost(ctx.model, hw, layout, StepBatch.decode_only(per_replica, per_replica * context_tokens))
    return cost, weight_bytes_per_gpu(ctx.model, layout)
