"""`predict --method replay` on closed-loop benchmark rows: the clients start together, as benchmark
clients do, and a fixed output length gets a small spread so that the waves do not stay in
lock-step (jaxplan.replay.clients; without it every TTFT would hold a whole wave's prefill, 1.4-3.5x
the measured vLLM TTFTs, docs/accuracy.md)."""

import numpy as np
import pytest

from jaxplan.calibrate import _data
from jaxplan.prediction import predict_rows, replay_predict_rows

ROW = dict(model="llama-3.1-8b", gpu="h100_sxm", tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
           weight_dtype="bf16", kv_cache_dtype="auto", isl=2048, osl=64, concurrency=32, num_prompts=192)


@pytest.fixture(scope="module")
def predicted():
    rows = [ROW, dict(ROW, concurrency=1)]
    return predict_rows(rows), replay_predict_rows(rows)


def test_replayed_closed_loop_agrees_with_stage_4(predicted):
    analytical, replayed = predicted
    a, r = analytical[0], replayed[0]
    assert r["status"] == "ok"
    assert r["tpot_ms_mean"] == pytest.approx(a["tpot_ms_mean"], rel=0.15)
    assert r["ttft_ms_mean"] == pytest.approx(a["ttft_ms_mean"], rel=0.35)


def test_desynchronised_clients_wait_less_than_a_lock_step_wave(predicted):
    """A lock-step wave of 32 x 2,048 prompt tokens at an 8,192 budget takes 8 prefill steps and the
    mean request waits for ~4.5 of them (over 5x a lone request's TTFT, which is one prompt's prefill
    and the request overhead); after the first wave, desynchronised clients mostly find the prefill
    free (3.0x on the shipped parameters of 2026-12-03, late)."""
    _, replayed = predicted
    alone_ms = replayed[1]["ttft_ms_mean"]  # one client: no one to wait for
    assert alone_ms < replayed[0]["ttft_ms_mean"] < 3.5 * alone_ms


def test_num_prompts_sets_the_request_count_of_open_loop_rows():
    rows = [dict(ROW, concurrency=None, request_rate=20.0, num_prompts=64, osl=16)]
    replayed = replay_predict_rows(rows)[0]
    assert replayed["status"] == "ok"
    assert replayed["request_s"] * 1.0 > 0
    # 64 requests at 20/s arrive over ~3 s: far shorter than the 1,000-request default (~50 s)
    assert 64 / replayed["request_s"] < 10.0


def test_fewer_prompts_than_clients_run_as_many_clients_as_prompts():
    """Found by an audit: 16 clients with 1, 5 or 10 prompts predicted the same as with 16; vllm bench
    serve runs num_prompts requests, so at most that many clients are ever busy."""
    rows = [dict(ROW, concurrency=16, num_prompts=n, osl=16) for n in (4, 16)] + [dict(ROW, concurrency=4, num_prompts=4, osl=16)]
    for method in (predict_rows, replay_predict_rows):
        four, sixteen, four_clients = method(rows)
        assert four["request_s"] == pytest.approx(four_clients["request_s"], rel=1e-6), method.__name__
        assert four["request_s"] < sixteen["request_s"], method.__name__


def test_a_rate_capped_by_clients_is_predicted_as_the_regime_that_binds():
    """vllm bench serve --request-rate R --max-concurrency C: Poisson arrivals at R, at most C in flight.
    Found by an audit: the rate was dropped (16 clients at 1 request/s predicted 5 requests/s). Below
    what the C clients would serve the rate binds (an open loop at R); above it the clients bind."""
    slow = dict(ROW, concurrency=16, request_rate=1.0, num_prompts=64, osl=16)
    fast = dict(slow, request_rate=1000.0)
    for method in (predict_rows, replay_predict_rows):
        at_rate, clients = method([slow, fast])
        # stage 4: the 64 prompts' 64 s of arrivals and then their last requests' drain (finite_run_share)
        assert at_rate["request_s"] == pytest.approx(1.0, rel=0.3 if method is replay_predict_rows else 0.01), method.__name__
        assert "request_rate 1/s binds" in at_rate["status"] and at_rate["concurrency"] == 16 and at_rate["request_rate"] == 1.0
        closed = method([dict(fast, request_rate=None)])[0]
        assert clients["request_s"] == pytest.approx(closed["request_s"], rel=1e-6) and "clients bind" in clients["status"]


