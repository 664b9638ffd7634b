"""Stage 7: the shortlist replayed with the physics' own step time agrees with stage 4 where it should."""

from __future__ import annotations

import numpy as np
import pytest

from jaxplan.funnel import run_sweep
from jaxplan.funnel.replay_stage import physics_step_fn, replay_rows
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list


@pytest.fixture(scope="module")
def chat_sweep():
    return run_sweep(load_model("llama-3.1-8b"), parse_gpu_list("h100_sxm"), load_workload("chat"), load_space("small"), top_k=4)


def test_replay_tpot_matches_stage_four_without_queueing(chat_sweep):
    # Chat at 20 req/s on these finalists runs far from saturation (no queueing), so the replay's
    # mean TPOT must agree with the steady-state estimate: both price steps with step_time_s.
    rows = replay_rows(chat_sweep, chat_sweep.shortlist, num_requests=400)
    assert len(rows) == len(chat_sweep.shortlist)
    for row in rows:
        assert row["utilization"] < 0.5
        assert row["replay_unfinished"] == 0
        np.testing.assert_allclose(row["replay_tpot_mean_s"], row["tpot_mean_s"], rtol=0.05)
    scores = [r["replay_score"] for r in rows]
    assert scores == sorted(scores, reverse=True)  # re-ranked best first


def test_replay_is_deterministic_and_reuses_one_step_function(chat_sweep):
    first = replay_rows(chat_sweep, chat_sweep.shortlist[:2], num_requests=200, seed=3)
    second = replay_rows(chat_sweep, chat_sweep.shortlist[:2], num_requests=200, seed=3)
    assert [r["replay_ttft_mean_s"] for r in first] == [r["replay_ttft_mean_s"] for r in second]
    # One function object per model: the replay's jit sees the same static argument and does not recompile.
    model = chat_sweep.context.model
    assert physics_step_fn(model) is physics_step_fn(model)
