"""Kernel-table priors for the FP8 input quantisation: the least-squares split of an FP8 GEMM's time
into tensor-core work and quantisation, checked on planted tables, by hand, and against NVIDIA's
measured GEMMs at the shapes a TP-sharded Llama-3.1-70B runs (and the NVFP4 pair on B200); the cost
of reading an FP8 KV cache,
by hand and from NVIDIA's decode-attention tables; the all-reduce group sizes."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan.buckets import bucket_size
from jaxplan.calibrate import _data, fit
from jaxplan.calibrate.kernels import GemmTable
from jaxplan.physics import hardware_table, make_layout, model_shape
from jaxplan.physics.params import DEFAULTS
from jaxplan.physics.step_time import input_quant_time_s, gemm_input_elements_per_token
from jaxplan.specs import load_gpu, load_model

PEAK_FLOPS_PER_S = 2e15
BYTES_PER_S = 4e12


def planted_table(efficiency, bytes_per_element, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    m, n, k = (rng.choice([1024, 2048, 4096, 8192, 16384], 300) for _ in range(3))
    latency = 2.0 * m * n * k / (efficiency * PEAK_FLOPS_PER_S) + m * k * bytes_per_element / BYTES_PER_S
    latency = latency * np.exp(noise * rng.standard_normal(latency.shape))
    return GemmTable(m, n, k, np.full(m.shape, "fp8"), np.full(m.shape, "cutlass"), latency)


@pytest.mark.parametrize("efficiency, bytes_per_element", [(0.7, 12.0), (0.5, 3.0), (0.9, 0.0)])
def test_quant_prior_recovers_planted_bytes(efficiency, bytes_per_element):
    table = planted_table(efficiency, bytes_per_element)
    rows = np.ones(table.m.shape, bool)
    found, quant_s = fit.fp8_quant_prior(table, rows, PEAK_FLOPS_PER_S, BYTES_PER_S)
    assert found == pytest.approx(bytes_per_element, abs=1e-6 * max(bytes_per_element, 1.0))
    # What is left after the quantisation is tensor-core time at the planted efficiency.
    compute_s = table.latency_s - quant_s
    np.testing.assert_allclose(2.0 * table.m * table.n * table.k / compute_s / PEAK_FLOPS_PER_S, efficiency, rtol=1e-6)


def test_quant_prior_is_never_negative_and_tolerates_noise():
    table = planted_table(0.8, 0.0, noise=0.05, seed=3)
    found, quant_s = fit.fp8_quant_prior(table, np.ones(table.m.shape, bool), PEAK_FLOPS_PER_S, BYTES_PER_S)
    assert found >= 0.0 and (quant_s >= 0.0).all()
    assert found < 1.0  # the planted value is 0; 5% noise may not invent a quantisation kernel
    table = planted_table(0.7, 10.0, noise=0.05, seed=4)
    found, _ = fit.fp8_quant_prior(table, np.ones(table.m.shape, bool), PEAK_FLOPS_PER_S, BYTES_PER_S)
    assert found == pytest.approx(10.0, rel=0.1)


def hardware(gpu, **values):
    hw = hardware_table((load_gpu(gpu),), {gpu: {**DEFAULTS, **values}})
    return hw._replace(**{f: v[0] for f, v in hw._asdict().items()})


def test_quant_time_hand_computed():
    """Llama-3.1-70B at TP8: per token and layer the hidden state (8192) into QKV and into gate/up,
    the attention shard (8192 / 8) into O, the FFN shard (28672 / 8) into down: 20,992 elements;
    80 layers; 1,000 tokens at 10 bytes per element over 4.8 TB/s x 0.8."""
    model = model_shape(load_model("llama-3.1-70b"))
    fp8 = make_layout(8, 1, 1, 1, 2, 256, 8192)
    assert float(gemm_input_elements_per_token(model, fp8)) == pytest.approx(80 * (8192 + 1024 + 8192 + 3584))
    h200 = hardware("h200_sxm", fp8_quant_bytes_per_element=10.0, memory_bandwidth_efficiency=0.8)
    expected_s = 1000 * 80 * 20992 * 10.0 / (4.8e12 * 0.8)
    assert float(input_quant_time_s(model, h200, fp8, jnp.float32(1000.0))) == pytest.approx(expected_s, rel=1e-5)
    assert float(input_quant_time_s(model, h200, make_layout(8, 1, 1, 2, 2, 256, 8192), jnp.float32(1000.0))) == 0.0
    a100 = hardware("a100_sxm", fp8_quant_bytes_per_element=10.0)  # no FP8 tensor cores: BF16 GEMMs
    assert float(input_quant_time_s(model, a100, fp8, jnp.float32(1000.0))) == 0.0
    # NVFP4 GEMMs quantise at their own bytes per element on a GPU with FP4 tensor cores (B200: 8 TB/s),
    # FP8 GEMMs there at the FP8 figure; H200 has no FP4 tensor cores: NVFP4 weights run weight-only.
    nvfp4 = make_layout(8, 1, 1, 0.5625, 1, 256, 8192)
    b200 = hardware("b200_sxm", fp8_quant_bytes_per_element=10.0, fp4_quant_bytes_per_element=4.0, memory_bandwidth_efficiency=0.8)
    assert float(input_quant_time_s(model, b200, nvfp4, jnp.float32(1000.0))) == pytest.approx(1000 * 80 * 20992 * 4.0 / (7.7e12 * 0.8), rel=1e-5)
    assert float(input_quant_time_s(model, b200, fp8, jnp.float32(1000.0))) == pytest.approx(1000 * 80 * 20992 * 10.0 / (7.7e12 * 0.8), rel=1e-5)
    assert float(input_quant_time_s(model, h200, nvfp4, jnp.float32(1000.0))) == 0.0


LLAMA_70B_SHARDS = {  # (n, k) of QKV, O, gate/up, down at TP t (NVIDIA's tables store n x k per shard)
    t: [(10240 // t, 8192), (8192, 8192 // t), (57344 // t, 8192), (8192, 28672 // t)] for t in (1, 2, 4, 8)
}


@pytest.mark.parametrize("gpu", ["h200_sxm", "b200_sxm"])
def test_priors_reproduce_how_fp8_gemms_slow_down_under_tp(gpu):
    """NVIDIA's FP8 GEMM tables: at the Llama-3.1-70B shards a TP8 layer runs its GEMMs at 0.56 (H200)
    and 0.38 (B200) of the FP8 peak against 0.72 / 0.53 at TP1 (narrower shards, and quantisation that
    TP does not split). One efficiency plus the quantisation prior gives each TP's efficiency within
    12%, and the drop from TP1 to TP8 within a third of it (one efficiency alone has no drop)."""
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    from jaxplan.calibrate import kernels

    spec = load_gpu(gpu)
    prior = fit.kernel_priors(gpu)
    table = kernels.load_gemm(gpu, dtypes=("fp8",))
    bytes_per_s = spec.hbm_bandwidth_bytes_per_s * prior["memory_bandwidth_efficiency"]
    for tokens in (1024, 8192):
        measured, modelled = [], []
        for tp, shards in LLAMA_70B_SHARDS.items():
            flops = measured_s = model_s = 0.0
            for n, k in shards:
                row = np.flatnonzero((table.m == tokens) & (table.n == n) & (table.k == k))
                if not row.size:  # shards not in the table: the nearest measured shape, scaled by FLOPs
                    row = [np.argmin(np.abs(np.log(table.m / tokens)) + np.abs(np.log(table.n / n)) + np.abs(np.log(table.k / k)))]
                i = row[0]
                f = 2.0 * tokens * n * k
                flops += f
                measured_s += table.latency_s[i] * f / (2.0 * table.m[i] * table.n[i] * table.k[i])
                model_s += f / (prior["gemm_flops_efficiency"] * spec.fp8_flops_per_s) + tokens * k * prior["fp8_quant_bytes_per_element"] / bytes_per_s
            measured.append(flops / measured_s / spec.fp8_flops_per_s)
            modelled.append(flops / model_s / spec.fp8_flops_per_s)
        measured, modelled = np.array(measured), np.array(modelled)
        np.testing.assert_allclose(modelled, measured, rtol=0.12, err_msg=f"{gpu} at {tokens} tokens")
        drop_measured, drop_modelled = measured[0] - measured[-1], modelled[0] - modelled[-1]
        assert drop_measured > 0.1 and abs(drop_modelled - drop_measured) < drop_measured / 3, (gpu, tokens, measured, modelled)


def llama_70b_shard_efficiency(table, tokens, tp, efficiency, quant_bytes, peak, bytes_per_s):
    """(measured, modelled) fraction of `peak` over the four GEMMs of a Llama-3.1-70B layer at TP `tp`
    (shards missing from the table: the nearest measured shape, scaled by FLOPs)."""
    flops = measured_s = model_s = 0.0
    for n, k in LLAMA_70B_SHARDS[tp]:
        row = np.flatnonzero((table.m == tokens) & (table.n == n) & (table.k == k))
        if not row.size:
            row = [np.argmin(np.abs(np.log(table.m / tokens)) + np.abs(np.log(table.n / n)) + np.abs(np.log(table.k / k)))]
        i = row[0]
        f = 2.0 * tokens * n * k
        flops += f
        measured_s += table.latency_s[i] * f / (2.0 * table.m[i] * table.n[i] * table.k[i])
        model_s += f / (efficiency * peak) + tokens * k * quant_bytes / bytes_per_s
    return flops / measured_s / peak, flops / model_s / peak


def test_nvfp4_priors_from_b200s_gemm_tables():
    """NVIDIA's B200 NVFP4 GEMM tables, read like the FP8 ones against the 9 PFLOP/s FP4 peak: 0.54 of
    it net of a quantisation of 4.4 B per input element (FP8 there: 0.70 and 15). At the Llama-3.1-70B
    shards and 8,192 tokens the model gives each TP's efficiency within 12% (0.39-0.49 measured). At
    1,024 tokens the narrow NVFP4 shards run below the one efficiency: the model over-states them by
    1.1x at TP1 rising to 1.45x at TP8 (0.44 -> 0.27 measured), a known optimism of the NVFP4 prefill."""
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    from jaxplan.calibrate import kernels

    spec = load_gpu("b200_sxm")
    prior = fit.kernel_priors("b200_sxm")
    assert prior["fp4_gemm_flops_efficiency"] == pytest.approx(0.54, abs=0.02)
    assert prior["fp4_quant_bytes_per_element"] == pytest.approx(4.4, abs=0.3)
    assert fit.kernel_priors("h200_sxm")["fp4_gemm_flops_efficiency"] == DEFAULTS["fp4_gemm_flops_efficiency"]  # no FP4 tensor cores
    table = kernels.load_gemm("b200_sxm", dtypes=("nvfp4",))
    bytes_per_s = spec.hbm_bandwidth_bytes_per_s * prior["memory_bandwidth_efficiency"]
    args = (prior["fp4_gemm_flops_efficiency"], prior["fp4_quant_bytes_per_element"], spec.fp4_flops_per_s, bytes_per_s)
    long = np.array([llama_70b_shard_efficiency(table, 8192, tp, *args) for tp in (1, 2, 4, 8)])
    np.testing.assert_allclose(long[:, 1], long[:, 0], rtol=0.12)
    short = np.array([llama_70b_shard_efficiency(table, 1024, tp, *args) for tp in (1, 2, 4, 8)])
    optimism = short[:, 1] / short[:, 0]
    assert np.all(np.diff(optimism) > 0) and 1.0 < optimism[0] < 1.2 and 1.3 < optimism[-1] < 1.6, optimism


def test_fp4_weight_read_prior_hand_computed():
    """Planted FP8 and NVFP4 tables. Weight-streaming shapes (<= 16 tokens, >= 64 MB of FP8 weights)
    timed in both formats: (8, 8192, 8192) at 100 us FP8 (its fastest of two kernels) and 60 us NVFP4,
    (16, 16384, 8192) at 200 / 150 us, (1, 8192, 16384) at 100 / 70 us: ratios 0.6, 0.75, 0.7, median
    0.7 B per weight. Not counted: 32 tokens (too many), 4096 x 4096 (16 MB, too small), a shape timed
    in FP8 only, and the bf16 row of a counted shape."""
    fp8 = GemmTable(
        m=np.array([8, 8, 16, 1, 32, 8, 4, 8]),
        n=np.array([8192, 8192, 16384, 8192, 8192, 4096, 8192, 8192]),
        k=np.array([8192, 8192, 8192, 16384, 8192, 4096, 65536, 8192]),
        dtype=np.array(["fp8", "fp8", "fp8", "fp8", "fp8", "fp8", "fp8", "bf16"]),
        kernel_source=np.array(["a", "b", "a", "a", "a", "a", "a", "torch"]),
        latency_s=np.array([130e-6, 100e-6, 200e-6, 100e-6, 100e-6, 30e-6, 500e-6, 10e-6]),
    )
    nvfp4 = GemmTable(
        m=np.array([8, 16, 1, 32, 8]),
        n=np.array([8192, 16384, 8192, 8192, 4096]),
        k=np.array([8192, 8192, 16384, 8192, 4096]),
        dtype=np.full(5, "nvfp4"), kernel_source=np.full(5, "cute"),
        latency_s=np.array([60e-6, 150e-6, 70e-6, 10e-6, 1e-6]),
    )
    assert fit.fp4_weight_read_prior(fp8, nvfp4) == pytest.approx(0.7)
    no_pairs = nvfp4._replace(m=nvfp4.m + 1000)
    assert fit.fp4_weight_read_prior(fp8, no_pairs) is None


def test_fp4_weight_read_prior_from_b200s_gemm_tables():
    """NVIDIA's B200 tables: over the ~1,400 weight-streaming shapes timed in FP8 and NVFP4, an NVFP4
    GEMM takes a median 0.67 of the FP8 one's time, i.e. streams 0.67 B per weight where FP8 streams
    1 (0.5625 are stored). Recomputed here in plain Python from the loaded rows. GPUs without FP4
    tensor cores keep the stored size."""
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    from jaxplan.calibrate import kernels

    table = kernels.load_gemm("b200_sxm", dtypes=("fp8", "nvfp4"))
    best = {}
    for m, n, k, dtype, latency in zip(table.m.tolist(), table.n.tolist(), table.k.tolist(), table.dtype.tolist(), table.latency_s.tolist()):
        if m <= 16 and n * k >= 64e6:
            best[(dtype, m, n, k)] = min(best.get((dtype, m, n, k), float("inf")), latency)
    ratios = sorted(best[("nvfp4",) + s[1:]] / t for s, t in best.items() if s[0] == "fp8" and ("nvfp4",) + s[1:] in best)
    assert len(ratios) > 1000
    want = float(np.median(ratios))
    prior = fit.kernel_priors("b200_sxm")["fp4_weight_read_bytes_per_param"]
    assert prior == pytest.approx(want, rel=1e-12)
    assert prior == pytest.approx(0.67, abs=0.02)
    assert fit.kernel_priors("h200_sxm")["fp4_weight_read_bytes_per_param"] == DEFAULTS["fp4_weight_read_bytes_per_param"] == 0.5625


def test_gemm_floor_prior_is_the_median_of_the_tiny_gemms(monkeypatch):
    """A planted table: GEMMs of <= 16 tokens over <= 1 MiB of weights take 3, 4 and 5 us (median 4 us);
    larger ones (more tokens, or a 2 MiB BF16 weight) do not count. No FP8 or NVFP4 rows: those fields
    keep their defaults."""
    from jaxplan.calibrate import kernels

    m = np.array([1, 16, 8, 32, 16])
    n = np.array([256, 512, 1024, 256, 1024])
    k = np.array([256, 512, 512, 256, 1024])  # the last: 1024 x 1024 x 2 B = 2 MiB
    table = GemmTable(m, n, k, np.full(5, "bf16"), np.full(5, "cutlass"), np.array([3e-6, 5e-6, 4e-6, 9e-6, 9e-6]))

    def load_gemm(gpu, dtypes, data_root=None):  # the real one keeps the rows of `dtypes`: here bf16 only
        assert "bf16" in dtypes
        return table

    monkeypatch.setattr(kernels, "load_gemm", load_gemm)
    assert fit.gemm_floor_prior("h200_sxm") == {"gemm_floor_s": pytest.approx(4e-6)}


def test_gemm_floors_from_nvidias_tables():
    """H200: 3.0 us (BF16), 5.4 us (FP8, with its input quantisation); B200: 2.2, 6.0 and 7.0 us (NVFP4).
    A low-precision GEMM's floor is a second kernel's worth above BF16's on every GPU with tables."""
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    h200, b200 = fit.kernel_priors("h200_sxm"), fit.kernel_priors("b200_sxm")
    assert h200["gemm_floor_s"] == pytest.approx(3.0e-6, abs=0.1e-6) and h200["fp8_gemm_floor_s"] == pytest.approx(5.4e-6, abs=0.1e-6)
    assert b200["gemm_floor_s"] == pytest.approx(2.2e-6, abs=0.1e-6) and b200["fp8_gemm_floor_s"] == pytest.approx(6.0e-6, abs=0.1e-6)
    assert b200["fp4_gemm_floor_s"] == pytest.approx(7.0e-6, abs=0.1e-6)
    for prior in (h200, b200, fit.kernel_priors("h100_sxm"), fit.kernel_priors("l40s")):
        assert prior["fp8_gemm_floor_s"] > 1.5 * prior["gemm_floor_s"]


