"""No recompilation on the second call of a jitted entry point with same-shaped, different-valued input.

Compilations are counted with JAX's own monitoring events: every XLA compilation records
'/jax/core/compile/backend_compile_duration' and every retrace '/jax/core/compile/jaxpr_trace_duration'
(cached calls record neither). `test_counter_sees_a_deliberate_recompile` checks that the counter
does see a recompilation, so a zero below means zero.

Entry points (grep `jax.jit` in jaxplan/): the sweep's chunk kernel and report-row kernel (run_sweep),
predict_rows (analytical), replay_predict_rows (the replay's simulate, metrics and helpers),
sensitivity.for_rows, and the calibration fit step (fit.fit_serving).
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan.buckets import bucket_size
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list

COMPILE = "/jax/core/compile/backend_compile_duration"
TRACE = "/jax/core/compile/jaxpr_trace_duration"
_events: list[str] | None = None


def _listener(event: str, duration: float, **kwargs) -> None:
    if _events is not None and event in (COMPILE, TRACE):
        _events.append(event)


jax.monitoring.register_event_duration_secs_listener(_listener)


@contextlib.contextmanager
def count_compilations():
    """Yields a list that holds, after the block, one entry per compilation or trace inside it."""
    global _events
    _events = []
    seen = _events
    try:
        yield seen
    finally:
        _events = None


def assert_no_recompilation(first, second, what: str):
    """Run first() (compiles), then second() (same shapes, other values): nothing may compile or trace."""
    a = first()
    with count_compilations() as events:
        b = second()
    assert not events, f"{what}: {events.count(COMPILE)} compilations and {events.count(TRACE)} traces on the second call"
    return a, b


def test_counter_sees_a_deliberate_recompile():
    f = jax.jit(lambda x: jnp.sin(x) * 2)
    small, other, bigger = np.ones(3, np.float32), np.full(3, 2.0, np.float32), np.ones(5, np.float32)
    f(small)
    with count_compilations() as same:
        f(other)
    with count_compilations() as new_shape:
        f(bigger)
    assert not same
    assert new_shape.count(COMPILE) >= 1 and new_shape.count(TRACE) >= 1


# ---- the sweep (stages 1-6) and sensitivity ---------------------------------------------------------------


@pytest.fixture(scope="module")
def sweeps():
    from jaxplan.funnel import run_sweep

    model, gpus, space = load_model("llama-3.1-8b"), parse_gpu_list("h100_sxm,a100_sxm"), load_space("small")
    first = lambda: run_sweep(model, gpus, load_workload("chat"), space, top_k=5)  # noqa: E731
    # Same shapes, other values: another workload (arrays in the kernel), budget and prices.
    cheaper = tuple(g.with_price(g.price_usd_per_hour * 0.5) for g in gpus)
    second = lambda: run_sweep(model, cheaper, load_workload("coding"), space.replace(gpu_budget=16), top_k=5)  # noqa: E731
    return assert_no_recompilation(first, second, "run_sweep")


def test_sweep_does_not_recompile(sweeps):
    a, b = sweeps
    assert a.shortlist and b.shortlist
    assert [r["digits"] for r in a.shortlist] != [r["digits"] for r in b.shortlist]  # the values did change


def test_another_model_sweeps_without_compiling(sweeps):
    """A small grid's chunk kernel takes the model as arrays (`chunk.TRACED_MODEL_MAX_CANDIDATES`):
    after the 8B sweeps, the 70B model's sweep of the same space and GPUs compiles nothing."""
    from jaxplan.funnel import run_sweep

    gpus, space = parse_gpu_list("h100_sxm,a100_sxm"), load_space("small")
    small, large = assert_no_recompilation(
        lambda: run_sweep(load_model("llama-3.1-8b"), gpus, load_workload("chat"), space, top_k=5),
        lambda: run_sweep(load_model("llama-3.1-70b"), gpus, load_workload("chat"), space, top_k=5),
        "run_sweep of another model",
    )
    assert small.shortlist and large.shortlist
    assert small.shortlist[0]["num_gpus"] < large.shortlist[0]["num_gpus"]  # the model did change


