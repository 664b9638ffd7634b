"""Routing policies are chosen once, by name: an unknown name is a one-line PlanError listing the
known ones (at every entry point that takes a routing), and the names the CLI offers are the
policies the replay knows."""

from __future__ import annotations

import numpy as np
import pytest

from jaxplan.errors import PlanError
from jaxplan.replay import ReplayConfig, Requests, simulate_trace
from jaxplan.replay import routing as routing_module
from jaxplan.replay.memory import ReplayShape, replay_bytes
from jaxplan.replay.routing import POLICIES, routing_policy
from jaxplan.replay.testing import affine_step_time
from jaxplan.specs.workload import Arrival, Workload

KNOWN = ("dp_coordinator", "least_loaded", "round_robin")


def _one_line_listing_the_known(err: PlanError, name: str) -> str:
    text = str(err)
    assert "\n" not in text
    assert "routing" in text and repr(name) in text
    assert text.endswith("Known: " + ", ".join(KNOWN))  # every policy, sorted
    return text


def test_the_registry_holds_each_policy_under_its_own_name():
    assert sorted(POLICIES) == list(KNOWN)
    assert all(policy.name == name and routing_policy(name) is policy for name, policy in POLICIES.items())


@pytest.mark.parametrize(("name", "closest"), [("least-loaded", "least_loaded"), ("roundrobin", "round_robin"), ("dp-coordinator", "dp_coordinator"), ("", None), (None, None), (3, None)])
def test_an_unknown_policy_is_one_line_listing_the_known_ones(name, closest):
    with pytest.raises(PlanError) as err:
        routing_policy(name)
    text = _one_line_listing_the_known(err.value, str(name))
    assert (f"Did you mean {closest!r}?" in text) if closest else ("Did you mean" not in text)


def test_every_entry_point_refuses_an_unknown_policy_the_same_way():
    from jaxplan import api
    from jaxplan.plan import check_options

    with pytest.raises(PlanError) as err:
        ReplayConfig.create(4, 64, 100, routing="random")
    _one_line_listing_the_known(err.value, "random")
    config = ReplayConfig.create(4, 64, 100, data_parallel_size=2)
    requests = Requests(np.full(4, 8, np.int32), np.full(4, 2, np.int32), np.zeros(4, np.int32), np.zeros(4, np.float32))
    workload = Workload(name="open", isl_mean_tokens=8, osl_mean_tokens=2, arrival=Arrival.POISSON, request_rate_per_s=1.0)
    with pytest.raises(PlanError) as err:
        simulate_trace(config, requests, workload, affine_step_time, np.full((1, 4), 2.0**-6, np.float32), routing="fastest")
    _one_line_listing_the_known(err.value, "fastest")
    with pytest.raises(PlanError) as err:
        check_options(top=3, chunk_size=4096, replay_requests=100, seed=0, routing="random")
    _one_line_listing_the_known(err.value, "random")
    with pytest.raises(PlanError) as err:
        api.predict([{"model": "llama-3.1-8b"}], routing="random")
    _one_line_listing_the_known(err.value, "random")
    with pytest.raises(PlanError) as err:
        replay_bytes(ReplayShape(1, 10, 1, 8, 8, "random"))
    _one_line_listing_the_known(err.value, "random")


def test_the_cli_offers_exactly_the_known_policies():
    from jaxplan.cli.common import Routing

    assert sorted(r.value for r in Routing) == list(KNOWN)


def test_a_new_policy_is_one_more_registry_entry(monkeypatch):
    """A policy registered under a new name is accepted everywhere the name goes, and the replay
    runs on its functions: here round robin's, renamed, gives round robin's trace bit for bit."""
    import dataclasses

    clone = dataclasses.replace(routing_module.ROUND_ROBIN, name="round_robin_copy")
    monkeypatch.setitem(routing_module.POLICIES, clone.name, clone)
    config = ReplayConfig.create([2, 3], [16, 32], [40, 60], data_parallel_size=[2, 3], block_size=4, routing=clone.name)
    rng = np.random.default_rng(1)
    requests = Requests(rng.integers(1, 30, 12).astype(np.int32), rng.integers(1, 9, 12).astype(np.int32), np.zeros(12, np.int32), np.sort(rng.integers(0, 64, 12)).astype(np.float32) / 16)
    workload = Workload(name="open", isl_mean_tokens=10, osl_mean_tokens=5, arrival=Arrival.POISSON, request_rate_per_s=1.0)
    params = np.full((2, 4), 2.0**-6, np.float32)
    copy = simulate_trace(config, requests, workload, affine_step_time, params, num_slots=4)
    original = simulate_trace(config, requests, workload, affine_step_time, params, num_slots=4, routing="round_robin")
    for field in original._fields:
        np.testing.assert_array_equal(np.asarray(getattr(copy, field)), np.asarray(getattr(original, field)), err_msg=field)
    assert np.all(np.asarray(copy.finish_step) >= 0)  # the comparison covers a finished replay
