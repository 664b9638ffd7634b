"""The bundled GPUs and models beyond the calibrated slice: B300, GB200 NVL72, MI325X, MI355X, and
gpt-oss-120b/20b, MiniMax-M2.5, Qwen3-235B-A22B, Kimi-K2.5, DeepSeek-R1.

GPU numbers are checked against the spec-sheet figures the TOMLs cite, redone by hand here
(per-GPU = rack or node figure / GPUs, dense = sparse / 2, AMD peaks = CUs x FLOP/clock x clock).
Model sizes are checked against the publishers' total and active parameter counts.
"""

from __future__ import annotations

import dataclasses

import pytest

from jaxplan.errors import PlanError
from jaxplan.physics.params import efficiency_for
from jaxplan.physics.shapes import hardware_table, make_layout
from jaxplan.physics.step_time import allreduce_time_s
from jaxplan.report.vllm_command import node_layout
from jaxplan.specs import ModelSpec, known, load_gpu, load_model
from jaxplan.specs.hf_config import model_from_hf_dict

NEW_GPUS = ("b300_sxm", "gb200", "gb300", "mi325x", "mi355x")
NEW_MODELS = ("gpt-oss-120b", "gpt-oss-20b", "minimax-m2.5", "qwen3-235b-a22b", "kimi-k2.5", "deepseek-r1")


# ---- GPUs ------------------------------------------------------------------------------------


def test_new_gpus_are_bundled_and_cite_sources():
    assert set(NEW_GPUS) <= set(known("gpus"))
    for name in NEW_GPUS:
        gpu = load_gpu(name)
        assert gpu.display_name and ("SECONDARY" in gpu.source or "via secondary pages" in gpu.source), name


def test_b300_from_the_hgx_b300_table():
    gpu = load_gpu("b300_sxm")
    # HGX B300, 8 GPUs: BF16 36 PFLOPS and FP8 72 PFLOPS with sparsity, FP4 105 PFLOPS dense
    assert gpu.bf16_flops_per_s == pytest.approx(36e15 / 8 / 2)
    assert gpu.fp8_flops_per_s == pytest.approx(72e15 / 8 / 2)
    assert gpu.fp4_flops_per_s == pytest.approx(105e15 / 8) == gpu.mxfp4_flops_per_s
    assert gpu.hbm_bytes == 288e9 and gpu.hbm_bandwidth_bytes_per_s == 8e12
    assert gpu.intra_node_bandwidth_bytes_per_s == pytest.approx(1.8e12 / 2)  # NVLink 5, both ways -> one way
    assert gpu.inter_node_bandwidth_bytes_per_s == pytest.approx(800e9 / 8)  # ConnectX-8 800 Gb/s
    assert gpu.gpus_per_node == 8


def test_gb200_from_the_nvl72_rack_table():
    gpu = load_gpu("gb200")
    # GB200 NVL72, 72 GPUs: FP4 1,440 / FP8 720 / BF16 360 PFLOPS with sparsity; 13.4 TB at 576 TB/s; NVLink 130 TB/s
    assert gpu.bf16_flops_per_s == pytest.approx(360e15 / 72 / 2)
    assert gpu.fp8_flops_per_s == pytest.approx(720e15 / 72 / 2)
    assert gpu.fp4_flops_per_s == pytest.approx(1440e15 / 72 / 2) == gpu.mxfp4_flops_per_s
    assert gpu.hbm_bytes == 186 * 1024**3  # 13.4 TB / 72 = 186, in GiB as the GPU reports it (below)
    assert gpu.hbm_bandwidth_bytes_per_s == pytest.approx(576e12 / 72)
    assert gpu.intra_node_bandwidth_bytes_per_s == pytest.approx(130e12 / 72 / 2, rel=0.01)
    assert gpu.gpus_per_node == 72  # the NVLink domain