def test_allreduce_efficiency_by_group_size_hand_computed():
    """8 GPUs (and more) at the 8-GPU efficiency; 2 GPUs at ratio x that; 4 GPUs at sqrt(ratio) x that."""
    from jaxplan.physics.step_time import allreduce_efficiency, allreduce_time_s

    hw = hardware("h200_sxm", allreduce_bandwidth_efficiency=0.9, allreduce_two_gpu_ratio=0.64, allreduce_latency_s=0.0)
    for tp, expected in ((2, 0.9 * 0.64), (4, 0.9 * 0.8), (8, 0.9), (16, 0.9)):
        assert float(allreduce_efficiency(hw, jnp.float32(tp))) == pytest.approx(expected, rel=1e-6)
    # 64 MiB over 4 GPUs: 2 x 3/4 x 64 MiB through 450 GB/s x 0.72.
    message = 64 * 2**20
    layout = make_layout(4, 1, 1, 1, 2, 256, 8192)
    assert float(allreduce_time_s(hw, layout, jnp.float32(message))) == pytest.approx(1.5 * message / (450e9 * 0.72), rel=1e-5)


def test_allreduce_priors_read_group_sizes_apart():
    """NCCL's all-reduce (NVIDIA's tables) at prefill sizes, 16-128 MiB: H200's 8-GPU all-reduces
    reach 0.74 of the link, pairs 0.77 x that; B200 0.43 and 1.11 x (its pairs reach more of their
    link at these sizes, its 8 GPUs more from 128 MiB on). A100 and H100 pairs reach less than 8 GPUs."""
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    h200, b200 = fit.kernel_priors("h200_sxm"), fit.kernel_priors("b200_sxm")
    assert h200["allreduce_bandwidth_efficiency"] == pytest.approx(0.739, abs=0.02)
    assert h200["allreduce_two_gpu_ratio"] == pytest.approx(0.769, abs=0.02)
    assert b200["allreduce_bandwidth_efficiency"] == pytest.approx(0.429, abs=0.02)
    assert b200["allreduce_two_gpu_ratio"] == pytest.approx(1.115, abs=0.02)
    for gpu in ("a100_sxm", "h100_sxm"):
        assert fit.kernel_priors(gpu)["allreduce_two_gpu_ratio"] < 1.0, gpu


