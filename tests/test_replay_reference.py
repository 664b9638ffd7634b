"""The JAX replay matches the plain-Python reference scheduler exactly on small random cases.

Each call replays several finalists with different capacities, replica counts
and step-time parameters in one vmapped program, so leakage between batch
elements would show up as a mismatch. Step times and arrivals are dyadic, so
float32 (JAX) and float64 (reference) clocks agree exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxplan.replay import ReplayConfig, Requests, simulate_trace
from jaxplan.replay.reference import reference_replay
from jaxplan.replay.testing import affine_step_time, affine_step_time_py, dyadic_params
from jaxplan.specs.workload import Arrival, Workload

NUM_F = 6
NUM_R = 24
BLOCK = 4
STATIC = {"num_slots": 8, "max_replicas": 4}  # one compiled program for every case


def _workload(closed: int) -> Workload:
    if closed:
        return Workload(name="closed", isl_mean_tokens=10, osl_mean_tokens=10, arrival=Arrival.CLOSED, concurrency=closed)
    return Workload(name="open", isl_mean_tokens=10, osl_mean_tokens=10, arrival=Arrival.POISSON, request_rate_per_s=1.0)


def _case(seed: int, *, kv_scale=(1, 4), prefix_caching: bool = True):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1, 80, NUM_R).astype(np.int32)
    osl = rng.integers(1, 30, NUM_R).astype(np.int32)
    hit = (rng.integers(0, 80, NUM_R) * (rng.random(NUM_R) < 0.3)).astype(np.int32)
    arrival = np.sort(rng.integers(0, 256, NUM_R)).astype(np.float32) / 64  # dyadic seconds
    if rng.random() < 0.2:
        arrival[:] = 0.0
    largest = int(-(-(prompt.max() + osl.max()) // BLOCK))  # blocks of the biggest request
    config = ReplayConfig.create(
        max_num_seqs=rng.integers(1, 9, NUM_F),
        max_num_batched_tokens=rng.integers(1, 100, NUM_F),
        num_kv_blocks=rng.integers(int(kv_scale[0] * largest), int(kv_scale[1] * largest), NUM_F),
        data_parallel_size=rng.integers(1, 5, NUM_F),
        block_size=BLOCK,
        # PP micro-batches per step (own generator: the other draws stay as they were)
        pipeline_parallel_size=np.random.default_rng(seed + 10_000).integers(1, 4, NUM_F),
        prefix_caching=prefix_caching,
    )
    return Requests(prompt, osl, hit, arrival), config, dyadic_params(rng, NUM_F, attention_seed=seed + 20_000)


def _compare(requests, config, params, closed=0, window=8):
    trace = simulate_trace(config, requests, _workload(closed), affine_step_time, params, window=window, **STATIC)
    preemptions = 0
    for f in range(NUM_F):
        ref = reference_replay(
            requests,
            max_num_seqs=int(config.max_num_seqs[f]),
            max_num_batched_tokens=int(config.max_num_batched_tokens[f]),
            num_kv_blocks=int(config.num_kv_blocks[f]),
            data_parallel_size=int(config.data_parallel_size[f]),
            pipeline_parallel_size=int(config.pipeline_parallel_size[f]),
            block_size=BLOCK,
            step_time=affine_step_time_py(params[f]),
            closed_concurrency=closed,
            prefix_caching=config.prefix_caching,
        )
        where = f"finalist {f}"
        np.testing.assert_array_equal(trace.first_token_step[f], [r.first_token_step for r in ref.requests], err_msg=where)
        np.testing.assert_array_equal(trace.finish_step[f], [r.finish_step for r in ref.requests], err_msg=where)
        np.testing.assert_array_equal(trace.preemptions[f], [r.preemptions for r in ref.requests], err_msg=where)
        dp = len(ref.replicas)
        np.testing.assert_array_equal(trace.replica_steps[f][:dp], [r.steps for r in ref.replicas], err_msg=where)
        np.testing.assert_array_equal(trace.replica_preemptions[f][:dp], [r.preemptions for r in ref.replicas], err_msg=where)
        np.testing.assert_array_equal(trace.replica_peak_kv_blocks[f][:dp], [r.peak_kv_blocks for r in ref.replicas], err_msg=where)
        np.testing.assert_array_equal(trace.replica_kv_sum[f][:dp], [r.kv_block_steps for r in ref.replicas], err_msg=where)
        np.testing.assert_array_equal(trace.replica_batch_sum[f][:dp], [r.scheduled_sum for r in ref.replicas], err_msg=where)
        np.testing.assert_array_equal(trace.replica_tokens_out[f][:dp], [r.tokens_out for r in ref.replicas], err_msg=where)
        np.testing.assert_array_equal(trace.replica_stalled[f][:dp], [r.stalled for r in ref.replicas], err_msg=where)
        np.testing.assert_array_equal(trace.replica_clock_s[f][:dp], [r.last_step_end for r in ref.replicas], err_msg=where)
        ttft = [r.first_token_time - r.arrival if r.first_token_time is not None and r.finish_step >= 0 else np.nan for r in ref.requests]
        e2e = [r.finish_time - r.arrival if r.finish_time is not None else np.nan for r in ref.requests]
        finished = np.asarray(trace.finish_step[f]) >= 0
        np.testing.assert_array_equal(np.where(finished, trace.ttft_s[f], np.nan), ttft, err_msg=where)
        np.testing.assert_array_equal(trace.e2e_s[f], e2e, err_msg=where)
        preemptions += sum(r.preemptions for r in ref.replicas)
    return preemptions


@pytest.mark.parametrize("seeds", [range(6), range(6, 12)])
def test_open_loop_matches_reference(seeds):
    preemptions = sum(_compare(*_case(seed)) for seed in seeds)
    assert preemptions > 0  # the cases exercise preemption


def test_tight_kv_matches_reference():
    """KV barely above the largest request: preemption storms, recompute, stalls."""
    assert sum(_compare(*_case(seed, kv_scale=(1, 2))) for seed in range(100, 104)) > 0


def test_tight_kv_without_prefix_caching_matches_reference():
    """Victims recomputed whole (a hybrid model's, or vLLM without its prefix cache)."""
    assert sum(_compare(*_case(seed, kv_scale=(1, 2), prefix_caching=False)) for seed in range(100, 102)) > 0


def test_stalls_match_reference():
    """KV smaller than the largest request: replicas stall, the rest of their requests stay unfinished."""
    stalled = 0
    for seed in range(200, 204):
        requests, config, params = _case(seed, kv_scale=(0.5, 1.0))
        _compare(requests, config, params)
        trace = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, **STATIC)
        stalled += int(np.asarray(trace.replica_stalled).sum())
    assert stalled > 0


