"""InferenceMAX AMD rows: the loader against rows read by hand from the CSV, the engine settings as
row inputs (gpu_memory_utilization and block_size size the KV cache), and the bundled fit's MI300X /
MI355X parameters against their measured rows."""

import math
from pathlib import Path

import pytest

from jaxplan.calibrate import _data
from jaxplan.calibrate.rows import make_row
from jaxplan.errors import PlanError
from jaxplan.prediction import predict_rows
from jaxplan.specs import load_gpu

REPORT = Path(__file__).resolve().parent.parent / "docs" / "calibration_report.json"


def needs_data():
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")


def amd_rows():
    from jaxplan.calibrate.inferencemax import load_inferencemax_rows

    needs_data()
    return load_inferencemax_rows()


def by_source(rows, prefix):
    (row,) = [r for r in rows if r["source_id"].startswith(prefix)]
    return row


def test_single_run_row_matches_the_csv_line():
    # mi355x, Llama-3.3-70B FP8-KV, TP8, 8k/1k, 64 clients: one run (18577146883), read by hand.
    row = by_source(amd_rows(), "mi355x:tp8:8192x1024:c64:")
    assert (row["model"], row["gpu"], row["tensor_parallel_size"]) == ("llama-3.1-70b", "mi355x", 8)
    assert (row["weight_dtype"], row["kv_cache_dtype"]) == ("fp8", "fp8")
    assert row["isl"] == pytest.approx(0.9 * 8192) and row["osl"] == pytest.approx(0.9 * 1024)  # lengths ~U[0.8 L, L]
    assert row["isl_distribution"] == "uniform" and row["isl_spread"] == pytest.approx(0.1 / 0.9)
    assert (row["concurrency"], row["num_prompts"], row["max_num_seqs"], row["max_num_batched_tokens"]) == (64, 640, 64, 131072)
    assert row["gpu_memory_utilization"] == 0.94 and row["block_size"] == 16  # SOURCE.txt's flag; vLLM's default block
    assert row["measured_ttft_ms_mean"] == pytest.approx(885.6475754349958)
    assert row["measured_tpot_ms_mean"] == pytest.approx(23.066100333229624)
    assert row["measured_ttft_ms_p99"] == pytest.approx(9517.227076785639)
    assert row["measured_output_tok_s"] == pytest.approx(2613.5428281096993) and not row["measured_output_tok_s_derived"]


def test_repeats_are_averaged_and_a_missing_output_rate_is_derived_from_the_total():
    # mi300x TP1 1k/1k at 4 clients: four nightly runs; only the last artifact has output tok/s.
    row = by_source(amd_rows(), "mi300x:tp1:1024x1024:c4:")
    ttft = (259.5445832819678 + 245.2742523397319 + 269.04042577371 + 254.18628648621961) / 4
    tpot = (26.13630114643277 + 23.846342829998033 + 26.13559096300936 + 23.86119288527702) / 4
    assert row["measured_ttft_ms_mean"] == pytest.approx(ttft)
    assert row["measured_tpot_ms_mean"] == pytest.approx(tpot)
    assert row["measured_output_tok_s"] == pytest.approx(160.71154393857609) and not row["measured_output_tok_s_derived"]
    assert "mean of 4 nightly run(s)" in row["notes"]


def test_counts_and_the_rows_left_out():
    from jaxplan.calibrate.inferencemax import inferencemax_rows, load_inferencemax_rows

    rows = amd_rows()
    assert sum(r["gpu"] == "mi300x" for r in rows) == 60 and sum(r["gpu"] == "mi355x" for r in rows) == 60  # 12 layouts x 5 loads
    assert len(load_inferencemax_rows(repeats=True)) == 372 + 79  # every Llama-3.3-70B FP8 measurement
    _, dropped = inferencemax_rows(_data.resolve_root(None).resolve())
    dropped = dict(dropped)
    assert sum(n for reason, n in dropped.items() if "MXFP4 in every layer" in reason) == 68  # Llama-3.3-70B MXFP4 on MI355X
    assert sum(n for reason, n in dropped.items() if "scored with the MoE rows" in reason) == 216 + 49  # gpt-oss-120b: moe_rows scores them
    assert sum(dropped.values()) == 784 - 372 - 79


def test_gpt_oss_runs_are_moe_rows_with_their_flags():
    """gpt-oss-120b on MI300X / MI355X: one row per configuration (the mean of its nightly repeats),
    MXFP4 experts, `--block-size 64` and vLLM's defaults otherwise (SOURCE.txt), never in the dense fit."""
    from jaxplan.calibrate import serving
    from jaxplan.calibrate.inferencemax import inferencemax_moe_rows

    needs_data()
    rows, dropped = inferencemax_moe_rows(_data.resolve_root(None).resolve())
    assert len(rows) == 105 and {r["model"] for r in rows} == {"gpt-oss-120b"}
    assert {(r["weight_dtype"], r["block_size"], r["gpu_memory_utilization"]) for r in rows} == {("mxfp4", 64, 0.9)}
    assert sum(dict(dropped).values()) == 784 - 216 - 49
    assert not any(r["model"] == "gpt-oss-120b" for r in serving.load_serving_rows(datasets=serving.INFERENCEMAX_AMD))


