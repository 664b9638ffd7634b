"""Closed-loop clients in the replay: all start at t = 0, and a fixed output length gets a small
uniform spread (same mean) so that requests admitted together do not stay in lock-step."""

import dataclasses

import numpy as np
import pytest

import jaxplan.replay.clients as clients
from jaxplan.prediction import replay_predict_rows
from jaxplan.replay import sample_requests
from jaxplan.replay.clients import DESYNC_SPREAD, output_length_shape
from jaxplan.specs.workload import Arrival, LengthDistribution, Workload

CLOSED = Workload(name="c", isl_mean_tokens=1024, osl_mean_tokens=1000, arrival=Arrival.CLOSED, concurrency=16, num_requests=4000)
POISSON = Workload(name="p", isl_mean_tokens=1024, osl_mean_tokens=1000, arrival=Arrival.POISSON, request_rate_per_s=2.0, num_requests=4000)


def test_only_a_closed_loops_fixed_output_length_is_spread():
    assert output_length_shape(CLOSED) == (LengthDistribution.UNIFORM, DESYNC_SPREAD)
    assert output_length_shape(POISSON) == (LengthDistribution.FIXED, 0.0)
    lognormal = dict(osl_distribution=LengthDistribution.LOGNORMAL, osl_spread=0.5)
    assert output_length_shape(dataclasses.replace(CLOSED, **lognormal)) == (LengthDistribution.LOGNORMAL, 0.5)
    assert 0.05 <= DESYNC_SPREAD <= 0.3  # the flat range measured on the silicon rows (clients.py)


def test_sampled_closed_loop_keeps_the_mean_output_length_and_fixed_prompts():
    r = sample_requests(CLOSED, None, seed=0)
    out = np.asarray(r.output_tokens)
    assert abs(out.mean() / 1000 - 1) < 0.005
    assert out.min() >= 1000 * (1 - DESYNC_SPREAD) and out.max() <= 1000 * (1 + DESYNC_SPREAD)
    assert len(np.unique(out)) > 100  # really spread
    assert np.all(np.asarray(r.prompt_tokens) == 1024) and np.all(np.asarray(r.arrival_s) == 0.0)  # everyone starts at 0
    assert np.all(np.asarray(sample_requests(POISSON, None, seed=0).output_tokens) == 1000)  # open loops as stated


def test_other_length_distributions_are_sampled_as_stated():
    shape = dict(osl_distribution=LengthDistribution.LOGNORMAL, osl_spread=0.5)
    closed = sample_requests(dataclasses.replace(CLOSED, **shape), None, seed=3)
    poisson = sample_requests(dataclasses.replace(POISSON, **shape), None, seed=3)
    np.testing.assert_array_equal(closed.output_tokens, poisson.output_tokens)


ROW = dict(model="llama-3.1-8b", gpu="h100_sxm", tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
           weight_dtype="bf16", kv_cache_dtype="auto", isl=2048, osl=64, concurrency=32, num_prompts=320)


@pytest.fixture(scope="module")
def spread_and_lock_step():
    rows = [ROW, dict(ROW, num_prompts=32)]
    spread = replay_predict_rows(rows)
    saved = clients.DESYNC_SPREAD
    clients.DESYNC_SPREAD = 0.0
    try:
        lock_step = replay_predict_rows(rows)
    finally:
        clients.DESYNC_SPREAD = saved
    return spread, lock_step


def test_the_spread_breaks_the_lock_step_waves(spread_and_lock_step):
    """32 clients x 2,048-token prompts at an 8,192-token budget: a lock-step wave takes 8 prefill
    steps, and every wave waits for them. With the spread only the first wave does (H100, 8B:
    205 ms against 272 ms at 10 requests per client). TPOT and throughput barely move."""
    spread, lock_step = spread_and_lock_step
    assert spread[0]["ttft_ms_mean"] < 0.85 * lock_step[0]["ttft_ms_mean"]
    assert spread[0]["tpot_ms_mean"] == pytest.approx(lock_step[0]["tpot_ms_mean"], rel=0.05)
    assert spread[0]["output_tok_s"] == pytest.approx(lock_step[0]["output_tok_s"], rel=0.05)


