"""Stage 4's closed loop: the first wave of clients starts together and waits for its own prefills;
it is concurrency / num_requests of the run (jaxplan.physics.steady_state, jaxplan.replay.clients)."""

import numpy as np
import pytest

from jaxplan.prediction import predict_rows, replay_predict_rows

ROW = dict(model="llama-3.1-8b", gpu="h100_sxm", tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
           weight_dtype="bf16", kv_cache_dtype="auto", isl=2048, osl=64, concurrency=32)


def _ttft(num_prompts: list[float], row=ROW, column="ttft_ms_mean") -> np.ndarray:
    return np.array([p[column] for p in predict_rows([dict(row, num_prompts=n) for n in num_prompts])])


def test_the_first_waves_wait_falls_as_one_over_the_request_count():
    """Mean TTFT = steady part + (c / N) x the wave's mean wait: halving c / N halves the excess."""
    c = ROW["concurrency"]
    t = _ttft([c, 2 * c, 4 * c, 1e9])
    assert t[0] > t[1] > t[2] > t[3]
    assert (t[0] - t[1]) == pytest.approx(2 * (t[1] - t[2]), rel=1e-3)
    assert (t[0] - t[3]) == pytest.approx(2 * (t[0] - t[1]), rel=1e-3)


def test_the_p99_leaves_the_wave_once_it_is_under_one_percent_of_the_run():
    c = ROW["concurrency"]
    p99 = _ttft([c, 10 * c, 200 * c, 1000 * c], column="ttft_ms_p99")
    assert p99[0] > p99[1] > p99[2]
    assert p99[2] == pytest.approx(p99[3], rel=1e-6)


def test_open_loops_do_not_depend_on_the_request_count():
    """Their latencies do not; their throughput is a finite run's, its drain a smaller share of a longer run."""
    poisson = dict(ROW, concurrency=None, request_rate=2.0)
    for column in ("ttft_ms_mean", "ttft_ms_p99", "tpot_ms_mean"):
        a, b = _ttft([100, 100_000], poisson, column)
        assert a == b, column
    short, long = _ttft([100, 100_000], poisson, "output_tok_s")
    assert short < long == pytest.approx(2.0 * ROW["osl"], rel=1e-3)


@pytest.mark.parametrize("requests_per_client", [1, 10])
def test_stage_4_agrees_with_the_replay(requests_per_client):
    """The replay (a separate implementation: clients at t = 0, scheduler step by step) measures the
    same first wave: 32 clients x 2,048-token prompts, 8B on H100 (stage 4 / replay: 871 / 829 ms mean
    and 1,631 / 1,392 ms p99 for one wave; 197 / 205 and 1,497 / 1,384 ms at 10 requests per client)."""
    row = dict(ROW, num_prompts=requests_per_client * ROW["concurrency"])
    (a,), (r,) = predict_rows([row]), replay_predict_rows([row])
    assert a["ttft_ms_mean"] == pytest.approx(r["ttft_ms_mean"], rel=0.15)
    assert a["ttft_ms_p99"] == pytest.approx(r["ttft_ms_p99"], rel=0.25)


def test_short_outputs_keep_stage_4_within_the_replay_and_littles_law():
    """Found by an audit: with 2 output tokens and 16 clients stage 4 served 307 requests/s (the replay
    46) because a step carried one prompt while b / OSL = 8 had to start per step; and with one output
    token it put TTFT at 3.0 s where 64 clients at 4.9 requests/s wait 13 s (Little's law). A step now
    carries the prompts the steady state needs (up to the token budget), and a closed loop's TTFT is at
    least clients / throughput less its decode steps."""
    short = dict(ROW, isl=1024, osl=2, concurrency=16, num_prompts=1000)
    single = dict(ROW, isl=8191, osl=1, concurrency=64, num_prompts=1000)
    analytical = predict_rows([short, single])
    replayed = replay_predict_rows([short, single])
    for a, r in zip(analytical, replayed):
        assert a["request_s"] == pytest.approx(r["request_s"], rel=0.1), (a, r)
    little_s = single["concurrency"] / analytical[1]["request_s"]  # one output token: the whole request is its TTFT
    assert analytical[1]["ttft_ms_mean"] / 1e3 == pytest.approx(little_s, rel=0.02)
    assert analytical[1]["tpot_ms_mean"] is None and replayed[1]["tpot_ms_mean"] is None  # no TPOT with one token
    lifetime_s = (analytical[0]["ttft_ms_mean"] + (short["osl"] - 1) * analytical[0]["tpot_ms_mean"]) / 1e3
    assert lifetime_s >= 0.98 * short["concurrency"] / analytical[0]["request_s"]
