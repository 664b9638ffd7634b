"""The fused-MoE kernel fields (`calibrate.moe_kernels`): recovered from a synthetic table built with known
values, the non-negative fit against numpy's unconstrained one, and the values read off NVIDIA's tables."""

import numpy as np
import pytest

from jaxplan.calibrate import _data
from jaxplan.calibrate.kernels import MoeTable
from jaxplan.calibrate.moe_kernels import expert_bytes_and_flops, fastest_per_shape, fit_latency, moe_kernel_fields
from jaxplan.physics.params import BOUNDS
from jaxplan.specs.formats import FORMATS


def synthetic_table(floor_s, hbm_fraction, flops_fraction, hbm=4.8e12, peak=989e12, dtype="int4_wo", slower_kernel=True):
    """Balanced rows of three shapes x tokens 1-8192 x TP 1-4, latency = floor + bytes / (f_hbm HBM) +
    FLOPs / (f_flops peak) exactly; with `slower_kernel` every row again from a kernel 1.5x slower, which
    the fastest-per-shape rule must ignore. One power-law row and one EP row the fit must ignore too."""
    shapes = [(7168, 2048, 8, 384), (2880, 2880, 4, 128), (3072, 1536, 8, 256)]
    columns = {k: [] for k in MoeTable._fields}
    for h, i, k, e in shapes:
        for t in (1, 2, 4, 8, 16, 64, 256, 1024, 8192):
            for tp in (1, 2, 4):
                for slow in ((1.0, 1.5) if slower_kernel else (1.0,)):
                    for field, value in zip(MoeTable._fields[:10], (t, h, i, k, e, tp, 1, dtype, "balanced", f"kernel{slow}")):
                        columns[field].append(value)
                    columns["latency_s"].append(slow)
    columns["distribution"][0] = "power_law_1.2"
    columns["moe_ep"][1] = 8
    table = MoeTable(*(np.array(columns[f]) for f in MoeTable._fields))
    stored = {"int4_wo": 0.5625, "fp8_block": 1.0}[dtype]
    bytes_, flops = expert_bytes_and_flops(table, stored)
    latency = table.latency_s * (floor_s + bytes_ / (hbm_fraction * hbm) + flops / (flops_fraction * peak))
    latency[:2] *= 100.0  # the rows the fit must not read
    return table._replace(latency_s=latency)


def test_fields_recovered_from_a_synthetic_table():
    table = synthetic_table(45e-6, 0.6, 0.25)
    found = moe_kernel_fields(table, 4.8e12, {"int4": 989e12, "bf16": 989e12, "fp8": 1979e12, "nvfp4": 989e12, "mxfp4": 989e12}, False)
    assert found == pytest.approx({"moe_int4_floor_s": 45e-6, "moe_int4_hbm_fraction": 0.6, "moe_int4_flops_fraction": 0.25}, rel=1e-6)


def test_balanced_routing_touches_min_experts_by_hand():
    """4 tokens x top-8 of 384 experts over TP2: 32 experts of 3 x 7168 x 2048 / 2 parameters; 8,192
    tokens touch all 384; FLOPs 2 x pairs x parameters per GPU."""
    table = synthetic_table(1e-5, 0.5, 0.5, slower_kernel=False)
    bytes_, flops = expert_bytes_and_flops(table, 1.0)
    per_expert = 3 * 7168 * 2048 / 2
    (four,) = np.flatnonzero((table.tokens == 4) & (table.moe_tp == 2) & (table.num_experts == 384))
    (many,) = np.flatnonzero((table.tokens == 8192) & (table.moe_tp == 2) & (table.num_experts == 384))
    assert bytes_[four] == 32 * per_expert and flops[four] == 2 * 32 * per_expert
    assert bytes_[many] == 384 * per_expert and flops[many] == 2 * 8192 * 8 * per_expert


def test_fastest_per_shape_keeps_one_row_per_shape():
    """81 shapes timed by two kernels; rows 0 and 1 (the first shape's two kernels) left out: 80 rows
    kept, each the faster kernel's."""
    table = synthetic_table(1e-5, 0.5, 0.5)
    rows = np.ones(len(table.tokens), bool)
    rows[:2] = False
    kept = fastest_per_shape(table, rows)
    assert len(kept) == 80 and not np.isin([0, 1], kept).any()
    assert set(table.kernel_source[kept]) == {"kernel1.0"}


def test_the_fit_keeps_terms_non_negative_and_matches_lstsq_when_unconstrained():
    rng = np.random.default_rng(0)
    bytes_, flops = rng.uniform(1e6, 1e9, 50), rng.uniform(1e9, 1e13, 50)
    latency = 3e-5 + bytes_ / 2e12 + flops / 3e14
    assert fit_latency(bytes_, flops, latency) == pytest.approx((3e-5, 1 / 2e12, 1 / 3e14), rel=1e-6)
    # A latency that falls with the bytes would need a negative rate: that term is dropped, not negated.
    floor_s, per_byte, per_flop = fit_latency(bytes_, flops, 3e-5 + flops / 3e14 - bytes_ / 1e14)
    assert per_byte == 0.0 and floor_s >= 0.0 and per_flop >= 0.0


def test_every_format_has_bounded_fields():
    for fmt in FORMATS:
        for what in ("floor_s", "hbm_fraction", "flops_fraction"):
            default, low, high = BOUNDS[f"moe_{fmt.name}_{what}"]
            assert low <= default <= high