def test_other_gpus_and_axis_lengths_sweep_without_compiling(sweeps):
    """The kernels take every axis but DP and the GPU table padded to a bucket (`Grid.kernel_axis_arrays`,
    `sweep.table_shape`): after the two-GPU sweeps, one GPU type and a space whose other axes have
    other lengths (DP kept: the kernel factorises over it) compile nothing."""
    from jaxplan.funnel import run_sweep

    space = load_space("small")
    other = space.replace(tensor_parallel_size=(1, 2, 4), max_num_seqs=(128, 512), kv_cache_dtype=("auto",), gpu_budget=8)
    assert len(other.data_parallel_size) == len(space.data_parallel_size)
    with count_compilations() as events:
        result = run_sweep(load_model("llama-3.1-8b"), parse_gpu_list("h200_sxm"), load_workload("chat"), other, top_k=5)
    assert not events, f"{events.count(COMPILE)} compilations and {events.count(TRACE)} traces"
    assert result.grid.sizes != sweeps[0].grid.sizes and result.shortlist
    assert {r["gpu"] for r in result.shortlist} == {"h200_sxm"} and {r["max_num_seqs"] for r in result.shortlist} <= {128, 512}


def test_rows_of_other_axis_lengths_and_scenarios_are_priced_without_compiling(sweeps):
    """The programs that price explicit rows (the report rows, the finalists' replay arrays) take every
    axis padded to `chunk.ROWS_AXIS_ENTRIES` and the workload one value a row (`chunk.rows_context`,
    `per_row_workload`): after the sweeps above, the rows of a sweep whose DP axis and another axis
    have other lengths (past the chunk kernel's bucket of 8), and rows under a scenario each (the
    winner map's), compile nothing, and they are the rows that the streaming priced."""
    from jaxplan.funnel import run_sweep
    from jaxplan.funnel.replay_stage import finalist_inputs
    from jaxplan.funnel.sweep import evaluate_blocks

    a, _ = sweeps
    evaluate_blocks(a.context, np.asarray([r["digits"] for r in a.shortlist[:1]] * 8, np.int32))
    finalist_inputs(a, a.shortlist[:1])
    space = load_space("small")
    wider = space.replace(data_parallel_size=(1, 2, 3, 4, 6, 8), max_num_seqs=(16, 32, 48, 64, 96, 128, 192, 256, 512, 1024))
    assert len(wider.data_parallel_size) != len(space.data_parallel_size) and len(wider.max_num_seqs) > 8
    other = run_sweep(load_model("llama-3.1-8b"), parse_gpu_list("h100_sxm,a100_sxm"), load_workload("chat"), wider, top_k=5)
    rows = other.shortlist[:1] * 8
    digits = np.asarray([r["digits"] for r in rows], np.int32)
    # the same rows, each under its own prompt length (a winner map's rows): the first keeps the sweep's
    scenarios = other.context.workload._replace(isl_tokens=other.context.workload.isl_tokens * np.linspace(1.0, 1.35, 8, dtype=np.float32))
    with count_compilations() as events:
        ev = evaluate_blocks(other.context, digits)
        per_scenario = evaluate_blocks(other.context._replace(workload=scenarios), digits)
        config, _ = finalist_inputs(other, other.shortlist[:1])
    assert not events, f"{events.count(COMPILE)} compilations and {events.count(TRACE)} traces"
    assert float(ev.score[0]) == pytest.approx(other.shortlist[0]["score"], rel=1e-5)
    assert float(per_scenario.score[0]) == pytest.approx(float(ev.score[0]), rel=1e-6)
    ttft = np.asarray(per_scenario.estimate.ttft_mean_s)
    assert np.all(np.diff(ttft) > 0), "longer prompts must take longer to a first token"
    assert int(config.data_parallel_size[0]) == other.shortlist[0]["data_parallel_size"]


def test_sensitivity_does_not_recompile(sweeps):
    from jaxplan.elasticity import for_rows

    a, b = sweeps
    k = min(len(a.shortlist), len(b.shortlist), 3)
    first, second = assert_no_recompilation(lambda: for_rows(a, a.shortlist[:k]), lambda: for_rows(b, b.shortlist[:k]), "sensitivity.for_rows")
    assert not np.allclose(first.values, second.values)


# ---- predict: analytical and replay -----------------------------------------------------------------------


def rows(isl: float, rate: float, gpu: str, model: str = "llama-3.1-8b") -> list[dict]:
    base = dict(model=model, gpu=gpu, tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
                weight_dtype="bf16", kv_cache_dtype="auto", osl=200.0, max_num_seqs=256, max_num_batched_tokens=8192)
    return [dict(base, isl=isl, request_rate=rate), dict(base, isl=isl * 2, concurrency=16, tensor_parallel_size=2)]


