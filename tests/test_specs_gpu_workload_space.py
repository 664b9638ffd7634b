"""GpuSpec, Workload and SearchSpace: bundled values against their sources, and validation."""

from __future__ import annotations

import csv
import dataclasses
import math

import pytest

from jaxplan.calibrate._data import default_data_root
from jaxplan.errors import PlanError
from jaxplan.specs import SearchSpace, Workload, known, load_gpu, load_space, load_workload
from jaxplan.specs.loader import build
from jaxplan.specs.workload import Arrival

SPECS_DATA = default_data_root() / "specs"  # $JAXPLAN_SHARED_DATA/specs, else <repo>/../shared/data/specs

# ---- GPUs ------------------------------------------------------------------------------------

# bundled name -> gpus.csv row name
GPU_ROWS = {"h100_sxm": "H100 SXM", "h200_sxm": "H200 SXM", "a100_sxm": "A100 SXM 80GB", "b200_sxm": "B200 SXM", "l40s": "L40S", "mi300x": "MI300X"}


@pytest.mark.skipif(not SPECS_DATA.is_dir(), reason="../shared/data/specs is not present")
@pytest.mark.parametrize("name", sorted(GPU_ROWS))
def test_bundled_gpu_matches_gpus_csv(name):
    rows = {row["gpu"]: row for row in csv.DictReader((SPECS_DATA / "gpus.csv").read_text().splitlines())}
    row, gpu = rows[GPU_ROWS[name]], load_gpu(name)
    if row["hbm_capacity_bytes_in_source"]:
        assert gpu.hbm_bytes == int(row["hbm_capacity_bytes_in_source"])
    else:  # MI300X: 192 GB marketed, binary (ROCm reports 191.7 GiB: tests/test_specs_breadth.py)
        assert gpu.hbm_bytes == float(row["hbm_capacity_GB_marketed"]) * 1024**3
    # csv in TB/s, TFLOP/s, GB/s; the spec in SI. Relative 1e-9: only float rounding of the unit conversion.
    assert gpu.hbm_bandwidth_bytes_per_s == pytest.approx(float(row["hbm_bw_TBps"]) * 1e12, rel=1e-9)
    assert gpu.bf16_flops_per_s == pytest.approx(float(row["bf16_dense_tflops"]) * 1e12, rel=1e-9)
    assert gpu.fp8_flops_per_s == pytest.approx(float(row["fp8_dense_tflops"] or 0) * 1e12, rel=1e-9)
    assert gpu.intra_node_bandwidth_bytes_per_s == pytest.approx(float(row["scaleup_bw_GBps_per_direction_per_gpu"]) * 1e9, rel=1e-9)
    assert gpu.gpus_per_node == int(row["gpus_per_node"])


def test_gpu_capacities_by_hand():
    # 80 GiB = 80 * 2^30 = 85,899,345,920 bytes; 141 GiB = 151,397,597,184; 180 GiB = 193,273,528,320
    assert load_gpu("h100_sxm").hbm_bytes == 80 * 2**30 == 85_899_345_920
    assert load_gpu("h200_sxm").hbm_bytes == 141 * 2**30
    assert load_gpu("b200_sxm").hbm_bytes == 180 * 2**30


def test_fp8_support():
    """FP8 tensor cores from Ada and Hopper on (compute capability 8.9; AMD's CDNA 3 and 4 too); the
    Ampere A100s have none."""
    assert not load_gpu("a100_sxm").supports_fp8 and not load_gpu("a100_sxm_40gb").supports_fp8
    for name in known("gpus"):
        gpu = load_gpu(name)
        assert gpu.supports_fp8 == (gpu.compute_capability == 0 or gpu.compute_capability >= 8.9), name


def test_with_price_revalidates():
    h100 = load_gpu("h100_sxm")
    assert h100.with_price(2.0).price_usd_per_hour == 2.0 and h100.price_usd_per_hour == 2.99
    for bad in (-1.0, math.nan, math.inf, 1e6):
        with pytest.raises(PlanError, match="price_usd_per_hour"):
            h100.with_price(bad)


