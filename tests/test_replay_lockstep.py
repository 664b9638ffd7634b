"""Lock-step DP ranks (vLLM's --data-parallel-size for a MoE model) under the DP coordinator's routing:
the JAX replay matches the plain-Python reference exactly, the idle rank's dummy steps are what the
physics says, and independent replicas are untouched.

Cases use dyadic step times and arrivals, so float32 (JAX) and float64 (reference) clocks agree.
The affine step time's 7th coefficient prices the group's tokens (the expert layers see them all).
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxplan.errors import PlanError
from jaxplan.replay import ReplayConfig, Requests, simulate_trace
from jaxplan.replay.reference import reference_replay
from jaxplan.replay.testing import affine_step_time, affine_step_time_py, dyadic_params
from jaxplan.specs.workload import Arrival, Workload

NUM_F = 6
NUM_R = 24
BLOCK = 4
STATIC = {"num_slots": 8, "max_replicas": 4, "routing": "dp_coordinator"}  # one compiled program for the random cases


def _workload(closed: int) -> Workload:
    if closed:
        return Workload(name="closed", isl_mean_tokens=10, osl_mean_tokens=10, arrival=Arrival.CLOSED, concurrency=closed)
    return Workload(name="open", isl_mean_tokens=10, osl_mean_tokens=10, arrival=Arrival.POISSON, request_rate_per_s=1.0)


def _params(rng, num, seed):
    """[num, 7] dyadic affine coefficients, the last per token of the whole lock-step group."""
    group = (2.0 ** -np.random.default_rng(seed + 30_000).integers(9, 13, num)).astype(np.float32)
    return np.concatenate([dyadic_params(rng, num, attention_seed=seed + 20_000), group[:, None]], 1)


def _case(seed: int, *, burst=False, kv_scale=(1, 4), dp=None, ranks=None):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1, 80, NUM_R).astype(np.int32)
    osl = rng.integers(1, 30, NUM_R).astype(np.int32)
    hit = (rng.integers(0, 80, NUM_R) * (rng.random(NUM_R) < 0.3)).astype(np.int32)
    arrival = np.sort(rng.integers(0, 256, NUM_R)).astype(np.float32) / 64  # dyadic seconds, some equal
    if burst:
        arrival[:] = 0.0
    largest = int(-(-(prompt.max() + osl.max()) // BLOCK))  # blocks of the biggest request
    choice = np.random.default_rng(seed + 40_000)
    dp = choice.choice([1, 2, 2, 4, 4], NUM_F) if dp is None else np.broadcast_to(dp, NUM_F)
    ranks = np.array([choice.choice([r for r in (1, 2, 4) if d % r == 0]) for d in dp]) if ranks is None else np.broadcast_to(ranks, NUM_F)
    config = ReplayConfig.create(
        max_num_seqs=rng.integers(1, 9, NUM_F),
        max_num_batched_tokens=rng.integers(1, 100, NUM_F),
        num_kv_blocks=rng.integers(int(kv_scale[0] * largest), int(kv_scale[1] * largest), NUM_F),
        data_parallel_size=dp,
        lockstep_ranks=ranks,
        block_size=BLOCK,
        routing="dp_coordinator",
        pipeline_parallel_size=np.random.default_rng(seed + 10_000).integers(1, 4, NUM_F),
    )
    return Requests(prompt, osl, hit, arrival), config, _params(rng, NUM_F, seed)


def _reference(requests, config, params, f, closed=0):
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
        routing="dp_coordinator",
        lockstep_ranks=int(config.lockstep_ranks[f]),
    )


def _compare(requests, config, params, closed=0, window=8, **static):
    """Assert the JAX replay equals the reference for every finalist; the trace."""
    trace = simulate_trace(config, requests, _workload(closed), affine_step_time, params, window=window, **{**STATIC, **static})
    for f in range(config.num_finalists):
        ref = _reference(requests, config, params, f, closed)
        where = f"finalist {f} (dp {int(config.data_parallel_size[f])}, lock-step {int(config.lockstep_ranks[f])})"
        np.testing.assert_array_equal(trace.replica[f], [r.replica for r in ref.requests], err_msg=where)
        np.testing.assert_array_equal(trace.first_token_step[f], [r.first_token_step for r in ref.requests], err_msg=where)
        np.testing.assert_array_equal(trace.finish_step[f], [r.finish_step for r in ref.requests], err_msg=where)
        np.testing.assert_array_equal(trace.preemptions[f], [r.preemptions for r in ref.requests], err_msg=where)
        dp = len(ref.replicas)
        for name, attr in (("replica_steps", "steps"), ("replica_preemptions", "preemptions"), ("replica_peak_kv_blocks", "peak_kv_blocks"),
                           ("replica_tokens_out", "tokens_out"), ("replica_stalled", "stalled"), ("replica_clock_s", "last_step_end"),
                           ("replica_kv_sum", "kv_block_steps"), ("replica_batch_sum", "scheduled_sum")):  # fmt: skip
            np.testing.assert_array_equal(getattr(trace, name)[f][:dp], [getattr(r, attr) for r in ref.replicas], err_msg=f"{where} {name}")
        e2e = [r.finish_time - r.arrival if r.finish_time is not None else np.nan for r in ref.requests]
        np.testing.assert_array_equal(trace.e2e_s[f], e2e, err_msg=where)
        finished = np.asarray(trace.finish_step[f]) >= 0
        ttft = [r.first_token_time - r.arrival if r.finish_step >= 0 else np.nan for r in ref.requests]
        np.testing.assert_array_equal(np.where(finished, trace.ttft_s[f], np.nan), ttft, err_msg=where)
    assert bool(np.asarray(trace.replica_done).all())
    return trace


@pytest.mark.parametrize("seeds", [range(4), range(4, 8)])
def test_lockstep_poisson_matches_reference(seeds):
    for seed in seeds:
        _compare(*_case(seed))


def test_lockstep_burst_tight_kv_and_step_by_step_match_reference():
    _compare(*_case(11, burst=True, kv_scale=(1, 2)))
    _compare(*_case(12), window=1)


def test_four_ranks_of_uneven_load_match_reference():
    """One group of 4: skewed sizes (a few long prompts), so the ranks' batches differ every step."""
    requests, config, params = _case(21, dp=4, ranks=4)
    prompt = np.where(np.arange(NUM_R) % 5 == 0, 79, requests.prompt_tokens).astype(np.int32)
    trace = _compare(requests._replace(prompt_tokens=prompt), config, params)
    for f in range(NUM_F):  # every rank of the group stepped every step: the same steps and clock
        assert len(set(np.asarray(trace.replica_steps[f]).tolist())) == 1
        assert len(set(np.asarray(trace.replica_clock_s[f]).tolist())) == 1
    assert len(set(np.asarray(trace.replica_tokens_out).ravel().tolist())) > 1  # ... but unevenly loaded