def test_predict_analytical_does_not_recompile():
    """Nor for another model: the model shape is traced."""
    from jaxplan.prediction import predict_rows

    a, b = assert_no_recompilation(lambda: predict_rows(rows(1000.0, 2.0, "h100_sxm")), lambda: predict_rows(rows(3000.0, 5.0, "a100_sxm", "qwen3-32b")), "predict_rows")
    assert a[0]["tpot_ms_mean"] != b[0]["tpot_ms_mean"]


def test_predict_replay_does_not_recompile():
    """Nor for another model or request count: the replay's step function is one for every model
    (`physics_step`), the model shape a traced parameter, and request counts in one bucket
    (`replay.traffic.request_bucket`: 20 and 30 in 256) share the padded request arrays."""
    from jaxplan.prediction import replay_predict_rows
    from jaxplan.replay.traffic import request_bucket

    assert request_bucket(20) == request_bucket(30)
    first = lambda: replay_predict_rows(rows(1000.0, 2.0, "h100_sxm")[:1], num_requests=20)  # noqa: E731
    second = lambda: replay_predict_rows(rows(3000.0, 5.0, "a100_sxm", "qwen3-32b")[:1], num_requests=30, seed=1)  # noqa: E731
    a, b = assert_no_recompilation(first, second, "replay_predict_rows")
    assert a[0]["ttft_ms_mean"] != b[0]["ttft_ms_mean"]


def test_predict_replay_of_a_burst_starts_with_enough_slot_rows(monkeypatch):
    """A burst of 200 requests on one replica (max_num_seqs 256) starts with 256 slot rows instead of
    running its first steps on 32 and then growing (a loop program each width), and gets the same
    answer as the grown replay."""
    from jaxplan import prediction as predict
    from jaxplan.replay import driver

    row = dict(rows(1000.0, 2.0, "h100_sxm")[0], request_rate="inf", num_prompts=200)
    grows = []
    real_grow = driver._grow
    monkeypatch.setattr(driver, "_grow", lambda *a, **k: grows.append(k["num_slots"]) or real_grow(*a, **k))
    wide = predict.replay_predict_rows([row])[0]
    assert grows == []
    monkeypatch.setattr(predict, "_initial_slots", lambda workload, layout: None)
    grown = predict.replay_predict_rows([row])[0]
    assert grows == [256]
    for column in predict.OUTPUT_COLUMNS:
        assert wide[column] == grown[column], column


def test_predict_replay_of_a_short_poisson_row_starts_with_a_slot_row_per_request(monkeypatch):
    """Poisson arrivals that outpace the GPU: 200 requests (the smallest request bucket) start with
    256 slot rows, where growing from 32 compiled a loop program at 64, 128 and 256; the answer is the
    same. A longer Poisson row (more requests than that bucket per replica) still starts small:
    its replay's cost is its steps, not compiling."""
    from jaxplan import prediction as predict
    from jaxplan.replay import driver
    from jaxplan.replay.traffic import MIN_REQUEST_BUCKET

    row = dict(rows(1000.0, 2.0, "h100_sxm")[0], request_rate=50.0, num_prompts=200)
    grows = []
    real_grow = driver._grow
    monkeypatch.setattr(driver, "_grow", lambda *a, **k: grows.append(k["num_slots"]) or real_grow(*a, **k))
    wide = predict.replay_predict_rows([row])[0]
    assert grows == []
    real_initial = predict._initial_slots
    monkeypatch.setattr(predict, "_initial_slots", lambda workload, layout: None)
    grown = predict.replay_predict_rows([row])[0]
    assert grows[-1] == 256 and len(grows) >= 2, grows  # it did need the rows, through more than one width
    for column in predict.OUTPUT_COLUMNS:
        # Tables of other widths may reassociate a float sum: the suite's -O0 rounds a p99 in its last bit.
        expected = pytest.approx(grown[column], rel=1e-6) if isinstance(grown[column], float) else grown[column]
        assert wide[column] == expected, column
    batch = next(iter(predict.row_batches([row], "input")))
    workload = predict._row_workload(batch, 0, None, row)
    assert real_initial(workload, batch.layout) == 200
    longer = dict(row, num_prompts=MIN_REQUEST_BUCKET + 1)
    batch = next(iter(predict.row_batches([longer], "input")))
    assert real_initial(predict._row_workload(batch, 0, None, longer), batch.layout) is None
    two_replicas = dict(longer, data_parallel_size=2)  # 129 per replica
    batch = next(iter(predict.row_batches([two_replicas], "input")))
    assert real_initial(predict._row_workload(batch, 0, None, two_replicas), batch.layout) == 129