@pytest.mark.parametrize(
    "field, value",
    [
        ("hbm_bytes", 0), ("hbm_bytes", 80), ("hbm_bytes", 80e9 * 1e6), ("hbm_bytes", math.nan), ("hbm_bytes", "80"),
        ("hbm_bytes", True), ("hbm_bandwidth_bytes_per_s", -1.0), ("bf16_flops_per_s", math.inf),
        ("fp8_flops_per_s", 1.0), ("fp8_flops_per_s", math.nan), ("fp8_flops_per_s", True), ("fp8_flops_per_s", 1e18),
        ("inter_node_bandwidth_bytes_per_s", 0), ("gpus_per_node", 0), ("gpus_per_node", 8.0), ("gpus_per_node", True),
        ("gpus_per_host", -1), ("gpus_per_host", 9), ("gpus_per_host", 4.0),
    ],
)
def test_gpu_rejects(field, value):
    with pytest.raises(PlanError) as err:
        dataclasses.replace(load_gpu("h100_sxm"), **{field: value})
    assert field in str(err.value) and "\n" not in str(err.value)


# ---- workloads -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", known("workloads"))
def test_bundled_workloads_describe(name):
    w = load_workload(name)
    assert "\n" not in w.describe() and name in w.describe()


def test_bundled_workload_facts():
    # design.md: coding ISL ~8,000 / OSL ~300; reasoning ISL ~2,000 / OSL ~10,000; chat p99 TPOT 50 ms
    assert (load_workload("coding").isl_mean_tokens, load_workload("coding").osl_mean_tokens) == (8000, 300)
    assert (load_workload("reasoning").isl_mean_tokens, load_workload("reasoning").osl_mean_tokens) == (2000, 10000)
    chat = load_workload("chat")
    assert chat.tpot_slo_s == 0.05 and chat.slo_percentile == 99 and chat.arrival is Arrival.POISSON and chat.has_slo
    rl = load_workload("rl-rollout")
    assert rl.arrival is Arrival.BURST and rl.target_output_tokens_per_s == 5000 and not rl.has_slo


W = dict(name="w", isl_mean_tokens=100, osl_mean_tokens=100)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(isl_mean_tokens=0), "isl_mean_tokens"),
        (dict(osl_mean_tokens=math.nan), "osl_mean_tokens"),
        (dict(osl_mean_tokens=1e9), "osl_mean_tokens"),
        (dict(prefix_hit_rate=1.0), "prefix_hit_rate"),
        (dict(isl_spread=-0.1), "isl_spread"),
        (dict(ttft_slo_s=0), "ttft_slo_s"),
        (dict(tpot_slo_s=math.nan), "tpot_slo_s"),
        (dict(slo_percentile=100), "slo_percentile"),
        (dict(slo_percentile="99"), "slo_percentile"),  # TypeError from `50 <= "99"` before
        (dict(target_output_tokens_per_s=-1), "target_output_tokens_per_s"),
        (dict(arrival=Arrival.POISSON), "request_rate_per_s"),
        (dict(arrival=Arrival.POISSON, request_rate_per_s=0), "request_rate_per_s"),
        (dict(request_rate_per_s=math.nan), "request_rate_per_s"),  # accepted for bursts before
        (dict(request_rate_per_s=-5.0), "request_rate_per_s"),  # accepted for bursts before
        (dict(arrival=Arrival.CLOSED), "concurrency"),
        (dict(concurrency=-3), "concurrency"),  # accepted for bursts before
        (dict(num_requests=0), "num_requests"),
        (dict(num_requests=True), "num_requests"),
    ],
)
def test_workload_rejects(changes, field):
    with pytest.raises(PlanError) as err:
        Workload(**{**W, **changes})
    assert field in str(err.value) and "\n" not in str(err.value)


def test_offered_output_tokens_per_s():
    """What the "Why" lines and the timelines' dashed line compare against: Poisson 2 req/s x 100
    output tokens = 200 tok/s, whatever the target; a burst or closed loop offers its target, if any."""
    assert Workload(**W, arrival=Arrival.POISSON, request_rate_per_s=2.0, target_output_tokens_per_s=150.0).offered_output_tokens_per_s == 200.0
    assert Workload(**W, arrival=Arrival.BURST, target_output_tokens_per_s=150.0).offered_output_tokens_per_s == 150.0
    assert Workload(**W, arrival=Arrival.BURST).offered_output_tokens_per_s is None


