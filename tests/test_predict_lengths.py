"""Length distributions in predict rows (`isl_distribution`, `isl_spread`, `osl_distribution`,
`osl_spread`, as in a workload file): the replay samples them, stage 4 takes their p99 context and
output-length spread. Before 2026-12-01 every predict row had fixed lengths, and the 200-request
ShareGPT runs (lengths' coefficient of variation ~1) were replayed at up to 5.6x their measured
throughput (MAPE 142%; see test_lengths_file.py for their own lengths)."""

import numpy as np
import pytest

from jaxplan.errors import PlanError
from jaxplan.prediction import _row_workload, predict_rows, replay_predict_rows, row_batches
from jaxplan.replay import sample_requests
from jaxplan.specs.workload import LengthDistribution

BURST = dict(model="llama-3.1-8b", gpu="h100_sxm", tensor_parallel_size=1, isl=256, osl=256, request_rate="inf", num_prompts=200)
VARIABLE = dict(BURST, isl_distribution="lognormal", isl_spread=1.0, osl_distribution="lognormal", osl_spread=1.0)


def test_the_replay_samples_the_rows_distribution():
    (batch,) = row_batches([VARIABLE])
    workload = _row_workload(batch, 0, None, VARIABLE)
    assert workload.osl_distribution == LengthDistribution.LOGNORMAL and workload.osl_spread == 1.0 and workload.num_requests == 200
    requests = sample_requests(workload, 20_000, seed=0)
    out = requests.output_tokens.astype(float)
    assert out.mean() == pytest.approx(256, rel=0.05) and out.std() / out.mean() == pytest.approx(1.0, abs=0.1)
    fixed = _row_workload(batch, 0, None, BURST)
    assert fixed.osl_distribution == LengthDistribution.FIXED


def test_a_finite_burst_lasts_as_long_as_its_longest_request():
    fixed, variable = replay_predict_rows([BURST, VARIABLE])
    # 200 lognormal outputs with CV 1 reach ~5-7x the mean (median of the maximum); the run lasts
    # until the longest finishes, so its output rate falls well below the fixed-length run's.
    assert fixed["status"] == variable["status"] == "ok"
    assert fixed["output_tok_s"] / variable["output_tok_s"] > 2.0


def test_stage_4_takes_the_p99_context_and_output_spread():
    fixed, variable = predict_rows([dict(BURST, request_rate=2.0), dict(VARIABLE, request_rate=2.0)])
    assert variable["ttft_ms_p99"] > fixed["ttft_ms_p99"] and variable["tpot_ms_p99"] >= fixed["tpot_ms_p99"]
    assert variable["ttft_ms_mean"] == pytest.approx(fixed["ttft_ms_mean"], rel=1e-6)  # means use the mean lengths


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({"isl_distribution": "pareto"}, ("isl_distribution = 'pareto'", "lognormal")),
        ({"osl_spread": 6}, ("osl_spread = 6", "[0, 5]")),
        ({"osl_spread": "wide"}, ("osl_spread = 'wide'", "number")),
    ],
)
def test_bad_length_fields_are_one_line_errors(changes, fragments):
    for run in (predict_rows, replay_predict_rows):
        with pytest.raises(PlanError) as excinfo:
            run([BURST, dict(VARIABLE, **changes)])
        message = str(excinfo.value)
        assert "\n" not in message and "row 2" in message and all(f in message for f in fragments), message


def test_csv_rows_check_the_distribution(tmp_path):
    from jaxplan.calibrate.rows import read_predict_csv

    path = tmp_path / "rows.csv"
    path.write_text("model,gpu,tensor_parallel_size,isl,osl,concurrency,osl_distribution,osl_spread\nllama-3.1-8b,h100_sxm,1,100,100,4,zipf,1\n")
    with pytest.raises(PlanError) as excinfo:
        read_predict_csv(path)
    assert "osl_distribution = 'zipf'" in str(excinfo.value) and "lognormal" in str(excinfo.value)
    path.write_text("model,gpu,tensor_parallel_size,isl,osl,concurrency,osl_distribution,osl_spread\nllama-3.1-8b,h100_sxm,1,100,100,4,uniform,0.5\n")
    (row,) = read_predict_csv(path)
    assert row["osl_distribution"] == "uniform" and row["osl_spread"] == 0.5 and row["isl_distribution"] is None
    assert np.isfinite(predict_rows([row])[0]["tpot_ms_p99"])


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"isl_distribution": "pareto"}, "isl_distribution"),
        ({"osl_spread": 6.0}, "osl_spread"),
        ({"osl_spread": -0.5}, "osl_spread"),
        ({"isl_spread": float("nan")}, "isl_spread"),
    ],
)
def test_workloads_predict_rows_and_measurement_rows_share_one_length_rule(changes, field):
    """The same bad length field is refused by a workload, a predict row and a measurement row (the
    one rule, `length_fields`), each naming the field; a name in any case is accepted by all three."""
    from jaxplan.calibrate.rows import make_row
    from jaxplan.specs.workload import Workload

    shape = dict(isl_distribution="uniform", isl_spread=0.2, osl_distribution="lognormal", osl_spread=1.0)
    bad = {**shape, **changes}
    entry_points = (
        lambda s: Workload(name="w", isl_mean_tokens=256, osl_mean_tokens=256, **{k: LengthDistribution(v) if k.endswith("distribution") and v in ("uniform", "lognormal") else v for k, v in s.items()}),
        lambda s: predict_rows([dict(BURST, **s)]),
        lambda s: make_row(**{k: v for k, v in BURST.items() if k != "request_rate"}, request_rate=float("inf"), **s),
    )
    for index, enter in enumerate(entry_points):
        enter(shape)
        if index:  # rows take text in any case
            enter(dict(shape, isl_distribution="Uniform", osl_distribution=" LOGNORMAL"))
        with pytest.raises(PlanError, match=rf"{field} = "):
            enter(bad)