def test_allreduce_bandwidth_prior_is_nccls_at_prefill_sizes():
    """The bandwidth prior is the median over NCCL's 8-GPU rows of 16-128 MiB, recomputed here by hand
    from the table (B200: 99, 168, 278 and 398 us): not NCCL's peak at 1 GiB (B200 reaches 0.73 of its
    link at >= 64 MiB once the multi-GiB messages count, 0.43 at the sizes a prefill step sends), and not
    vLLM 0.19's own dispatch (`vLLM_custom_eager`), which is faster there than NCCL: not NCCL's path."""
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    from jaxplan.calibrate import kernels

    def fractions(table, link):
        return [
            2.0 * 7.0 / 8.0 * size / seconds / link
            for n, size, seconds in zip(table.num_gpus, table.message_bytes, table.latency_s)
            if n == 8 and 16 * 2**20 <= size <= 128 * 2**20
        ]

    for gpu in ("h200_sxm", "b200_sxm"):
        link = load_gpu(gpu).intra_node_bandwidth_bytes_per_s
        nccl = fractions(kernels.load_nccl(gpu, ops=("all_reduce",), dtypes=("fp16",)), link)
        assert len(nccl) == 4  # 16, 32, 64 and 128 MiB
        assert fit.allreduce_prior(gpu, load_gpu(gpu))["allreduce_bandwidth_efficiency"] == pytest.approx(float(np.median(nccl)), rel=1e-9)
    vllm_dispatch = fractions(kernels.load_custom_allreduce("b200_sxm", modes=("eager",)), load_gpu("b200_sxm").intra_node_bandwidth_bytes_per_s)
    assert float(np.median(vllm_dispatch)) > 1.15 * fit.allreduce_prior("b200_sxm", load_gpu("b200_sxm"))["allreduce_bandwidth_efficiency"]
    big = kernels.load_nccl("b200_sxm", ops=("all_reduce",), dtypes=("fp16",))
    assert big.message_bytes.max() > 128 * 2**20  # the window leaves out messages no prefill step sends