def test_a_target_above_what_poisson_arrivals_bring_names_the_rate_that_would_bring_it(tmp_path):
    """2 req/s x 100 output tokens bring 200 tok/s: a larger target cannot be met by any deployment. A
    workload file and the CLI's overrides are refused; a winner-map scenario is not (its cell has no winner)."""
    from jaxplan.cli.common import load_cli_inputs
    from jaxplan.specs import load_workload
    from jaxplan.winner_map import scenario_workload

    over = Workload(**W, arrival=Arrival.POISSON, request_rate_per_s=2.0, target_output_tokens_per_s=250.0)
    with pytest.raises(PlanError, match=r"target_output_tokens_per_s = 250.0: above the 200 output tokens/s .*\(--rate\) to >= 2\.5 "):
        over.check_target_is_offered()
    path = tmp_path / "w.toml"
    path.write_text('isl_mean_tokens = 100\nosl_mean_tokens = 100\narrival = "poisson"\nrequest_rate_per_s = 2.0\ntarget_output_tokens_per_s = 250.0\n')
    with pytest.raises(PlanError, match="target_output_tokens_per_s"):
        load_workload(str(path))
    with pytest.raises(PlanError, match=r"8 requests/s x 300 output tokens .* >= 16\.67 "):  # coding: 2,400 tok/s offered
        load_cli_inputs("llama-3.1-70b", "h100_sxm", "coding", "small", None, 5000.0, None, None)
    assert load_cli_inputs("llama-3.1-70b", "h100_sxm", "coding", "small", None, 5000.0, 17.0, None).workload.request_rate_per_s == 17.0
    scenario = scenario_workload(load_cli_inputs("llama-3.1-70b", "h100_sxm", "coding", "small", None, 2000.0, None, None).workload, {"rate": 1.0})
    assert scenario.request_rate_per_s == 1.0 and scenario.target_output_tokens_per_s == 2000.0
    # exactly the offered load, and any target for bursts and closed loops (their throughput is the deployment's)
    Workload(**W, arrival=Arrival.POISSON, request_rate_per_s=2.0, target_output_tokens_per_s=200.0).check_target_is_offered()
    Workload(**W, target_output_tokens_per_s=1e6).check_target_is_offered()
    Workload(**W, arrival=Arrival.CLOSED, concurrency=4, target_output_tokens_per_s=1e6).check_target_is_offered()


def test_workload_arrival_variants():
    assert Workload(**W, arrival=Arrival.CLOSED, concurrency=32).describe().count("32 in flight") == 1
    # a closed loop's request count sets its first wave's share (stage 4 and the replay)
    assert "closed loop, 64 in flight, 640 requests (first wave 10%)" in Workload(**W, arrival=Arrival.CLOSED, concurrency=64, num_requests=640).describe()
    assert "Poisson 2 req/s" in Workload(**W, arrival=Arrival.POISSON, request_rate_per_s=2.0).describe()


# ---- search spaces -------------------------------------------------------------------------


def test_default_space_has_over_a_million_candidates_per_gpu_type():
    s = load_space("default")
    # 5 TP x 4 PP x 128 DP x 12 max_num_seqs x 9 token budgets x 2 weight dtypes x 2 KV dtypes = 1,105,920
    assert s.size(1) == 5 * 4 * 128 * 12 * 9 * 2 * 2 == 1_105_920 >= 1_000_000
    assert s.size(3) == 3 * 1_105_920
    assert s.data_parallel_size == tuple(range(1, 129))  # from the {min, max} range table


def test_huge_and_small_spaces():
    # huge: 9 x 6 x 1024 x 12 x 12 x 2 x 2 = 31,850,496 (its description: ~3.2e7 per GPU type)
    assert load_space("huge").size(1) == 9 * 6 * 1024 * 12 * 12 * 2 * 2 == 31_850_496
    assert load_space("small").size(1) == 4 * 2 * 4 * 3 * 2 * 2 * 2


AXES = dict(tensor_parallel_size=(1,), pipeline_parallel_size=(1,), data_parallel_size=(1,), max_num_seqs=(8,), max_num_batched_tokens=(256,))


