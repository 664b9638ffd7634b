"""An analytical (stage-4) prediction of an open-loop row whose arrivals outpace the deployment.

No steady state exists: the row's throughput is the capacity (and the status says so) and it has no
steady-state TTFT; a run whose prompts all find a slot at once is predicted as that one wave."""

from __future__ import annotations

import math

import pytest

from jaxplan.prediction import predict_rows

ROW = {"model": "llama-3.1-8b", "gpu": "h100_sxm", "tensor_parallel_size": 1, "isl": 1000, "osl": 200}


@pytest.fixture(scope="module")
def predicted():
    rates_and_prompts = [(0.05, 50), (20, 1000), (60, 1000), (1000, 5000), (1000, 50)]
    rows = [dict(ROW, request_rate=rate, num_prompts=n) for rate, n in rates_and_prompts]
    return dict(zip(rates_and_prompts, predict_rows(rows)))


def test_an_overloaded_long_run_reports_the_capacity_and_no_ttft(predicted):
    stable, over, far_over = predicted[(20, 1000)], predicted[(60, 1000)], predicted[(1000, 5000)]
    # 1,000 prompts arrive over 50 s and the last then drain (seconds, not tens): a little under 20/s
    assert stable["status"] == "ok" and 20.0 * 50 / (50 + 10) < stable["request_s"] < 20.0
    capacity = over["request_s"]
    assert capacity > 20.0  # the stable row is below it ...
    assert far_over["request_s"] == pytest.approx(capacity, rel=1e-5)  # ... and past it, the arrival rate no longer matters
    assert over["output_tok_s"] == pytest.approx(capacity * ROW["osl"], rel=1e-5)
    for row, rate, n in ((over, 60, 1000), (far_over, 1000, 5000)):
        assert row["ttft_ms_mean"] is None and row["ttft_ms_p99"] is None, row
        status = row["status"]
        assert status.startswith(f"overloaded: requests arrive at {rate:g}/s, above the {capacity:.4g}/s"), status
        assert "output_tok_s and request_s are that capacity" in status and f"its {n:,} prompts arrive" in status, status
        assert f"grows by {rate - capacity:.3g} requests/s" in status and "grows without bound" not in status


def test_an_overloaded_run_whose_prompts_all_fit_is_one_wave(predicted):
    """50 prompts at 1000/s on a replica with hundreds of slots: all 50 run together, none queues for
    a slot. Its TTFT is finite and no shorter than a prompt's alone (one every 20 s), its throughput
    that of 50 in flight: under the capacity, above one request's."""
    wave, alone, capacity = predicted[(1000, 50)], predicted[(0.05, 50)], predicted[(60, 1000)]["request_s"]
    assert wave["status"].startswith("overloaded: requests arrive at 1000/s") and "its 50 prompts all fit in its" in wave["status"]
    assert "predicted as all arriving at once (TTFT an upper bound)" in wave["status"]
    assert wave["ttft_ms_mean"] is not None and math.isfinite(wave["ttft_ms_mean"]), wave
    assert wave["ttft_ms_mean"] > alone["ttft_ms_mean"] and wave["ttft_ms_p99"] >= wave["ttft_ms_mean"]
    assert alone["status"] == "ok" and 0.05 * 1.5 < wave["request_s"] < capacity
    assert wave["request_rate"] == 1000 and wave.get("concurrency") is None  # the row as given, not the wave it was predicted as


def test_the_replay_says_an_overloaded_run_falls_behind():
    """--method replay of the same rows: the stable run (20/s) is ok; the one at 60/s, past the
    capacity the analytical prediction found, has a queue that stops emptying, and says so with the
    output rate it sustains, near that capacity, and the rate sent."""
    from jaxplan.prediction import replay_predict_rows

    stable, over = replay_predict_rows([dict(ROW, request_rate=rate, num_prompts=1000) for rate in (20, 60)])
    capacity = predict_rows([dict(ROW, request_rate=60, num_prompts=1000)])[0]["request_s"] * ROW["osl"]
    assert stable["status"] == "ok", stable["status"]
    status = over["status"]
    assert status.startswith("overloaded: the replay's queue stops emptying while requests arrive at 60/s"), status
    served = float(status.split("it serves about ")[1].split(" of the ")[0].replace(",", ""))
    assert 0.7 * capacity < served < 1.3 * capacity and "of the 12,000 output tok/s sent" in status, (served, capacity)
