"""The vLLM release a prediction assumes (`jaxplan.vllm_release`): which engine serves pipeline
parallelism (V0 before 0.9.1, vllm#18915) and the default --gpu-memory-utilization (0.92 from 0.22),
by hand, through predict rows, the command line and the sweep."""

from __future__ import annotations

import csv

import pytest
from typer.testing import CliRunner

from jaxplan import vllm_release
from jaxplan.cli import app
from jaxplan.errors import PlanError
from jaxplan.physics.params import DEFAULTS, load_efficiency
from jaxplan.prediction import predict_rows

V1_COST = DEFAULTS["pipeline_seq_overhead_s"]
PP_ROW = dict(model="llama-3.1-70b", gpu="a100_sxm", tensor_parallel_size=4, pipeline_parallel_size=2, isl=200, osl=200, concurrency=64, num_prompts=640)


@pytest.mark.parametrize(("text", "release"), [
    ("0.8.3", (0, 8, 3)), ("v0.10.1", (0, 10, 1)), ("0.11.0rc2", (0, 11, 0)), ("0.9", (0, 9, 0)), (" 0.19.0 ", (0, 19, 0)), ("0.6.3.post1", (0, 6, 3)),
])
def test_releases_parse_by_hand(text, release):
    assert vllm_release.parse_release(text) == release


@pytest.mark.parametrize("text", ["latest", "nightly-5b8c30d62b754b57", "0", "0.x.1", ""])
def test_a_release_that_does_not_parse_is_one_line_naming_the_field(text):
    with pytest.raises(PlanError, match=r"vllm_version.*must be a vLLM release such as 0\.8\.3") as caught:
        vllm_release.parse_release(text)
    assert "\n" not in str(caught.value)


def test_the_selected_release(monkeypatch):
    monkeypatch.delenv(vllm_release.RELEASE_ENV, raising=False)
    assert vllm_release.selected() == (0, 19, 0) == vllm_release.parse_release(vllm_release.NEWEST_MEASURED)
    monkeypatch.setenv(vllm_release.RELEASE_ENV, "0.8.3")
    assert vllm_release.selected() == (0, 8, 3) and vllm_release.selected("0.22.1") == (0, 22, 1)
    monkeypatch.setenv(vllm_release.RELEASE_ENV, "newest")
    with pytest.raises(PlanError, match=r"\$JAXPLAN_VLLM_VERSION.*or unset JAXPLAN_VLLM_VERSION"):
        vllm_release.selected()


@pytest.mark.parametrize(("release", "v0", "fraction"), [
    ((0, 8, 3), True, 0.9), ((0, 9, 0), True, 0.9), ((0, 9, 1), False, 0.9), ((0, 21, 9), False, 0.9), ((0, 22, 0), False, 0.92), ((1, 0, 0), False, 0.92),
])
def test_what_a_release_changes_by_hand(release, v0, fraction):
    assert vllm_release.pipeline_on_v0(release) is v0
    assert vllm_release.default_gpu_memory_utilization(release) == fraction


def test_the_pipeline_host_cost_by_hand():
    """V1 releases take V1's value on every GPU; V0 releases the V0 pipeline fit's (the A100's), or a
    GPU's own where a fit on its V0 rows put it higher."""
    efficiency = {"a100_sxm": {"pipeline_seq_overhead_s": 118e-6}, "h100_sxm": {"pipeline_seq_overhead_s": 4e-6}, "h200_sxm": {"pipeline_seq_overhead_s": 200e-6}}
    assert vllm_release.pipeline_seq_overhead_s(efficiency, "a100_sxm", (0, 19, 0)) == V1_COST
    assert vllm_release.pipeline_seq_overhead_s(efficiency, "a100_sxm", (0, 8, 3)) == 118e-6
    assert vllm_release.pipeline_seq_overhead_s(efficiency, "h100_sxm", (0, 8, 3)) == 118e-6
    assert vllm_release.pipeline_seq_overhead_s(efficiency, "h200_sxm", (0, 8, 3)) == 200e-6
    assert vllm_release.pipeline_seq_overhead_s({"h100_sxm": {"pipeline_seq_overhead_s": 4e-6}}, "h100_sxm", (0, 8, 3)) == 4e-6


