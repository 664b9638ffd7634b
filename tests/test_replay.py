"""Replay: closed-form cases, invariants on a realistic workload, metrics, and no recompilation."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from jaxplan.errors import PlanError
from jaxplan.replay import (
    ReplayConfig,
    Requests,
    sample_requests,
    simulate,
    simulate_trace,
    summarize,
)
from jaxplan.replay.reference import reference_replay
from jaxplan.replay.testing import affine_step_time, affine_step_time_py
from jaxplan.specs import load_workload
from jaxplan.specs.workload import Arrival, Workload

A, B, C, D = (2.0**-6, 2.0**-16, 2.0**-10, 2.0**-20)  # dyadic affine step time: exact in float32


def _params(num_f: int, vary: bool = True) -> np.ndarray:
    """[num_f, 4] affine parameters; with `vary`, finalist f's are scaled by 2**-(f % 3) (still dyadic)."""
    scale = 2.0 ** -(np.arange(num_f) % 3)[:, None] if vary else np.ones((num_f, 1))
    return (np.array([[A, B, C, D]]) * scale).astype(np.float32)


# --- one request alone -------------------------------------------------------------------------

ISL, OSL = 8000, 5
BUDGETS = [6144, 682, 8192, 100_000, 8192]


@pytest.fixture(scope="module")
def single():
    requests = Requests(np.array([ISL], np.int32), np.array([OSL], np.int32), np.zeros(1, np.int32), np.zeros(1, np.float32))
    # the last finalist's KV cache cannot hold the prompt: it stalls
    config = ReplayConfig.create(
        max_num_seqs=4, max_num_batched_tokens=BUDGETS, num_kv_blocks=[1000, 1000, 1000, 1000, 100], data_parallel_size=[1, 1, 2, 1, 1]
    )
    workload = Workload(name="one", isl_mean_tokens=ISL, osl_mean_tokens=OSL, ttft_slo_s=0.2, tpot_slo_s=1.0)
    params = _params(len(BUDGETS), vary=False)  # the closed forms below use A, B, C, D
    trace = simulate_trace(config, requests, workload, affine_step_time, params)
    return trace, summarize(trace, workload)


def test_prefill_takes_ceil_isl_over_budget_steps(single):
    trace, metrics = single
    chunks = [math.ceil(ISL / b) for b in BUDGETS[:4]]
    assert chunks[:2] == [2, 12]  # 8,000 tokens: 2 chunks at 6,144, 12 at 682
    np.testing.assert_array_equal(trace.first_token_step[:4, 0], [c - 1 for c in chunks])
    np.testing.assert_array_equal(trace.finish_step[:4, 0], [c - 1 + OSL - 1 for c in chunks])
    for f, c in enumerate(chunks):
        ttft = c * A + ISL * B  # every prefill step: overhead + its chunk
        decode = [A + C + D * (ISL + j) for j in range(1, OSL)]  # context grows by one per token
        assert float(trace.ttft_s[f, 0]) == ttft
        assert float(trace.e2e_s[f, 0]) == ttft + sum(decode)
        assert float(metrics.ttft.p99_s[f]) == pytest.approx(ttft)
        assert float(metrics.tpot.mean_s[f]) == pytest.approx(sum(decode) / (OSL - 1))
        assert float(metrics.itl.p50_s[f]) == pytest.approx(decode[0], rel=0.012)  # histogram bins
        assert int(metrics.num_steps[f]) == c + OSL - 1
        assert float(metrics.output_tokens_per_s[f]) == pytest.approx(OSL / (ttft + sum(decode)))


def test_prompt_chunks_are_jumped(single):
    """Budget 682: the first chunk is stepped alone (it admits the request), chunks 2-11 in one
    iteration, the 12th (498 tokens, it completes the prompt) alone, then the 4 decode steps in one:
    4 iterations for 16 steps."""
    trace, _ = single
    assert int(trace.replica_steps[1, 0]) == 12 + OSL - 1
    assert int(trace.replica_iterations[1, 0]) == 4
    assert int(trace.replica_iterations[0, 0]) == 3  # 6,144: the first chunk, the rest, the decode jump