@pytest.mark.parametrize("closed", [3, 8])
def test_closed_loop_one_group_matches_reference(closed):
    requests, config, params = _case(31, ranks=None, dp=np.array([2, 4, 4, 2, 4, 1]))
    config = ReplayConfig.create(config.max_num_seqs, config.max_num_batched_tokens, config.num_kv_blocks, config.data_parallel_size,
                                 block_size=BLOCK, routing="dp_coordinator", lockstep_ranks=config.data_parallel_size)  # fmt: skip
    _compare(requests, config, params, closed=closed)


@pytest.mark.parametrize("closed", [3, 8])
def test_closed_loop_two_groups_match_reference(closed):
    """Two servers of 2 lock-step ranks: a replacement released by one group may go to the other,
    so neither jumps past the other's next step or a pending release."""
    for seed in (100, 104):
        _compare(*_case(seed, dp=4, ranks=2), closed=closed)


def _two_ranks(arrival, prompt, osl, params, ranks=2):
    requests = Requests(np.asarray(prompt, np.int32), np.asarray(osl, np.int32), np.zeros(len(prompt), np.int32), np.asarray(arrival, np.float32))
    config = ReplayConfig.create(8, 64, 100, 2, block_size=BLOCK, routing="dp_coordinator", lockstep_ranks=ranks)
    return requests, config, simulate_trace(config, requests, _workload(0), affine_step_time, np.asarray([params], np.float32), window=8, num_slots=8)