# ---- calibration ------------------------------------------------------------------------------------------


def test_calibration_fit_does_not_recompile():
    """The fit's program depends on the number of GPUs and models and on each model's row bucket
    (`buckets.bucket_size`), not on the rows, the GPU, the model or the step count: a held-out fold, a
    test or a user's measurements of another size reuse it."""
    from jaxplan.calibrate import fit

    def data(scale: float, gpu: str, model: str, extra: int):
        base = rows(1000.0, 2.0, gpu) + [dict(rows(1000.0 + 500 * k, 2.0, gpu)[1], concurrency=8 + k) for k in range(extra)]
        measured = [dict(r, model=model, measured_ttft_ms_mean=100.0 * scale * (i + 1), measured_tpot_ms_mean=10.0 * scale, concurrency=16, request_rate=None)
                    for i, r in enumerate(base)]
        return fit.fit_data(measured, [gpu])

    def prior(gpu: str):
        return np.stack([fit.free_vector(fit.kernel_priors(gpu))])

    first_data, second_data = data(1.0, "h100_sxm", "llama-3.1-8b", 0), data(1.7, "a100_sxm", "qwen3-32b", 3)
    assert bucket_size(2) == bucket_size(5)
    a, b = assert_no_recompilation(lambda: fit.fit_serving(first_data, ["h100_sxm"], prior("h100_sxm"), steps=3),
                                   lambda: fit.fit_serving(second_data, ["a100_sxm"], prior("a100_sxm"), steps=5), "fit_serving")
    assert not np.allclose(a[0], b[0]) and a[0].shape[0] == b[0].shape[0] == 1
    # two GPUs, the second without rows (second_data indexes the A100 as 0): the one-GPU fits above ran
    # padded to MIN_FIT_GPUS, so this is their program
    both = ["a100_sxm", "h100_sxm"]
    with count_compilations() as events:
        two, _ = fit.fit_serving(second_data, both, np.concatenate([prior(g) for g in both]), steps=5)
    assert not events and two.shape[0] == 2 and fit.MIN_FIT_GPUS == 2
    np.testing.assert_allclose(two[0], b[0][0], rtol=1e-5, atol=1e-6)  # the listed GPU without rows has no say


def test_held_out_gpu_fits_reuse_the_complete_fits_program():
    """`jaxplan calibrate` fits every GPU, then each GPU held out (one vector, shared, on the others'
    rows), then a quarter of the layouts held out: with the held-out GPU listed (no say in the fit)
    and the rows padded to the complete fit's bucket, all of them run one compiled program (each
    compilation costs ~10 s on 2 cores)."""
    from jaxplan.calibrate import fit, run
    from jaxplan.physics.params import DEFAULTS

    def measured(gpu: str, n: int):
        return [dict(r, measured_ttft_ms_mean=100.0 * (i + 1), measured_tpot_ms_mean=10.0 + i, concurrency=16 + i, request_rate=None)
                for i, r in enumerate(rows(1000.0, 2.0, gpu) * n)]

    train = measured("h100_sxm", 10) + measured("h200_sxm", 2)  # 20 and 4 rows: a bucket of 32 (one model)
    fit._fit.clear_cache()  # counted from none: another test in this process may have compiled a bucket below
    priors = {g: {**DEFAULTS, **fit.kernel_priors(g)} for g in ("h100_sxm", "h200_sxm")}
    gpus, _, _ = run.serving_fit(train, priors, steps=3, like=train)
    programs = fit._fit._cache_size()
    assert programs == 1  # counted from none: the counter sees the complete fit's program
    held = run.held_out_params(train, "h100_sxm", priors, steps=4)  # a shared fit on 4 H200 rows
    assert fit._fit._cache_size() == programs, "the held-out fit compiled its own program"
    assert gpus == ["h100_sxm", "h200_sxm"] and all(np.isfinite(v) for v in held.values())
    run.serving_fit(train, priors, steps=3)  # without `like`: H100's 20 rows and H200's 4 in one bucket of 32 (one model)
    assert fit._fit._cache_size() == programs
    run.held_out_params(train[:4] + train[-4:], "h100_sxm", priors, steps=4)  # 8 rows: padded to MIN_FIT_ROWS, the same program
    assert fit._fit._cache_size() == programs and fit.MIN_FIT_ROWS == 32
