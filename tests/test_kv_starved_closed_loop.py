"""KV-starved closed loops (more clients than the KV cache holds at their full contexts): stage 4 and
the replay against each other, and against measured vLLM rows (docs/accuracy.md, "KV-starved closed
loops").

The measured rows are Llama-3.1-70B with FP8 weights and FP8 KV at TP1, 64 clients, 10 requests per
client, from NVIDIA's AIConfigurator silicon runs (`../shared/data/e2e_aiconfigurator_silicon`,
source ids below); their numbers are copied here so that the test runs without `../shared`.
"""

import pytest

from jaxplan.prediction import predict_rows, replay_predict_rows

ROW = dict(model="llama-3.1-70b", tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
           weight_dtype="fp8", kv_cache_dtype="fp8", concurrency=64, num_prompts=640)
LONG_PROMPTS = dict(ROW, gpu="h200_sxm", isl=8192, osl=1024)  # ~40 requests fit at their mean context
LONG_OUTPUTS = dict(ROW, gpu="h200_sxm", isl=1024, osl=8192)  # ~35 at their full context, ~68 at their mean
# (row, measured mean TTFT in ms, source id)
MEASURED = {
    "b200 1k/8k": (dict(ROW, gpu="b200_sxm", isl=1024, osl=8192), 381.9, "2026_04_06_llama_3_1_70b_b200_sxm_vllm_fp8_agg_1024x8192_c64_tp1_ep1_362"),
    "h200 8k/1k": (LONG_PROMPTS, 39807.1, "2026_04_06_llama_3_1_70b_h200_sxm_vllm_fp8_agg_8192x1024_c64_tp1_ep1_846"),
}


def both(rows):
    return predict_rows(rows), replay_predict_rows(rows)


@pytest.fixture(scope="module")
def long_prompts():
    rows = [dict(LONG_PROMPTS, concurrency=c, num_prompts=10 * c) for c in (24, 32, 44, 64)]
    return both(rows)


def test_requests_beyond_the_kv_capacity_queue_in_stage_4_as_in_the_replay(long_prompts):
    """8k/1k on one H200: below ~40 clients every request runs; above, the rest wait in line for the
    KV of a finishing request. Stage 4 prices that line (Little's law: a client's whole cycle is
    clients / requests served per second, and the first token takes what its decode does not; with the
    line of requests the engine cannot admit) within 15% of the replay, which schedules, preempts and
    recomputes request by request. Without both, stage 4 gives 3.7 s at 64 clients against 61 s."""
    analytical, replayed = long_prompts
    for a, r in zip(analytical, replayed):
        assert a["status"] == "ok"
        # The replay preempts where more clients run than the cache holds whole (37 of 8k + 1k tokens), and says so.
        assert r["status"] == "ok" if a["concurrency"] <= 37 else r["status"].startswith("ok; the replay preempted"), (a["concurrency"], r["status"])
        assert a["ttft_ms_mean"] == pytest.approx(r["ttft_ms_mean"], rel=0.15), a["concurrency"]
    queued = [a["ttft_ms_mean"] for a in analytical]
    assert queued == sorted(queued) and queued[-1] > 10 * queued[0]
    # Past the capacity more clients add waiting, not throughput.
    assert analytical[-1]["output_tok_s"] == pytest.approx(analytical[-2]["output_tok_s"], rel=0.02)


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_measured_kv_starved_rows(name):
    """Against the measured runs. B200 1k/8k: in steady state its cache holds the 64 clients at their
    mean context (only their full contexts overflow it), so the first token does not wait: both within
    20%. H200 8k/1k: 24 clients wait in line for the KV cache throughout; the measured TTFT of such a
    run depends on how long it ran (the line builds from the start), which the source does not state
    beyond its request count, so the bar is a factor of 2 (stage 4 1.55x, the replay 1.52x)."""
    row, measured_ms, _ = MEASURED[name]
    (analytical,), (replayed,) = both([row])
    tolerance = 1.2 if name.startswith("b200") else 2.0
    for predicted in (analytical, replayed):
        assert measured_ms / tolerance < predicted["ttft_ms_mean"] < measured_ms * tolerance, predicted


@pytest.mark.xfail(strict=True, reason=(
    "stage 4 queues no request while the cache holds the clients at their mean context (b_max), but "
    "the replay's clients start together, grow together and preempt one another from about 0.75 b_max "
    "(docs/accuracy.md, 'KV-starved closed loops'); not yet modelled"))
def test_between_full_and_mean_context_capacity_stage_4_prices_the_preemption_queue():
    """1k/8k on one H200, 64 clients: ~35 fit at their full context, ~68 at their mean. The replay
    gives 13 s of TTFT (measured: 5.3 s), stage 4 0.7 s."""
    (analytical,), (replayed,) = both([LONG_OUTPUTS])
    assert analytical["ttft_ms_mean"] == pytest.approx(replayed["ttft_ms_mean"], rel=0.5)
