"""`xla_options.LEAN_COMPILE`, `ONE_SHOT_COMPILE` and `LEAN_ONE_SHOT_COMPILE` change how XLA:CPU
compiles a program, never what it computes: the chunk kernel compiled both ways gives the same tables
bit for bit, the one-shot programs at -O0 (the finalists' arrays, and the replay's start and merge with
the older emitters; the report rows) give the same metrics as at -O2, and the Jacobian at -O0 with the
older emitters the same elasticities."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import RUNS_LONG, SHIPPED_EMITTERS
from jaxplan.funnel import chunk
from jaxplan.funnel import run_sweep
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list
from jaxplan.xla_options import LEAN_ONE_SHOT_COMPILE, ONE_SHOT_COMPILE, accepted

# What the one-shot programs would compile with but for ONE_SHOT_COMPILE: XLA's default emitters at -O2
# (named: the suite compiles everything at -O0 with the older emitters, conftest).
DEFAULT_COMPILE = {**SHIPPED_EMITTERS, **RUNS_LONG}


def _sweep():
    # two GPU types and the llama-3.1-70b model: every stage rejects some candidates
    return run_sweep(load_model("llama-3.1-70b"), parse_gpu_list("h100_sxm,h200_sxm"), load_workload("coding"), load_space("small"), top_k=10)


def test_the_lean_chunk_kernel_gives_the_same_tables(monkeypatch):
    assert chunk.chunk_kernel(10) is chunk.sweep_chunk_lean and chunk.chunk_kernel(10**10) is chunk.sweep_chunk
    # the default emitters, named: the suite compiles everything else with the older ones (conftest)
    monkeypatch.setattr(chunk, "sweep_chunk", jax.jit(chunk._sweep_chunk, **chunk._CHUNK_STATIC, compiler_options=accepted(SHIPPED_EMITTERS) or None))
    monkeypatch.setattr(chunk, "LEAN_MAX_CANDIDATES", 0)
    default = _sweep()
    monkeypatch.setattr(chunk, "LEAN_MAX_CANDIDATES", 10**12)
    lean = _sweep()
    assert default.shortlist, "something must survive for the comparison to mean anything"
    assert lean.reason_counts == default.reason_counts
    assert [r["digits"] for r in lean.shortlist] == [r["digits"] for r in default.shortlist]
    assert [r["digits"] for r in lean.frontier] == [r["digits"] for r in default.frontier]
    assert [r["score"] for r in lean.shortlist] == [r["score"] for r in default.shortlist]


def test_the_replays_one_shot_programs_give_the_same_metrics(monkeypatch):
    from jaxplan.funnel import replay_stage
    from jaxplan.funnel.replay_stage import replay_rows
    from jaxplan.replay import driver

    result = _sweep()
    rows = result.shortlist[:4]
    lean = replay_rows(result, rows, num_requests=200)
    # the same programs compiled with XLA's default emitters at -O2
    one_shot = (replay_stage, "_finalist_arrays", (), ONE_SHOT_COMPILE), (driver, "_start_lanes", ("num_slots", "max_dp", "policy"), LEAN_ONE_SHOT_COMPILE), (driver, "_finish", ("policy",), LEAN_ONE_SHOT_COMPILE)
    for module, name, static, options in one_shot:
        assert getattr(module, name)._options == options, name
        monkeypatch.setattr(module, name, jax.jit(getattr(module, name).__wrapped__, static_argnames=static, compiler_options=accepted(DEFAULT_COMPILE) or None))
    default = replay_rows(result, rows, num_requests=200)
    keys = [k for k in lean[0] if k.startswith("replay_")]
    assert keys and [[r[k] for k in keys] for r in lean] == [[r[k] for k in keys] for r in default]


@pytest.mark.slow
def test_the_lean_jacobian_gives_the_same_elasticities(monkeypatch):
    """The sensitivities' Jacobian compiles at -O0 with the older emitters: its elasticities agree with
    the default emitters' at -O2 (to 2.2e-5 on 600 default-space finalists; here the small space's
    shortlist). Behind --run-slow: the default emitters' Jacobian is the suite's costliest compilation
    (about a minute of CPU), and the shipped program is checked against central differences of an
    independent one in every run (`tests/test_sensitivity.py`)."""
    from jaxplan import elasticity

    result = _sweep()
    rows = result.shortlist
    lean = elasticity.for_rows(result, rows)
    assert elasticity._jacobian._options == LEAN_ONE_SHOT_COMPILE
    monkeypatch.setattr(elasticity, "_jacobian", jax.jit(elasticity._jacobian.__wrapped__, compiler_options=accepted(DEFAULT_COMPILE) or None))
    default = elasticity.for_rows(result, rows)
    assert len(rows) >= 4 and np.all(np.isfinite(lean.elasticity))
    np.testing.assert_allclose(lean.values, default.values, rtol=1e-5)
    np.testing.assert_allclose(lean.elasticity, default.elasticity, atol=1e-4)


def test_the_lean_report_rows_give_the_default_emitters_numbers(monkeypatch):
    """The report rows' kernel compiles at -O0 with the default emitters (it compiles beside the chunk
    kernel on a first run and runs once): every field of every row agrees with the default emitters'
    at -O2 to 1e-5 relative (the README's sweep: its `--json` differs in the last float32 bit of a
    few values)."""
    result = _sweep()
    digits = jnp.asarray([r["digits"] for r in result.shortlist + result.frontier], jnp.int32)
    lean = jax.device_get(chunk.evaluate_digits(result.context, digits))
    assert chunk._evaluate_digits._options == ONE_SHOT_COMPILE
    monkeypatch.setattr(chunk, "_evaluate_digits", jax.jit(chunk._evaluate_digits.__wrapped__, compiler_options=accepted(DEFAULT_COMPILE) or None))
    default = jax.device_get(chunk.evaluate_digits(result.context, digits))
    assert len(digits) >= 4 and bool(np.any(np.asarray(default.estimate.output_tokens_per_s) > 0))
    for a, b in zip(jax.tree.leaves(lean), jax.tree.leaves(default), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_options_this_xla_lacks_are_left_out_not_fatal():
    """An XLA without a debug option refuses any program compiled with it ("No such compile option",
    as JAX 0.11's XLA does for `xla_cpu_use_fusion_emitters`): such options are dropped, known ones kept."""
    from jaxplan.xla_options import jit_with_options

    known, unknown = {"xla_backend_optimization_level": 0}, {"xla_jaxplan_no_such_option": True}
    assert accepted({**known, **unknown}) == known

    @jit_with_options({**known, **unknown})
    def double(x):
        return 2 * x

    assert float(double(np.float32(3))) == 6.0
    assert double.lower(np.float32(3)).compile() is not None and double._cache_size() == 1
    assert double.__wrapped__(1) == 2  # the plain function, as jax.jit exposes it
    with pytest.raises(Exception, match="No such compile option"):  # what the wrapper saves a caller from
        jax.jit(lambda x: 2 * x, compiler_options=unknown)(np.float32(3))


def test_the_shortlist_stands_only_on_rows_that_price_as_the_chunk_kernel_scored_them(monkeypatch):
    """The report rows and the chunk kernel are compiled apart (-O0 and -O2, different emitters); -O0
    with the older emitters once priced two rows wrong. Every shortlist row's score and every frontier
    row's throughput per GPU are checked against the kernel's tables: a one-shot program that
    disagrees is replaced by the same rows at XLA's defaults, and where those disagree too the sweep
    stops with a one-line error instead of printing them."""
    from jaxplan.errors import PlanError

    truth = _sweep()

    def off_by_a_percent(program):
        def wrapped(ctx, digits):
            ev = program(ctx, digits)
            return ev._replace(score=ev.score * 1.01, estimate=ev.estimate._replace(output_tokens_per_s=ev.estimate.output_tokens_per_s * 1.01))
        return wrapped

    monkeypatch.setattr(chunk, "_evaluate_digits", off_by_a_percent(chunk._evaluate_digits))
    recovered = _sweep()
    assert [r["digits"] for r in recovered.shortlist] == [r["digits"] for r in truth.shortlist]
    assert [r["score"] for r in recovered.shortlist] == [r["score"] for r in truth.shortlist]
    assert [r["output_tokens_per_s_per_gpu"] for r in recovered.frontier] == [r["output_tokens_per_s_per_gpu"] for r in truth.frontier]
    monkeypatch.setattr(chunk, "_evaluate_digits_default", off_by_a_percent(chunk._evaluate_digits_default))
    with pytest.raises(PlanError, match=r"internal check: the (shortlist|frontier)'s row \d+ has (score|output_tokens_per_s_per_gpu) .* where the sweep's kernel has"):
        _sweep()


def test_the_sizing_table_stands_only_on_rows_that_price_as_the_chunk_kernel_scored_them(monkeypatch):
    """`jaxplan size`'s rows (the best of every layout) are checked like the shortlist's: a one-shot
    program off by a percent is replaced at XLA's defaults, and both off stop with the one-line error."""
    from jaxplan.errors import PlanError
    from jaxplan.sizing import layout_rows

    result = _sweep()
    truth = layout_rows(result)
    assert len(truth) >= max(len(result.shortlist), 4)  # the best of every layout that passed

    def off_by_a_percent(program):
        return lambda ctx, digits: (lambda ev: ev._replace(score=ev.score * 1.01))(program(ctx, digits))

    monkeypatch.setattr(chunk, "_evaluate_digits", off_by_a_percent(chunk._evaluate_digits))
    assert [r["score"] for r in layout_rows(result)] == [r["score"] for r in truth]
    monkeypatch.setattr(chunk, "_evaluate_digits_default", off_by_a_percent(chunk._evaluate_digits_default))
    with pytest.raises(PlanError, match=r"internal check: the sizing table's row \d+ has score .* where the sweep's kernel has"):
        layout_rows(result)


def test_the_split_table_stands_only_on_splits_whose_best_prices_as_the_chunk_kernel_scored_it(monkeypatch):
    """The same GPUs arranged differently (`plot splits`, the report, why the winner wins) are priced by
    the report rows' program over every candidate of each split: each split's best score is checked
    against the chunk kernel's best-per-layout table. A one-shot program off by a percent is replaced
    at XLA's defaults (the same rows as unperturbed), both off stop with the one-line error, and a
    split whose candidates all fail must fail in the kernel's table too."""
    from jaxplan.errors import PlanError
    from jaxplan.plots.splits import best_per_split

    result = _sweep()
    count = result.winner["num_gpus"]
    truth = best_per_split(result, count)
    assert sum(r["passes"] for r in truth) >= 2 and result.layouts is not None  # the sweep kept its table

    def off_by_a_percent(program):
        return lambda ctx, digits: (lambda ev: ev._replace(score=ev.score * 1.01))(program(ctx, digits))

    def nothing_passes(program):
        return lambda ctx, digits: (lambda ev: ev._replace(score=jnp.full_like(ev.score, -jnp.inf)))(program(ctx, digits))

    monkeypatch.setattr(chunk, "_evaluate_digits", off_by_a_percent(chunk._evaluate_digits))
    again = best_per_split(result, count)  # at -O2: the same splits and candidates, scores to the last bits
    assert [(r["tensor_parallel_size"], r["pipeline_parallel_size"], r["data_parallel_size"], r["passes"], r.get("digits")) for r in again] == \
        [(r["tensor_parallel_size"], r["pipeline_parallel_size"], r["data_parallel_size"], r["passes"], r.get("digits")) for r in truth]
    np.testing.assert_allclose([r["score"] for r in again], [r["score"] for r in truth], rtol=1e-5)
    with monkeypatch.context() as m:
        m.setattr(chunk, "_evaluate_digits_default", nothing_passes(chunk._evaluate_digits_default))
        with pytest.raises(PlanError, match=r"internal check: the split table's split \d+ has best score -inf where the sweep's kernel has"):
            best_per_split(result, count)
    monkeypatch.setattr(chunk, "_evaluate_digits_default", off_by_a_percent(chunk._evaluate_digits_default))
    with pytest.raises(PlanError, match=r"internal check: the split table's split \d+ has best score .* where the sweep's kernel has"):
        best_per_split(result, count)