def test_gb300_from_the_nvl72_rack_table():
    """GB300 NVL72, 72 GPUs: FP4 1,080 PFLOPS dense, FP8 720 and BF16 360 with sparsity; 288 GB a GPU
    (20.7 TB) at 576 TB/s; NVLink 130 TB/s; a ConnectX-8 800 Gb/s NIC a GPU. B300's silicon (compute
    capability 10.3) in the GB200's rack: 72 GPUs one NVLink domain, launched 4 to a tray."""
    gpu, b300, gb200 = load_gpu("gb300"), load_gpu("b300_sxm"), load_gpu("gb200")
    assert gpu.bf16_flops_per_s == pytest.approx(360e15 / 72 / 2)
    assert gpu.fp8_flops_per_s == pytest.approx(720e15 / 72 / 2)
    assert gpu.fp4_flops_per_s == pytest.approx(1080e15 / 72) == gpu.mxfp4_flops_per_s
    assert gpu.hbm_bytes > b300.hbm_bytes and gpu.hbm_bandwidth_bytes_per_s == pytest.approx(576e12 / 72)  # it exposes more (below)
    assert gpu.intra_node_bandwidth_bytes_per_s == pytest.approx(130e12 / 72 / 2, rel=0.01)
    assert gpu.inter_node_bandwidth_bytes_per_s == pytest.approx(800e9 / 8)
    assert (gpu.gpus_per_node, gpu.launch_gpus_per_host) == (72, 4) == (gb200.gpus_per_node, gb200.launch_gpus_per_host)
    assert gpu.compute_capability == b300.compute_capability == 10.3


def test_mi325x_is_mi300x_compute_with_more_hbm():
    gpu, mi300x = load_gpu("mi325x"), load_gpu("mi300x")
    assert gpu.fp8_flops_per_s == pytest.approx(304 * 4096 * 2.1e9, rel=1e-4)  # CUs x FP8 FLOP/clock x clock
    assert gpu.bf16_flops_per_s == pytest.approx(gpu.fp8_flops_per_s / 2, rel=1e-4)
    assert (gpu.bf16_flops_per_s, gpu.fp8_flops_per_s) == (mi300x.bf16_flops_per_s, mi300x.fp8_flops_per_s)
    assert gpu.hbm_bytes == 256 * 1024**3 and gpu.hbm_bandwidth_bytes_per_s == 6e12  # 8 stacks x 32 GiB, binary like MI300X's
    assert gpu.intra_node_bandwidth_bytes_per_s == pytest.approx(7 * 64e9)  # 7 links x 64 GB/s one way
    assert gpu.fp4_flops_per_s == gpu.mxfp4_flops_per_s == 0  # CDNA 3: no FP4


def test_mi355x_records_mxfp4_not_nvfp4():
    gpu = load_gpu("mi355x")
    fp8 = 256 * 8192 * 2.4e9  # CUs x FP8 FLOP/clock (CDNA 4) x peak clock = 5.03 PFLOPS
    assert gpu.fp8_flops_per_s == pytest.approx(fp8, rel=1e-4)
    assert gpu.bf16_flops_per_s == pytest.approx(fp8 / 2, rel=1e-4)
    assert gpu.mxfp4_flops_per_s == pytest.approx(2 * fp8, rel=1e-4)  # "up to 10 PFLOPS FP4"
    # its FP4 is OCP MXFP4: the nvfp4 weight dtype (ModelOpt NVFP4) has no tensor cores here
    assert gpu.fp4_flops_per_s == 0 and gpu.tensor_core_flops_per_s("nvfp4") == 0
    assert gpu.hbm_bytes == 288 * 1024**3 and gpu.hbm_bandwidth_bytes_per_s == 8e12
    assert gpu.intra_node_bandwidth_bytes_per_s == pytest.approx(7 * 153.6e9 / 2)


