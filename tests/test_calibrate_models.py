"""Leave-one-model-out and the held-out accuracy table: the protocol never shows a fit a row of the
model it scores, a model no fit has seen is priced from its config.json alone, the bands and scores of
the table by hand, the shipped report's numbers, and docs/accuracy.md's table is the report's."""

import json
import re
from pathlib import Path

import pytest

from jaxplan.calibrate import _data
from jaxplan.calibrate.accuracy_table import _scores, accuracy_table, concurrency_band, group_key, length_band, markdown

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "calibration_report.json"
RAW_CONFIGS = "specs/raw_model_configs"


def needs_data():
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")


def test_length_and_concurrency_bands():
    assert [length_band(n) for n in (213, 1000, 1024, 2000, 4000, 8000, 8192)] == ["<=1k", "<=1k", "<=1k", "1k-4k", "1k-4k", ">4k", ">4k"]
    assert [concurrency_band({"concurrency": c}) for c in (4, 8, 16, 32, 48, 64, 80, 128)] == ["1-8", "1-8", "9-32", "9-32", "33-64", "33-64", ">64", ">64"]
    assert concurrency_band({"request_rate": 4.0}) == concurrency_band({"request_rate": float("inf"), "concurrency": None}) == "open loop"
    row = {"model": "m", "gpu": "g", "weight_dtype": "fp8", "kv_cache_dtype": "fp8", "isl": 8192, "osl": 1024, "concurrency": 64}
    assert group_key(row) == ("m", "g", "fp8/fp8", ">4k / <=1k", "33-64")
    assert group_key(dict(row, weight_dtype=None, kv_cache_dtype=None))[2] == "bf16/auto"


def test_scores_by_hand():
    rows = [{"measured_ttft_ms_mean": 100.0, "measured_tpot_ms_mean": 10.0, "measured_output_tok_s": v} for v in (1.0, 2.0, 3.0)]
    predicted = [
        {"ttft_ms_mean": 120.0, "tpot_ms_mean": 9.0, "output_tok_s": 1.0},
        {"ttft_ms_mean": 90.0, "tpot_ms_mean": 10.0, "output_tok_s": 3.0},
        None,
    ]
    out = _scores(rows, predicted)
    assert out["rows"] == 3 and out["not_predicted"] == 1
    assert out["ttft_mape"] == pytest.approx(0.15) and out["ttft_bias"] == pytest.approx(0.05)  # +20%, -10%
    assert out["tpot_mape"] == pytest.approx(0.05) and out["tpot_bias"] == pytest.approx(-0.05)
    assert "throughput_spearman" not in out  # two predicted rows: no rank correlation


def test_table_groups_and_totals_by_hand():
    base = {"model": "m", "gpu": "g", "weight_dtype": "fp8", "kv_cache_dtype": "fp8", "isl": 1024, "osl": 1024, "measured_ttft_ms_mean": 100.0, "measured_tpot_ms_mean": 10.0}
    rows = [dict(base, concurrency=4), dict(base, concurrency=64), dict(base, concurrency=8, gpu="h")]
    prediction = {"ttft_ms_mean": 110.0, "tpot_ms_mean": 10.0}
    table = accuracy_table(rows, {"gpu": {id(r): prediction for r in rows}, "model": {id(rows[0]): prediction}})
    assert [g["key"][1:] for g in table["groups"]] == [["g", "fp8/fp8", "<=1k / <=1k", "1-8"], ["g", "fp8/fp8", "<=1k / <=1k", "33-64"], ["h", "fp8/fp8", "<=1k / <=1k", "1-8"]]
    assert table["totals"]["gpu"]["all"]["ttft_mape"] == pytest.approx(0.1) and table["totals"]["gpu"]["gpu"]["g"]["rows"] == 2
    assert table["totals"]["model"]["all"]["not_predicted"] == 2  # a row missing from a protocol is counted, not scored
    text = markdown(table)
    assert "| leave-one-model-out | all dense vLLM rows | 3 (2 not predicted) | 10.0% (+10.0%) | 0.0% (+0.0%) | - |" in text
    assert "| m | g | fp8/fp8 | <=1k / <=1k | 33-64 | 1 | 10.0% (+10.0%) | 0.0% (+0.0%) | - [1 not predicted] | - |" in text


