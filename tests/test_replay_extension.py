"""`replay.extension`: a burst or closed loop replayed as its first M requests and extended to all N of them.

Checked by hand on a one-slot server whose continuation is known exactly, and against the replay of
the whole burst (an independent computation: the same scheduler over all N requests) on a
multi-replica engine with spread lengths."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxplan.replay import ReplayConfig, sample_requests, simulate
from jaxplan.replay.extension import extend_run
from jaxplan.replay.testing import affine_step_time
from jaxplan.specs.workload import Arrival, LengthDistribution, Workload


def test_a_one_slot_server_continues_as_it_ran():
    """Ten requests of 1 s each on one slot, admitted at 0, 1, ..., 9, first token 0.1 s after
    admission and 11 output tokens: the next ten of a 20-request burst are admitted at 10, ..., 19
    with the same 0.1 s to a first token and 0.9 s of decode, and the run lasts 10 s longer."""
    m, n = 10, 20
    admit = np.arange(m, dtype=np.float64)[None, :]
    ext = extend_run(admit, admit + 0.1, admit + 1.0, np.zeros((1, m), np.int64), np.ones((1, 1), bool), np.full(m, 11), n)
    np.testing.assert_allclose(ext.ttft_s[0], np.arange(m, n) + 0.1)
    np.testing.assert_allclose(ext.e2e_s[0], np.arange(m, n) + 1.0)
    np.testing.assert_allclose(ext.extra_duration_s, [10.0])


def test_requests_that_all_found_a_slot_at_once_give_no_rate_and_no_extension():
    m = 10
    zeros = np.zeros((1, m))
    ext = extend_run(zeros, zeros + 0.1, zeros + 1.0, np.zeros((1, m), np.int64), np.ones((1, 1), bool), np.full(m, 11), 30)
    assert np.isnan(ext.ttft_s).all() and np.isnan(ext.e2e_s).all() and ext.extra_duration_s[0] == 0.0


BURST = Workload(name="b", arrival=Arrival.BURST, num_requests=1536, isl_mean_tokens=400, isl_distribution=LengthDistribution.UNIFORM,
                 isl_spread=0.3, osl_mean_tokens=120, osl_distribution=LengthDistribution.UNIFORM, osl_spread=0.5)  # fmt: skip


@pytest.fixture(scope="module")
def whole_and_extended():
    """The same engines (2 replicas x 32 slots; 1 replica x 64 slots) over the whole 1,536-request
    burst, and over its first 512 extended to 1,536."""
    config = ReplayConfig.create(max_num_seqs=[32, 64], max_num_batched_tokens=1024, num_kv_blocks=100_000, data_parallel_size=[2, 1])
    params = np.tile(np.array([[2.0**-6, 2.0**-16, 2.0**-10, 2.0**-20]], np.float32), (2, 1))
    whole = simulate(config, sample_requests(BURST, seed=1), BURST, affine_step_time, params)
    extended = simulate(config, sample_requests(BURST, 512, seed=1), BURST, affine_step_time, params)
    alone = simulate(config, sample_requests(BURST, 512, seed=1), dataclasses.replace(BURST, num_requests=512), affine_step_time, params)
    return whole, extended, alone


def test_an_extended_burst_matches_the_whole_burst_replayed(whole_and_extended):
    whole, extended, alone = whole_and_extended
    # Without the extension a 512-request replay sees a third of the queue: its TTFTs are far shorter.
    assert np.all(alone.ttft.p99_s < 0.5 * whole.ttft.p99_s)
    for name in ("ttft.mean_s", "ttft.p50_s", "ttft.p99_s", "e2e.p99_s", "tpot.mean_s", "tpot.p99_s", "output_tokens_per_s", "duration_s"):
        get = lambda m, name=name: np.asarray(eval("m." + name), np.float64)  # noqa: E731
        np.testing.assert_allclose(get(extended), get(whole), rtol=0.05, err_msg=name)
    assert np.all(extended.completed == 512) and np.all(extended.unfinished == 0)  # the replay's own requests


def test_a_closed_loop_replayed_in_part_is_extended_to_its_whole_run():
    """48 clients over 1,536 requests of spread output lengths (lognormal), replayed whole and as
    their first 512. The part's own run drains for longer against its length (its throughput 3.5-5.7%
    low) and weighs the first wave three times its share (mean TTFT 17-25% high); extended to the
    whole run, its throughput, TTFT and TPOT are within 3% of the whole run's. (The run's duration is
    not compared: the requests past the 512th are other samples of the lengths.)"""
    loop = dataclasses.replace(BURST, arrival=Arrival.CLOSED, concurrency=48, osl_distribution=LengthDistribution.LOGNORMAL, osl_spread=0.6)
    config = ReplayConfig.create(max_num_seqs=[32, 64], max_num_batched_tokens=1024, num_kv_blocks=100_000, data_parallel_size=[2, 1])
    params = np.tile(np.array([[2.0**-6, 2.0**-16, 2.0**-10, 2.0**-20]], np.float32), (2, 1))
    whole = simulate(config, sample_requests(loop, seed=1), loop, affine_step_time, params)
    extended = simulate(config, sample_requests(loop, 512, seed=1), loop, affine_step_time, params)
    alone = simulate(config, sample_requests(loop, 512, seed=1), dataclasses.replace(loop, num_requests=512), affine_step_time, params)
    assert np.all(alone.output_tokens_per_s < 0.97 * whole.output_tokens_per_s) and np.all(alone.ttft.mean_s > 1.1 * whole.ttft.mean_s)
    for name in ("ttft.mean_s", "tpot.mean_s", "tpot.p99_s", "output_tokens_per_s"):
        get = lambda m, name=name: np.asarray(eval("m." + name), np.float64)  # noqa: E731
        np.testing.assert_allclose(get(extended), get(whole), rtol=0.03, err_msg=name)


def test_a_long_run_is_represented_by_an_even_spread_of_its_added_requests(monkeypatch):
    """A 30x longer run than the 1-slot one above, with at most one added request materialised per
    replayed one: the added ones are spread evenly over the whole run (the last admitted near its
    end), and the run's length counts all of them."""
    import jaxplan.replay.extension as extension

    m, n = 10, 300
    admit = np.arange(m, dtype=np.float64)[None, :]
    args = (admit, admit + 0.1, admit + 1.0, np.zeros((1, m), np.int64), np.ones((1, 1), bool), np.full(m, 11), n)
    whole = extension.extend_run(*args)
    monkeypatch.setattr(extension, "MAX_ADDED_PER_REPLAYED", 1)
    spread = extension.extend_run(*args)
    assert whole.ttft_s.shape == (1, n - m) and spread.ttft_s.shape == (1, m)
    np.testing.assert_allclose(spread.extra_duration_s, whole.extra_duration_s)  # 290 s either way
    np.testing.assert_allclose(whole.extra_duration_s, [290.0])
    # Request 10 + floor((k + 0.5) x 29) of the 290 added, k = 0 .. 9: admitted at 24, 53, ..., 285 (+ 0.1 s to a first token).
    np.testing.assert_allclose(spread.ttft_s[0], m + np.floor((np.arange(m) + 0.5) * 29) + 0.1)