# What each device reports as its total memory, read in public logs (nvidia-smi --query-gpu=name,memory.total
# in MiB; CUDA's deviceQuery on an A100-SXM4-40GB; ROCm's rocm-smi on an MI300X and a PyTorch profiler trace's
# deviceProperties on an MI355X, in bytes).
MIB = 1024**2
GIB = 1 << 30
REPORTED_BYTES = {
    "a100_sxm": 81_920 * MIB, "a100_sxm_40gb": 42_405_855_232, "h100_sxm": 81_559 * MIB, "h200_sxm": 143_771 * MIB, "b200_sxm": 183_359 * MIB,
    "b300_sxm": 275_040 * MIB, "gb200": 189_471 * MIB, "gb300": 284_208 * MIB, "l40s": 46_068 * MIB,
    "mi300x": 205_822_885_888, "mi355x": 309.22e9,
}


@pytest.mark.parametrize("gpu", sorted(REPORTED_BYTES))
def test_hbm_is_what_the_device_reports(gpu):
    """vLLM sizes its KV cache as a fraction of the memory the runtime reports to PyTorch, which
    jaxplan takes as `visible_hbm_fraction` of the file's `hbm_bytes`. The readings above are the
    device tools' totals (nvidia-smi, rocm-smi, totalGlobalMem; deviceQuery's is CUDA's own): CUDA reports 0.5-0.9 GiB less than
    nvidia-smi (H100, H200, B200), ROCm the same. Marketed sizes are binary for most parts (192 GB =
    192 GiB) but not all (B300's 288 GB is 268.6 GiB): read the wrong way, MI300X, MI355X and GB200
    came out 7% short and GB300 4%; at CUDA's 0.99, MI300X and MI355X came out 1.6 and 2.9 GiB short."""
    spec = load_gpu(gpu)
    visible, reported = spec.visible_hbm_fraction * spec.hbm_bytes, REPORTED_BYTES[gpu]
    assert reported - GIB < visible <= reported


@pytest.mark.parametrize("fraction", [1.2, 0.5, True])
def test_visible_hbm_fraction_is_validated(fraction):
    """A share of the HBM the runtime reports, not a size: 80 (GiB) or 0.5 is refused by name."""
    with pytest.raises(PlanError, match="visible_hbm_fraction"):
        dataclasses.replace(load_gpu("h100_sxm"), visible_hbm_fraction=fraction)


def test_mxfp4_peak_is_validated():
    with pytest.raises(PlanError, match="mxfp4_flops_per_s"):
        dataclasses.replace(load_gpu("mi355x"), mxfp4_flops_per_s=1e30)


def test_gb200_keeps_tensor_parallel_16_on_nvlink():
    """TP inside the 72-GPU NVLink domain is intra-node: ring over NVLink, no cross-node latency."""
    gpus = (load_gpu("gb200"), load_gpu("b300_sxm"))
    hw = hardware_table(gpus, efficiency_for([g.name for g in gpus]))
    message = 64e6
    times = allreduce_time_s(hw, make_layout(tp=16.0), message)
    for i, (gpu, crosses) in enumerate(zip(gpus, (False, True))):
        link = gpu.inter_node_bandwidth_bytes_per_s if crosses else gpu.intra_node_bandwidth_bytes_per_s
        # from 8 GPUs on, the ring reaches allreduce_bandwidth_efficiency of the link
        expected = float(hw.allreduce_latency_s[i]) * (4.0 if crosses else 1.0) + 2 * 15 / 16 * message / (link * float(hw.allreduce_bandwidth_efficiency[i]))
        assert float(times[i]) == pytest.approx(expected, rel=1e-5), gpu.name
    assert float(times[0]) < float(times[1])


def test_gb200_launches_per_compute_tray():
    """The NVL72's NVLink domain is the physics' node (72 GPUs), but a launch command addresses one
    4-GPU tray: two TP2 x PP2 ranks take two trays, one rank each; a TP16 replica spans trays (Ray)."""
    assert load_gpu("gb200").gpus_per_node == 72 and load_gpu("gb200").launch_gpus_per_host == 4
    assert node_layout({"gpu": "gb200", "tensor_parallel_size": 2, "pipeline_parallel_size": 2, "data_parallel_size": 2}) == (2, 1)
    assert node_layout({"gpu": "gb200", "tensor_parallel_size": 16, "pipeline_parallel_size": 2, "data_parallel_size": 2}) is None
    assert node_layout({"gpu": "b300_sxm", "tensor_parallel_size": 16, "pipeline_parallel_size": 1, "data_parallel_size": 1}) is None
    assert node_layout({"gpu": "b300_sxm", "tensor_parallel_size": 2, "pipeline_parallel_size": 2, "data_parallel_size": 2}) == (1, 2)


