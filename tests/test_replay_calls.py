"""Stage 7 replays a MoE model's lock-step finalists in calls grouped by their padded replica count
(`replay_stage.lockstep_calls`): a lane steps every replica of its call's widest finalist, so finalists
of 2 ranks beside finalists of 16 would step 16. Grouping changes how long the replay takes, never
what it gives."""

import numpy as np
import pytest

from jaxplan.funnel import replay_stage
from jaxplan.funnel.replay_stage import LOCKSTEP_COMPILE_S, LOCKSTEP_STEP_S, lockstep_calls, replay_rows, replica_bucket
from jaxplan.funnel.sweep import run_sweep
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list


def test_replica_buckets_are_the_replays_padding():
    assert replica_bucket([1, 2, 3, 4, 5, 8, 9, 16]).tolist() == [1, 2, 4, 4, 8, 8, 16, 16]


def test_long_replays_split_by_bucket_by_hand():
    """Buckets 2, 2, 4, 16 with 100,000 steps each on 2 devices (25 us a lane-replica-step, 4 s a
    compile). One call: 16 replicas x 2 lanes a device x 1e5 steps = 80 s. 2 | 4 | 16: 2 x 1 x 1e5 +
    4 x 1 x 1e5 + 16 x 1 x 1e5 = 55 s + 8 s. 2 + 4 | 16: three lanes do not split evenly, so one device
    runs them: 4 x 3 x 1e5 + 16 x 1 x 1e5 = 70 s + 4 s. 2 | 4 + 16: 2 x 1 x 1e5 + 16 x 1 x 1e5 = 45 s
    + 4 s, the least: the 4-rank finalist rides beside the 16-rank one on the other device."""
    calls = lockstep_calls([2, 2, 4, 16], np.full(4, 1e5), devices=2)
    assert [c.tolist() for c in calls] == [[0, 1], [2, 3]]
    cost = lambda rank_steps, calls: LOCKSTEP_STEP_S * rank_steps + LOCKSTEP_COMPILE_S * (calls - 1)  # noqa: E731
    assert cost(1.8e6, 2) < min(cost(3.2e6, 1), cost(2.2e6, 3), cost(2.8e6, 2))


def test_short_replays_stay_in_one_call():
    """1,000 steps: splitting saves 25 ms, less than a compile."""
    assert [c.tolist() for c in lockstep_calls([2, 2, 4, 16], np.full(4, 1e3), devices=2)] == [[0, 1, 2, 3]]


@pytest.mark.parametrize("steps", [None, np.array([1e5, np.inf, 1e5])])
def test_unknown_work_stays_in_one_call(steps):
    assert [c.tolist() for c in lockstep_calls([2, 4, 8], steps)] == [[0, 1, 2]]


def test_split_calls_replay_what_one_call_replays(monkeypatch):
    """The same MoE finalists (lock-step groups of 2, 4 and 8 replicas and an independent one) replayed
    in one lock-step call and in one call per bucket: the same numbers (to float32 rounding: the
    calls' programs differ in their padding, and may round a step time's last bit differently)."""
    model = load_model("qwen3-30b-a3b")
    result = run_sweep(model, parse_gpu_list("h100_sxm"), load_workload("chat"), load_space("small").for_model(model), top_k=40)
    lockstep = {int(r["data_parallel_size"]): r for r in reversed(result.shortlist) if int(r.get("lockstep_ranks") or 1) > 1}
    independent = next(r for r in result.shortlist if int(r.get("lockstep_ranks") or 1) == 1)
    rows = [lockstep[2], independent, lockstep[4], lockstep[8]]  # the best of each replica count, out of order
    calls = []
    real = replay_stage.simulate
    monkeypatch.setattr(replay_stage, "simulate", lambda config, *a, **k: calls.append(config.routing) or real(config, *a, **k))

    def replayed(compile_s):
        monkeypatch.setattr(replay_stage, "LOCKSTEP_COMPILE_S", compile_s)
        calls.clear()
        out = replay_rows(result, rows, num_requests=64)
        return {(r["gpu"], r["tensor_parallel_size"], r["pipeline_parallel_size"], r["data_parallel_size"], r["layout_kind"], r["max_num_seqs"], r["max_num_batched_tokens"]):
                {k: v for k, v in r.items() if k.startswith("replay_")} for r in out}, list(calls)

    split, split_calls = replayed(-1.0)  # every grouping's compile "pays": one call per bucket
    whole, whole_calls = replayed(np.inf)
    assert split_calls.count("dp_coordinator") == 3 and whole_calls.count("dp_coordinator") == 1
    assert split.keys() == whole.keys()
    for key in split:
        assert split[key].keys() == whole[key].keys()
        for name, value in split[key].items():
            expected = whole[key][name]
            assert value == (pytest.approx(expected, rel=1e-5) if isinstance(expected, float) else expected), (key, name)