def test_two_ranks_one_idle_by_hand():
    """Requests one after the other all go to rank 0 (score 0 ties to the lowest index); rank 1 runs
    a dummy step with each of rank 0's, so both count the same steps and end at the same clock,
    and each step costs rank 0's own (the dummy's, overhead + the group's tokens, is cheaper).
    Prompt 32 (one chunk), 4 outputs: a prefill step, then 3 decode steps."""
    p = [2.0**-4, 2.0**-10, 2.0**-8, 2.0**-14, 0.0, 0.0, 2.0**-9]
    requests, config, trace = _two_ranks([0.0, 4.0, 8.0], [32, 32, 32], [4, 4, 4], p)
    np.testing.assert_array_equal(trace.replica[0], [0, 0, 0])
    np.testing.assert_array_equal(trace.replica_steps[0][:2], [12, 12])
    np.testing.assert_array_equal(trace.replica_tokens_out[0][:2], [12, 0])
    prefill = p[0] + 32 * p[1] + 32 * p[6]
    decodes = [p[0] + p[2] + (33 + j) * p[3] + p[6] for j in range(3)]
    np.testing.assert_array_equal(trace.ttft_s[0], [prefill] * 3)
    np.testing.assert_array_equal(trace.e2e_s[0], [prefill + sum(decodes)] * 3)
    np.testing.assert_array_equal(trace.replica_clock_s[0][:2], [8.0 + prefill + sum(decodes)] * 2)
    ref = reference_replay(requests, max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=100, data_parallel_size=2, block_size=BLOCK,
                           step_time=affine_step_time_py(np.asarray(p)), routing="dp_coordinator", lockstep_ranks=2)  # fmt: skip
    assert [r.steps for r in ref.replicas] == [12, 12]


def test_busy_ranks_share_the_slowest_step_and_the_group_tokens():
    """Two requests at t = 0 go to ranks 0 and 1; each step lasts the slower rank's, whose expert
    term counts both ranks' tokens, so the short request's TTFT is the long prompt's step."""
    p = [2.0**-4, 2.0**-10, 2.0**-8, 2.0**-14, 0.0, 0.0, 2.0**-9]
    _, _, trace = _two_ranks([0.0, 0.0], [64, 8], [2, 2], p)
    np.testing.assert_array_equal(trace.replica[0], [0, 1])
    first = p[0] + 64 * p[1] + (64 + 8) * p[6]
    np.testing.assert_array_equal(trace.ttft_s[0], [first, first])
    # the same requests on independent ranks: each its own step, its own tokens
    _, _, alone = _two_ranks([0.0, 0.0], [64, 8], [2, 2], p, ranks=1)
    np.testing.assert_array_equal(alone.ttft_s[0], [p[0] + 64 * p[1] + 64 * p[6], p[0] + 8 * p[1] + 8 * p[6]])


def test_coordinator_score_weighs_waiting_four_times_running():
    """Rank 0 runs 4 requests (score 4), rank 1 has 1 running + 1 waiting behind max_num_seqs 1 ...
    checked against the reference: with max_num_seqs 2, 8 arrivals at 1/64 s apart spread by the score."""
    rng = np.random.default_rng(5)
    num = 12
    requests = Requests(rng.integers(1, 40, num).astype(np.int32), rng.integers(20, 30, num).astype(np.int32), np.zeros(num, np.int32), (np.arange(num) / 64).astype(np.float32))
    params = np.asarray([[2.0**-6, 2.0**-10, 2.0**-8, 2.0**-14, 0.0, 0.0, 2.0**-9]] * 2, np.float32)
    config = ReplayConfig.create([2, 3], 64, 100, 2, block_size=BLOCK, routing="dp_coordinator", lockstep_ranks=[2, 1])
    trace = _compare(requests, config, params, num_slots=8, max_replicas=2)
    assert set(np.asarray(trace.replica).ravel().tolist()) == {0, 1}


def test_one_rank_groups_equal_round_robin_on_one_replica():
    """lockstep_ranks = 1, one replica: routing has no choice, so every policy replays the same, bit for bit."""
    requests, _, params = _case(41)
    params = params[:, :6]  # the group term would be the step's own tokens anyway
    base = {"max_num_seqs": 4, "max_num_batched_tokens": 48, "num_kv_blocks": 60, "data_parallel_size": 1, "block_size": BLOCK}
    traces = [simulate_trace(ReplayConfig.create(**base, routing=r), requests, _workload(0), affine_step_time, params[:1], window=8, num_slots=8)
              for r in ("round_robin", "dp_coordinator")]  # fmt: skip
    for name in ("first_token_step", "finish_step", "ttft_s", "e2e_s", "replica_steps", "replica_clock_s", "itl_hist"):
        np.testing.assert_array_equal(getattr(traces[0], name), getattr(traces[1], name), err_msg=name)