def test_slo_goodput_and_replicas(single):
    trace, metrics = single
    ttft = np.asarray(trace.ttft_s[:4, 0])
    np.testing.assert_array_equal(np.asarray(metrics.slo_attainment[:4]), (ttft <= 0.2).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(metrics.completed), [1, 1, 1, 1, 0])
    # dp 2 with one request: replica 1 is idle, replica 0 does all the work
    assert int(trace.replica[2, 0]) == 0 and int(trace.replica_steps[2, 1]) == 0 and bool(trace.replica_active[2, 1])


def test_request_that_never_fits_stalls(single):
    _trace, metrics = single
    assert bool(metrics.stalled[4]) and int(metrics.unfinished[4]) == 1 and int(metrics.completed[4]) == 0
    assert not np.asarray(metrics.stalled[:4]).any()


def test_iteration_limit_reports_unfinished(single):
    trace, _ = single
    requests = Requests(np.array([ISL], np.int32), np.array([OSL], np.int32), np.zeros(1, np.int32), np.zeros(1, np.float32))
    config = ReplayConfig.create(max_num_seqs=4, max_num_batched_tokens=BUDGETS, num_kv_blocks=[1000, 1000, 1000, 1000, 100], data_parallel_size=[1, 1, 2, 1, 1])
    workload = Workload(name="one", isl_mean_tokens=ISL, osl_mean_tokens=OSL)
    cut = simulate_trace(config, requests, workload, affine_step_time, _params(len(BUDGETS), vary=False), max_iterations=3)
    # 682-token chunks need 4 iterations (see above): cut short, the request is reported unfinished
    assert int(cut.finish_step[1, 0]) == -1 and not bool(cut.replica_done[1, 0])
    assert int(cut.finish_step[0, 0]) == int(trace.finish_step[0, 0])  # 2 prefill steps and one decode jump fit
    assert int(summarize(cut, workload).unfinished[1]) == 1


# --- pipeline parallelism: micro-batches share a step, one budget per request -------------------


def test_pipeline_micro_batches_each_have_a_budget():
    """4 prompts of 30 tokens arrive together, budget 10 per micro-batch. PP 1: 10 tokens per step, so
    the prompts prefill one after another (3 steps each, first tokens at steps 2, 5, 8, 11). PP 4: 40
    tokens per step but at most 10 per request, so all four prefill side by side in 3 steps."""
    n = 4
    requests = Requests(np.full(n, 30, np.int32), np.ones(n, np.int32), np.zeros(n, np.int32), np.zeros(n, np.float32))
    config = ReplayConfig.create(max_num_seqs=8, max_num_batched_tokens=10, num_kv_blocks=1000, pipeline_parallel_size=[1, 4, 2])
    workload = Workload(name="pp", isl_mean_tokens=30, osl_mean_tokens=1)
    trace = simulate_trace(config, requests, workload, affine_step_time, _params(3, vary=False))
    np.testing.assert_array_equal(trace.first_token_step[0], [2, 5, 8, 11])
    np.testing.assert_array_equal(trace.first_token_step[1], [2, 2, 2, 2])
    np.testing.assert_array_equal(trace.first_token_step[2], [2, 2, 5, 5])  # two micro-batches: pairs
    np.testing.assert_array_equal(trace.replica_steps[:, 0], [12, 3, 6])
    # each PP-4 step carries 40 prefill tokens: A + 40 B per step
    np.testing.assert_allclose(trace.ttft_s[1], 3 * (A + 40 * B), rtol=1e-6)


def test_pipeline_budget_overflow_is_a_plan_error():
    with pytest.raises(PlanError, match="pipeline_parallel_size x max_num_batched_tokens"):
        ReplayConfig.create(max_num_seqs=4, max_num_batched_tokens=2**23, num_kv_blocks=100, pipeline_parallel_size=4)


# --- a realistic workload: invariants, and the reference at scale -------------------------------

NUM_R = 240


