"""A preempted request finds what is left of its blocks in vLLM V1's prefix cache: a hand-counted case.

Block size 4, 6 KV blocks, two requests of 8 prompt + 12 output tokens arriving together.
Both prefill in step 0 (2 blocks each) and take a third block in step 1. In step 5 A needs a
fourth: B (12 tokens in 3 whole blocks) is preempted, its blocks freed tail first, and A takes
B's last block off the free queue's head; in step 9 A takes B's second. A finishes in step 11
(8 + 11 tokens in 5 blocks). In step 12 B finds its first block (4 tokens) still cached and
recomputes the other 9 of its 13 tokens (8 prompt + 5 outputs), not all 13, then decodes its
last 6 tokens in steps 13-18. The step time is 2^-4 s + 2^-6 s a prefill token, so the clocks
count the recomputed tokens: 19 steps and 8 + 8 + 9 prefill tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxplan.replay import ReplayConfig, Requests, simulate_trace
from jaxplan.replay.reference import reference_replay
from jaxplan.replay.testing import affine_step_time, affine_step_time_py
from jaxplan.specs.workload import Arrival, Workload

PARAMS = np.array([[2.0**-4, 2.0**-6, 0.0, 0.0]], np.float32)
REQUESTS = Requests(np.array([8, 8], np.int32), np.array([12, 12], np.int32), np.zeros(2, np.int32), np.zeros(2, np.float32))
CAPACITY = dict(max_num_seqs=2, max_num_batched_tokens=64, num_kv_blocks=6, block_size=4)
EXPECTED_CLOCK_S = 19 * 2.0**-4 + (8 + 8 + 9) * 2.0**-6
WHOLE_RECOMPUTE_CLOCK_S = 19 * 2.0**-4 + (8 + 8 + 13) * 2.0**-6  # without the prefix cache
WORKLOAD = Workload(name="burst", isl_mean_tokens=8, osl_mean_tokens=12, arrival=Arrival.POISSON, request_rate_per_s=1.0)


@pytest.mark.parametrize(("window", "prefix_caching", "clock_s"), [(1, True, EXPECTED_CLOCK_S), (8, True, EXPECTED_CLOCK_S), (8, False, WHOLE_RECOMPUTE_CLOCK_S)])
def test_replay_recomputes_only_what_was_evicted(window, prefix_caching, clock_s):
    config = ReplayConfig.create(**CAPACITY, prefix_caching=prefix_caching)
    trace = simulate_trace(config, REQUESTS, WORKLOAD, affine_step_time, PARAMS, window=window, num_slots=4, max_replicas=1)
    np.testing.assert_array_equal(trace.first_token_step[0], [0, 0])
    np.testing.assert_array_equal(trace.finish_step[0], [11, 18])
    np.testing.assert_array_equal(trace.preemptions[0], [0, 1])
    assert int(trace.replica_steps[0][0]) == 19
    assert float(trace.replica_clock_s[0][0]) == clock_s


@pytest.mark.parametrize(("prefix_caching", "clock_s"), [(True, EXPECTED_CLOCK_S), (False, WHOLE_RECOMPUTE_CLOCK_S)])
def test_reference_block_pool_counts_the_same(prefix_caching, clock_s):
    ref = reference_replay(REQUESTS, **CAPACITY, step_time=affine_step_time_py(PARAMS[0]), prefix_caching=prefix_caching)
    assert [r.finish_step for r in ref.requests] == [11, 18]
    assert [r.preemptions for r in ref.requests] == [0, 1]
    assert ref.replicas[0].steps == 19
    assert ref.replicas[0].last_step_end == clock_s


def test_hybrid_models_recompute_their_victims_whole():
    """vLLM caches a linear-attention layer's state only in some releases, experimentally."""
    from jaxplan.funnel.replay_stage import prefix_caching
    from jaxplan.physics.shapes import model_shape
    from jaxplan.specs.loader import load_model

    assert prefix_caching(model_shape(load_model("llama-3.1-70b")))
    assert not prefix_caching(model_shape(load_model("qwen3.5-27b")))
