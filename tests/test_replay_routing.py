"""Least-loaded routing: the JAX replay matches the plain-Python reference exactly, closed forms,
the property it exists for (lower TTFT under skewed request sizes), and the memory refusal.

Cases use dyadic step times and arrivals, so float32 (JAX) and float64 (reference) clocks agree.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxplan.errors import PlanError
from jaxplan.replay import ReplayConfig, Requests, sample_requests, simulate_trace
from jaxplan.replay.reference import reference_replay
from jaxplan.replay.testing import affine_step_time, affine_step_time_py, dyadic_params
from jaxplan.specs import load_workload
from jaxplan.specs.workload import Arrival, Workload

NUM_F = 6
NUM_R = 24
BLOCK = 4
STATIC = {"num_slots": 8, "max_replicas": 4, "routing": "least_loaded"}  # one compiled program for the random cases


def _workload(closed: int) -> Workload:
    if closed:
        return Workload(name="closed", isl_mean_tokens=10, osl_mean_tokens=10, arrival=Arrival.CLOSED, concurrency=closed)
    return Workload(name="open", isl_mean_tokens=10, osl_mean_tokens=10, arrival=Arrival.POISSON, request_rate_per_s=1.0)


def _case(seed: int, *, burst=False, kv_scale=(1, 4), dp=(2, 5)):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1, 80, NUM_R).astype(np.int32)
    osl = rng.integers(1, 30, NUM_R).astype(np.int32)
    hit = (rng.integers(0, 80, NUM_R) * (rng.random(NUM_R) < 0.3)).astype(np.int32)
    arrival = np.sort(rng.integers(0, 256, NUM_R)).astype(np.float32) / 64  # dyadic seconds, some equal
    if burst:
        arrival[:] = 0.0
    largest = int(-(-(prompt.max() + osl.max()) // BLOCK))  # blocks of the biggest request
    config = ReplayConfig.create(
        max_num_seqs=rng.integers(1, 9, NUM_F),
        max_num_batched_tokens=rng.integers(1, 100, NUM_F),
        num_kv_blocks=rng.integers(int(kv_scale[0] * largest), int(kv_scale[1] * largest), NUM_F),
        data_parallel_size=rng.integers(dp[0], dp[1], NUM_F),
        block_size=BLOCK,
        routing="least_loaded",
        # PP micro-batches per step (own generator: the other draws stay as they were)
        pipeline_parallel_size=np.random.default_rng(seed + 10_000).integers(1, 4, NUM_F),
    )
    return Requests(prompt, osl, hit, arrival), config, dyadic_params(rng, NUM_F, attention_seed=seed + 20_000)


def _reference(requests, config, params, f, closed=0, routing="least_loaded"):
    return reference_replay(
        requests,
        max_num_seqs=int(config.max_num_seqs[f]),
        max_num_batched_tokens=int(config.max_num_batched_tokens[f]),
        num_kv_blocks=int(config.num_kv_blocks[f]),
        data_parallel_size=int(config.data_parallel_size[f]),
        pipeline_parallel_size=int(config.pipeline_parallel_size[f]),
        block_size=BLOCK,
        step_time=affine_step_time_py(params[f]),
        closed_concurrency=closed,
        routing=routing,
    )


def _compare(requests, config, params, closed=0, window=8):
    """Assert the JAX replay equals the reference for every finalist; (preemptions, requests not on replica i % dp)."""
    trace = simulate_trace(config, requests, _workload(closed), affine_step_time, params, window=window, **STATIC)
    preemptions = off_round_robin = 0
    for f in range(NUM_F):
        ref = _reference(requests, config, params, f, closed)
        where = f"finalist {f}"
        np.testing.assert_array_equal(trace.replica[f], [r.replica for r in ref.requests], err_msg=where)
        np.testing.assert_array_equal(trace.first_token_step[f], [r.first_token_step for r in ref.requests], err_msg=where)
        np.testing.assert_array_equal(trace.finish_step[f], [r.finish_step for r in ref.requests], err_msg=where)
        np.testing.assert_array_equal(trace.preemptions[f], [r.preemptions for r in ref.requests], err_msg=where)
        dp = len(ref.replicas)
        assert dp == int(config.data_parallel_size[f])
        for name, attr in (("replica_steps", "steps"), ("replica_preemptions", "preemptions"), ("replica_peak_kv_blocks", "peak_kv_blocks"),
                           ("replica_tokens_out", "tokens_out"), ("replica_stalled", "stalled"), ("replica_clock_s", "last_step_end"),
                           ("replica_kv_sum", "kv_block_steps"), ("replica_batch_sum", "scheduled_sum")):  # fmt: skip
            np.testing.assert_array_equal(getattr(trace, name)[f][:dp], [getattr(r, attr) for r in ref.replicas], err_msg=f"{where} {name}")
        arrival = [r.arrival if r.arrival is not None else np.inf for r in ref.requests]
        np.testing.assert_array_equal(trace.arrival_s[f], arrival, err_msg=where)
        e2e = [r.finish_time - r.arrival if r.finish_time is not None else np.nan for r in ref.requests]
        np.testing.assert_array_equal(trace.e2e_s[f], e2e, err_msg=where)
        finished = np.asarray(trace.finish_step[f]) >= 0
        ttft = [r.first_token_time - r.arrival if r.finish_step >= 0 else np.nan for r in ref.requests]
        np.testing.assert_array_equal(np.where(finished, trace.ttft_s[f], np.nan), ttft, err_msg=where)
        preemptions += sum(r.preemptions for r in ref.replicas)
        routed = np.asarray([r.replica for r in ref.requests])
        off_round_robin += int(np.sum((routed >= 0) & (routed != np.arange(NUM_R) % dp)))
    assert bool(np.asarray(trace.replica_done).all())
    return preemptions, off_round_robin


@pytest.mark.parametrize("seeds", [range(5), range(5, 10)])
def test_poisson_matches_reference(seeds):
    totals = np.sum([_compare(*_case(seed)) for seed in seeds], axis=0)
    assert totals[0] > 0  # preemption is exercised
    assert totals[1] > 0  # and routing differs from round robin


def test_burst_and_tight_kv_match_reference():
    totals = np.sum([_compare(*_case(seed, burst=True)) for seed in range(20, 24)], axis=0)
    totals += np.sum([_compare(*_case(seed, kv_scale=(1, 2))) for seed in range(24, 27)], axis=0)
    assert totals[0] > 0 and totals[1] > 0


def test_stalls_match_reference():
    """KV smaller than the largest request: a replica stalls and keeps its requests; routing avoids it."""
    stalled = 0
    for seed in range(30, 33):
        requests, config, params = _case(seed, kv_scale=(0.5, 1.0))
        _compare(requests, config, params)
        trace = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, **STATIC)
        stalled += int(np.asarray(trace.replica_stalled).sum())
    assert stalled > 0


@pytest.mark.parametrize("closed", [1, 3, 5, 40])
def test_closed_loop_matches_reference(closed):
    _compare(*_case(40 + closed), closed=closed)


def test_step_by_step_matches_reference():
    """window=1 (no decode jumps) gives the same answers as the jumps above."""
    for seed in (0, 7):
        _compare(*_case(seed), window=1)
    _compare(*_case(8), closed=3, window=1)


def test_growing_slot_rows_resumes_exactly(monkeypatch):
    """Start with 4 rows per replica: the driver widens every replica's tables mid-run and resumes."""
    from jaxplan.replay import driver

    grown = []
    real_grow = driver._grow
    monkeypatch.setattr(driver, "INITIAL_SLOTS", 4)
    monkeypatch.setattr(driver, "_grow", lambda *a, **k: grown.append(k["num_slots"]) or real_grow(*a, **k))
    requests, config, params = _case(3, burst=True)
    config = ReplayConfig.create(8, config.max_num_batched_tokens * 4, config.num_kv_blocks * 4, config.data_parallel_size, block_size=BLOCK, routing="least_loaded")
    small = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, max_replicas=4)
    fixed = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, num_slots=8, max_replicas=4)
    assert grown == [8]
    for name in small._fields:
        if name != "replica_iterations":  # the frozen iteration before the widening counts
            np.testing.assert_array_equal(getattr(small, name), getattr(fixed, name), err_msg=name)


