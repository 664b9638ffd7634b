"""Winner map: a hand-built two-candidate case whose winner must flip where the cheaper candidate
stops keeping up, checked against stage 4 of each candidate at each rate.

Its own module (no fixture shared with tests/test_winner_map.py): its map has its own shapes, and
pytest-xdist's --dist loadfile can run it beside the other winner-map tests."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.sweep import build_context, evaluate_blocks
from jaxplan.grid import Grid
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list
from jaxplan.winner_map import winner_map

MODEL = load_model("llama-3.1-70b")
CODING = load_workload("coding")  # ISL 8,000, Poisson 8 req/s


def two_candidate_space():
    """One H100 layout, TP4 x PP1, at DP 1 or 2 (everything else fixed): two candidates."""
    return load_space("small").replace(
        tensor_parallel_size=(4,), pipeline_parallel_size=(1,), data_parallel_size=(1, 2), max_num_seqs=(256,),
        max_num_batched_tokens=(8192,), weight_dtype=("fp8",), kv_cache_dtype=("fp8",),
    )


def test_winner_flips_where_the_cheaper_candidate_stops_keeping_up():
    # Poisson traffic: while both keep up within the SLOs they deliver the same tokens/s, so the one
    # replica (half the GPUs, half the price) wins by ~2x tokens per dollar; past the rate where it
    # overloads or misses an SLO, only the two-replica layout is left.
    gpus = parse_gpu_list("h100_sxm")
    space = two_candidate_space()
    rates = tuple(float(r) for r in np.geomspace(1.0, 64.0, 13))
    wmap = winner_map(MODEL, gpus, CODING, space, "rate=" + ",".join(f"{r:.6g}" for r in rates))
    labels = wmap.labels[0, 0, :]  # a one-axis map is [1, 1, nx]
    # Independently: stage 4 of each candidate at each rate (explicit digits, no streaming tables).
    grid = Grid(gpus, space)
    ok = {}
    for dp_digit in (0, 1):
        digits = np.zeros((1, 8), np.int32)
        digits[0, -1] = dp_digit
        feasible = []
        for r in wmap.axes[0].values:
            ctx = build_context(grid, MODEL, dataclasses.replace(CODING, request_rate_per_s=r))
            ev = evaluate_blocks(ctx, digits)
            feasible.append(int(ev.reason[0]) == Reason.ADMITTED)
        ok[dp_digit + 1] = np.array(feasible)
    assert ok[1].any() and not ok[1].all(), "the rate range must straddle where one replica stops keeping up"
    assert not np.any(ok[1] & ~ok[2]), "two replicas keep up wherever one does"
    expected = np.where(ok[1], "H100 TP4xPP1xDP1", np.where(ok[2], "H100 TP4xPP1xDP2", ""))
    np.testing.assert_array_equal(labels, expected)
    both = ok[1] & ok[2]
    assert both.any()
    # Same throughput, half the price: margin ~ +100% (minus the 1% TPOT tie-break weight).
    np.testing.assert_allclose(wmap.margins[0, 0, both], 1.0, atol=0.05)
    assert np.all(np.isnan(wmap.margins[0, 0, ~ok[1]]))  # one candidate (or none) left: no runner-up
    flips = [b for b in wmap.boundaries() if b["from_winner"] == "H100 TP4xPP1xDP1"]
    assert len(flips) == 1 and flips[0]["to_winner"] == "H100 TP4xPP1xDP2"
