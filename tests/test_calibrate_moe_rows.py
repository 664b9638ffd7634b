"""The vLLM MoE silicon rows (`calibrate.moe_rows`): the mapping of AIConfigurator's layout columns onto
vLLM's flags against CSV lines read by hand (one per layout kind and expert format), the drop reasons,
and the held-out accuracy the shipped report states (docs/accuracy.md, "MoE rows")."""

import json
import re
from pathlib import Path

import pytest

from jaxplan.calibrate import _data

REPORT = Path(__file__).resolve().parent.parent / "docs" / "calibration_report.json"


def moe_rows():
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    from jaxplan.calibrate.moe_rows import load_moe_rows

    return load_moe_rows()


def by_source(rows, source_id):
    (row,) = [r for r in rows if r["source_id"] == source_id]
    return row


# (source id, the CSV line's fields as read by hand) -> the predict row's layout, format and workload.
# AIConfigurator: tp_size = attention TP per DP rank, attention_dp_size = DP ranks, moe_tp x moe_ep = the
# expert group (tp x DP); batch_size is per DP rank, silicon_concurrency the clients of the engine.
HAND_READ = {
    # ep, FP8: MiniMax-M2.5 B300, tp 4, attention_dp 4, moe_tp 1, moe_ep 16, batch 128, silicon_concurrency=512: the
    # shape AIConfigurator gives `-tp 4 --enable-expert-parallel` (`relabelled_expert_parallel`), one engine of 4 GPUs
    "minimaxm2_5_b300_vllm_fp8_agg_1024x1024_c512_cfg734": dict(
        model="minimax-m2.5", gpu="b300_sxm", tensor_parallel_size=4, data_parallel_size=1, enable_expert_parallel=True, weight_dtype="fp8",
        kv_cache_dtype="fp8", isl=1024, osl=1024, concurrency=512, measured_ttft_ms_mean=727.8426075309881, measured_tpot_ms_mean=31.74447123107922, kind="ep"),
    # ep, NVFP4: Kimi-K2.5 B200, tp 4, attention_dp 1, moe_tp 1, moe_ep 4, batch 4
    "2026_03_25_kimi_k2_5_b200_sxm_vllm_fp4_agg_1024x8192_c4_tp4_0_ep4_0_566": dict(
        model="kimi-k2.5", gpu="b200_sxm", tensor_parallel_size=4, data_parallel_size=1, enable_expert_parallel=True, weight_dtype="nvfp4",
        kv_cache_dtype="fp8", isl=1024, osl=8192, concurrency=4, measured_ttft_ms_mean=183.53645480165144, measured_tpot_ms_mean=8.279534125352987, kind="ep"),
    # dp, FP8: Qwen3-235B-A22B-FP8 H200, tp 1, attention_dp blank, moe_tp 2, moe_ep 1 -> DP = 2 x 1 / 1
    "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_vllm_agg_1000x100_c8_tp1_epnone_2": dict(
        model="qwen3-235b-a22b", gpu="h200_sxm", tensor_parallel_size=1, data_parallel_size=2, enable_expert_parallel=False, weight_dtype="fp8",
        kv_cache_dtype="fp8", isl=1000, osl=100, concurrency=8, measured_ttft_ms_mean=356.92, measured_tpot_ms_mean=54.93, kind="dp"),
    # tp, MXFP4 (labelled fp4 / nvfp4 in the CSV): gpt-oss-120b H200, tp 2, moe_tp 2
    "2026_03_25_gpt_oss_120b_h200_sxm_vllm_fp4_agg_8192x1024_c32_tp2_0_ep1_0_189": dict(
        model="gpt-oss-120b", gpu="h200_sxm", tensor_parallel_size=2, data_parallel_size=1, enable_expert_parallel=False, weight_dtype="mxfp4",
        kv_cache_dtype="auto", isl=8192, osl=1024, concurrency=32, measured_ttft_ms_mean=630.3159052797128, measured_tpot_ms_mean=15.74079487610182, kind="tp"),
    # tp, INT4 (int4_wo): Kimi-K2.5 H200, tp 8, moe_tp 8
    "2026_03_25_kimi_k2_5_h200_sxm_vllm_int4_agg_8192x1024_c4_tp8_0_ep1_0_597": dict(
        model="kimi-k2.5", gpu="h200_sxm", tensor_parallel_size=8, data_parallel_size=1, enable_expert_parallel=False, weight_dtype="int4",
        kv_cache_dtype="auto", isl=8192, osl=1024, concurrency=4, measured_ttft_ms_mean=504.4941308558919, measured_tpot_ms_mean=11.731443304604047, kind="tp"),
}


