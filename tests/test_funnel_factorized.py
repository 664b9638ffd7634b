"""The streamed, DP-factorised funnel equals a flat evaluation of every candidate."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

from jaxplan.funnel.chunk import evaluate_digits
from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.sweep import build_context, evaluate_blocks, stream
from jaxplan.grid import Grid, layout_index
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list


@pytest.mark.parametrize("model_name, workload_name", [("llama-3.1-70b", "coding"), ("qwen3-30b-a3b", "rl-rollout")])
def test_factorised_stream_matches_flat_evaluation(model_name, workload_name):
    grid = Grid(parse_gpu_list("h100_sxm,a100_sxm"), load_space("small"))
    ctx = build_context(grid, load_model(model_name), load_workload(workload_name))
    digits = np.array(list(itertools.product(*(range(n) for n in grid.sizes))), np.int32)  # index order
    flat = evaluate_blocks(ctx, digits)
    part = stream(grid, ctx, chunk_size=1024)

    # Same per-reason counts (PADDING is not a candidate).
    expected = np.bincount(flat.reason, minlength=len(Reason))
    np.testing.assert_array_equal(part.totals[: Reason.PADDING], expected[: Reason.PADDING])
    assert expected[Reason.ADMITTED] > 0  # the comparison covers admitted candidates too

    # Same best candidate per layout: highest score, ties to the lowest index. Scores may differ in
    # the last bits (the factorised kernel fuses differently), so compare the winners' scores to 1e-5.
    layouts = np.asarray(layout_index(digits, np.array(grid.sizes)))
    for layout in np.unique(layouts[np.isfinite(flat.score)]):
        members = np.flatnonzero(layouts == layout)
        best = members[np.argmax(flat.score[members])]
        np.testing.assert_allclose(part.state.layouts.score[layout], flat.score[best], rtol=1e-5)
    assert np.isfinite(part.state.layouts.score).sum() == len(np.unique(layouts[np.isfinite(flat.score)]))


def test_report_rows_in_blocks_equal_one_evaluation_of_every_row():
    """`rows_for` prices its rows in blocks of REPORT_ROWS (one program): more rows than a block, and
    per-row workloads cut with them (the winner map's), give each row what pricing it alone gives."""
    from jaxplan.funnel.sweep import REPORT_ROWS, report_rows, rows_for
    from jaxplan.physics.traffic import WorkloadParams

    grid = Grid(parse_gpu_list("h100_sxm,a100_sxm"), load_space("small"))
    ctx = build_context(grid, load_model("llama-3.1-70b"), load_workload("coding"))
    every = np.array(list(itertools.product(*(range(n) for n in grid.sizes))), np.int32)
    digits = every[np.random.default_rng(0).choice(len(every), REPORT_ROWS + 37, replace=False)]
    assert report_rows(len(digits)) == 2 * REPORT_ROWS and report_rows(1) == REPORT_ROWS
    rows = rows_for(grid, ctx, digits)
    assert [r["digits"] for r in rows] == digits.tolist()
    for i in (0, REPORT_ROWS - 1, REPORT_ROWS, len(digits) - 1):  # either side of the block edge
        alone = jax.device_get(evaluate_digits(ctx, digits[i : i + 1]))
        assert rows[i]["score"] == pytest.approx(float(alone.score[0]), rel=1e-6)
        assert rows[i]["ttft_mean_s"] == pytest.approx(float(alone.estimate.ttft_mean_s[0]), rel=1e-6, nan_ok=True)

    # One workload a row: the rows of a block get theirs (ISL doubled on every other row here).
    padded = np.zeros((report_rows(len(digits)), digits.shape[1]), np.int32)
    padded[: len(digits)] = digits
    isl = np.where(np.arange(len(padded)) % 2 == 0, 1.0, 2.0) * float(ctx.workload.isl_tokens)
    per_row = ctx._replace(workload=WorkloadParams(*(np.full(len(padded), float(f), np.float32) for f in ctx.workload))._replace(isl_tokens=isl.astype(np.float32)))
    blocks, uniform = evaluate_blocks(per_row, padded), evaluate_blocks(ctx, padded)
    finite = np.isfinite(uniform.estimate.ttft_mean_s[: len(digits)])
    odd = finite & (np.arange(len(digits)) % 2 == 1)
    assert odd[:REPORT_ROWS].any() and odd[REPORT_ROWS:].any()
    assert np.all(blocks.estimate.ttft_mean_s[: len(digits)][odd] > uniform.estimate.ttft_mean_s[: len(digits)][odd])  # longer prompts
    for i in (1, REPORT_ROWS + 1, REPORT_ROWS + 2):
        one = ctx._replace(workload=ctx.workload._replace(isl_tokens=np.float32(isl[i])))
        alone = jax.device_get(evaluate_digits(one, padded[i : i + 1]))
        np.testing.assert_allclose(blocks.estimate.ttft_mean_s[i], alone.estimate.ttft_mean_s[0], rtol=1e-6)
