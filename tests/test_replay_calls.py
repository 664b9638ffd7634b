"""Stage 7 replays its finalists in calls of similar width (`replay_calls`): a round-robin lane works
on slot tables as wide as its call's widest finalist needs, and a lock-step lane steps every replica of
its call's largest group, so finalists of 2 ranks beside finalists of 16 would step 16. Grouping
changes how long the replay takes, never what it gives."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxplan.funnel import replay_calls, replay_stage
from jaxplan.funnel.replay_calls import CALL_COMPILE_S, LOCKSTEP_STEP_S, CallEstimate, call_estimate, contiguous_calls, independent_calls, lockstep_calls, replica_bucket, slot_need
from jaxplan.funnel.replay_stage import replay_rows
from jaxplan.funnel.sweep import run_sweep
from jaxplan.replay.driver import replica_work
from jaxplan.replay.traffic import Requests
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list


def test_replica_buckets_are_the_replays_padding():
    assert replica_bucket([1, 2, 3, 4, 5, 8, 9, 16]).tolist() == [1, 2, 4, 4, 8, 8, 16, 16]


def test_contiguous_calls_by_hand():
    """Widths 1, 1, 2, 3; a call costs 10 s x its members x its widest. One call: 4 x 3 x 10 = 120 s.
    1+1 | 2 | 3: 20 + 20 + 30 = 70 s + two compiles; 1+1 | 2+3: 20 + 60 = 80 s + one; 1+1+2 | 3: 60 + 30
    = 90 s + one. At 5 s a compile three calls win (80 s), at 15 s two (95 s), at 50 s one."""
    levels = np.array([1, 1, 2, 3])
    cost = lambda call: 10.0 * call.size * levels[call].max()  # noqa: E731
    assert [c.tolist() for c in contiguous_calls(levels, cost, 5.0)] == [[0, 1], [2], [3]]
    assert [c.tolist() for c in contiguous_calls(levels, cost, 15.0)] == [[0, 1], [2, 3]]
    assert [c.tolist() for c in contiguous_calls(levels, cost, 50.0)] == [[0, 1, 2, 3]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=9), st.floats(0.0, 30.0))
def test_contiguous_calls_match_every_partition(levels, compile_s):
    """The dynamic programme finds the cheapest of all 2^(L-1) partitions of the L sorted widths into
    contiguous ranges (a call's cost: its members' count x its widest squared, for something that is
    not additive)."""
    levels = np.array(levels)
    cost = lambda call: float(call.size * levels[call].max() ** 2)  # noqa: E731
    values = np.unique(levels)
    best = np.inf
    for cuts in range(1 << (values.size - 1)):
        ends = [i for i in range(values.size - 1) if cuts >> i & 1] + [values.size - 1]
        starts = [0] + [e + 1 for e in ends[:-1]]
        calls = [np.flatnonzero((levels >= values[a]) & (levels <= values[b])) for a, b in zip(starts, ends)]
        best = min(best, sum(cost(c) for c in calls) + compile_s * (len(calls) - 1))
    chosen = contiguous_calls(levels, cost, compile_s)
    assert sorted(np.concatenate(chosen).tolist()) == list(range(levels.size))
    assert sum(cost(c) for c in chosen) + compile_s * (len(chosen) - 1) == pytest.approx(best)


def test_slot_need_by_hand():
    """Twice the requests in flight, at most max_num_seqs (all of it where unknown), in the replay's
    slot buckets (powers of two to 64, then multiples of 64): 20 -> 32, 48 -> 64, 128 -> 128, 300 -> 320."""
    assert slot_need([10.0, np.nan, 100.0, 150.0], [64, 48, 128, 512]).tolist() == [32, 64, 128, 320]


def test_kv_bound_finalists_count_more_work():
    """A finalist whose KV cache bounds its batch preempts, which adds loop events: its work is
    KV_BOUND_WORK_FACTOR x `replica_work`'s, the others' unchanged."""
    requests = Requests(np.full(100, 500, np.int32), np.full(100, 200, np.int32), np.zeros(100, np.int32), np.zeros(100, np.float32))
    steps, inflight, dp = np.array([1e6, 1e6]), np.array([20.0, 20.0]), np.array([2, 2])
    estimate = call_estimate(steps, inflight, [64, 64], dp, requests, kv_bound=[True, False])
    plain = replica_work(requests, dp, 128, steps, inflight)
    assert estimate.work.tolist() == pytest.approx([replay_calls.KV_BOUND_WORK_FACTOR * plain[0], plain[1]])


def _estimate(slots, work, routed=None):
    n = len(slots)
    return CallEstimate(np.full(n, 1e9), np.asarray(work, np.float64), np.asarray(slots, np.int64), np.ones(n, np.int64) if routed is None else np.asarray(routed, np.int64))


def test_independent_calls_by_slot_width_by_hand():
    """Three finalists needing 32 slot rows and one needing 1,024, one replica each, 1e6 loop
    iterations, one device (20 us an iteration, 5.3 us a lane, 73 ns a lane's row). One call: 4 lanes
    of 1,024 rows, 1e6 x (20 + 4 x (5.3 + 74.75)) us = 340 s. 32 | 1,024: 1e6 x (20 + 3 x (5.3 + 2.34))
    us = 42.9 s and 1e6 x (20 + 5.3 + 74.75) us = 100 s, 143 s + 5 s of compilation. With 1e3
    iterations the split saves 0.2 s, less than the compile: one call."""
    assert [c.tolist() for c in independent_calls(_estimate([32, 32, 32, 1024], [1e6] * 4))] == [[0, 1, 2], [3]]
    assert [c.tolist() for c in independent_calls(_estimate([32, 32, 32, 1024], [1e3] * 4))] == [[0, 1, 2, 3]]


def test_least_loaded_calls_by_hand():
    """Least loaded: one lane a finalist, which steps one replica an iteration, so a finalist of 4
    replicas needing 32 rows runs 4 x 1e6 iterations and one of 1 replica needing 1,024 rows 1e6, one
    device. One call: 4e6 x (20 + 2 x (5.3 + 74.75)) us = 720 s. Split: 4e6 x (20 + 5.3 + 2.34) us =
    110.5 s and 1e6 x (20 + 5.3 + 74.75) us = 100 s, 210.6 s + 5 s."""
    estimate = _estimate([32, 1024], [1e6, 1e6], routed=[4, 1])
    assert [c.tolist() for c in independent_calls(estimate, "least_loaded")] == [[0], [1]]


def test_independent_calls_unknown_or_one_width():
    unknown = _estimate([32, 1024], [1e6, 1e6])._replace(steps=np.array([np.inf, 1e5]))
    assert [c.tolist() for c in independent_calls(unknown)] == [[0, 1]]
    assert [c.tolist() for c in independent_calls(_estimate([256, 256], [1e6, 1e6]))] == [[0, 1]]


def test_long_replays_split_by_bucket_by_hand():
    """Buckets 2, 2, 4, 16 with 100,000 steps each on 2 devices (25 us a lane-replica-step, 5 s a
    compile). One call: 16 replicas x 2 lanes a device x 1e5 steps = 80 s. 2 | 4 | 16: 2 x 1 x 1e5 +
    4 x 1 x 1e5 + 16 x 1 x 1e5 = 55 s + 10 s. 2 + 4 | 16: three lanes, two on a device: 4 x 2 x 1e5 +
    16 x 1 x 1e5 = 60 s + 5 s. 2 | 4 + 16: 2 x 1 x 1e5 + 16 x 1 x 1e5 = 45 s + 5 s, the least: the
    4-rank finalist rides beside the 16-rank one on the other device."""
    calls = lockstep_calls([2, 2, 4, 16], np.full(4, 1e5), devices=2)
    assert [c.tolist() for c in calls] == [[0, 1], [2, 3]]
    cost = lambda rank_steps, calls: LOCKSTEP_STEP_S * rank_steps + CALL_COMPILE_S * (calls - 1)  # noqa: E731
    assert cost(1.8e6, 2) < min(cost(3.2e6, 1), cost(2.2e6, 3), cost(2.4e6, 2))


def test_short_replays_stay_in_one_call():
    """1,000 steps: splitting saves 25 ms, less than a compile."""
    assert [c.tolist() for c in lockstep_calls([2, 2, 4, 16], np.full(4, 1e3), devices=2)] == [[0, 1, 2, 3]]


@pytest.mark.parametrize("steps", [None, np.array([1e5, np.inf, 1e5])])
def test_unknown_work_stays_in_one_call(steps):
    assert [c.tolist() for c in lockstep_calls([2, 4, 8], steps)] == [[0, 1, 2]]


def test_split_calls_replay_what_one_call_replays(monkeypatch):
    """The same MoE finalists (lock-step groups of 2, 4 and 8 replicas and two independent ones that
    need slot tables of different widths) replayed in one call per routing and in one call per width:
    the same numbers (to float32 rounding: the calls' programs differ in their padding, and may round
    a step time's last bit differently)."""
    model = load_model("qwen3-30b-a3b")
    result = run_sweep(model, parse_gpu_list("h100_sxm"), load_workload("chat"), load_space("small").for_model(model), top_k=40)
    lockstep = {int(r["data_parallel_size"]): r for r in reversed(result.shortlist) if int(r.get("lockstep_ranks") or 1) > 1}
    by_slots = {int(slot_need([r["concurrency_per_replica"]], [r["max_num_seqs"]])[0]): r for r in reversed(result.shortlist) if int(r.get("lockstep_ranks") or 1) == 1}
    narrow, wide = by_slots[min(by_slots)], by_slots[max(by_slots)]
    assert min(by_slots) < max(by_slots)
    rows = [lockstep[2], wide, lockstep[4], narrow, lockstep[8]]  # the best of each replica count, out of order
    calls = []
    real = replay_stage.simulate
    monkeypatch.setattr(replay_stage, "simulate", lambda config, *a, **k: calls.append(config.routing) or real(config, *a, **k))

    def replayed(compile_s):
        monkeypatch.setattr(replay_calls, "CALL_COMPILE_S", compile_s)
        calls.clear()
        out = replay_rows(result, rows, num_requests=64)
        return {(r["gpu"], r["tensor_parallel_size"], r["pipeline_parallel_size"], r["data_parallel_size"], r["layout_kind"], r["max_num_seqs"], r["max_num_batched_tokens"]):
                {k: v for k, v in r.items() if k.startswith("replay_")} for r in out}, list(calls)

    split, split_calls = replayed(-1.0)  # every grouping's compile "pays": one call per bucket
    whole, whole_calls = replayed(np.inf)
    assert split_calls.count("dp_coordinator") == 3 and whole_calls.count("dp_coordinator") == 1
    assert split_calls.count("round_robin") == 2 and whole_calls.count("round_robin") == 1
    assert split.keys() == whole.keys()
    for key in split:
        assert split[key].keys() == whole[key].keys()
        for name, value in split[key].items():
            expected = whole[key][name]
            assert value == (pytest.approx(expected, rel=1e-5) if isinstance(expected, float) else expected), (key, name)