@pytest.mark.parametrize("source_id", sorted(HAND_READ))
def test_row_matches_the_csv_line(source_id):
    from jaxplan.calibrate.moe_rows import layout_kind

    row = by_source(moe_rows(), source_id)
    expected = dict(HAND_READ[source_id])
    assert layout_kind(row) == expected.pop("kind")
    for column, value in expected.items():
        assert row[column] == (pytest.approx(value) if isinstance(value, float) else value), column
    assert row["num_prompts"] == 10 * row["concurrency"] and row["backend"] == "vllm" and row["pipeline_parallel_size"] == 1


def test_layout_columns_that_are_not_one_vllm_command_are_refused():
    from jaxplan.calibrate.moe_rows import parallel_layout

    base = {"tp_size": "2", "attention_dp_size": "2", "moe_tp_size": "1", "moe_ep_size": "4", "pp_size": "1"}
    assert parallel_layout(base) == (2, 1, True)  # AIConfigurator's label of -tp 2 --enable-expert-parallel
    assert parallel_layout({**base, "attention_dp_size": ""}) == (2, 2, True)  # blank: moe_tp x moe_ep / tp
    assert parallel_layout({**base, "tp_size": "1", "attention_dp_size": "4"}) == (1, 4, True)  # DP 4 x TP 1, EP 4
    assert "both ways" in parallel_layout({**base, "moe_tp_size": "2", "moe_ep_size": "2"})
    assert "differs" in parallel_layout({**base, "moe_ep_size": "8"})
    assert parallel_layout({**base, "pp_size": "2"}) == "pipeline parallel"


def test_counts_and_the_rows_left_out():
    from collections import Counter

    from jaxplan.calibrate.moe_rows import layout_kind, moe_silicon_rows

    everything = moe_rows()
    rows = [r for r in everything if r["dataset"] == "aiconfigurator_silicon_moe"]
    amd = [r for r in everything if r["dataset"] == "inferencemax_amd"]
    assert len(rows) == 569 and len(everything) == 569 + len(amd)
    assert Counter(r["model"] for r in rows) == {"minimax-m2.5": 292, "kimi-k2.5": 100, "gpt-oss-120b": 126, "qwen3-235b-a22b": 51}
    assert Counter(layout_kind(r) for r in rows) == {"tp": 472, "ep": 78, "dp": 19}
    assert {r["weight_dtype"] for r in rows if r["model"] == "gpt-oss-120b"} == {"mxfp4"}
    # InferenceMAX's gpt-oss-120b runs (TP only): 12 layouts x loads on MI300X, 9 on MI355X.
    assert Counter(r["gpu"] for r in amd) == {"mi300x": 60, "mi355x": 45}
    assert {(r["model"], r["weight_dtype"], r["kv_cache_dtype"], r["block_size"], layout_kind(r)) for r in amd} == {("gpt-oss-120b", "mxfp4", "auto", 64, "tp")}
    _, dropped = moe_silicon_rows(_data.resolve_root(None).resolve())
    assert dict(dropped) == {
        "disagg mode (separate prefill/decode workers)": 14, "marked wip=True": 153,
        "duplicate of another row (same config and values to 0.01 ms, different id)": 168,
    }