def _chat_requests(seed=0) -> Requests:
    requests = sample_requests(load_workload("chat"), NUM_R, seed=seed)
    arrival = np.round(np.asarray(requests.arrival_s) * 256) / 256  # dyadic, so float32 clocks are exact
    return requests._replace(arrival_s=arrival.astype(np.float32))


def _chat_config(requests: Requests, seqs, dp):
    blocks = -(-(np.asarray(requests.prompt_tokens) + np.asarray(requests.output_tokens)) // 16)
    ample = int(blocks.sum())  # every request's whole KV at once: preemption is impossible
    tight = int(blocks.max()) + 8  # the largest request fits alone, little else does
    return ReplayConfig.create(
        max_num_seqs=seqs, max_num_batched_tokens=[2048, 512, 2048, 700], num_kv_blocks=[ample, ample, tight, tight + 40], data_parallel_size=dp
    )


TRACES: list[int] = []


def _counting_step_time(params, batch):
    TRACES.append(1)  # runs once per trace, never during execution
    return affine_step_time(params, batch)


CHAT_STATIC = {"num_slots": 64, "max_replicas": 4}  # one compiled program for every chat call


@pytest.fixture(scope="module")
def chat():
    workload = load_workload("chat")
    requests = _chat_requests()
    config = _chat_config(requests, seqs=[64, 24, 40, 33], dp=[1, 2, 3, 4])
    params = _params(4)
    trace = simulate_trace(config, requests, workload, _counting_step_time, params, **CHAT_STATIC)
    return requests, config, params, workload, trace, summarize(trace, workload)


def test_every_request_finishes_and_tokens_are_conserved(chat):
    requests, config, _, _, trace, metrics = chat
    osl = np.asarray(requests.output_tokens)
    np.testing.assert_array_equal(np.asarray(metrics.completed), NUM_R)
    np.testing.assert_array_equal(np.asarray(metrics.unfinished), 0)
    assert not np.asarray(metrics.stalled).any()
    # every output token produced exactly once, preempted or not
    np.testing.assert_array_equal(np.asarray(trace.replica_tokens_out).sum(1), osl.sum())
    first, finish = np.asarray(trace.first_token_step), np.asarray(trace.finish_step)
    assert (first >= 0).all() and (finish >= first).all()
    assert ((finish - first)[:, osl > 1] >= 1).all()
    ttft, e2e = np.asarray(trace.ttft_s), np.asarray(trace.e2e_s)
    assert (ttft > 0).all() and (e2e >= ttft).all()
    for f in range(4):
        dp = int(config.data_parallel_size[f])
        np.testing.assert_array_equal(np.asarray(trace.replica[f]), np.arange(NUM_R) % dp)


def test_kv_never_exceeds_capacity_and_preempts_only_when_tight(chat):
    _, config, _, _, trace, metrics = chat
    peak = np.asarray(trace.replica_peak_kv_blocks).max(1)
    assert (peak <= np.asarray(config.num_kv_blocks)).all()
    assert (np.asarray(metrics.kv_utilization_peak) <= 1).all()
    preempt = np.asarray(metrics.num_preemptions)
    assert (preempt[:2] == 0).all()  # ample KV: never
    assert (preempt[2:] > 0).all()  # tight KV: it must happen
    np.testing.assert_array_equal(preempt, np.asarray(trace.preemptions).sum(1))
    assert (np.asarray(metrics.mean_batch_size) <= np.asarray(config.max_num_seqs)).all()
    assert (np.asarray(metrics.mean_batch_size) >= 1).all()


def test_timeline_kv_never_exceeds_what_the_replay_held(chat):
    """The timeline reconstructs KV use from request times; on the tight finalists (which preempt)
    that overstates it. Each replica's series stays at or under the most blocks it held in one step,
    so the deployment's never exceeds its capacity."""
    from jaxplan.replay.timeline import timeline

    _, config, _, _, trace, _ = chat
    tl = timeline(trace, points=200, block_size=16)
    held = np.where(np.asarray(trace.replica_active), np.asarray(trace.replica_peak_kv_blocks), 0).sum(1)
    capacity = np.asarray(tl.capacity_blocks)
    np.testing.assert_array_equal(capacity, np.asarray(config.num_kv_blocks) * np.asarray(config.data_parallel_size))
    assert (tl.kv_utilization >= 0).all()
    assert (tl.kv_utilization <= (held / capacity)[:, None] + 1e-9).all() and (tl.kv_utilization <= 1.0).all()
    assert (tl.kv_utilization[2:].max(axis=1) > 0.5 * held[2:] / capacity[2:]).all()  # the tight ones run near what they held
    assert (np.asarray(trace.preemptions)[2:].sum(1) > 0).all()


def test_queue_length_series(chat):
    _, _, _, _, _trace, metrics = chat
    queue = np.asarray(metrics.queue_length)
    assert queue.shape == (4, 64) and (queue >= 0).all() and (queue[:, -1] == 0).all()
    times = np.asarray(metrics.series_time_s)
    np.testing.assert_allclose(times[:, -1], np.asarray(metrics.duration_s))
    # the tight-KV finalists keep requests waiting
    assert queue[2:].max() > 0


def test_chat_matches_reference_with_long_decode_jumps(chat):
    requests, config, params, _, trace, _ = chat
    for f in (1, 2):  # ample and tight KV
        ref = reference_replay(
            requests,
            max_num_seqs=int(config.max_num_seqs[f]),
            max_num_batched_tokens=int(config.max_num_batched_tokens[f]),
            num_kv_blocks=int(config.num_kv_blocks[f]),
            data_parallel_size=int(config.data_parallel_size[f]),
            step_time=affine_step_time_py(params[f]),
        )
        np.testing.assert_array_equal(trace.first_token_step[f], [r.first_token_step for r in ref.requests])
        np.testing.assert_array_equal(trace.finish_step[f], [r.finish_step for r in ref.requests])
        np.testing.assert_array_equal(trace.preemptions[f], [r.preemptions for r in ref.requests])
        dp = len(ref.replicas)
        np.testing.assert_array_equal(trace.replica_steps[f][:dp], [r.steps for r in ref.replicas])
    jumps = np.asarray(trace.replica_steps).sum() / np.asarray(trace.replica_iterations).sum()
    assert jumps > 3  # decode-only stretches were covered several steps per iteration


def test_metrics_agree_with_trace(chat):
    requests, _, _, workload, trace, metrics = chat
    finished = np.asarray(trace.finish_step) >= 0
    ttft = np.asarray(trace.ttft_s)
    osl = np.asarray(requests.output_tokens)
    tpot = (np.asarray(trace.e2e_s) - ttft) / np.maximum(osl - 1, 1)
    for f in range(4):
        np.testing.assert_allclose(float(metrics.ttft.p90_s[f]), np.percentile(ttft[f][finished[f]], 90), rtol=1e-6)
        np.testing.assert_allclose(float(metrics.tpot.p50_s[f]), np.percentile(tpot[f][osl > 1], 50), rtol=1e-6)
        np.testing.assert_allclose(float(metrics.e2e.mean_s[f]), np.mean(np.asarray(trace.e2e_s)[f]), rtol=1e-5)
        met = (ttft[f] <= workload.ttft_slo_s) & ((tpot[f] <= workload.tpot_slo_s) | (osl <= 1))
        assert float(metrics.slo_attainment[f]) == pytest.approx(met.mean())
        duration = float(metrics.duration_s[f])
        assert float(metrics.goodput_req_per_s[f]) == pytest.approx(met.sum() / duration, rel=1e-5)
        assert float(metrics.output_tokens_per_s[f]) == pytest.approx(osl.sum() / duration, rel=1e-5)
        # mean ITL pools every gap: total decode time over total gaps
        gaps = np.where(osl > 1, osl - 1, 0)
        assert float(metrics.itl.mean_s[f]) == pytest.approx(np.sum((np.asarray(trace.e2e_s)[f] - ttft[f])[osl > 1]) / gaps.sum(), rel=1e-5)
        assert float(metrics.itl.p50_s[f]) <= float(metrics.itl.p99_s[f])


def test_the_summary_runs_on_the_host_and_compiles_nothing(chat):
    """`summarize` is NumPy: summaries of other finalist and request counts (each of which a compiled
    summary would have traced and compiled again) trace and compile no program, and a finalist's
    metrics do not depend on the others summarised beside it."""
    _, _, _, workload, trace, metrics = chat
    events = []
    listener = lambda name, *_, **__: events.append(name) if name.startswith("/jax/core/compile/") else None  # noqa: E731
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for f, r in ((slice(1, 3), NUM_R), (slice(0, 4), NUM_R - 7), (slice(2, 3), 13)):
            cut = trace._replace(**{name: np.asarray(value)[f] for name, value in trace._asdict().items() if name not in ("prompt_tokens", "output_tokens")})
            cut = cut._replace(**{name: np.asarray(getattr(cut, name))[..., :r] for name in ("first_token_step", "finish_step", "preemptions", "arrival_s", "admit_s", "ttft_s", "e2e_s", "replica", "prompt_tokens", "output_tokens")})
            part = summarize(cut, workload)
            if r == NUM_R:
                np.testing.assert_array_equal(part.ttft.p99_s, np.asarray(metrics.ttft.p99_s)[f])
                np.testing.assert_array_equal(part.completed, np.asarray(metrics.completed)[f])
            assert isinstance(part.tpot.mean_s, np.ndarray) and part.tpot.mean_s.dtype == np.float32
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert events == []


# --- compilation --------------------------------------------------------------------------------


def test_no_recompilation_for_new_per_finalist_values(chat):
    from jaxplan.replay import driver

    _, _, _, workload, _, metrics = chat  # compiled and ran once already
    traced, cached = len(TRACES), driver._advance._cache_size()
    assert traced >= 1
    requests = _chat_requests(seed=2)
    other = _chat_config(requests, seqs=[40, 64, 50, 17], dp=[4, 3, 1, 2])
    other = ReplayConfig.create(other.max_num_seqs, [1024, 4096, 333, 8192], np.asarray(other.num_kv_blocks) + [7, 0, 0, 99], other.data_parallel_size)
    second = simulate(other, requests, workload, _counting_step_time, _params(4) * np.float32(1.5), **CHAT_STATIC)
    assert len(TRACES) == traced and driver._advance._cache_size() == cached
    assert not np.array_equal(np.asarray(metrics.ttft.mean_s), np.asarray(second.ttft.mean_s))


def test_progress_reports_output_tokens_and_leaves_the_replay_unchanged(chat, monkeypatch):
    """With a progress callback the loop runs in short calls (the first of 8 iterations here) and
    reports output tokens after each: monotone, ending at every finalist's tokens; the trace is
    the same bit for bit. A memory limit that forces two finalists per call still counts up to the
    whole replay."""
    from jaxplan.replay import driver, memory

    requests, config, params, workload, trace, _ = chat
    monkeypatch.setattr(driver, "PROGRESS_FIRST_ITERATIONS", 8)
    calls: list[tuple[int, int]] = []
    again = simulate_trace(config, requests, workload, _counting_step_time, params, progress=lambda d, t: calls.append((d, t)), **CHAT_STATIC)
    for name in trace._fields:
        np.testing.assert_array_equal(np.asarray(getattr(again, name)), np.asarray(getattr(trace, name)), err_msg=name)
    total = 4 * int(np.asarray(requests.output_tokens).sum())
    done = [d for d, _ in calls]
    assert len(calls) >= 3 and {t for _, t in calls} == {total}
    assert done == sorted(done) and done[-1] == total and done[0] < total

    per_f, shared = memory.replay_bytes(memory.ReplayShape(4, NUM_R, 4, 64, driver.DEFAULT_WINDOW, "round_robin"))
    calls.clear()
    chunked = simulate_trace(config, requests, workload, _counting_step_time, params, progress=lambda d, t: calls.append((d, t)), memory_limit_bytes=shared + 2 * per_f, **CHAT_STATIC)
    np.testing.assert_array_equal(np.asarray(chunked.ttft_s), np.asarray(trace.ttft_s))
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == total and {t for _, t in calls} == {total}
    assert total // 2 in done  # the first call of two finalists ends at half the tokens


def test_deadline_stops_a_replay_that_projects_past_the_limit(chat, monkeypatch):
    """A Deadline on a clock that runs 10 s per loop call: a 60 s limit stops the replay with a
    one-line PlanError naming the limit and the fix, before its end; a generous one lets it finish."""
    from jaxplan.deadline import Deadline
    from jaxplan.replay import driver

    requests, config, params, workload, trace, _ = chat
    monkeypatch.setattr(driver, "PROGRESS_FIRST_ITERATIONS", 4)
    monkeypatch.setattr(driver, "PROGRESS_CALL_S", 0.0)  # never grow the calls: many reports
    ticks = iter(range(0, 10**6, 10))
    deadline = Deadline(60.0, clock=lambda: float(next(ticks)), what="the replay of row 1", unit="output tokens", fix="replay fewer requests")
    with pytest.raises(PlanError, match=r"^stopped the replay of row 1 after .* output tokens.* beyond --max-seconds = 60; replay fewer requests, or raise --max-seconds$"):
        simulate_trace(config, requests, workload, _counting_step_time, params, progress=deadline, **CHAT_STATIC)
    assert next(ticks) < 200  # stopped after a few calls, not at the end
    ok = simulate_trace(config, requests, workload, _counting_step_time, params, progress=Deadline(1e9), **CHAT_STATIC)
    np.testing.assert_array_equal(np.asarray(ok.e2e_s), np.asarray(trace.e2e_s))
    for bad in (float("nan"), 0.0, -1.0, "60", True):
        with pytest.raises(PlanError, match=r"--max-seconds = .*: give a positive number \(inf: no limit\)"):
            Deadline(bad)


# --- traffic and inputs -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["chat", "coding", "reasoning", "rl-rollout"])
def test_sample_requests_follows_the_workload(name):
    workload = load_workload(name)
    requests = sample_requests(workload, 4000, seed=3)
    again = sample_requests(workload, 4000, seed=3)
    for a, b in zip(requests, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(requests.prompt_tokens, sample_requests(workload, 4000, seed=4).prompt_tokens)
    prompt, osl = np.asarray(requests.prompt_tokens), np.asarray(requests.output_tokens)
    assert prompt.min() >= 1 and osl.min() >= 1
    assert prompt.mean() == pytest.approx(workload.isl_mean_tokens, rel=0.05)
    assert osl.mean() == pytest.approx(workload.osl_mean_tokens, rel=0.05)
    hit = np.asarray(requests.prefix_hit_tokens)
    np.testing.assert_array_equal(hit, np.floor(workload.prefix_hit_rate * prompt))
    arrival = np.asarray(requests.arrival_s)
    assert (np.diff(arrival) >= 0).all() and arrival[0] == 0
    if workload.arrival == Arrival.POISSON:
        assert (len(arrival) - 1) / arrival[-1] == pytest.approx(workload.request_rate_per_s, rel=0.05)
    else:
        assert (arrival == 0).all()


def test_bad_inputs_are_plan_errors():
    with pytest.raises(PlanError, match="max_num_seqs"):
        ReplayConfig.create(max_num_seqs=[0, 4], max_num_batched_tokens=512, num_kv_blocks=100)
    with pytest.raises(PlanError, match="block_size"):
        ReplayConfig.create(4, 512, 100, block_size=0)
    config = ReplayConfig.create(max_num_seqs=[4, 4], max_num_batched_tokens=512, num_kv_blocks=100)
    requests = sample_requests(load_workload("chat"), 4)
    with pytest.raises(PlanError, match="step_params"):
        simulate(config, requests, load_workload("chat"), affine_step_time, np.zeros((3, 4), np.float32))
    with pytest.raises(PlanError, match="num_requests"):
        sample_requests(load_workload("chat"), 0)