def generation_table(rows):
    """A GenerationAttentionTable from (batch, context, kv_dtype, kernel, latency_s) tuples; 64 query
    heads, 8 KV heads of 128 (Llama-3.1-70B at TP1): 4,096 B of BF16 KV per token and layer."""
    from jaxplan.calibrate.kernels import GenerationAttentionTable

    cols = list(zip(*rows))
    n = len(rows)
    return GenerationAttentionTable(
        batch=np.array(cols[0], np.int64), context_tokens=np.array(cols[1], np.int64), num_heads=np.full(n, 64), num_kv_heads=np.full(n, 8),
        head_dim=np.full(n, 128), kv_dtype=np.array(cols[2]), window_tokens=np.zeros(n, np.int64), kernel_source=np.array(cols[3]), latency_s=np.array(cols[4]),
    )


def test_fp8_kv_read_prior_hand_computed():
    """Pairs of the same call with FP8 and BF16 caches give 2 B x t(FP8) / t(BF16); a call reading less
    than 512 MiB of BF16 KV (launch-bound), a call without its BF16 twin and another kernel's twin do
    not count. 64 x 4,096 tokens x 4,096 B = 1 GiB and 128 x 4,096 = 2 GiB qualify; 16 x 4,096 = 256 MiB does not."""
    table = generation_table([
        (64, 4096, "bf16", "fa3", 2.0e-4), (64, 4096, "fp8", "fa3", 1.5e-4),  # 1.5
        (128, 4096, "bf16", "fa3", 4.0e-4), (128, 4096, "fp8", "fa3", 2.4e-4),  # 1.2
        (256, 4096, "bf16", "fa3", 8.0e-4), (256, 4096, "fp8", "fa3", 7.2e-4),  # 1.8
        (16, 4096, "bf16", "fa3", 1.0e-5), (16, 4096, "fp8", "fa3", 1.0e-5),  # too small: would be 2.0
        (512, 4096, "fp8", "fa3", 1.0e-3),  # no BF16 twin
        (64, 8192, "bf16", "fa3", 4.0e-4), (64, 8192, "fp8", "triton", 8.0e-4),  # another kernel: would be 4.0
    ])
    assert fit.fp8_kv_read_prior(table) == pytest.approx(1.5)
    assert fit.fp8_kv_read_prior(generation_table([(16, 4096, "bf16", "fa3", 1e-5), (16, 4096, "fp8", "fa3", 1e-5)])) is None


