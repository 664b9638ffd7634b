"""Stage 4 prices a burst's own prefill queue: prompts that arrive together are prefilled a step's
room at a time, so the mean one waits for half of their prefill. Checked against the replay (the
step-by-step scheduler), the independent reference; without the queue stage 4 gave a burst of 50
prompts of 1,000 tokens the TTFT of one prompt (81 ms against the replay's 655)."""

from __future__ import annotations

import pytest

from jaxplan.prediction import predict_rows, replay_predict_rows

ROW = {"model": "llama-3.1-8b", "gpu": "h100_sxm", "tensor_parallel_size": 1, "isl": 1000, "osl": 200}


@pytest.fixture(scope="module")
def predicted():
    rows = [dict(ROW, request_rate="inf", num_prompts=n) for n in (1, 50)]
    return predict_rows(rows), replay_predict_rows(rows)


def test_a_bursts_prompts_queue_for_the_prefill(predicted):
    (alone, burst), (_, replayed) = predicted
    assert burst["ttft_ms_mean"] > 4 * alone["ttft_ms_mean"]
    assert burst["ttft_ms_mean"] == pytest.approx(replayed["ttft_ms_mean"], rel=0.35)
    assert burst["ttft_ms_p99"] == pytest.approx(replayed["ttft_ms_p99"], rel=0.35)


def test_the_queue_is_the_prompts_tokens_over_the_steps_room(predicted):
    """By hand: 50 x 1,000 prompt tokens of an 8B model are 2 x 8.0e9 x 5e4 = 8.0e14 FLOPs, at least
    0.81 s at the H100's BF16 peak (9.89e14 FLOP/s), filling about 6 steps of 8,192: the mean prompt
    waits at least half of that, and the last (the p99) about twice the mean's wait."""
    (alone, burst), _ = predicted
    mean_wait, p99_wait = burst["ttft_ms_mean"] - alone["ttft_ms_mean"], burst["ttft_ms_p99"] - alone["ttft_ms_p99"]
    assert mean_wait >= 0.5 * 2 * 8.03e9 * 50 * 1000 / 9.89e14 * 1e3
    assert p99_wait == pytest.approx(2 * mean_wait, rel=0.25)