def test_a_v0_pipeline_row_pays_the_host_cost_per_running_sequence():
    """TP4 x PP2 of Llama-3.1-70B on A100, 64 clients: under 0.8.3 each step carries the V0 host cost
    per running sequence (64 run, the KV cache holds them), so TPOT grows by 64 x (V0 - V1 cost), the
    bundled A100 fit's V0 cost against V1's; TP8 (no PP) and a release on V1 are unchanged."""
    v0_cost = load_efficiency()["a100_sxm"]["pipeline_seq_overhead_s"]
    assert v0_cost > 10 * V1_COST
    newest, v0, v1, tp8, tp8_v0 = predict_rows([PP_ROW, dict(PP_ROW, vllm_version="0.8.3"), dict(PP_ROW, vllm_version="0.9.1"),
                                                dict(PP_ROW, tensor_parallel_size=8, pipeline_parallel_size=1),
                                                dict(PP_ROW, tensor_parallel_size=8, pipeline_parallel_size=1, vllm_version="0.8.3")])
    assert v0["tpot_ms_mean"] - newest["tpot_ms_mean"] == pytest.approx(64 * (v0_cost - V1_COST) * 1e3, rel=0.02)
    assert v1["tpot_ms_mean"] == newest["tpot_ms_mean"] and tp8["tpot_ms_mean"] == tp8_v0["tpot_ms_mean"]
    # Another GPU under V0 takes the A100's fit, the only V0 pipeline measurement.
    h100, h100_v0 = predict_rows([dict(PP_ROW, gpu="h100_sxm"), dict(PP_ROW, gpu="h100_sxm", vllm_version="0.8.3")])
    assert h100_v0["tpot_ms_mean"] - h100["tpot_ms_mean"] == pytest.approx(64 * (v0_cost - V1_COST) * 1e3, rel=0.02)


def test_vllm_0_22_defaults_to_0_92_of_the_memory():
    row = dict(PP_ROW, gpu="h100_sxm", tensor_parallel_size=8, pipeline_parallel_size=1)
    new, stated, old = predict_rows([dict(row, vllm_version="0.22.0"), dict(row, gpu_memory_utilization=0.92), dict(row, vllm_version="0.21.0")])
    assert new["kv_cache_tokens"] == stated["kv_cache_tokens"] > old["kv_cache_tokens"]


def test_a_bad_release_in_a_row_is_one_line():
    with pytest.raises(PlanError, match=r"input row 1: vllm_version = 'latest': must be a vLLM release"):
        predict_rows([dict(PP_ROW, vllm_version="latest")])


def test_the_command_line_selects_the_release(tmp_path, monkeypatch):
    """--vllm-version prices every row that states none; a row's column wins; a bad value exits 1 (bad input) with one line."""
    monkeypatch.setenv(vllm_release.RELEASE_ENV, vllm_release.NEWEST_MEASURED)  # restored after the test: the option sets it
    path = tmp_path / "rows.csv"
    path.write_text("model,gpu,tensor_parallel_size,pipeline_parallel_size,isl,osl,concurrency,num_prompts,vllm_version\n"
                    "llama-3.1-70b,a100_sxm,4,2,200,200,64,640,\nllama-3.1-70b,a100_sxm,4,2,200,200,64,640,0.19.0\n")
    runner = CliRunner()
    tpots = {}
    for option in ([], ["--vllm-version", "0.8.3"]):
        out = tmp_path / f"out{len(option)}.csv"
        result = runner.invoke(app, ["predict", str(path), "--method", "analytical", *option, "-o", str(out)])
        assert result.exit_code == 0, result.output
        assert ("vLLM release priced: 0.8.3 (from --vllm-version)" in result.output) is bool(option)
        tpots[len(option)] = [float(r["tpot_ms_mean"]) for r in csv.DictReader(out.open())]
    assert tpots[2][0] > tpots[0][0] == tpots[0][1] == tpots[2][1]
    bad = runner.invoke(app, ["predict", str(path), "--vllm-version", "latest"])
    assert bad.exit_code == 1 and "must be a vLLM release such as 0.8.3" in bad.output and "Traceback" not in bad.output


def test_the_sweep_prices_every_gpu_for_the_release():
    """The sweep's hardware table (every candidate's, and the finalists' replay's): under 0.8.3 each GPU
    carries the V0 pipeline host cost of the A100 fit, under a release on V1 V1's."""
    import numpy as np

    from jaxplan.funnel.sweep import build_context
    from jaxplan.grid import Grid
    from jaxplan.inputs import load_inputs

    inputs = load_inputs("llama-3.1-70b", "a100_sxm,h100_sxm", "chat", "small")
    grid = Grid(inputs.gpus, inputs.space.for_model(inputs.model))
    v0_cost = load_efficiency()["a100_sxm"]["pipeline_seq_overhead_s"]
    for release, cost in (("0.8.3", v0_cost), ("0.9.1", V1_COST), (None, V1_COST)):
        hardware = build_context(grid, inputs.model, inputs.workload, vllm_version=release).hardware
        per_gpu = np.asarray(hardware.pipeline_seq_overhead_s)  # two GPUs, padded to the kernels' 8 rows with the last
        assert per_gpu.shape == (8,)
        np.testing.assert_allclose(per_gpu, [cost] * 8, rtol=1e-6)


def test_a_plan_records_the_release_it_priced():
    from jaxplan import api
    from jaxplan.plan import Plan

    plan = api.sweep("llama-3.1-8b", "h100_sxm", "chat", "small", replay=False, top=3, vllm_version="v0.8.3")
    assert plan.vllm_version == "0.8.3" and plan.to_dict()["vllm_version"] == "0.8.3"
    assert Plan.from_json(plan.to_json()).vllm_version == "0.8.3"
