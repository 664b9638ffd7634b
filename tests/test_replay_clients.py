"""Closed-loop client start times: groups of the calibrated wave size, spread over a lifetime."""

import numpy as np
import pytest

from jaxplan.errors import PlanError
from jaxplan.replay.clients import SPREAD_OF_LIFETIME, closed_loop_start_times


def test_full_sync_starts_everyone_at_zero():
    assert np.all(closed_loop_start_times(16, 1.0, 10.0) == 0.0)


def test_no_sync_gives_one_client_per_group_within_the_spread():
    starts = closed_loop_start_times(64, 0.0, 10.0, seed=3)
    assert starts.shape == (64,) and starts.dtype == np.float32
    assert starts[0] == 0.0 and np.all(np.diff(starts) >= 0)
    assert starts.max() <= SPREAD_OF_LIFETIME * 10.0
    assert len(np.unique(starts)) == 64  # every client on its own
    assert starts.max() > 0.5 * SPREAD_OF_LIFETIME * 10.0  # really spread, not bunched at 0


@pytest.mark.parametrize("n,s,group", [(64, 0.11, 8), (4, 0.11, 1), (33, 0.5, 17), (2, 0.25, 1)])
def test_group_size_is_one_plus_s_times_the_others(n, s, group):
    starts = closed_loop_start_times(n, s, 100.0, seed=1)
    _, counts = np.unique(starts, return_counts=True)
    assert counts.max() == group  # round(1 + s (n - 1))
    assert counts.sum() == n


def test_seeded_and_deterministic():
    a = closed_loop_start_times(32, 0.1, 5.0, seed=7)
    assert np.array_equal(a, closed_loop_start_times(32, 0.1, 5.0, seed=7))
    assert not np.array_equal(a, closed_loop_start_times(32, 0.1, 5.0, seed=8))


def test_unknown_lifetime_means_no_spread():
    assert np.all(closed_loop_start_times(8, 0.1, float("inf")) == 0.0)
    assert np.all(closed_loop_start_times(8, 0.1, 0.0) == 0.0)


@pytest.mark.parametrize("args", [(0, 0.1, 1.0), (4, -0.1, 1.0), (4, 1.5, 1.0), (4, 0.1, float("nan")), (4, 0.1, -1.0)])
def test_bad_input_is_a_plan_error(args):
    with pytest.raises(PlanError):
        closed_loop_start_times(*args)
