"""The replay pads its request set to a bucket (`request_bucket`) so that nearby request counts share
one compiled program; the padding must change nothing: same trace, bit for bit, for every routing
and arrival kind, and the padded requests never reach a replica."""

from __future__ import annotations

import numpy as np
import pytest

from jaxplan.errors import PlanError
from jaxplan.replay import ReplayConfig, Requests, driver, simulate, simulate_trace
from jaxplan.replay.testing import affine_step_time, dyadic_params
from jaxplan.replay.traffic import pad_requests, request_bucket
from jaxplan.specs.workload import Arrival, Workload

NUM_F = 3
BLOCK = 4


@pytest.mark.parametrize(
    ("num", "bucket"),
    [(1, 256), (8, 256), (256, 256), (257, 512), (1000, 1024), (4096, 4096), (4097, 4608), (5000, 5120), (10_000, 10_240), (1_000_000, 1_048_576)],
)
def test_request_bucket_by_hand(num, bucket):
    assert request_bucket(num) == request_bucket(np.int64(num)) == bucket


def test_request_bucket_is_monotone_and_pads_little_where_arrays_are_large():
    nums = np.arange(1, 70_000)
    buckets = np.array([request_bucket(int(n)) for n in nums])
    assert np.all(buckets >= nums) and np.all(np.diff(buckets) >= 0)
    large = nums > 4096
    assert np.all(buckets[large] <= 1.125 * nums[large])
    assert np.all(buckets[~large] < np.maximum(2 * nums[~large], 256 + 1))
    assert len(set(buckets.tolist())) < 100  # few programs for 70,000 request counts


def test_pad_requests_appends_requests_that_never_arrive():
    requests = Requests(np.array([5, 7], np.int32), np.array([3, 1], np.int32), np.array([4, 0], np.int32), np.array([0.0, 0.5], np.float32))
    padded = pad_requests(requests, 5)
    np.testing.assert_array_equal(padded.prompt_tokens, [5, 7, 1, 1, 1])
    np.testing.assert_array_equal(padded.output_tokens, [3, 1, 1, 1, 1])
    np.testing.assert_array_equal(padded.prefix_hit_tokens, [4, 0, 0, 0, 0])
    np.testing.assert_array_equal(padded.arrival_s, [0.0, 0.5, np.inf, np.inf, np.inf])
    with pytest.raises(PlanError, match="size"):
        pad_requests(requests, 1)


def _case(num_r: int, routing: str, seed: int = 3):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1, 60, num_r).astype(np.int32)
    osl = rng.integers(1, 20, num_r).astype(np.int32)
    hit = (rng.integers(0, 60, num_r) * (rng.random(num_r) < 0.3)).astype(np.int32)
    arrival = np.sort(rng.integers(0, 128, num_r)).astype(np.float32) / 64  # dyadic seconds
    largest = int(-(-(prompt.max() + osl.max()) // BLOCK))
    config = ReplayConfig.create(
        max_num_seqs=[3, 8, 5],
        max_num_batched_tokens=[16, 64, 40],
        num_kv_blocks=[largest, 4 * largest, 2 * largest],  # the first is tight: preemptions
        data_parallel_size=[1, 3, 2],
        block_size=BLOCK,
        routing=routing,
    )
    return Requests(prompt, osl, hit, arrival), config, dyadic_params(rng, NUM_F)


def _workload(closed: int) -> Workload:
    if closed:
        return Workload(name="closed", isl_mean_tokens=10, osl_mean_tokens=10, arrival=Arrival.CLOSED, concurrency=closed)
    return Workload(name="open", isl_mean_tokens=10, osl_mean_tokens=10, arrival=Arrival.POISSON, request_rate_per_s=1.0)


@pytest.mark.parametrize("routing", ["round_robin", "least_loaded"])
@pytest.mark.parametrize("closed", [0, 5])
def test_padding_changes_nothing(monkeypatch, routing, closed):
    """13 requests replayed unpadded and with 37 padding requests: every trace field is equal, bit
    for bit (dp 1-3, an uneven round-robin split, preemptions, closed and open loop)."""
    requests, config, params = _case(13, routing)
    traces = []
    for bucket in (lambda n: n, lambda n: n + 37):
        monkeypatch.setattr(driver, "request_bucket", bucket)
        traces.append(simulate_trace(config, requests, _workload(closed), affine_step_time, params, window=8, num_slots=8, max_replicas=4))
    bare, padded = traces
    for name in bare._fields:
        assert np.shape(getattr(bare, name)) == np.shape(getattr(padded, name)), name
        np.testing.assert_array_equal(np.asarray(getattr(bare, name)), np.asarray(getattr(padded, name)), err_msg=name)
    assert np.all(np.asarray(bare.finish_step) >= 0)  # every real request finished, none waits on padding
    assert int(np.asarray(bare.preemptions).sum()) > 0  # the tight finalist was exercised


def test_request_counts_in_one_bucket_share_the_compiled_replay():
    """9 and 200 requests (bucket 256): the second replay compiles nothing new (its summary is NumPy), and
    its metrics count only the real requests."""
    workload = _workload(0)
    first, config, params = _case(9, "round_robin")
    simulate(config, first, workload, affine_step_time, params, window=8, num_slots=8, max_replicas=4)
    programs = lambda: (driver._advance._cache_size(), driver._start_lanes._cache_size(), driver._finish._cache_size())  # noqa: E731
    before = programs()
    second, config, params = _case(200, "round_robin", seed=4)  # other values, the same shapes
    out = simulate(config, second, workload, affine_step_time, params, window=8, num_slots=8, max_replicas=4)
    assert programs() == before
    np.testing.assert_array_equal(out.completed, [200] * NUM_F)
    np.testing.assert_array_equal(out.unfinished, [0] * NUM_F)
    np.testing.assert_array_equal(out.slo_attainment, [1.0] * NUM_F)  # no SLO: every finished request meets it