@pytest.mark.skipif(not _data.data_root_exists(), reason="measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
def test_values_read_off_nvidias_tables():
    """vLLM 0.24 on H200: FP8 experts stream near the HBM peak (0.96) and INT4 Marlin at 0.75 of it, every
    kernel has a least time of 20-60 us per layer, and grouped FP8 GEMMs reach about 0.30 of the FP8 peak;
    B300 and GB200, without tables, take B200's (`run.KERNEL_PEERS`), and so every other field read
    off B200's tables that the serving fit leaves alone (its FP8 KV read, NVFP4 GEMMs, GEMM floors), but
    not the fields the fit sets (those come from the fit, `run.priced_without_rows`)."""
    from jaxplan.calibrate.fit import FIT_FIELDS
    from jaxplan.calibrate.run import calibration_priors
    from jaxplan.physics.params import DEFAULTS

    priors, _ = calibration_priors(["h200_sxm", "b200_sxm", "b300_sxm"])
    h200 = priors["h200_sxm"]
    assert h200["moe_fp8_hbm_fraction"] == pytest.approx(0.96, abs=0.03)
    assert h200["moe_int4_hbm_fraction"] == pytest.approx(0.75, abs=0.03)
    assert h200["moe_fp8_flops_fraction"] == pytest.approx(0.30, abs=0.03)
    for gpu in ("h200_sxm", "b200_sxm"):
        for fmt in ("fp8", "int4", "mxfp4"):
            assert 20e-6 <= priors[gpu][f"moe_{fmt}_floor_s"] <= 60e-6
    assert all(priors["b300_sxm"][f] == priors["b200_sxm"][f] for f in priors["b200_sxm"] if f.startswith("moe_"))
    b200, b300 = priors["b200_sxm"], priors["b300_sxm"]
    assert all(b300[f] == b200[f] for f in b200 if f not in FIT_FIELDS)
    assert b300["fp8_kv_read_bytes_per_element"] == pytest.approx(1.17, abs=0.01) != DEFAULTS["fp8_kv_read_bytes_per_element"]
    assert b300["fp4_weight_read_bytes_per_param"] > 0.6 > DEFAULTS["fp4_weight_read_bytes_per_param"]
    assert b300["gemm_flops_efficiency"] == DEFAULTS["gemm_flops_efficiency"] != b200["gemm_flops_efficiency"]


def test_the_moe_gemm_rate_takes_the_serving_share_of_the_gemm_table():
    """Hand-computed: a GPU whose dense GEMMs reach 0.6 in serving against the tables' 0.75 (a share of
    0.8) prices its MoE kernel's GEMM rate at 0.8 x the table's (0.3 -> 0.24); the streaming rate and the
    least time stay as read, a rate past BOUNDS is clipped, and applying it twice changes nothing. The
    tables are the GPU's own, its MoE peer's (B300: B200's) or, for a GPU without either, H100's."""
    from jaxplan.calibrate.run import MOE_SERVING_SHARE_FIELDS, moe_table_gpu, with_moe_serving_share

    assert MOE_SERVING_SHARE_FIELDS and all(f.endswith("_flops_fraction") for f in MOE_SERVING_SHARE_FIELDS)
    prior = {"gemm_flops_efficiency": 0.75, "moe_fp8_flops_fraction": 0.3, "moe_fp8_hbm_fraction": 0.7, "moe_fp8_floor_s": 2e-5, "moe_bf16_flops_fraction": 0.9}
    fitted = {**prior, "gemm_flops_efficiency": 0.6}
    shared = with_moe_serving_share(fitted, prior, 0.75)
    assert shared["moe_fp8_flops_fraction"] == pytest.approx(0.24) and shared["moe_bf16_flops_fraction"] == pytest.approx(0.72)
    assert shared["moe_fp8_hbm_fraction"] == 0.7 and shared["moe_fp8_floor_s"] == 2e-5 and shared["gemm_flops_efficiency"] == 0.6
    assert with_moe_serving_share(shared, prior, 0.75) == shared
    above = with_moe_serving_share({**prior, "gemm_flops_efficiency": 1.5}, prior, 0.75)
    assert above["moe_bf16_flops_fraction"] == BOUNDS["moe_bf16_flops_fraction"][2]  # 1.8 clipped
    with_tables = {"h200_sxm", "b200_sxm", "h100_sxm"}
    assert [moe_table_gpu(g, with_tables) for g in ("h200_sxm", "b300_sxm", "gb200", "mi300x")] == ["h200_sxm", "b200_sxm", "b200_sxm", "h100_sxm"]


@pytest.mark.parametrize(("gpu", "table"), [("h200_sxm", "h200_sxm"), ("b200_sxm", "b200_sxm"), ("h100_sxm", "h100_sxm"), ("b300_sxm", "b200_sxm"), ("mi300x", "h100_sxm"), ("mi355x", "h100_sxm")])
def test_the_shipped_moe_gemm_rates_are_the_tables_times_the_serving_share(gpu, table):
    """docs/calibration_report.json's kernel priors against the shipped parameters: every MoE GEMM rate is
    the table's (the GPU's own, B200's for B300, H100's defaults for the AMD GPUs) times the GPU's fitted
    or priced dense GEMM efficiency over the table's."""
    import json
    from pathlib import Path

    from jaxplan.calibrate.run import MOE_SERVING_SHARE_FIELDS
    from jaxplan.physics.params import DEFAULTS, load_efficiency

    priors = json.loads((Path(__file__).parent.parent / "docs" / "calibration_report.json").read_text())["priors"]
    read = priors.get(gpu, priors[table] if gpu.startswith("b300") else DEFAULTS)  # the MoE fields as read off the tables
    shipped = load_efficiency()[gpu]
    share = shipped["gemm_flops_efficiency"] / priors[table]["gemm_flops_efficiency"]
    assert share < 0.97 or gpu.startswith("b300")  # serving reaches less than the tables time each GEMM alone
    for field in MOE_SERVING_SHARE_FIELDS:
        assert shipped[field] == pytest.approx(read[field] * share, rel=1e-4), field