def test_leave_one_model_out_never_fits_a_row_of_the_model_it_scores(monkeypatch):
    """Two models, both fitted: each is scored by a fit that saw only the other's rows (the fit is
    stubbed to record its rows and return the priors), and every row of the held-out model is scored."""
    needs_data()
    from jaxplan.calibrate import fit, run
    from jaxplan.calibrate.serving import load_silicon_rows

    rows = run.measured_rows([r for r in load_silicon_rows() if r["backend"] == "vllm" and r["gpu"] == "h200_sxm"])
    small = [r for r in rows if r["model"] == "llama-3.1-8b"][:4]
    large = [r for r in rows if r["model"] == "llama-3.1-70b" and r["concurrency"] <= 8][:4]
    priors = {g: fit.kernel_priors(g) for g in ("h200_sxm", "b200_sxm")}
    seen = []

    def stub(fit_rows, priors_, *, steps=fit.STEPS, shared=False, gpus=None, like=None):
        seen.append({r["model"] for r in fit_rows})
        import numpy as np

        return gpus, np.stack([fit.free_vector(priors_[g]) for g in gpus]), 0.0

    monkeypatch.setattr(run, "serving_fit", stub)
    collect = {}
    out = run.held_out_models(small + large, small + large, priors, set(priors), final={}, collect=collect, log=lambda _: None)
    assert seen == [{"llama-3.1-8b"}, {"llama-3.1-70b"}]  # 70B scored by the 8B-only fit, then the other way round
    assert out["llama-3.1-70b"]["fitted_on"] == ["llama-3.1-8b"] and out["llama-3.1-8b"]["fitted_on"] == ["llama-3.1-70b"]
    assert set(collect) == {id(r) for r in small + large} and out["llama-3.1-70b"]["rows"] == 4
    assert out["llama-3.1-70b"]["by_gpu"]["h200_sxm"]["rows"] == 4 and "not_predicted" not in out["llama-3.1-70b"]
    # B200 has no row in the fit: priced as a GPU without serving rows, its decode HBM fraction from the
    # fitted GPU's (here the stub's H200 priors), not its own prior
    params = run.params_without(large, small + large, priors, {"b200_sxm"})
    field = "memory_bandwidth_efficiency"
    assert params["b200_sxm"][field] == pytest.approx(priors["h200_sxm"][field], rel=1e-4) and priors["b200_sxm"][field] != pytest.approx(priors["h200_sxm"][field], rel=1e-3)


def test_with_no_row_left_the_held_out_model_is_priced_by_the_priors_alone():
    from jaxplan.calibrate import run
    from jaxplan.physics.params import DEFAULTS

    priors = {"a": dict(DEFAULTS, gemm_flops_efficiency=0.7)}
    assert run.params_without([], [], priors, {"a"}) == {"a": dict(DEFAULTS, gemm_flops_efficiency=0.7)}


def test_the_parameters_are_per_gpu_never_per_model():
    """The shipped file holds [record], [gpu.*] and [prior.*] tables only, one per bundled GPU: nothing a
    model could be looked up by."""
    import tomllib

    from jaxplan.physics.params import BOUNDS, PARAMS_PATH
    from jaxplan.specs import known

    data = tomllib.loads(PARAMS_PATH.read_text())
    assert set(data) == {"record", "gpu", "prior"}
    assert set(data["gpu"]) <= set(known("gpus"))
    assert all(set(fields) == set(BOUNDS) for fields in data["gpu"].values())