def _space(**changes) -> SearchSpace:
    return SearchSpace(name="s", **{**AXES, **changes})


def test_axes_are_sorted():
    s = _space(tensor_parallel_size=(8, 1, 4, 2), max_num_seqs=[64, 8])
    assert s.tensor_parallel_size == (1, 2, 4, 8) and s.max_num_seqs == (8, 64)
    assert list(s.axis_values()) == ["tensor_parallel_size", "pipeline_parallel_size", "layout_kind", "data_parallel_size", "max_num_seqs",
                                     "max_num_batched_tokens", "weight_dtype", "kv_cache_dtype"]


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(tensor_parallel_size=(1, 2, 2)), "tensor_parallel_size"),
        (dict(max_num_seqs=()), "max_num_seqs"),
        (dict(data_parallel_size=(0, 1)), "data_parallel_size"),
        (dict(data_parallel_size=(1, 2.0)), "data_parallel_size"),
        (dict(data_parallel_size=(True,)), "data_parallel_size"),
        (dict(max_num_batched_tokens=(10**8,)), "max_num_batched_tokens"),
        (dict(weight_dtype=("bf16", "int3")), "weight_dtype"),
        (dict(layout_kind=("tp", "tp")), "layout_kind"),
        (dict(layout_kind=("dp_tp",)), "layout_kind"),
        (dict(kv_cache_dtype=("fp8", "fp8")), "kv_cache_dtype"),
        (dict(kv_cache_dtype=()), "kv_cache_dtype"),
        (dict(gpu_budget=0), "gpu_budget"),
        (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
        (dict(gpu_memory_utilization=math.nan), "gpu_memory_utilization"),
        (dict(block_size_tokens=24), "block_size_tokens"),
        (dict(block_size_tokens=16.0), "block_size_tokens"),
    ],
)
def test_space_rejects(changes, field):
    with pytest.raises(PlanError) as err:
        _space(**changes)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_block_size_message_lists_what_is_accepted():
    # the message used to say "8, 16, ..." while 1 was accepted too
    with pytest.raises(PlanError, match="use one of 1, 8, 16, 32, 64, 128, 256"):
        _space(block_size_tokens=3)
    assert _space(block_size_tokens=1).block_size_tokens == 1


def _from_toml(data: dict) -> SearchSpace:
    return build(SearchSpace, {**{k: list(v) for k, v in AXES.items()}, **data}, name="t", where="t.toml")


def test_range_table_size_cap():
    # 100,000 values is the most one {min, max} table may expand to (10^7 took 3.4 s to validate)
    assert len(_from_toml({"max_num_batched_tokens": {"min": 1, "max": 100_000}}).max_num_batched_tokens) == 100_000
    with pytest.raises(PlanError, match="at most 100,000 values"):
        _from_toml({"max_num_batched_tokens": {"min": 1, "max": 100_001}})


def test_range_tables():
    assert _from_toml({"max_num_seqs": {"min": 8, "max": 64, "step": 8}}).max_num_seqs == (8, 16, 24, 32, 40, 48, 56, 64)
    assert _from_toml({"data_parallel_size": {"min": 3, "max": 3}}).data_parallel_size == (3,)


@pytest.mark.parametrize(
    "value",
    [
        {"min": 4, "max": 2},
        {"min": 1.0, "max": 2},
        {"min": 1, "max": 8, "step": 0},
        {"min": True, "max": 2},
        {"min": 1, "max": 10**12},  # too many values
        {"min": 1},
        {"min": 1, "max": 2, "stride": 1},
        {"min": 0, "max": 4},  # 0 is not a valid axis value
        "1..4",
        [1, "2"],
        [[1]],
    ],
)
def test_bad_ranges_and_lists(value):
    with pytest.raises(PlanError) as err:
        _from_toml({"data_parallel_size": value})
    assert "data_parallel_size" in str(err.value) and "\n" not in str(err.value)


def test_replace_revalidates():
    with pytest.raises(PlanError, match="gpu_budget"):
        load_space("small").replace(gpu_budget=-1)
    assert load_space("small").replace(gpu_budget=8).gpu_budget == 8