def test_fp8_kv_read_priors_from_nvidias_decode_tables():
    """NVIDIA's vLLM decode-attention tables: an FP8 KV cache costs 1.35 B per element on H100, 1.76 on
    H200 (FA3 dequantises as it reads, and H200's faster HBM leaves it further behind) and 1.17 on B200;
    every one between the byte it stores and the two of BF16. Without FP8 timings (A100) the default."""
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    found = {g: fit.kernel_priors(g)["fp8_kv_read_bytes_per_element"] for g in ("h100_sxm", "h200_sxm", "b200_sxm", "a100_sxm")}
    assert found["h100_sxm"] == pytest.approx(1.35, abs=0.02)
    assert found["h200_sxm"] == pytest.approx(1.76, abs=0.02)
    assert found["b200_sxm"] == pytest.approx(1.17, abs=0.02)
    assert found["a100_sxm"] == DEFAULTS["fp8_kv_read_bytes_per_element"]
    assert all(1.0 < v < 2.0 for v in found.values())


def test_padding_rows_carry_no_weight_in_the_fit_loss():
    """The fit pads each model's rows to `buckets.bucket_size` (repeating the last row, weight 0);
    its loss at the prior (one step: the loss before the first update) must be the plain mean squared
    log error of the real rows, computed here from `log_errors` without padding."""
    base = dict(model="llama-3.1-8b", gpu="h100_sxm", tensor_parallel_size=1, weight_dtype="bf16", kv_cache_dtype="auto", osl=200.0)
    measured = [dict(base, isl=500.0 * (k + 1), concurrency=4 * (k + 1), measured_ttft_ms_mean=80.0 + 40 * k, measured_tpot_ms_mean=9.0 + k) for k in range(3)]
    data = fit.fit_data(measured, ["h100_sxm"])
    assert bucket_size(3) > 3
    prior = np.stack([fit.free_vector(fit.kernel_priors("h100_sxm"))])
    _, loss = fit.fit_serving(data, ["h100_sxm"], prior, steps=1)
    table = fit.hardware_from_free(fit.base_table(["h100_sxm"]), prior)
    ttft_err, tpot_err = (np.asarray(e, np.float64) for e in fit.log_errors(data, table))
    assert ttft_err.shape == (3,)
    expected = np.mean(ttft_err**2) + np.mean(tpot_err**2)
    assert expected > 0.01  # the rows are off the model: a loss that ignored them would show
    assert loss == pytest.approx(expected, rel=1e-5)