@pytest.mark.parametrize("model, config", [("llama-3.1-8b", "meta-llama--Meta-Llama-3.1-8B_config.json"), ("qwen3.5-27b", "Qwen--Qwen3.5-27B_config.json")])
def test_a_model_no_fit_has_seen_is_predicted_from_its_config_json_alone(model, config, tmp_path):
    """Llama-3.1-8B (no row of it is fitted) and Qwen3.5-27B (no row of it is measured), given as the
    publisher's config.json, predict exactly what the bundled name predicts, with the shipped parameters:
    the physics needs the model's shape and nothing fitted to it."""
    needs_data()
    from jaxplan.prediction import predict_rows

    path = tmp_path / "config.json"
    path.write_text((_data.resolve_root(None) / RAW_CONFIGS / config).read_text())
    row = {"gpu": "h200_sxm", "tensor_parallel_size": 2, "weight_dtype": "fp8", "kv_cache_dtype": "fp8", "isl": 2000, "osl": 500, "concurrency": 32, "num_prompts": 320}
    by_name, by_config = predict_rows([dict(row, model=model), dict(row, model=str(path))])
    for column in ("ttft_ms_mean", "tpot_ms_mean", "output_tok_s"):
        assert by_name[column] is not None and by_name[column] == pytest.approx(by_config[column], rel=1e-6), column


# ---- the shipped report (docs/calibration_report.json, written by `jaxplan calibrate --write-bundled --report`) ----

# Leave-one-model-out as reached, analytical, every row predicted. Llama-3.1-70B is scored by a fit
# with no row left (the 8B rows are not fitted, run.FIT_EXCLUDED): the kernel-table priors and the
# default runtime fields. Llama-3.1-8B is scored by the complete fit, which never saw it.
LEAVE_ONE_MODEL_OUT = {  # model -> GPU -> (rows, TTFT MAPE, TPOT MAPE)
    # MI300X and MI355X have no kernel tables: with no row left they are priced at DEFAULTS (docs/amd.md).
    "llama-3.1-70b": {"a100_sxm": (16, 0.401, 0.307), "b200_sxm": (120, 0.254, 0.063), "h200_sxm": (60, 0.142, 0.072),
                      "mi300x": (60, 0.589, 0.254), "mi355x": (60, 0.460, 0.175)},
    "llama-3.1-8b": {"h200_sxm": (21, 1.266, 0.953)},
}


def report():
    return json.loads(REPORT.read_text())


def test_shipped_report_leave_one_model_out_per_row_group():
    """The issue's bar (TTFT <= 15%, TPOT <= 8%, Spearman >= 0.98) is not met in TTFT and TPOT:
    docs/accuracy.md gives the gap; these pin what is reached so that a change is seen."""
    held = report()["held_out_models"]
    assert held["llama-3.1-70b"]["fitted_on"] == [] and held["llama-3.1-8b"]["fitted_on"] == ["llama-3.1-70b"]
    for model, by_gpu in LEAVE_ONE_MODEL_OUT.items():
        assert "not_predicted" not in held[model]
        assert held[model]["rows"] == sum(n for n, _, _ in by_gpu.values())
        for gpu, (rows, ttft, tpot) in by_gpu.items():
            scores = held[model]["by_gpu"][gpu]
            assert scores["rows"] == rows and "not_predicted" not in scores, (model, gpu)
            assert scores["ttft_mape"] == pytest.approx(ttft, abs=0.005) and scores["tpot_mape"] == pytest.approx(tpot, abs=0.005), (model, gpu)
    assert held["llama-3.1-70b"]["throughput_spearman"] == pytest.approx(0.984, abs=0.005)


def test_shipped_report_table_covers_every_dense_vllm_row_under_both_protocols():
    table = report()["accuracy_table"]
    assert list(table["protocols"]) == ["gpu", "model"]
    for protocol in ("gpu", "model"):
        totals = table["totals"][protocol]
        assert totals["all"]["rows"] == 337 and "not_predicted" not in totals["all"]
        assert sum(g[protocol]["rows"] for g in table["groups"]) == 337
        assert {name: s["rows"] for name, s in totals["gpu"].items()} == {"a100_sxm": 16, "b200_sxm": 120, "h200_sxm": 81, "mi300x": 60, "mi355x": 60}


def test_docs_accuracy_table_is_the_shipped_reports():
    """docs/accuracy.md holds `markdown(report["accuracy_table"])` between its generated-table markers,
    as `jaxplan calibrate --accuracy-table` writes it."""
    text = (ROOT / "docs" / "accuracy.md").read_text()
    found = re.search(r"<!-- accuracy-table: begin.*?-->\n(.*?)<!-- accuracy-table: end -->", text, re.S)
    assert found, "docs/accuracy.md has no generated accuracy table"
    assert found.group(1) == markdown(report()["accuracy_table"])
