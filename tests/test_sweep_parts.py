"""Hosts' parts: streaming every other chunk on two 'hosts' and combining equals one host."""

from __future__ import annotations

import numpy as np

from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.sweep import build_context, combine, finish, stream
from jaxplan.grid import Grid
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list


def test_two_parts_combine_to_the_single_host_result():
    model, workload = load_model("llama-3.1-8b"), load_workload("chat")
    grid = Grid(parse_gpu_list("h100_sxm,a100_sxm"), load_space("small"))
    ctx = build_context(grid, model, workload)
    whole = stream(grid, ctx, chunk_size=1024)
    halves = [stream(grid, ctx, chunk_size=1024, part=(i, 2)) for i in range(2)]
    # Each half saw a strict, non-empty subset of the candidates (PADDING, the last code, is not a candidate).
    seen = [int(h.totals[: Reason.PADDING].sum()) for h in halves]
    assert seen == [1024, grid.size - 1024]
    assert int(whole.totals[: Reason.PADDING].sum()) == grid.size
    joined = combine(halves[::-1])  # order must not matter
    np.testing.assert_array_equal(joined.totals, whole.totals)
    for a, b in zip(joined.state, whole.state):
        np.testing.assert_array_equal(a.score, b.score)
        np.testing.assert_array_equal(a.digits, b.digits)
    top_whole = finish(grid, model, workload, ctx, whole, 5).shortlist
    top_joined = finish(grid, model, workload, ctx, joined, 5).shortlist
    assert [r["digits"] for r in top_whole] == [r["digits"] for r in top_joined]
    assert len(top_whole) == 5