# ---- models ----------------------------------------------------------------------------------

# name -> (published total, published active, how the publisher counts "active", tolerance)
PUBLISHED = {
    # OpenAI gpt-oss model card: 116.83B total, 5.13B active; 20.91B / 3.61B. Active excludes the
    # input embedding (a lookup) and includes the unembedding.
    "gpt-oss-120b": (116.83e9, 5.13e9, "no_embedding", 0.01),
    "gpt-oss-20b": (20.91e9, 3.61e9, "no_embedding", 0.01),
    # DeepSeek-R1 / V3: 671B total, 37B active (the 14B multi-token-prediction module not counted)
    "deepseek-r1": (671e9, 37e9, "all", 0.02),
    "qwen3-235b-a22b": (235e9, 22e9, "all", 0.02),
    # Kimi-K2.5: "1T total, 32B activated" (rounded); the vision tower is not counted
    "kimi-k2.5": (1.0e12, 32e9, "all", 0.03),
    # MiniMax M2 series (sglang docs, vercel model page): 230B total, 10B active, rounded; the
    # derived 9.8B counts the transformer layers only (embedding and lm_head 0.6B each left out)
    "minimax-m2.5": (230e9, 10e9, "layers", 0.03),
}


def _active(spec: ModelSpec, convention: str) -> int:
    if convention == "no_embedding":
        return spec.active_params - spec.embedding_params
    if convention == "layers":
        return spec.layer_params(active=True)
    return spec.active_params


@pytest.mark.parametrize("name", NEW_MODELS)
def test_parameter_counts_match_the_publishers(name):
    total, active, convention, tolerance = PUBLISHED[name]
    spec = load_model(name)
    assert spec.total_params == pytest.approx(total, rel=tolerance)
    assert _active(spec, convention) == pytest.approx(active, rel=tolerance)


