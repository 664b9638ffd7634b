"""Replay traces for the timeline figures: stage 7 and `simulate` return summaries only, so the
finalists (or CSV rows) are replayed again here with the same inputs and seed (same results)."""

from __future__ import annotations


def sweep_traces(result, rows: list[dict], *, num_requests: int | None = None, seed: int = 0, routing: str = "round_robin"):
    """(ReplayTrace [F], block size) for sweep rows, replayed exactly as stage 7 replays them: the
    finalists of independent replicas with `routing`, the lock-step ones (a MoE model's vLLM data
    parallelism) in calls of their own, routed as vLLM's DP coordinator routes (`replay_rows`)."""
    import jax
    import numpy as np

    from jaxplan.funnel.replay_stage import DEFAULT_REQUESTS, finalist_estimate, finalist_inputs, physics_step, replay_parts
    from jaxplan.replay import sample_requests, simulate_trace
    from jaxplan.replay.driver import lane_devices

    workload = result.workload
    configs, params = finalist_inputs(result, rows, routing)
    requests = sample_requests(workload, num_requests or min(workload.num_requests, DEFAULT_REQUESTS), seed)
    parts = replay_parts(configs, params, routing, finalist_estimate(rows, workload, requests, configs, routing), lane_devices())
    traces = [jax.device_get(simulate_trace(sub_config, requests, workload, physics_step, sub_params)) for _, sub_params, sub_config in parts]
    order = np.argsort(np.concatenate([idx for idx, _, _ in parts]), kind="stable")
    return merged_traces(traces, order), configs.block_size


def merged_traces(traces: list, order) -> object:
    """One ReplayTrace [F] of the traces of parts of the finalists (each [F_i], the same requests),
    rows taken in `order` (into the concatenation); per-replica fields padded to the widest part with
    inactive replicas (0 / False), per-request-only fields ([R]) taken from the first part."""
    import numpy as np

    from jaxplan.replay.driver import SHARED_FIELDS

    if len(traces) == 1:
        return traces[0]
    width = max(np.shape(t.replica_active)[1] for t in traces)
    merged = {}
    for name in type(traces[0])._fields:
        values = [np.asarray(getattr(t, name)) for t in traces]
        if name in SHARED_FIELDS:
            merged[name] = values[0]
            continue
        if name.startswith("replica_"):
            values = [np.pad(v, ((0, 0), (0, width - v.shape[1]))) for v in values]
        merged[name] = np.concatenate(values)[order]
    return type(traces[0])(**merged)


def csv_traces(rows: list[dict], *, num_requests: int | None = None, seed: int = 0, params_path: str | None = None, source: str = "input", step=lambda text: None) -> list[tuple]:
    """[(row index, ReplayTrace [1], block size, workload)] for predict-format rows that fit, replayed as
    `jaxplan simulate` replays them (the row's own workload, one replay per row). step(text) before each row."""
    import jax
    import jax.numpy as jnp

    from jaxplan.funnel.replay_stage import physics_params, physics_step, prefix_caching, replay_config
    from jaxplan.prediction import _row_workload, batch_kv_blocks, row_batches, row_hardware
    from jaxplan.replay import sample_requests, simulate_trace

    out = []
    for batch in row_batches(rows, source):
        hw_all = row_hardware(batch, params_path)
        _, blocks = batch_kv_blocks(batch, hw_all)  # the scheduler's blocks, as predict's replay counts them
        for k, i in enumerate(batch.row_ids):
            step(f"replaying row {int(i) + 1} for its timeline")
            if blocks[k] < 1:
                continue
            workload = _row_workload(batch, k, num_requests, rows[i])
            pick = lambda tree, k=k: jax.tree.map(lambda x: x[k : k + 1] if jnp.ndim(x) else x, tree)  # noqa: E731
            caching = prefix_caching(batch.model, rows[i].get("enable_prefix_caching") is not False)
            config = replay_config(pick(batch.layout), blocks[k : k + 1], prefix_caching=caching)
            trace = simulate_trace(config, sample_requests(workload, None, seed), workload, physics_step, physics_params(batch.model, pick(hw_all), pick(batch.layout)))
            out.append((int(i), trace, config.block_size, workload))
    return out
