"""The timeline figures' traces (`plots.traces.sweep_traces`) replay each finalist as stage 7 does: a
lock-step MoE finalist routed by vLLM's DP coordinator, an independent one by the sweep's routing, even
when both are drawn in one figure set."""

import numpy as np

from jaxplan.funnel.sweep import run_sweep
from jaxplan.plots.traces import merged_traces, sweep_traces
from jaxplan.replay import ReplayTrace
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list


def test_mixed_finalists_replay_as_they_would_alone():
    model = load_model("qwen3-30b-a3b")
    space = load_space("small").for_model(model)
    result = run_sweep(model, parse_gpu_list("h100_sxm"), load_workload("chat"), space, top_k=40)
    lockstep = [r for r in result.shortlist if int(r.get("lockstep_ranks") or 1) > 1]
    independent = [r for r in result.shortlist if int(r.get("lockstep_ranks") or 1) == 1 and r["data_parallel_size"] > 1]
    assert lockstep and independent
    rows = [lockstep[0], independent[0]]
    together, _ = sweep_traces(result, rows, num_requests=60)
    for i, row in enumerate(rows):
        alone, _ = sweep_traces(result, [row], num_requests=60)
        np.testing.assert_array_equal(np.asarray(together.ttft_s)[i], np.asarray(alone.ttft_s)[0])
        np.testing.assert_array_equal(np.asarray(together.replica)[i], np.asarray(alone.replica)[0])
        width = np.shape(alone.replica_steps)[1]
        np.testing.assert_array_equal(np.asarray(together.replica_steps)[i, :width], np.asarray(alone.replica_steps)[0])
        assert not np.asarray(together.replica_active)[i, width:].any()


def test_merged_traces_pad_replicas_and_keep_the_order():
    """Two parts of 1 and 2 finalists with 3 and 1 replicas: rows back in `order`, the narrow part's
    replica fields padded with inactive replicas, the requests' own fields once."""
    def part(f, d, mark):
        fields = {}
        for name in ReplayTrace._fields:
            if name in ("prompt_tokens", "output_tokens"):
                fields[name] = np.arange(5)
            elif name.startswith("replica_"):
                fields[name] = np.full((f, d), mark)
            elif name == "num_kv_blocks":
                fields[name] = np.full((f,), mark)
            else:
                fields[name] = np.full((f, 5), mark)
        return ReplayTrace(**fields)

    merged = merged_traces([part(1, 3, 1), part(2, 1, 2)], np.array([1, 0, 2]))
    assert merged.ttft_s[:, 0].tolist() == [2, 1, 2]
    assert merged.replica_steps.tolist() == [[2, 0, 0], [1, 1, 1], [2, 0, 0]]
    assert merged.prompt_tokens.tolist() == list(range(5)) and merged.num_kv_blocks.tolist() == [2, 1, 2]