@pytest.mark.parametrize(
    "hf_id, name",
    [
        ("openai/gpt-oss-120b", "gpt-oss-120b"),
        ("openai/gpt-oss-20b", "gpt-oss-20b"),
        ("MiniMaxAI/MiniMax-M2.5", "minimax-m2.5"),
        ("Qwen/Qwen3-235B-A22B", "qwen3-235b-a22b"),
        ("moonshotai/Kimi-K2.5", "kimi-k2.5"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-r1"),
        ("DEEPSEEK-AI/deepseek-r1-0528", "deepseek-r1"),
    ],
)
def test_hf_ids_resolve(hf_id, name):
    assert load_model(hf_id).name == name


def test_architectures_by_hand():
    gpt = load_model("gpt-oss-120b")
    # alternating layers: 18 sliding (128 tokens) + 18 full; KV per token = 36 layers x 2 x 8 heads x 64 x 2 bytes
    assert (gpt.full_attention_layers, gpt.sliding_window_layers, gpt.sliding_window_tokens) == (18, 18, 128)
    assert gpt.kv_bytes_per_token(2) == 36 * 2 * 8 * 64 * 2
    assert (gpt.num_experts, gpt.experts_per_token, gpt.moe_intermediate_size, gpt.num_shared_experts) == (128, 4, 2880, 0)
    kimi = load_model("kimi-k2.5")
    # DeepSeek-V3 shape with 384 experts, 64 heads, one dense layer; MLA caches 512 + 64 per token per layer
    assert (kimi.num_experts, kimi.num_shared_experts, kimi.first_dense_layers, kimi.num_attention_heads) == (384, 1, 1, 64)
    assert kimi.kv_bytes_per_token(2) == 61 * (512 + 64) * 2
    minimax = load_model("minimax-m2.5")
    # no moe_intermediate_size in its config: each of the 256 experts is intermediate_size 1536 wide
    assert (minimax.num_experts, minimax.experts_per_token, minimax.moe_intermediate_size, minimax.first_dense_layers) == (256, 8, 1536, 0)
    r1, v3 = load_model("deepseek-r1"), load_model("deepseek-v3")
    assert r1.total_params == v3.total_params and r1.kv_bytes_per_token(2) == v3.kv_bytes_per_token(2)


def test_checkpoint_weight_formats():
    formats = {name: load_model(name).checkpoint_weight_format for name in NEW_MODELS}
    assert formats == {"gpt-oss-120b": "mxfp4", "gpt-oss-20b": "mxfp4", "minimax-m2.5": "fp8", "qwen3-235b-a22b": "bf16",
                       "kimi-k2.5": "int4", "deepseek-r1": "fp8"}
    assert "mxfp4 experts in the checkpoint" in load_model("gpt-oss-120b").describe()
    assert "int4 experts in the checkpoint" in load_model("kimi-k2.5").describe()
    assert "checkpoint" not in load_model("qwen3-235b-a22b").describe()


BASE = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 1000}


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"quantization_config": {"quant_method": "mxfp4"}}, "mxfp4"),
        ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}, "fp8"),
        ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, "nvfp4"),
        ({"quantization_config": {"quant_method": "awq", "bits": 4}}, "int4"),
        ({"quantization_config": {"quant_method": "compressed-tensors",
                                  "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}}}, "int4"),
        ({"quantization_config": {"quant_method": "compressed-tensors",
                                  "config_groups": {"a": {"weights": {"num_bits": 4, "type": "int"}}, "b": {"weights": {"num_bits": 8, "type": "float"}}}}}, "other"),
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "other"),
        ({"torch_dtype": "bfloat16"}, "bf16"),
        ({"dtype": "float16"}, "bf16"),
        ({"torch_dtype": "float32"}, ""),
        ({}, ""),
        # Kimi-K2.5: the quantization_config sits in text_config
        ({"text_config": {**BASE, "quantization_config": {"quant_method": "mxfp4"}}}, "mxfp4"),
    ],
)
def test_checkpoint_format_from_quantization_config(extra, expected):
    assert model_from_hf_dict({**BASE, **extra}, "synthetic").checkpoint_weight_format == expected


def test_checkpoint_format_is_validated():
    with pytest.raises(PlanError, match="checkpoint_weight_format"):
        dataclasses.replace(load_model("gpt-oss-20b"), checkpoint_weight_format="q4_k_m")


def test_a100_40gb_is_the_a100_runs_without_overrides():
    """The A100's fit comes from A100-SXM4-40GB runs given as `a100_sxm` with the 40 GB part's memory
    and bandwidth per row; `a100_sxm_40gb` is that GPU by name (bands.ROWS_FITTED_AS, in
    calibrate.run.SAME_SILICON): the same step times, and a KV cache smaller only by what CUDA
    reports (0.987 of 40 GiB against 0.99)."""
    from jaxplan.prediction import predict_rows

    row = dict(model="llama-3.1-70b", tensor_parallel_size=8, weight_dtype="bf16", kv_cache_dtype="auto", isl=1000, osl=500, concurrency=16)
    named, overridden = predict_rows([dict(row, gpu="a100_sxm_40gb"),
                                      dict(row, gpu="a100_sxm", gpu_hbm_bytes_override=42949672960, gpu_hbm_bandwidth_bytes_per_s_override=1.555e12)])
    assert named["tpot_ms_mean"] == pytest.approx(overridden["tpot_ms_mean"], rel=1e-6)
    assert named["ttft_ms_mean"] == pytest.approx(overridden["ttft_ms_mean"], rel=1e-6)
    assert 0.99 * overridden["kv_cache_tokens"] < named["kv_cache_tokens"] < overridden["kv_cache_tokens"]