@pytest.mark.parametrize(("change", "fragment"), [
    (dict(tensor_parallel_size=3), "tensor_parallel_size 3 does not divide llama-3.1-8b's 32 attention heads"),
    (dict(model="qwen3.5-27b", tensor_parallel_size=3), "tensor_parallel_size 3 does not divide qwen3.5-27b's hidden size of 5,120"),  # 24 heads divide
    (dict(pipeline_parallel_size=64), "pipeline_parallel_size 64 exceeds llama-3.1-8b's 32 layers"),
    (dict(isl=200_000), "exceeds llama-3.1-8b's context of 131,072"),
    (dict(max_num_seqs=1024, max_num_batched_tokens=16), "max_num_batched_tokens 16 is below max_num_seqs 1,024"),
    (dict(max_num_seqs=100_000), "max_num_seqs 100,000 is above the 4,096 jaxplan models"),
])
def test_rows_vllm_would_refuse_say_so_instead_of_numbers(change, fragment):
    """Found by an audit: TP 3 or 64 on a 32-head model, PP 64 over 32 layers, prompts past the context
    and a token budget below max_num_seqs were predicted `ok` with numbers, and a max_num_seqs past the
    replay's limit aborted the whole file. Both methods mark the row and predict the others."""
    rows = [dict(ROW, osl=16, **change), dict(ROW, osl=16)]
    for method in (predict_rows, replay_predict_rows):
        bad, good = method(rows)
        assert bad["status"].startswith("invalid: ") and fragment in bad["status"], (method.__name__, bad["status"])
        assert all(bad[c] is None for c in ("ttft_ms_mean", "tpot_ms_mean", "output_tok_s")) and good["status"] == "ok"


def test_measured_vllm_rows_where_the_kv_cache_holds_the_clients():
    """In sample, H200 Llama-3.1-70B (TP 4 and 8, 1k/1k and 8k/1k, 4-64 clients), each row replayed
    at 10 requests per client (the silicon loader's num_prompts): TTFT within 12% MAPE and TPOT within
    10% (measured on these 20 rows: 5.2% and 5.2%; at 200 requests each, whose first wave weighs
    up to a third, TTFT is 38% off)."""
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    from jaxplan.calibrate.run import measured_rows
    from jaxplan.calibrate.serving import load_serving_rows

    rows = [r for r in measured_rows(load_serving_rows()) if r["backend"] == "vllm" and r["gpu"] == "h200_sxm" and r["model"] == "llama-3.1-70b"
            and r["tensor_parallel_size"] >= 4 and r["osl"] == 1024]
    assert len(rows) >= 12
    assert all(r["num_prompts"] == 10 * r["concurrency"] for r in rows)
    replayed = replay_predict_rows(rows)
    ttft = np.array([(p["ttft_ms_mean"], r["measured_ttft_ms_mean"]) for p, r in zip(replayed, rows)])
    tpot = np.array([(p["tpot_ms_mean"], r["measured_tpot_ms_mean"]) for p, r in zip(replayed, rows)])
    assert np.mean(np.abs(ttft[:, 0] / ttft[:, 1] - 1)) < 0.12
    assert np.mean(np.abs(tpot[:, 0] / tpot[:, 1] - 1)) < 0.10


def test_the_silicon_rows_ran_an_fp8_kv_cache():
    """H200, Llama-3.1-70B FP8 at TP1, 32 clients of 8,192 + 1,024 tokens: 295k tokens of context at
    the end of a wave. A BF16 cache holds ~170k, so with it the clients would queue for the KV blocks
    (replayed ~13x the measured 3.1 s TTFT); an FP8 cache holds them, as the measured TTFT says it
    did (within 15%; 5% at this writing). The silicon loader gives FP8 rows an FP8 cache
    (`serving.silicon_kv_cache_dtype`)."""
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    from jaxplan.calibrate.run import measured_rows
    from jaxplan.calibrate.serving import load_serving_rows

    rows = [r for r in measured_rows(load_serving_rows()) if r["backend"] == "vllm" and r["gpu"] == "h200_sxm" and r["model"] == "llama-3.1-70b"
            and r["tensor_parallel_size"] == 1 and r["isl"] == 8192 and r["concurrency"] == 32]
    assert len(rows) == 1 and rows[0]["kv_cache_dtype"] == "fp8"
    row = rows[0]
    fp8, bf16 = replay_predict_rows([row, dict(row, kv_cache_dtype="auto")])
    measured = row["measured_ttft_ms_mean"]
    assert fp8["ttft_ms_mean"] == pytest.approx(measured, rel=0.15)
    assert bf16["ttft_ms_mean"] > 5 * measured