def test_the_first_wave_waits_for_the_others_prefills(spread_and_lock_step):
    """One request per client: the wave is the whole run, and the mean request waits for about half
    of the 8 prefill steps the 32 prompts need (with the spread or without, the same)."""
    spread, lock_step = spread_and_lock_step
    first_wave = spread[1]["ttft_ms_mean"]
    assert first_wave == pytest.approx(lock_step[1]["ttft_ms_mean"], rel=0.02)
    assert first_wave > 3.0 * spread[0]["ttft_ms_mean"]


def test_a_shortened_closed_loop_counts_its_first_wave_at_the_whole_runs_share():
    """Hand case: 4 clients, 20 requests replayed of a 100-request run. The wave would weigh 4 / 20;
    keeping m = round(4 x 16 / 96) = 1 of its 4 gives 1 / 17 ~ 4 / 100. Open loops, and closed loops
    replayed at full length, count every request."""
    arrival = np.array([[0.0] * 4 + [1.0 + i for i in range(16)]])
    run = dataclasses.replace(CLOSED, concurrency=4, num_requests=100)
    scored = clients.scored_requests(arrival, run)
    assert scored[0, 4:].all() and scored[0, :4].sum() == 1
    # 8 clients of 40 replayed of 80: m = round(8 x 32 / 72) = 4, every other one of the wave.
    arrival = np.array([[0.0] * 8 + [1.0] * 32])
    scored = clients.scored_requests(arrival, dataclasses.replace(CLOSED, concurrency=8, num_requests=80))
    assert scored[0, :8].tolist() == [False, True] * 4 and scored[0, 8:].all()
    assert clients.scored_requests(arrival, dataclasses.replace(CLOSED, concurrency=8, num_requests=40)).all()
    assert clients.scored_requests(arrival, dataclasses.replace(POISSON, num_requests=4000)).all()


def test_the_sweeps_shortened_replay_of_a_closed_loop_matches_the_whole_run(monkeypatch):
    """32 clients, a 1,280-request run (first wave 2.5%) replayed at 320 requests, as the sweep caps a
    long run: counted as is, the wave would weigh 10% and the mean TTFT come out ~1.5x the whole
    run's (measured: 132 ms whole, 208 ms as is). Extended to the whole run (`replay.extension`: the
    other 960 repeat late requests at the full loop's completion rate, the first wave then weighs
    its share) it is within 10% (140 ms), the p99 TTFT, TPOT and throughput within 5% (the
    throughput 1,026 against 1,002 output tok/s; the 320-request run's own: 991)."""
    import jaxplan.replay as replay

    row = dict(model="llama-3.1-8b", gpu="h100_sxm", tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
               weight_dtype="bf16", kv_cache_dtype="auto", isl=2048, osl=64, concurrency=32, num_prompts=1280)
    whole = replay_predict_rows([row])[0]
    as_is = replay_predict_rows([row], num_requests=320)[0]  # the workload itself is 320 requests long
    real = replay.sample_requests
    monkeypatch.setattr(replay, "sample_requests", lambda workload, n, seed: real(workload, 320, seed))
    capped = replay_predict_rows([row])[0]  # 320 replayed of a 1,280-request workload
    assert as_is["ttft_ms_mean"] > 1.3 * whole["ttft_ms_mean"]
    assert capped["ttft_ms_mean"] == pytest.approx(whole["ttft_ms_mean"], rel=0.10)
    for column in ("ttft_ms_p99", "tpot_ms_mean", "output_tok_s"):
        assert capped[column] == pytest.approx(whole[column], rel=0.05), column