def test_the_fit_prices_each_gpu_with_its_own_values_of_the_fields_it_does_not_fit():
    """The serving fit replaces FIT_FIELDS only; every other field (FP8 KV reads, NVFP4 GEMMs, GEMM
    floors) must be the GPU's own value, the one it is evaluated and shipped with. Until 2026-12-03
    the fit priced them at DEFAULTS (H200 read an FP8 KV cache at 1.35 B per element in the fit and
    1.76 B everywhere else). Three B200 rows with NVFP4 weights and an FP8 cache, 32-64 clients at
    1,024 / 8,192 tokens (decode-bound): the fit's loss at the prior, with B200's kernel values held
    fixed, is the loss stage 4 (`log_errors`) gives with the complete parameters, and differs from the DEFAULTS
    one by more than rounding."""
    base = dict(model="llama-3.1-70b", gpu="b200_sxm", tensor_parallel_size=2, weight_dtype="nvfp4", kv_cache_dtype="fp8", isl=1024.0, osl=8192.0)
    measured = [dict(base, concurrency=32.0 * (k + 1), measured_ttft_ms_mean=150.0 + 50 * k, measured_tpot_ms_mean=12.0 + 2 * k) for k in range(3)]
    gpus = ["b200_sxm"]
    data = fit.fit_data(measured, gpus)
    kernel = dict(DEFAULTS, fp8_kv_read_bytes_per_element=1.1, fp4_weight_read_bytes_per_param=0.7, fp4_gemm_flops_efficiency=0.5, fp4_gemm_floor_s=9e-6)
    prior = np.stack([fit.free_vector(kernel)])
    _, loss = fit.fit_serving(data, gpus, prior, fixed={"b200_sxm": kernel}, steps=1)
    _, loss_defaults = fit.fit_serving(data, gpus, prior, steps=1)
    complete = hardware_table((load_gpu("b200_sxm"),), {"b200_sxm": {**kernel, **fit.values_of(prior[0])}})
    ttft_err, tpot_err = (np.asarray(e, np.float64) for e in fit.log_errors(data, complete))
    assert loss == pytest.approx(np.mean(ttft_err**2) + np.mean(tpot_err**2), rel=1e-5)
    assert abs(loss - loss_defaults) > 1e-3 * loss
    # The table the fit starts from carries the fixed values field by field.
    table = fit.base_table(gpus, {"b200_sxm": kernel})
    for field in ("fp8_kv_read_bytes_per_element", "fp4_weight_read_bytes_per_param", "fp4_gemm_flops_efficiency", "fp4_gemm_floor_s"):
        assert float(getattr(table, field)[0]) == pytest.approx(kernel[field], rel=1e-6), field