def test_rows_labelled_as_attention_dp_are_one_expert_parallel_engine():
    """AIConfigurator labels vLLM's `-tp T --enable-expert-parallel` as T attention-DP ranks of TP T with
    moe_ep T x T (T x T GPUs). Read as written they would be DP ranks serving 1/T of the clients each;
    their measurements say otherwise: each equals the row labelled TP T with EP T (one engine of T GPUs,
    wip runs included) on the same model, GPU, format, workload and clients, TTFT within 0.75-1.25x and
    TPOT within 0.9-1.12x, and the run names that give a layout (25 of the 82) say tp{T}_ep{T}."""
    import csv
    from collections import defaultdict

    from jaxplan.calibrate.moe_rows import relabelled_expert_parallel

    moe_rows()  # skips without the data
    path = _data.resolve_root(None) / "e2e_aiconfigurator_silicon" / "silicon_calibration.csv"
    raw = [r for r in csv.DictReader(path.open()) if r["backend"] == "vllm" and r["mode"] == "agg"]
    clients = lambda r: re.search(r"silicon_concurrency=(\d+)", r["silicon_data_source"]).group(1)
    workload = lambda r: (r["model_path"], r["system"], r["precision"], r["isl"], r["osl"], clients(r), r["tp_size"])
    one_engine = defaultdict(list)
    for r in raw:
        if r["attention_dp_size"] in ("", "1") and r["moe_tp_size"] == "1" and r["moe_ep_size"] == r["tp_size"] != "1":
            one_engine[workload(r)].append(r)
    relabelled = [r for r in raw if relabelled_expert_parallel(r)]
    assert len(relabelled) == 82 and all(int(r["attention_dp_size"]) > 1 for r in relabelled)
    assert not [r for r in raw if r["attention_dp_size"] not in ("", "1") and not relabelled_expert_parallel(r)]
    named = [re.search(r"_tp(\d+)_ep(\d+)_", r["id"]) for r in relabelled]
    assert sum(1 for m in named if m) == 25 and all(m.group(1) == m.group(2) for m in named if m)  # the rest: cfg ids
    pairs = [(r, twin) for r in relabelled for twin in one_engine[workload(r)]]
    assert len(pairs) >= 80
    for r, twin in pairs:
        ttft = float(r["silicon_ttft_ms"]) / float(twin["silicon_ttft_ms"])
        tpot = float(r["silicon_tpot_ms"]) / float(twin["silicon_tpot_ms"])
        assert 0.75 <= ttft <= 1.25 and 0.9 <= tpot <= 1.12, (r["id"], twin["id"], ttft, tpot)


# Held out as reached (docs/accuracy.md, "MoE rows"): (rows, TTFT MAPE, TPOT MAPE) per protocol and group.
MOE_HELD_OUT = {
    "gpu": {
        "all": (674, 0.302, 0.138),
        "gpu/b200_sxm": (271, 0.276, 0.119),
        "gpu/b300_sxm": (106, 0.376, 0.075),
        "gpu/h200_sxm": (192, 0.263, 0.178),
        "gpu/mi300x": (60, 0.534, 0.154),
        "gpu/mi355x": (45, 0.144, 0.219),
        "kind/dp": (19, 0.677, 0.521),
        "kind/ep": (78, 0.537, 0.100),
        "kind/tp": (577, 0.258, 0.131),
        "model/gpt-oss-120b": (231, 0.357, 0.170),
        "model/kimi-k2.5": (100, 0.151, 0.072),
        "model/minimax-m2.5": (292, 0.294, 0.085),
        "model/qwen3-235b-a22b": (51, 0.398, 0.432),
    },
    "model": {
        "all": (674, 0.330, 0.136),
        "gpu/b200_sxm": (271, 0.353, 0.115),
        "gpu/b300_sxm": (106, 0.376, 0.075),
        "gpu/h200_sxm": (192, 0.262, 0.183),
        "gpu/mi300x": (60, 0.393, 0.130),
        "gpu/mi355x": (45, 0.282, 0.207),
        "kind/dp": (19, 0.706, 0.513),
        "kind/ep": (78, 0.529, 0.097),
        "kind/tp": (577, 0.290, 0.128),
        "model/gpt-oss-120b": (231, 0.385, 0.166),
        "model/kimi-k2.5": (100, 0.146, 0.070),
        "model/minimax-m2.5": (292, 0.333, 0.085),
        "model/qwen3-235b-a22b": (51, 0.419, 0.418),
    },
}


def test_shipped_report_holds_the_documented_moe_numbers():
    moe = json.loads(REPORT.read_text())["moe"]
    assert set(moe) == {"gpu", "model"}
    for protocol, groups in MOE_HELD_OUT.items():
        for key, (rows, ttft, tpot) in groups.items():
            scores = moe[protocol][key]
            assert scores["rows"] == rows and "not_predicted" not in scores, (protocol, key)
            assert scores["ttft_mape"] == pytest.approx(ttft, abs=0.005) and scores["tpot_mape"] == pytest.approx(tpot, abs=0.005), (protocol, key)