def test_chat_at_scale_matches_reference_with_long_decode_jumps():
    """240 chat requests (Poisson, and closed loop with 7 clients) on dp 2-4, window 128: long jumps stop
    before each unrouted arrival and the routing still matches the reference exactly."""
    workload = load_workload("chat")
    requests = sample_requests(workload, 240, seed=1)
    requests = requests._replace(arrival_s=(np.round(np.asarray(requests.arrival_s) * 256) / 256).astype(np.float32))
    blocks = int((-(-(np.asarray(requests.prompt_tokens) + np.asarray(requests.output_tokens)) // 16)).max())
    config = ReplayConfig.create(max_num_seqs=[24, 40, 16], max_num_batched_tokens=[512, 2048, 700], num_kv_blocks=[blocks * 30, blocks + 8, blocks * 4],
                                 data_parallel_size=[2, 3, 4], routing="least_loaded")  # fmt: skip
    params = np.array([[2.0**-7, 2.0**-16, 2.0**-10, 2.0**-20]] * 3, np.float32)
    for closed in (0, 7):
        wl = _workload(closed) if closed else workload
        trace = simulate_trace(config, requests, wl, affine_step_time, params, num_slots=64, max_replicas=4)
        for f in range(3):
            ref = reference_replay(
                requests, max_num_seqs=int(config.max_num_seqs[f]), max_num_batched_tokens=int(config.max_num_batched_tokens[f]),
                num_kv_blocks=int(config.num_kv_blocks[f]), data_parallel_size=int(config.data_parallel_size[f]),
                step_time=affine_step_time_py(params[f]), closed_concurrency=closed, routing="least_loaded",
            )  # fmt: skip
            where = f"closed {closed} finalist {f}"
            np.testing.assert_array_equal(trace.replica[f], [r.replica for r in ref.requests], err_msg=where)
            np.testing.assert_array_equal(trace.first_token_step[f], [r.first_token_step for r in ref.requests], err_msg=where)
            np.testing.assert_array_equal(trace.finish_step[f], [r.finish_step for r in ref.requests], err_msg=where)
            np.testing.assert_array_equal(trace.preemptions[f], [r.preemptions for r in ref.requests], err_msg=where)
            np.testing.assert_array_equal(trace.replica_steps[f][: len(ref.replicas)], [r.steps for r in ref.replicas], err_msg=where)
        assert np.asarray(trace.preemptions).sum() > 0
        jumps = np.asarray(trace.replica_steps).sum() / np.asarray(trace.replica_iterations).sum()
        assert jumps > 2, jumps  # decode-only stretches were covered several steps per iteration


# --- closed forms -------------------------------------------------------------------------------

A, C = 2.0**-6, 2.0**-10  # overhead and per-decode-token seconds; no prefill cost


def _two_replicas(routing):
    """A long request (800 output tokens) then eight 2-token requests 1 s apart, on 2 replicas."""
    n = 9
    osl = np.array([800] + [2] * (n - 1), np.int32)
    requests = Requests(np.full(n, 4, np.int32), osl, np.zeros(n, np.int32), np.arange(n, dtype=np.float32))
    config = ReplayConfig.create(max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=1000, data_parallel_size=2, routing=routing)
    params = np.array([[A, 0.0, C, 0.0]], np.float32)
    return simulate_trace(config, requests, _workload(0), affine_step_time, params)


def test_long_request_sends_the_next_arrivals_to_the_other_replica():
    rr, ll = _two_replicas("round_robin"), _two_replicas("least_loaded")
    # The long request holds replica 0 for ~800 steps (> 8 s): every later arrival finds it busy.
    assert float(ll.e2e_s[0, 0]) > 8
    np.testing.assert_array_equal(np.asarray(ll.replica[0]), [0] + [1] * 8)
    np.testing.assert_array_equal(np.asarray(rr.replica[0]), np.arange(9) % 2)
    # Alone on replica 1, each short request takes two steps: its prefill (A) and one decode (A + C).
    np.testing.assert_array_equal(np.asarray(ll.e2e_s[0, 1:]), np.float32(2 * A + C))
    assert np.all(np.asarray(rr.e2e_s[0, 2::2]) > 2 * A + C)  # round robin shares replica 0's steps


def test_least_loaded_lowers_ttft_under_skewed_sizes():
    """Every fourth request is long (2,000 output tokens): round robin (dp 4) sends all of them to
    replica 0, whose 4 seats then make the later ones queue for ~16 s each; least loaded spreads
    them. Same requests, capacities and physics; only the routing differs."""
    n = 64
    osl = np.where(np.arange(n) % 4 == 0, 2000, 16).astype(np.int32)
    requests = Requests(np.full(n, 100, np.int32), osl, np.zeros(n, np.int32), (np.arange(n) / 16).astype(np.float32))
    params = np.array([[2.0**-7, 2.0**-15, 2.0**-11, 2.0**-22]], np.float32)
    ttft = {}
    for routing in ("round_robin", "least_loaded"):
        config = ReplayConfig.create(max_num_seqs=4, max_num_batched_tokens=2048, num_kv_blocks=4000, data_parallel_size=4, routing=routing)
        trace = simulate_trace(config, requests, _workload(0), affine_step_time, params)
        assert int(np.sum(np.asarray(trace.finish_step[0]) >= 0)) == n
        ttft[routing] = float(np.mean(np.asarray(trace.ttft_s[0])))
        long_replicas = np.asarray(trace.replica[0])[osl == 2000]
        assert (long_replicas == 0).all() if routing == "round_robin" else len(set(long_replicas.tolist())) == 4
    assert ttft["least_loaded"] < 0.5 * ttft["round_robin"], ttft


def test_least_loaded_matches_round_robin_when_requests_are_identical_and_spread():
    """Identical requests arriving far apart: each finds every replica empty and goes to replica 0."""
    n = 6
    requests = Requests(np.full(n, 16, np.int32), np.full(n, 4, np.int32), np.zeros(n, np.int32), (np.arange(n) * 4.0).astype(np.float32))
    config = ReplayConfig.create(4, 64, 100, 3, routing="least_loaded")
    trace = simulate_trace(config, requests, _workload(0), affine_step_time, np.array([[A, 0.0, C, 0.0]], np.float32))
    np.testing.assert_array_equal(np.asarray(trace.replica[0]), 0)
    np.testing.assert_array_equal(np.asarray(trace.replica_steps[0, :3]), [n * 4, 0, 0])


# --- API ----------------------------------------------------------------------------------------


def test_routing_is_checked_and_overrides_the_config():
    with pytest.raises(PlanError, match="routing"):
        ReplayConfig.create(4, 64, 100, routing="random")
    requests, config, params = _case(0)
    with pytest.raises(PlanError, match="routing"):
        simulate_trace(config, requests, _workload(0), affine_step_time, params, routing="fastest")
    rr = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, num_slots=8, max_replicas=4, routing="round_robin")
    dp = np.asarray(config.data_parallel_size)[:, None]
    np.testing.assert_array_equal(np.asarray(rr.replica), np.arange(NUM_R)[None, :] % dp)


# --- memory refusal -----------------------------------------------------------------------------


def test_requests_that_would_not_fit_are_refused_in_one_line():
    workload = load_workload("chat")
    requests = sample_requests(workload, 4000)
    config = ReplayConfig.create(max_num_seqs=[64, 64], max_num_batched_tokens=2048, num_kv_blocks=5000)
    params = np.tile(np.array([[A, 0.0, C, 0.0]], np.float32), (2, 1))
    with pytest.raises(PlanError, match=r"num_requests = 4000: .*needs about .* GiB.*fewer requests") as err:
        simulate_trace(config, requests, workload, affine_step_time, params, memory_limit_bytes=100_000)
    assert "\n" not in str(err.value)
    with pytest.raises(PlanError, match="memory_limit_bytes"):
        simulate_trace(config, requests, workload, affine_step_time, params, memory_limit_bytes=-1)


def test_finalists_run_in_chunks_when_all_at_once_would_not_fit():
    from jaxplan.replay.memory import ReplayShape, replay_bytes

    requests, config, params = _case(11)
    per_finalist, shared = replay_bytes(ReplayShape(NUM_F, NUM_R, 4, 8, 8, "least_loaded"))
    limit = shared + 4 * per_finalist  # four finalists per call: chunks of 4 and 2 (padded to 4)
    whole = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, **STATIC)
    parts = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, memory_limit_bytes=limit, **STATIC)
    for name in whole._fields:
        np.testing.assert_array_equal(np.asarray(getattr(parts, name)), np.asarray(getattr(whole, name)), err_msg=name)
    with pytest.raises(PlanError, match="num_requests"):
        simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, memory_limit_bytes=shared + per_finalist // 2, **STATIC)


def test_predict_passes_routing_through():
    from jaxplan.prediction import replay_predict_rows

    # Llama-3.1-8B on 2 x A100 (dp 2) at 2 req/s: light load, so both routings give about the same TPOT.
    row = {"model": "llama-3.1-8b", "gpu": "a100_sxm", "data_parallel_size": 2, "isl": 1000, "osl": 100, "request_rate": 2.0}
    rr = replay_predict_rows([row], num_requests=100)[0]
    ll = replay_predict_rows([row], num_requests=100, routing="least_loaded")[0]
    assert rr["status"] == ll["status"] == "ok"
    np.testing.assert_allclose(ll["tpot_ms_mean"], rr["tpot_ms_mean"], rtol=0.05)
    with pytest.raises(PlanError, match="routing"):
        replay_predict_rows([row], num_requests=10, routing="least-loaded")