def test_a_gpu_listed_without_rows_has_no_say_in_the_fit():
    """The held-out-GPU fit lists the held-out GPU (so that it runs the complete fit's program) and
    pads the rows to the complete fit's bucket: its vector must be the one fitted on the other GPU's
    rows alone, unpadded, and in an unshared fit the listed GPU keeps its prior."""
    base = dict(model="llama-3.1-8b", gpu="h200_sxm", tensor_parallel_size=1, weight_dtype="fp8", kv_cache_dtype="auto", osl=200.0)
    measured = [dict(base, isl=500.0 * (k + 1), concurrency=4 * (k + 1), measured_ttft_ms_mean=80.0 + 40 * k, measured_tpot_ms_mean=9.0 + k) for k in range(3)]
    priors = {g: np.asarray(fit.free_vector(fit.kernel_priors(g))) for g in ("h100_sxm", "h200_sxm")}
    alone, loss_alone = fit.fit_serving(fit.fit_data(measured, ["h200_sxm"]), ["h200_sxm"], np.stack([priors["h200_sxm"]]), shared=True, steps=50)
    both = ["h100_sxm", "h200_sxm"]
    listed, loss_listed = fit.fit_serving(fit.fit_data(measured, both), both, np.stack([priors[g] for g in both]), shared=True, steps=50, min_rows=20)
    assert np.abs(alone[0] - priors["h200_sxm"]).max() > 1e-3  # the fit moved
    np.testing.assert_allclose(listed[0], alone[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(listed[1], alone[0], rtol=1e-5, atol=1e-6)  # shared: one vector
    assert loss_listed == pytest.approx(loss_alone, rel=1e-5)
    # padded like `listed`, so that it runs the program compiled for it (shared is an argument, not a static)
    unshared, _ = fit.fit_serving(fit.fit_data(measured, both), both, np.stack([priors[g] for g in both]), steps=50, min_rows=20)
    np.testing.assert_array_equal(unshared[0], priors["h100_sxm"].astype(np.float32))
    np.testing.assert_allclose(unshared[1], alone[0], rtol=1e-5, atol=1e-6)