def test_lockstep_configs_are_checked_in_one_line():
    with pytest.raises(PlanError, match="lockstep_ranks"):
        ReplayConfig.create(8, 64, 100, 4, lockstep_ranks=3, routing="dp_coordinator")
    with pytest.raises(PlanError, match="dp_coordinator"):
        ReplayConfig.create(8, 64, 100, 4, lockstep_ranks=2, routing="round_robin")
    requests, config, params = _case(1, dp=2, ranks=2)
    with pytest.raises(PlanError, match="dp_coordinator"):
        simulate_trace(config, requests, _workload(0), affine_step_time, params, routing="least_loaded")


def test_predict_replays_a_moe_data_parallel_row_in_lock_step_near_stage_four():
    """A MoE row with data_parallel_size 4 replays as one lock-step group under the DP coordinator
    (the physics gets the group's tokens); at an even load its TPOT is stage 4's, which spreads the
    load evenly over the ranks, and more clients per rank make a slower step."""
    from jaxplan.funnel.replay_stage import LOCKSTEP_ROUTING, replay_config
    from jaxplan.physics.shapes import Layout
    from jaxplan.prediction import predict_rows, replay_predict_rows

    row = dict(model="qwen3-235b-a22b", gpu="h200_sxm", tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=4,
               enable_expert_parallel="true", weight_dtype="fp8", isl=1024, osl=128, concurrency=8, num_prompts=64)  # fmt: skip
    rows = [row, dict(row, concurrency=32, num_prompts=128)]
    analytical, replayed = predict_rows(rows), replay_predict_rows(rows)
    for a, r in zip(analytical, replayed):
        assert r["status"].startswith("ok"), r["status"]
        assert r["tpot_ms_mean"] == pytest.approx(a["tpot_ms_mean"], rel=0.15)
    assert replayed[1]["tpot_ms_mean"] > replayed[0]["tpot_ms_mean"]
    # Long prompts: most group steps carry some rank's prefill chunk, and the whole group waits for it.
    # Stage 4 prices the group's chunk steps (1 - (1 - f)^D of them), not one rank's f: it stays within
    # 25% of the replay, where pricing one rank's f undercut the replay's TPOT by half.
    long = [dict(row, isl=8000, osl=300, concurrency=64, num_prompts=400)]
    (a,), (r,) = predict_rows(long), replay_predict_rows(long)
    assert r["tpot_ms_mean"] == pytest.approx(a["tpot_ms_mean"], rel=0.25)
    layout = Layout(*(np.asarray([v], np.float32) for v in (2, 1, 4, 1, 2, 64, 2048, 1, 4, 1)))
    assert replay_config(layout, np.asarray([100])).routing == LOCKSTEP_ROUTING


def test_a_lane_of_several_servers_steps_one_servers_ranks_and_replays_the_same(monkeypatch):
    """Four servers of 2 lock-step ranks in a lane of 8 replicas: the replay schedules and prices 2
    rows an iteration (`routing.lockstep_policy`) instead of 8, and its trace is the same, bit for bit,
    as when every row takes part (and as the reference's)."""
    from jaxplan.replay import driver, routing

    requests, config, params = _case(7, dp=8, ranks=2)
    chosen = []
    monkeypatch.setattr(driver, "call_policy", lambda *a: chosen.append(routing.call_policy(*a)) or chosen[-1])
    narrow = _compare(requests, config, params, max_replicas=8)
    assert chosen == [routing.lockstep_policy(2)]
    monkeypatch.setattr(driver, "call_policy", lambda policy, *a: policy)  # every row of the lane
    wide = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8, **{**STATIC, "max_replicas": 8})
    for name in wide._fields:
        np.testing.assert_array_equal(np.asarray(getattr(narrow, name)), np.asarray(getattr(wide, name)), err_msg=name)
