"""vLLM's batching defaults by GPU, as `predict` fills a row that leaves them out: 8,192 tokens and
1,024 sequences on a GPU of 70 GiB or more that is not an A100, else 2,048 and 256
(`EngineArgs.get_batch_defaults`); and the A100 runs of vLLM 0.8.3 state what their server ran."""

from __future__ import annotations

import dataclasses

import pytest

from jaxplan.calibrate import _data
from jaxplan.engine_defaults import LARGE_GPU_BYTES, batch_knobs, default_batch_knobs
from jaxplan.prediction import predict_rows
from jaxplan.specs import load_gpu


@pytest.mark.parametrize(("gpu", "knobs"), [
    ("a100_sxm", (256, 2048)),  # 80 GB, but an A100: vLLM keeps the small budget there (vllm PR #17885)
    ("l40s", (256, 2048)),  # 48 GB
    ("h100_sxm", (1024, 8192)),
    ("h200_sxm", (1024, 8192)),
    ("b200_sxm", (1024, 8192)),
    ("mi300x", (1024, 8192)),
])
def test_defaults_by_gpu_by_hand(gpu, knobs):
    assert default_batch_knobs(load_gpu(gpu)) == knobs


def test_the_memory_threshold_is_70_gib():
    h100 = load_gpu("h100_sxm")
    assert default_batch_knobs(dataclasses.replace(h100, hbm_bytes=LARGE_GPU_BYTES)) == (1024, 8192)
    assert default_batch_knobs(dataclasses.replace(h100, hbm_bytes=LARGE_GPU_BYTES - 1)) == (256, 2048)


def test_a_row_without_knobs_is_predicted_at_its_gpus_defaults():
    """An L40S row that names no knobs is the row naming 256 and 2,048, not 1,024 and 8,192: the
    sampler's start-up profile (max_num_seqs x vocabulary logits) leaves it more KV cache."""
    row = {"model": "llama-3.1-8b", "gpu": "l40s", "tensor_parallel_size": 1, "isl": 1000, "osl": 200, "concurrency": 16, "num_prompts": 160}
    blank, vllms, datacenter = predict_rows([row, dict(row, max_num_seqs=256, max_num_batched_tokens=2048), dict(row, max_num_seqs=1024, max_num_batched_tokens=8192)])
    assert blank["kv_cache_tokens"] == vllms["kv_cache_tokens"] > datacenter["kv_cache_tokens"]
    assert blank["ttft_ms_mean"] == pytest.approx(vllms["ttft_ms_mean"], rel=1e-6) and blank["tpot_ms_mean"] == pytest.approx(vllms["tpot_ms_mean"], rel=1e-6)


@pytest.mark.parametrize(("gpu", "stated", "knobs"), [
    ("h200_sxm", (None, None), (1024, 8192)),
    ("h200_sxm", (None, 512), (512, 512)),  # the default 1,024 sequences capped at the stated budget
    ("h200_sxm", (None, 4096), (1024, 4096)),
    ("a100_sxm", (None, 128), (128, 128)),
    ("a100_sxm", (64, None), (64, 2048)),
    ("h200_sxm", (2048, 16384), (2048, 16384)),
])
def test_flags_left_out_take_vllms_values_by_hand(gpu, stated, knobs):
    """`EngineArgs.get_batch_defaults` sets a left-out --max-num-seqs to min(the GPU's default, the
    token budget), so `vllm serve --max-num-batched-tokens 512` starts with 512 sequences."""
    assert batch_knobs(load_gpu(gpu), *stated) == knobs


def test_the_a100_runs_state_vllm_0_8_3s_knobs():
    """TP8 ran on the V1 engine (256 sequences, 2,048 tokens); TP4 x PP2 on V0, one scheduler per
    virtual engine with 256 each."""
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    from jaxplan.calibrate.serving import load_vllm_a100_rows

    rows = load_vllm_a100_rows()
    assert {(r["pipeline_parallel_size"], r["max_num_seqs"], r["max_num_batched_tokens"]) for r in rows} == {(1, 256, 2048), (2, 512, 2048)}
    assert {r["vllm_version"] for r in rows} == {"0.8.3"}  # so their PP runs are priced on V0 (`vllm_release`)