def test_the_bundled_fit_reads_the_dataset():
    from jaxplan.calibrate import serving

    needs_data()
    assert serving.INFERENCEMAX_AMD in serving.DATASETS
    assert len(serving.load_serving_rows(datasets=serving.INFERENCEMAX_AMD)) == 120


def test_engine_settings_are_row_inputs():
    base = dict(model="llama-3.1-70b", gpu="mi300x", tensor_parallel_size=1, weight_dtype="fp8", kv_cache_dtype="fp8", isl=1000, osl=1000, concurrency=8)
    default, more, coarse = predict_rows([make_row(**base), make_row(**base, gpu_memory_utilization=0.94), make_row(**base, block_size=64)])
    # 0.04 more of the HBM ROCm reports (0.998 of 192 GiB, mi300x.toml), at 80 layers x 8 KV heads x 128
    # x (K, V) x 1 byte = 163,840 bytes per token of FP8 cache, in whole 16-token blocks.
    extra = 0.04 * 0.998 * 206_158_430_208 / 163_840
    assert more["kv_cache_tokens"] - default["kv_cache_tokens"] == pytest.approx(extra, abs=32)
    assert coarse["kv_cache_tokens"] % 64 == 0 and 0 <= default["kv_cache_tokens"] - coarse["kv_cache_tokens"] < 64


@pytest.mark.parametrize(("column", "value"), [("gpu_memory_utilization", 1.2), ("gpu_memory_utilization", 0.0), ("block_size", 17)])
def test_bad_engine_settings_name_the_column(column, value):
    with pytest.raises(PlanError, match=column):
        make_row(model="llama-3.1-70b", gpu="mi300x", tensor_parallel_size=1, isl=1000, osl=1000, concurrency=8, **{column: value})


def mape(predicted, measured):
    return sum(abs(p / m - 1.0) for p, m in zip(predicted, measured)) / len(measured)


# In sample with the bundled fit (docs/amd.md): MI300X 11.6% / 7.4%, MI355X 10.4% / 6.1%; before it
# (MI300X at DEFAULTS, MI355X unknown) 52% / 26% and 46% / 17%.
FITTED_BOUNDS = {"mi300x": (0.125, 0.075), "mi355x": (0.11, 0.065)}


@pytest.mark.parametrize("gpu", sorted(FITTED_BOUNDS))
def test_fitted_amd_gpus_against_their_measured_rows(gpu):
    rows = [r for r in amd_rows() if r["gpu"] == gpu]
    predicted = predict_rows(rows)
    assert all(p["ttft_ms_mean"] is not None and math.isfinite(p["tpot_ms_mean"]) for p in predicted)
    ttft = mape([p["ttft_ms_mean"] for p in predicted], [r["measured_ttft_ms_mean"] for r in rows])
    tpot = mape([p["tpot_ms_mean"] for p in predicted], [r["measured_tpot_ms_mean"] for r in rows])
    assert ttft <= FITTED_BOUNDS[gpu][0] and tpot <= FITTED_BOUNDS[gpu][1], (ttft, tpot)


def test_the_fit_prices_prefill_far_below_the_fp8_peak():
    """The mechanism (docs/amd.md): MI300X's prefill GEMMs reach about a quarter of the FP8 spec peak in
    these runs (H200's fit: 0.68), its decode reads HBM at two thirds of the spec bandwidth."""
    from jaxplan.physics.params import efficiency_for

    fitted = efficiency_for(["mi300x", "mi355x"])
    assert 0.18 <= fitted["mi300x"]["gemm_flops_efficiency"] <= 0.30
    assert 0.22 <= fitted["mi355x"]["gemm_flops_efficiency"] <= 0.35
    assert 0.60 <= fitted["mi300x"]["memory_bandwidth_efficiency"] <= 0.72
    assert efficiency_for(["mi325x"])["mi325x"] == fitted["mi300x"]  # same CDNA 3 die, no rows


def test_shipped_report_holds_the_documented_leave_one_gpu_out_numbers():
    """docs/amd.md: each AMD GPU priced from the other's fit alone (the ROCm stack's only other GPU; no
    kernel tables): TTFT / TPOT 23.2% / 10.3% (MI300X), 27.5% / 9.8% (MI355X), pinned as reached."""
    import json

    report = json.loads(REPORT.read_text())
    for gpu, (ttft, tpot) in {"mi300x": (0.232, 0.103), "mi355x": (0.275, 0.098)}.items():
        held = report["held_out"][gpu]
        assert held["rows"] == 60 and held["throughput_spearman"] >= 0.99
        assert held["ttft_mape"] == pytest.approx(ttft, abs=0.005) and held["tpot_mape"] == pytest.approx(tpot, abs=0.005)
