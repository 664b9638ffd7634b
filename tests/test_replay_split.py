"""Round robin: a finalist's replicas spread over several lanes give the same trace, bit for bit.

The driver may replay a finalist's data-parallel replicas on several lanes (each a contiguous
range of replicas, one after the other) so that the loop, which runs as long as the busiest lane,
is shorter. Replicas are independent under round robin, so every ReplayTrace field must equal the
one-lane-per-finalist replay's.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_replay_reference import STATIC, _case, _workload

from jaxplan.errors import PlanError
from jaxplan.replay import ReplayConfig, Requests, driver, simulate_trace
from jaxplan.replay.memory import ReplayShape, replay_bytes
from jaxplan.replay.testing import affine_step_time


def _same(a, b, where=""):
    for name in a._fields:
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        assert x.dtype == y.dtype and x.shape == y.shape, f"{where} {name}"
        assert x.tobytes() == y.tobytes(), f"{where} {name} differs"  # bit for bit (nan and -0.0 too)


def _dp_case(seed: int, kv_scale=(1, 4)):
    """A reference case with 2-4 replicas per finalist."""
    requests, config, params = _case(seed, kv_scale=kv_scale)
    dp = np.random.default_rng(seed + 500).integers(2, 5, config.num_finalists)
    config = ReplayConfig.create(
        config.max_num_seqs, config.max_num_batched_tokens, config.num_kv_blocks, dp, block_size=config.block_size, pipeline_parallel_size=config.pipeline_parallel_size
    )
    return requests, config, params


@pytest.mark.parametrize("closed", [0, 3, 40])
def test_split_lanes_match_one_lane_per_finalist(closed):
    preempted = stalled = 0
    for seed, kv_scale in ((1, (1, 4)), (2, (1, 2)), (3, (1, 2)), (4, (0.5, 1.0))):
        requests, config, params = _dp_case(seed, kv_scale)
        run = lambda **kw: simulate_trace(config, requests, _workload(closed), affine_step_time, params, window=8, **STATIC, **kw)  # noqa: E731
        whole = run()
        hints = {"replica_steps_hint": np.full(config.num_finalists, 1e6), "replica_concurrency_hint": np.arange(config.num_finalists) + 1.0}
        for kw in ({"max_replicas_per_lane": 1}, {"max_replicas_per_lane": 2}, {"replica_steps_hint": np.full(config.num_finalists, 1e6)}, hints):
            _same(whole, run(**kw), f"seed {seed} closed {closed} {kw}")
        preempted += int(np.asarray(whole.preemptions).sum())
        stalled += int(np.asarray(whole.replica_stalled).sum())
    assert preempted > 0 and stalled > 0  # the cases exercise preemption and stalls


def test_split_with_growing_slot_rows(monkeypatch):
    """Slot rows grow at other times when lanes are split: the results (and iteration counts) do not change."""
    monkeypatch.setattr(driver, "INITIAL_SLOTS", 2)
    for seed, closed in ((5, 0), (6, 3)):
        requests, config, params = _dp_case(seed, (1, 2))
        run = lambda **kw: simulate_trace(config, requests, _workload(closed), affine_step_time, params, window=8, max_replicas=4, **kw)  # noqa: E731
        whole = run()
        _same(whole, run(max_replicas_per_lane=1), f"seed {seed}")
        _same(whole, simulate_trace(config, requests, _workload(closed), affine_step_time, params, window=8, **STATIC), f"seed {seed} fixed rows")


def test_initial_slot_rows_do_not_change_the_trace():
    """Starting with 1 row (many widenings), the default or more rows than needed: the same trace."""
    for seed, closed in ((5, 0), (6, 3)):
        requests, config, params = _dp_case(seed, (1, 2))
        run = lambda **kw: simulate_trace(config, requests, _workload(closed), affine_step_time, params, window=8, max_replicas=4, **kw)  # noqa: E731
        whole = run()
        for initial in (1, 64):
            _same(whole, run(initial_slots=initial), f"seed {seed} initial_slots {initial}")
    with pytest.raises(Exception, match="initial_slots"):
        run(initial_slots=0)


def _count_iterations(monkeypatch):
    ran = []
    real = driver._advance
    monkeypatch.setattr(driver, "_advance", lambda *a, **k: (lambda out: ran.append(driver._host_flags(*out[1:])[0]) or out)(real(*a, **k)))
    return ran


def test_split_shortens_the_loop(monkeypatch):
    """Finalists of 4 replicas: one lane per finalist runs its replicas one after the other; split, the
    loop runs as long as the busiest replica."""
    requests, config, params = _case(8)
    config = ReplayConfig.create(config.max_num_seqs, config.max_num_batched_tokens, config.num_kv_blocks * 4, 4, block_size=config.block_size)
    ran = _count_iterations(monkeypatch)
    whole = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, **STATIC)
    whole_loop = sum(ran)
    ran.clear()
    split = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, max_replicas_per_lane=1, **STATIC)
    split_loop = sum(ran)
    _same(whole, split)
    iters = np.asarray(whole.replica_iterations)
    # one lane per finalist: the loop runs as long as the longest sum over a finalist's replicas
    assert whole_loop == iters.sum(1).max()
    # one replica per lane: as long as the longest replica
    assert split_loop == max(iters.max(), 1) and split_loop < whole_loop


def test_choose_split():
    dp = np.array([8, 1, 2])
    np.testing.assert_array_equal(driver.choose_split(dp), [1, 1, 1])  # no estimate: no split
    np.testing.assert_array_equal(driver.choose_split(dp, max_replicas_per_lane=3), [3, 1, 1])
    # equal work per replica: the 8-replica finalist is split, the loop cost ((lanes + overhead) x load) falls
    k = driver.choose_split(dp, np.array([100.0, 100.0, 100.0]))
    cost = lambda k: (driver.lane_count_bucket(int(k.sum()), 3) + driver.LANE_OVERHEAD) * np.max(-(-dp // k) * 100.0)  # noqa: E731
    assert k[0] > 1 and cost(k) < cost(np.ones(3, int))
    # the replicas of the 8-replica finalist are cheap: it stays whole, the 2-replica one is the longest lane
    np.testing.assert_array_equal(driver.choose_split(dp, np.array([10.0, 100.0, 100.0])), [1, 1, 2])
    # a fixed lane count (memory chunks) is never exceeded
    assert driver.choose_split(dp, np.array([100.0, 100.0, 100.0]), lanes=5).sum() <= 5


def test_lane_split_layout():
    split = driver.lane_split([5, 1, 3], [2, 1, 3], max_dp=8)
    assert len(split.finalist) == 8  # 6 lanes, padded to a power of two
    np.testing.assert_array_equal(split.finalist[:6], [0, 0, 1, 2, 2, 2])
    np.testing.assert_array_equal(split.first[:6], [0, 3, 0, 0, 1, 2])
    np.testing.assert_array_equal(split.end[:6], [3, 5, 1, 1, 2, 3])
    assert (split.end[6:] <= split.first[6:]).all()  # padding lanes replay nothing
    np.testing.assert_array_equal(split.lane_of[0], [0, 0, 0, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(split.lane_of[2], [3, 4, 5, 5, 5, 5, 5, 5])
    unsplit = driver.lane_split([5, 1, 3], [1, 1, 1], max_dp=8)
    assert len(unsplit.finalist) == 3  # no split: one lane per finalist, no padding


def test_split_in_memory_chunks():
    requests, config, params = _dp_case(9)
    whole = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, **STATIC)
    lanes = driver.lane_count_bucket(int(np.asarray(config.data_parallel_size).sum()), config.num_finalists)  # one replica per lane
    shape = ReplayShape(config.num_finalists, requests.num_requests, 4, 8, 8, "round_robin", lanes / config.num_finalists)
    per_finalist, shared = replay_bytes(shape)
    assert per_finalist > replay_bytes(shape._replace(lanes_per_finalist=1.0))[0]  # more lanes, more memory
    parts = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, memory_limit_bytes=shared + 3 * per_finalist, max_replicas_per_lane=1, **STATIC)
    _same(whole, parts)


def test_no_recompilation_for_another_split_of_the_same_bucket():
    requests, config, params = _dp_case(10)
    run = lambda c: simulate_trace(c, requests, _workload(0), affine_step_time, params, window=8, max_replicas_per_lane=1, **STATIC)  # noqa: E731
    run(config)  # 6 finalists, 2-4 replicas: 12-24 lanes (one replica each), padded to 16 or 32
    lanes = int(np.asarray(config.data_parallel_size).sum())
    other_dp = np.roll(np.asarray(config.data_parallel_size), 1)
    other = ReplayConfig.create(config.max_num_seqs, np.asarray(config.max_num_batched_tokens) + 3, config.num_kv_blocks, other_dp, block_size=config.block_size)
    cached = driver._advance._cache_size(), driver._start_lanes._cache_size(), driver._finish._cache_size()
    run(other)
    assert driver.lane_count_bucket(lanes, 6) == driver.lane_count_bucket(int(other_dp.sum()), 6)
    assert (driver._advance._cache_size(), driver._start_lanes._cache_size(), driver._finish._cache_size()) == cached


def test_least_loaded_is_not_split():
    requests, config, params = _dp_case(11)
    config = ReplayConfig.create(config.max_num_seqs, config.max_num_batched_tokens, config.num_kv_blocks, config.data_parallel_size, block_size=config.block_size, routing="least_loaded")
    run = lambda **kw: simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, **STATIC, **kw)  # noqa: E731
    _same(run(), run(max_replicas_per_lane=1))


def test_bad_split_arguments():
    requests, config, params = _dp_case(12)
    with pytest.raises(PlanError, match="max_replicas_per_lane"):
        simulate_trace(config, requests, _workload(0), affine_step_time, params, max_replicas_per_lane=0)
    with pytest.raises(PlanError, match="replica_steps_hint"):
        simulate_trace(config, requests, _workload(0), affine_step_time, params, replica_steps_hint=np.ones(2))
    with pytest.raises(PlanError, match="replica_concurrency_hint"):
        simulate_trace(config, requests, _workload(0), affine_step_time, params, replica_concurrency_hint=np.ones(2))


def test_work_estimate_falls_with_requests_in_flight():
    """Iterations per request: 8 x in-flight^(-1/3) x (1 + OSL / window)^(1/4); at most the steps hint."""
    from jaxplan.replay.driver import replica_work

    requests = Requests(np.full(120, 100, np.int32), np.full(120, 128, np.int32), np.zeros(120, np.int32), np.zeros(120, np.float32))
    work = replica_work(requests, np.array([1, 2, 4]), 128, concurrency_hint=np.array([1.0, 8.0, np.nan]))
    np.testing.assert_allclose(work, [120 * 8 * 2**0.25, 60 * 8 / 2 * 2**0.25, 30 * 8 * 2**0.25], rtol=1e-9)  # nan: as 1
    capped = replica_work(requests, np.array([1, 2, 4]), 128, steps_hint=np.array([50.0, np.inf, np.nan]))
    np.testing.assert_allclose(capped, [50.0, 60 * 8 * 2**0.25, 30 * 8 * 2**0.25], rtol=1e-9)


def test_stage_hint_is_finite_steps():
    from jaxplan.funnel.replay_stage import replica_steps_hint
    from jaxplan.specs.workload import Arrival, Workload

    rows = [{"tpot_mean_s": 0.02, "ttft_mean_s": 0.5}, {"tpot_mean_s": 0.04, "ttft_mean_s": 1.0}, {"tpot_mean_s": float("nan"), "ttft_mean_s": 1.0}]
    config = ReplayConfig.create(64, 2048, 1000, [1, 2, 2])
    requests = Requests(np.full(100, 10, np.int32), np.full(100, 10, np.int32), np.zeros(100, np.int32), np.linspace(0, 99, 100).astype(np.float32))
    open_loop = Workload(name="o", isl_mean_tokens=10, osl_mean_tokens=11, arrival=Arrival.POISSON, request_rate_per_s=1.0)
    hint = replica_steps_hint(rows, open_loop, requests, config)
    np.testing.assert_allclose(hint[:2], [(99 + 0.5 + 10 * 0.02) / 0.02, (99 + 1.0 + 10 * 0.04) / 0.04], rtol=1e-6)
    assert hint[2] == np.inf
    closed = Workload(name="c", isl_mean_tokens=10, osl_mean_tokens=11, arrival=Arrival.CLOSED, concurrency=10)
    np.testing.assert_allclose(replica_steps_hint(rows, closed, requests, config)[0], 10 * 0.7 / 0.02, rtol=1e-6)


def test_stage_hints_read_stage_4_concurrency():
    from jaxplan.funnel.replay_stage import concurrency_hint, initial_slots_hint

    rows = [{"concurrency_per_replica": 10.2}, {"concurrency_per_replica": float("nan")}, {}]
    np.testing.assert_array_equal(concurrency_hint(rows), [10.2, np.nan, np.nan])
    assert initial_slots_hint(rows) == 21  # ceil(2 x 10.2)
    assert initial_slots_hint([]) is None and initial_slots_hint([{"concurrency_per_replica": 0.0}]) is None
    # a finalist never runs more than its max_num_seqs: 2 x 110.3 in flight with 192 seqs starts at 192
    capped = [{"concurrency_per_replica": 110.3, "max_num_seqs": 192}, {"concurrency_per_replica": 57.6, "max_num_seqs": 128}]
    assert initial_slots_hint(capped) == 192
    assert initial_slots_hint([{"concurrency_per_replica": 57.6, "max_num_seqs": 128}, {"concurrency_per_replica": 10.0, "max_num_seqs": 8}]) == 116