def test_closed_loop_matches_reference():
    for seed, closed in ((20, 1), (21, 3), (22, 5), (23, 40)):
        _compare(*_case(seed), closed=closed)


def test_prefill_context_matches_reference():
    """A step time that charges each prompt chunk's cached context (as dense MLA's re-up-projection
    does): the replay counts it, jumps included, as the reference does chunk by chunk (prefix hits,
    recomputation after preemption)."""
    for seed in (30, 31, 32):
        requests, config, params = _case(seed)
        context_s = 2.0 ** -np.random.default_rng(seed + 30_000).integers(10, 14, NUM_F)
        params = np.concatenate([params, np.zeros((NUM_F, 1)), context_s[:, None]], 1).astype(np.float32)
        _compare(requests, config, params)


def test_step_by_step_matches_reference():
    """window=1 (no decode jumps) gives the same answers as the jumps above."""
    for seed in (0, 7):
        _compare(*_case(seed), window=1)


def test_growing_slot_rows_resumes_exactly(monkeypatch):
    """Start with 4 rows per replica: the driver widens the tables mid-run and resumes."""
    from jaxplan.replay import driver

    grown = []
    real_grow = driver._grow
    monkeypatch.setattr(driver, "INITIAL_SLOTS", 4)
    monkeypatch.setattr(driver, "_grow", lambda *a, **k: grown.append(k["num_slots"]) or real_grow(*a, **k))
    requests, config, params = _case(3)
    config = ReplayConfig.create(8, config.max_num_batched_tokens * 4, config.num_kv_blocks * 4, config.data_parallel_size, block_size=BLOCK)
    requests = requests._replace(arrival_s=np.zeros_like(requests.arrival_s))  # a burst fills every row
    trace_small = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, max_replicas=4)
    trace_fixed = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, **STATIC)
    assert grown == [8]
    for name in trace_small._fields:
        if name != "replica_iterations":  # the frozen iteration before the widening counts
            np.testing.assert_array_equal(getattr(trace_small, name), getattr(trace_fixed, name), err_msg=name)
    assert not np.asarray(trace_small.replica_overflow).any()


def test_slot_rows_past_64_grow_in_steps_of_64(monkeypatch):
    """max_num_seqs 130 with 160 requests in a burst: the rows grow 64 -> 192, not to 256, and the
    trace equals that of 256 fixed rows (the row count never changes a result)."""
    from jaxplan.replay import driver

    assert [driver.slot_rows(v) for v in (1, 3, 33, 64, 65, 128, 130, 192, 193, 300)] == [1, 4, 64, 64, 128, 128, 192, 192, 256, 320]
    grown = []
    real_grow = driver._grow
    monkeypatch.setattr(driver, "INITIAL_SLOTS", 64)
    monkeypatch.setattr(driver, "_grow", lambda *a, **k: grown.append(k["num_slots"]) or real_grow(*a, **k))
    rng = np.random.default_rng(5)
    n = 160
    requests = Requests(rng.integers(1, 20, n).astype(np.int32), rng.integers(1, 12, n).astype(np.int32), np.zeros(n, np.int32), np.zeros(n, np.float32))
    config = ReplayConfig.create(max_num_seqs=[130], max_num_batched_tokens=[4096], num_kv_blocks=[4096], data_parallel_size=[1], block_size=BLOCK)
    params = dyadic_params(rng, 1, attention_seed=5)
    grown_trace = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, max_replicas=1)
    fixed = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, num_slots=256, max_replicas=1)
    assert grown == [192]
    assert not np.asarray(grown_trace.replica_overflow).any()
    for name in grown_trace._fields:
        if name != "replica_iterations":  # the frozen iteration before the widening counts
            np.testing.assert_array_equal(getattr(grown_trace, name), getattr(fixed, name), err_msg=name)
